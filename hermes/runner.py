"""The driver: validate, plan shards, feed Ray workers with bounded in-flight work, resume.

Where work runs (Ray actors, local or a cluster) is decided here; what runs is
``hermes.worker``. The driver holds only the shards in flight, so its memory stays flat
whatever the dataset size.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hermes.config import JobConfig, load_prefill, resolve_api_key
from hermes.dataset import BadRow, DatasetSpec, PromptRow, PromptSource
from hermes.errors import ConfigError, HermesError
from hermes.journal import journal_dir
from hermes.progress import Progress
from hermes.rundir import RunIdentity, prepare_run_dir, save_run_files
from hermes.stats import RunStats
from hermes.worker import ShardReceipt, ShardTask, WorkerSpec, tool_settings
from hermes.writer import ShardWriter
from tools.discovery import discover_tools
from tools.registry import RegistrySnapshot, registry
from tools.sandbox import check_sandbox
from toolset_distributions import load_distributions, validate

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
MAX_SHARD_ATTEMPTS = 3
MAX_BAD_ROWS_REPORTED = 1000


class JobAborted(HermesError):
    """A run stopped on an error a retry cannot fix; the message says how to resume."""


@dataclass
class Plan:
    """What a run has to do, decided before any worker starts."""

    config: JobConfig
    source: PromptSource
    snapshot: RegistrySnapshot
    identity: RunIdentity
    endpoint_config: Any = None
    warnings: list[str] = field(default_factory=list)


def plan_job(config: JobConfig) -> Plan:
    """Validate everything a run needs; raises ConfigError/DatasetError, writes nothing."""
    report = discover_tools()
    if report.failed:
        failed = "; ".join(f"{m}: {e}" for m, e in sorted(report.failed.items()))
        raise ConfigError(f"tool modules failed to import: {failed}")
    settings = tool_settings(config)
    sandbox = check_sandbox(settings)  # one trial command in the configured sandbox
    if not sandbox.ok:
        raise ConfigError(f"sandbox: {sandbox.reason}")
    snapshot = registry.snapshot(settings)
    catalog = load_distributions(config.distributions, config.distributions_file)
    validate(catalog, config.distribution, list(snapshot.toolsets))
    warnings = _toolset_warnings(config, catalog.get(config.distribution).toolsets, snapshot)
    warnings.extend(sandbox.warnings)
    load_prefill(config.episode.prefill_messages_file)
    endpoint_config = None
    if config.uses_embedded_endpoint():
        from hermes.endpoint import EndpointConfig

        endpoint_config = EndpointConfig.from_dict(config.endpoint)
    elif config.endpoint:
        raise ConfigError(
            "the endpoint: section configures the embedded endpoint, but model.base_url is "
            f"{config.model.base_url!r}; remove the section or set model.base_url: embedded"
        )
    d = config.dataset
    spec = DatasetSpec(
        path=d.path,
        format=d.format,
        split=d.split,
        prompt_column=d.prompt_column,
        id_column=d.id_column,
        max_samples=d.max_samples,
        shuffle=d.shuffle,
        seed=config.seed,
    )
    source = PromptSource(spec, cache_dir=Path(config.output_dir) / ".hermes-cache")
    identity = RunIdentity(config_hash=config.hash(), dataset_fingerprint=source.fingerprint())
    return Plan(
        config=config,
        source=source,
        snapshot=snapshot,
        identity=identity,
        endpoint_config=endpoint_config,
        warnings=warnings,
    )


def _toolset_warnings(
    config: JobConfig, toolsets: Iterable[str], snapshot: RegistrySnapshot
) -> list[str]:
    """Start-up warnings for the distribution's toolsets that are missing tools here;
    raises ConfigError for a wholly unavailable one under ``strict_toolsets``."""
    warnings = []
    for toolset in toolsets:
        where = f"toolset {toolset!r} of distribution {config.distribution!r}"
        state = snapshot.toolset_available(toolset)
        if not state.available:
            message = f"{where} is unavailable here: {state.reason}"
            if config.strict_toolsets:
                raise ConfigError(message + " (strict_toolsets is set)")
            warnings.append(message + "; prompts that draw it get the others")
            continue
        # A toolset counts as available with one tool; the hidden ones deserve a word too.
        hidden = [t for t in snapshot.toolsets.get(toolset, ()) if t not in snapshot.entries]
        if hidden:
            reasons = "; ".join(
                f"{t}: {snapshot.unavailable.get(t, 'not registered')}" for t in hidden
            )
            warnings.append(f"{where} is only partly available here (hidden: {reasons})")
    return warnings


def _start_ray(config: JobConfig) -> Any:
    import ray

    address = config.runner.ray_address
    if not address:
        # Ray's token auth writes ~/.ray/auth_token and breaks on a read-only HOME; a local
        # cluster started for this run has no use for it.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address=address or "local",
        include_dashboard=False,
        logging_level=logging.WARNING,
        configure_logging=False,
    )
    # Ray replaces the SIGTERM handler; a terminated driver should stop like an
    # interrupted one: finished episodes are journaled, the message says how to resume.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    return ray


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class _Pending:
    task: ShardTask
    attempts: int
    actor: int


class Driver:
    """Runs one planned job to the end (or until interrupted)."""

    def __init__(self, plan: Plan, run_dir: Path, *, resume: bool, out: TextIO) -> None:
        self.plan = plan
        self.config = plan.config
        self.run_dir = run_dir
        self.resume = resume
        self.out = out
        self.writer = ShardWriter(str(run_dir))
        self.bad_rows: list[BadRow] = []
        self.bad_row_count = 0
        self.failed: list[tuple[str, str]] = []
        self.lost_shards: list[int] = []
        self.lost_prompts = 0
        # Lines the reader rejected before loading (not JSON, not UTF-8) hold no position.
        for bad in plan.source.bad_rows_before_load:
            self._note_bad_row(bad)
        self.bad_row_count = plan.source.bad_rows_before_load_count

    def tasks(self) -> Iterator[ShardTask]:
        """Shard tasks in order, skipping committed shards (or, on resume, running only
        their infrastructure failures)."""
        batch = self.config.runner.batch_size
        committed = self.writer.committed_index()
        rows: list[PromptRow] = []
        shard = 0
        for position, item in enumerate(self.plan.source.iter_rows()):
            if position // batch != shard:
                task = self._task_for(shard, rows, committed)
                if task is not None:
                    yield task
                shard, rows = position // batch, []
            if isinstance(item, BadRow):
                self._note_bad_row(item)
            elif shard not in committed or committed[shard]:
                rows.append(item)
        total = len(self.plan.source)
        if total:
            task = self._task_for(shard, rows, committed)
            if task is not None:
                yield task

    def _task_for(
        self, shard: int, rows: list[PromptRow], committed: dict[int, tuple[str, ...]]
    ) -> ShardTask | None:
        failed = committed.get(shard)
        if failed is None:
            return ShardTask(shard=shard, rows=tuple(rows))
        retry = set(failed)
        if not retry:
            return None
        return ShardTask(
            shard=shard, rows=tuple(r for r in rows if r.prompt_id in retry), merge_committed=True
        )

    def _note_failed(self, failures: list[tuple[str, str]]) -> None:
        # Bounded like every other per-prompt list on the driver (invariant 6).
        room = MAX_BAD_ROWS_REPORTED - len(self.failed)
        self.failed += failures[: max(room, 0)]

    def _note_bad_row(self, item: BadRow) -> None:
        self.bad_row_count += 1
        if len(self.bad_rows) < MAX_BAD_ROWS_REPORTED:
            self.bad_rows.append(item)
        where = f"line {item.line}" if item.line is not None else f"row {item.index}"
        logger.warning("skipping bad dataset row (%s): %s", where, item.reason)

    def prompts_to_run(self) -> int:
        total = len(self.plan.source)
        committed = self.writer.committed_index()
        batch = self.config.runner.batch_size
        done = sum(
            min(batch, total - shard * batch) - len(failed)
            for shard, failed in committed.items()
            if shard * batch < total
        )
        return max(total - done, 0)

    def run(self, ray: Any, actors: list[Any]) -> None:
        per_actor = math.ceil(self.config.runner.concurrency / self.config.runner.batch_size) + 1
        pending: dict[Any, _Pending] = {}
        load = [0] * len(actors)
        tasks = self.tasks()
        exhausted = False
        progress = Progress(
            total=self.prompts_to_run(), enabled=self.config.runner.progress, out=self.out
        )
        try:
            while True:
                while not exhausted and min(load) < per_actor:
                    task = next(tasks, None)
                    if task is None:
                        exhausted = True
                        break
                    index = load.index(min(load))
                    self._submit(actors, pending, load, _Pending(task, 1, index))
                if not pending:
                    break
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    item = pending.pop(ref)
                    load[item.actor] -= 1
                    receipt = self._collect(ray, ref, item, actors, pending, load)
                    if receipt is not None:
                        progress.update(receipt)
        finally:
            progress.close()

    def _submit(
        self, actors: list[Any], pending: dict[Any, _Pending], load: list[int], item: _Pending
    ) -> None:
        ref = actors[item.actor].run_shard.remote(item.task)
        pending[ref] = item
        load[item.actor] += 1

    def _collect(
        self,
        ray: Any,
        ref: Any,
        item: _Pending,
        actors: list[Any],
        pending: dict[Any, _Pending],
        load: list[int],
    ) -> ShardReceipt | None:
        from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError

        try:
            receipt: ShardReceipt = ray.get(ref)
        except RayTaskError as exc:
            # The worker is alive but could not finish the shard (disk full, output dir
            # gone): retrying elsewhere would fail the same way, so the job stops here.
            cause = getattr(exc, "cause", None) or exc
            raise JobAborted(
                f"shard {item.task.shard} could not be completed: {type(cause).__name__}: "
                f"{cause}. Finished episodes are journaled; fix the cause and run the same "
                f"command with --resume:\n  {resume_command()}"
            ) from None
        except (RayActorError, WorkerCrashedError) as exc:
            if item.attempts >= MAX_SHARD_ATTEMPTS:
                logger.error(
                    "shard %d lost %d times; giving up on it: %s",
                    item.task.shard,
                    item.attempts,
                    exc,
                )
                self.lost_shards.append(item.task.shard)
                self.lost_prompts += len(item.task.rows)
                self._note_failed([(r.prompt_id, "worker died repeatedly") for r in item.task.rows])
                return None
            other = (item.actor + 1) % len(actors)
            logger.warning(
                "worker %d died on shard %d (%s); giving the shard to worker %d",
                item.actor,
                item.task.shard,
                type(exc).__name__,
                other,
            )
            self._submit(actors, pending, load, _Pending(item.task, item.attempts + 1, other))
            return None
        self._note_failed(receipt.failed)
        return receipt

    def statistics(self) -> RunStats:
        """Statistics of the whole run, rebuilt from every committed shard's marker."""
        stats = RunStats()
        for _, marker in self.writer.iter_markers():
            data = (marker.get("extra") or {}).get("stats")
            if data:
                stats.merge(RunStats.from_dict(data))
        return stats


