"""The run directory: exclusive lock, saved config, and the resume/refuse decision.

Layout of ``<output_dir>/<run_name>/``::

    config.yaml          the resolved job config (re-run with --job config.yaml)
    run.json             config hash, dataset and registry fingerprints, versions
    trajectories/        part-00000.parquet ...   kept episodes
    rejected/            part-00000.parquet ...   rejected episodes, with reject_reason
    shards/              00000.json ...           completion markers (a shard is done)
    journal/             finished episodes of shards not yet committed
    statistics.json      written at the end of every run or resume
    .lock                held while a run is active
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from hermes import __version__
from hermes.config import JobConfig, diff_configs
from hermes.errors import ConfigError

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
CONFIG_FILE = "config.yaml"
LOCK_FILE = ".lock"
# Entries that may exist in a run directory without it counting as "has output".
_HARMLESS = {LOCK_FILE, ".cache"}


@dataclass(frozen=True, kw_only=True)
class RunIdentity:
    config_hash: str
    dataset_fingerprint: str


class RunLock:
    """An exclusive advisory lock on the run directory; a second run refuses to start."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"run directory {self.path.parent} is in use by {holder}; wait for it to "
                "finish or stop it, then use --resume"
            ) from None
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}\n".encode())
        except OSError as exc:
            # The pid only names the holder in messages; a full disk must not stop the
            # run here (the lock itself is held), it is reported where output is written.
            logger.debug("could not record the pid in %s: %s", self.path, exc)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def has_output(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(p.name not in _HARMLESS for p in run_dir.iterdir())


def _stage(path: Path, text: str) -> Path:
    """Write ``text`` beside ``path`` under a temporary name; nothing is left on failure."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _keep_history(path: Path, history: Path) -> None:
    """Keep a copy of ``path`` as ``history``; a hard link needs no free space."""
    try:
        os.link(path, history)
    except OSError:
        try:
            shutil.copy2(path, history)
        except BaseException:
            history.unlink(missing_ok=True)
            raise


def save_run_files(
    run_dir: Path, config: JobConfig, identity: RunIdentity, extra: dict[str, Any]
) -> None:
    """Write config.yaml and run.json (atomically), keeping the previous run.json.

    Both files are staged before anything is replaced, so a full disk or a crash leaves
    the previous run.json in place and the run resumable.
    """
    previous = run_dir / RUN_FILE
    header = (
        f"# Resolved job config of run {config.run_name} (hash {identity.config_hash}).\n"
        f"# Re-run it with: hermes-batch run --job {run_dir / CONFIG_FILE} --run_name NEW_NAME\n"
    )
    dumped = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
    record = {
        "config_hash": identity.config_hash,
        "dataset_fingerprint": identity.dataset_fingerprint,
        "hashed_config": config.hashed_dict(),
        "hermes_batch_version": __version__,
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
    staged = [(_stage(run_dir / CONFIG_FILE, header + dumped), run_dir / CONFIG_FILE)]
    try:
        staged.append((_stage(previous, json.dumps(record, indent=2, sort_keys=True)), previous))
        if previous.exists():
            stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}"
            _keep_history(previous, run_dir / f"run.previous-{stamp}.json")
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in staged:
        os.replace(tmp, final)


def check_resume(run_dir: Path, config: JobConfig, identity: RunIdentity, *, force: bool) -> None:
    """Refuse to resume a run whose config or dataset changed, unless ``force``."""
    path = run_dir / RUN_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{run_dir} has output but no {RUN_FILE}; it was not written by hermes-batch "
            "or is damaged. Use another --run_name."
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); use another --run_name") from None
    changes = diff_configs(saved.get("hashed_config", {}), config.hashed_dict())
    if saved.get("dataset_fingerprint") != identity.dataset_fingerprint:
        changes.append("dataset: its content or selection (path, columns, shuffle) changed")
    if changes and not force:
        listing = "\n  ".join(changes)
        raise ConfigError(
            f"refusing to resume {run_dir}: the job differs from the run's saved config "
            f"(hash {saved.get('config_hash')} -> {identity.config_hash}):\n  {listing}\n"
            "Restore those settings, or pass --force to resume anyway (rows from before and "
            "after the change will be mixed)."
        )


def prepare_run_dir(
    config: JobConfig, identity: RunIdentity, *, resume: bool, force: bool
) -> tuple[Path, RunLock]:
    """Lock the run directory and decide fresh start vs resume; raises ConfigError."""
    run_dir = config.resolved_output()
    lock = RunLock(run_dir)
    # Locked first: a second start of a running job must hear that the run is in use,
    # not be told to pass --resume (which would then fail on the lock anyway).
    lock.acquire()
    try:
        if has_output(run_dir) and not resume:
            raise ConfigError(
                f"run directory {run_dir} already has output; pass --resume to finish it, or "
                "choose another --run_name (nothing was changed)"
            )
        if has_output(run_dir):
            check_resume(run_dir, config, identity, force=force)
    except ConfigError:
        lock.release()
        raise
    return run_dir, lock
