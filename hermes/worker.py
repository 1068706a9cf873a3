"""The worker: one registry snapshot, many episodes, one committed Parquet shard per task.

Ray-agnostic: ``hermes.runner`` wraps ``EpisodeWorker`` in an async Ray actor. Each
finished episode is appended to a journal file of its shard before anything else, so a
killed worker loses only the episodes in flight; a shard retried elsewhere reuses them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from hermes.agent import EpisodeRecord, EpisodeSettings, run_episode
from hermes.config import JobConfig, RejectionConfig, load_prefill
from hermes.dataset import PromptRow
from hermes.journal import Journal, journal_dir, read_journal_entries
from hermes.model_client import ModelClient, ModelSettings
from hermes.outage import OutagePolicy
from hermes.schema import episode_row, failure_row, rows_to_table
from hermes.stats import RunStats
from hermes.writer import ShardWriter
from tools.discovery import discover_tools
from tools.dispatch import ToolDispatcher
from tools.registry import registry
from tools.settings import SandboxSettings, ToolSettings
from toolset_distributions import load_distributions, sample_toolsets

logger = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """Everything a worker needs; pickled once to each Ray actor."""

    config: JobConfig
    config_hash: str
    base_url: str | None
    api_key: str | None
    run_dir: str
    worker_name: str


@dataclass(frozen=True, kw_only=True)
class ShardTask:
    """Prompts of one shard to run. ``merge_committed`` keeps the rows of an already
    committed shard and adds these (a resume retrying its infrastructure failures)."""

    shard: int
    rows: tuple[PromptRow, ...]
    merge_committed: bool = False


@dataclass(frozen=True, kw_only=True)
class ShardReceipt:
    shard: int
    kept: int
    rejected: int
    failed: list[tuple[str, str]] = field(default_factory=list)
    ran: int = 0
    reused: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    worker: str = ""


def tool_settings(config: JobConfig) -> ToolSettings:
    limits = config.tool_limits
    box = config.sandbox
    sandbox = SandboxSettings(
        backend=box.backend,
        allow_unsafe_none=box.allow_unsafe_none,
        allow_network=box.allow_network,
        tmpfs_size_mb=box.tmpfs_size_mb,
        run_as_uid=box.run_as_uid,
        strip_ansi=box.strip_ansi,
        **box.limits.model_dump(),
    )
    return ToolSettings(
        options=config.tools,
        default_max_result_chars=limits.default_max_result_chars,
        call_timeout_s=limits.call_timeout_s,
        command_timeout_s=limits.command_timeout_s,
        env_passthrough=limits.env_passthrough,
        sandbox=sandbox,
    )


def model_settings(config: JobConfig, base_url: str | None, api_key: str | None) -> ModelSettings:
    m = config.model
    return ModelSettings(
        model=m.name,
        base_url=base_url,
        api_key=api_key,
        temperature=m.temperature,
        top_p=m.top_p,
        max_tokens=m.max_tokens,
        seed=m.seed,
        stop=m.stop,
        reasoning_effort=m.reasoning_effort,
        extra_body=m.extra_body,
        stream=m.stream,
        request_timeout_s=m.request_timeout_s,
        max_retries=m.max_retries,
        backoff_base_s=m.backoff_base_s,
        backoff_max_s=m.backoff_max_s,
        retry_after_cap_s=m.retry_after_cap_s,
        outage=OutagePolicy(
            failure_threshold=m.outage_failure_threshold,
            probe_interval_s=m.outage_probe_interval_s,
            max_outage_s=m.max_outage_s,
        ),
    )


def episode_settings(config: JobConfig) -> EpisodeSettings:
    e = config.episode
    return EpisodeSettings(
        max_turns=e.max_turns,
        max_invalid_turns=e.max_invalid_turns,
        summary_on_max_turns=e.summary_on_max_turns,
        deadline_s=e.deadline_s,
        system_prompt=e.system_prompt,
        ephemeral_system_prompt=e.ephemeral_system_prompt,
        prefill_messages=load_prefill(e.prefill_messages_file),
        scratch_root=Path(e.scratch_root) if e.scratch_root else None,
        keep_scratch=e.keep_scratch,
    )


def classify(record: EpisodeRecord, rules: RejectionConfig) -> tuple[str, str | None]:
    """``kept``, ``rejected`` (with a reason) or ``failed`` (infrastructure; retried)."""
    if record.error_kind == "transient":
        return "failed", record.error or "transient model error"
    if record.error_kind == "permanent":
        return "rejected", "permanent_error"
    if rules.reject_partial and record.partial:
        return "rejected", f"partial:{record.finish_reason}"
    all_invalid = record.num_tool_calls > 0 and record.invalid_tool_calls == record.num_tool_calls
    if rules.reject_only_invalid_calls and all_invalid:
        return "rejected", "only_invalid_tool_calls"
    if rules.require_reasoning and not record.has_reasoning:
        return "rejected", "no_reasoning"
    return "kept", None


class EpisodeWorker:
    """Builds its tools once, then runs shards; up to ``concurrency`` episodes at a time."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.config = spec.config
        report = discover_tools()
        self.failed_imports = dict(report.failed)
        self.snapshot = registry.snapshot(tool_settings(self.config))
        self.dispatcher = ToolDispatcher(
            self.snapshot, max_threads=min(64, self.config.runner.concurrency)
        )
        catalog = load_distributions(self.config.distributions, self.config.distributions_file)
        self.distribution = catalog.get(self.config.distribution)
        self.available_toolsets = sorted(
            ts for ts in self.snapshot.toolsets if self.snapshot.toolset_available(ts).available
        )
        self.settings = episode_settings(self.config)
        self.writer = ShardWriter(spec.run_dir)
        self._client: ModelClient | None = None
        self._slots: asyncio.Semaphore | None = None

    def info(self) -> dict[str, Any]:
        return {
            "worker": self.spec.worker_name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "fingerprint": self.snapshot.fingerprint,
            "failed_imports": self.failed_imports,
        }

    def _ensure_async_state(self) -> tuple[ModelClient, asyncio.Semaphore]:
        # Both bind to the running event loop, so they are made inside it.
        if self._client is None or self._slots is None:
            settings = model_settings(self.config, self.spec.base_url, self.spec.api_key)
            self._client = ModelClient(settings)
            self._slots = asyncio.Semaphore(self.config.runner.concurrency)
        return self._client, self._slots

    async def run_shard(self, task: ShardTask) -> ShardReceipt:
        """Run the shard's prompts that have no journaled episode yet, then commit it."""
        reused = {
            e["prompt_id"]: e
            for e in read_journal_entries(self.spec.run_dir, shard=task.shard)
            if e.get("status") != "failed"
        }
        todo = [row for row in task.rows if row.prompt_id not in reused]
        writer_id = f"s{task.shard:05d}-{self.spec.worker_name}-{uuid.uuid4().hex[:8]}"
        with Journal(self.spec.run_dir, writer_id) as journal:
            fresh = await asyncio.gather(*(self._run_prompt(r, journal, task.shard) for r in todo))
        entries = [*reused.values(), *fresh]
        receipt = self._commit(task, entries)
        _remove_shard_journals(self.spec.run_dir, task.shard)
        return ShardReceipt(**{**receipt.__dict__, "ran": len(fresh), "reused": len(reused)})

    async def _run_prompt(self, row: PromptRow, journal: Journal, shard: int) -> dict[str, Any]:
        client, slots = self._ensure_async_state()
        async with slots:
            toolsets = sample_toolsets(
                self.distribution,
                job_seed=self.config.seed,
                prompt_id=row.prompt_id,
                available=self.available_toolsets,
            )
            entry = await self._episode_entry(row, toolsets, client)
        entry["shard"] = shard
        journal.append(entry)
        return entry

    async def _episode_entry(
        self, row: PromptRow, toolsets: list[str], client: ModelClient
    ) -> dict[str, Any]:
        common: dict[str, Any] = {
            "prompt_id": row.prompt_id,
            "prompt_index": row.prompt_index,
            "prompt": row.prompt,
            "toolsets": toolsets,
            "metadata": row.metadata,
            "model": self.config.model.name,
            "seed": self.config.seed,
            "config_hash": self.spec.config_hash,
            "registry_fingerprint": self.snapshot.fingerprint,
            "run_name": self.config.run_name,
        }
        task_id = _UNSAFE.sub("_", f"{self.config.run_name}-{row.prompt_id}")[:120]
        try:
            record = await run_episode(
                row.prompt,
                task_id=task_id,
                tool_names=self.snapshot.tools_for(toolsets),
                dispatcher=self.dispatcher,
                client=client,
                settings=self.settings,
            )
        except Exception as exc:
            # A bug, not a model failure: loud in the log, and the prompt is retried on resume.
            logger.exception("episode for prompt %s crashed", row.prompt_id)
            entry = failure_row(
                error=f"{type(exc).__name__}: {exc}", error_kind="worker_error", **common
            )
            entry["status"] = "failed"
            return entry
        status, reason = classify(record, self.config.rejection)
        entry = episode_row(record, **common)
        entry["status"] = status
        if reason is not None:
            entry["reject_reason"] = reason
        return entry

    def _commit(self, task: ShardTask, entries: list[dict[str, Any]]) -> ShardReceipt:
        kept = [e for e in entries if e["status"] == "kept"]
        rejected = [e for e in entries if e["status"] == "rejected"]
        failed = [e for e in entries if e["status"] == "failed"]
        kept_table = rows_to_table(kept, rejected=False)
        rejected_table = rows_to_table(rejected, rejected=True)
        if task.merge_committed:
            kept_table = pa.concat_tables([self.writer.read_shard_rows(task.shard), kept_table])
            rejected_table = pa.concat_tables(
                [self.writer.read_shard_rows(task.shard, rejected=True), rejected_table]
            )
        stats = RunStats()
        for row in kept_table.to_pylist():
            stats.add_row(row, "kept")
        for row in rejected_table.to_pylist():
            stats.add_row(row, "rejected")
        for entry in failed:
            stats.add_row(entry, "failed")
        self.writer.commit(
            task.shard,
            kept_table,
            rejected_table,
            failed=[e["prompt_id"] for e in failed],
            config_hash=self.spec.config_hash,
            extra={"stats": stats.to_dict(), "worker": self.spec.worker_name},
        )
        return ShardReceipt(
            shard=task.shard,
            kept=kept_table.num_rows,
            rejected=rejected_table.num_rows,
            failed=[(e["prompt_id"], str(e.get("error") or "")) for e in failed],
            stats=stats.to_dict(),
            worker=self.spec.worker_name,
        )


def _remove_shard_journals(run_dir: str, shard: int) -> None:
    """The shard is committed: its journal files (this attempt's and any dead one's) go."""
    for path in journal_dir(run_dir).glob(f"s{shard:05d}-*.jsonl"):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