def _bad_rows_json(driver: Driver) -> dict[str, Any]:
    return {
        "count": driver.bad_row_count,
        "rows": [{"index": b.index, "line": b.line, "reason": b.reason} for b in driver.bad_rows],
    }


def write_statistics(driver: Driver, elapsed_s: float) -> RunStats:
    import json

    stats = driver.statistics()
    data = stats.to_json_dict()
    data["bad_rows"] = _bad_rows_json(driver)
    data["failed_prompts_this_attempt"] = [
        {"prompt_id": pid, "error": err} for pid, err in driver.failed[:1000]
    ]
    data["wall_time_s"] = round(elapsed_s, 3)
    data["config_hash"] = driver.plan.identity.config_hash
    data["registry_fingerprint"] = driver.plan.snapshot.fingerprint
    path = driver.run_dir / "statistics.json"
    tmp = path.with_name(".statistics.json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return stats


def run_job(config: JobConfig, *, resume: bool, force: bool, out: TextIO = sys.stdout) -> int:
    """Run or resume a job; returns the process exit code (0, 1 or 2)."""
    started = time.monotonic()
    plan = plan_job(config)
    for warning in plan.warnings:
        logger.warning("%s", warning)
    run_dir, lock = prepare_run_dir(config, plan.identity, resume=resume, force=force)
    endpoint = None
    ray = None
    try:
        save_run_files(
            run_dir, config, plan.identity, {"registry_fingerprint": plan.snapshot.fingerprint}
        )
        ShardWriter(str(run_dir)).cleanup_staging()
        base_url = config.model.base_url
        if plan.endpoint_config is not None:
            from hermes.endpoint import EmbeddedEndpoint

            endpoint = EmbeddedEndpoint(plan.endpoint_config).start()
            base_url = endpoint.base_url
        ray = _start_ray(config)
        actors = _start_actors(ray, plan, run_dir, base_url)
        driver = Driver(plan, run_dir, resume=resume, out=out)
        driver.run(ray, actors)
        stats = write_statistics(driver, time.monotonic() - started)
        print(stats.summary_table(), file=out)
        return _finish(driver, run_dir, out)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: finished episodes are saved in {run_dir}; continue with:\n"
            f"  {resume_command()}",
            file=sys.stderr,
        )
        return 130
    except OSError as exc:
        # Disk full, permissions, a vanished output dir: say so without a traceback.
        raise JobAborted(
            f"the run stopped on a system error: {exc}. Finished episodes are journaled; "
            f"fix the cause and run the same command with --resume:\n  {resume_command()}"
        ) from exc
    finally:
        if ray is not None:
            ray.shutdown()
        if endpoint is not None:
            endpoint.stop()
        lock.release()


def resume_command(argv: list[str] | None = None) -> str:
    """The command line that resumes this run (the current one, plus --resume)."""
    args = list(sys.argv if argv is None else argv)
    if "--resume" not in args:
        args.append("--resume")
    program = "python " if args and args[0].endswith(".py") else ""
    return program + shlex.join(args)


def _start_actors(ray: Any, plan: Plan, run_dir: Path, base_url: str | None) -> list[Any]:
    from hermes.worker import EpisodeWorker

    config = plan.config
    remote = ray.remote(EpisodeWorker).options(
        max_restarts=MAX_SHARD_ATTEMPTS,
        max_task_retries=0,
        max_concurrency=1000,
        num_cpus=0,
        scheduling_strategy="SPREAD",
    )
    actors = [
        remote.remote(
            WorkerSpec(
                config=config,
                config_hash=plan.identity.config_hash,
                base_url=base_url,
                api_key=resolve_api_key(config.model),
                run_dir=str(run_dir),
                worker_name=f"w{i}",
            )
        )
        for i in range(config.runner.num_workers)
    ]
    infos = ray.get([a.info.remote() for a in actors])
    prints = {info["fingerprint"] for info in infos}
    if len(prints) > 1 or plan.snapshot.fingerprint not in prints:
        listing = ", ".join(f"{i['worker']}@{i['host']}={i['fingerprint']}" for i in infos)
        raise ConfigError(
            "workers disagree on the tool registry (different code or configuration on some "
            f"nodes): driver={plan.snapshot.fingerprint}, {listing}"
        )
    return actors


def _finish(driver: Driver, run_dir: Path, out: TextIO) -> int:
    failed = sum(len(f) for f in driver.writer.committed_index().values()) + driver.lost_prompts
    if failed:
        print(
            f"{failed} prompt(s) failed for infrastructure reasons (listed in "
            f"{run_dir / 'statistics.json'}); run the same command with --resume to retry them",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        shutil.rmtree(journal_dir(run_dir))
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove the journal of a finished run: %s", exc)
    print(f"output: {run_dir}", file=out)
    return EXIT_OK


__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "HermesError", "Plan", "plan_job", "run_job"]
