"""Invariants 1 and 3 under real process kills: exactly one row per prompt, stable toolsets."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runner.helpers import (
    job_dict,
    rows,
    run_cli,
    start_cli,
    wait_for,
    worker_pids,
    write_job,
)
from toolset_distributions import inclusion_probabilities, load_distributions

pytestmark = pytest.mark.slow


def _all_rows(run_dir: Path) -> list[str]:
    kept, rejected = rows(run_dir), rows(run_dir, "rejected")
    return [*kept.get("prompt_id", []), *rejected.get("prompt_id", [])]


def _journal(run_dir: Path) -> dict[str, str]:
    """prompt_id -> started_at of every complete journal line."""
    found: dict[str, str] = {}
    for path in (run_dir / "journal").glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # the torn last line of a killed writer
            if entry.get("status") != "failed":
                found.setdefault(entry["prompt_id"], entry["started_at"])
    return found


def _markers(run_dir: Path) -> int:
    return len(list((run_dir / "shards").glob("*.json"))) if (run_dir / "shards").exists() else 0


def test_driver_sigkill_then_resume_is_exactly_once(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    total = 120
    job = job_dict(prompts(total), tmp_path / "out", endpoint={"seed": 3, "latency_ms": 60})
    job["runner"].update(concurrency=6, batch_size=10)
    job_path = write_job(tmp_path / "job.yaml", job)
    run_dir = tmp_path / "out" / "run"
    proc = start_cli("--job", str(job_path), log=tmp_path / "first.log")
    try:
        wait_for(lambda: _markers(run_dir) >= 2 and len(_journal(run_dir)) >= 3, 120, "progress")
        journaled = _journal(run_dir)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert 0 < _markers(run_dir) < total // 10, "the kill must land mid-run"
    committed_before = set(_all_rows(run_dir))

    resumed = run_cli("--job", str(job_path), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    every = _all_rows(run_dir)
    assert sorted(every) == [f"p{i:05d}" for i in range(total)]  # once each, none missing
    assert committed_before <= set(every)
    # Episodes journaled before the crash were reused, not run again.
    final = rows(run_dir).set_index("prompt_id")
    rejected = rows(run_dir, "rejected")
    if len(rejected):
        final = final._append(rejected.set_index("prompt_id"))
    reused = [pid for pid in journaled if pid not in committed_before]
    for pid in journaled:
        assert str(final.loc[pid, "started_at"].isoformat()).startswith(journaled[pid][:23]), pid
    assert reused, "some journaled episodes were in uncommitted shards at the kill"
    assert not (run_dir / "journal").exists()


def test_worker_sigkill_mid_run_completes_exactly_once(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    total = 100
    job = job_dict(prompts(total), tmp_path / "out", endpoint={"seed": 3, "latency_ms": 60})
    job["runner"].update(num_workers=2, concurrency=4, batch_size=10)
    job_path = write_job(tmp_path / "job.yaml", job)
    run_dir = tmp_path / "out" / "run"
    proc = start_cli("--job", str(job_path), log=tmp_path / "run.log")
    try:
        wait_for(
            lambda: len(worker_pids(proc.pid)) >= 2 and _markers(run_dir) >= 1,
            120,
            "two workers at work",
        )
        victim = worker_pids(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "run.log").read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert "died on shard" in log
    assert sorted(_all_rows(run_dir)) == [f"p{i:05d}" for i in range(total)]
    assert _markers(run_dir) == total // 10


def test_toolset_assignment_does_not_depend_on_worker_count(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    dataset = prompts(40)
    results = {}
    for workers, concurrency in ((1, 2), (3, 16)):
        job = job_dict(dataset, tmp_path / f"out{workers}")
        job["runner"].update(num_workers=workers, concurrency=concurrency, batch_size=7)
        result = run_cli("--job", str(write_job(tmp_path / f"job{workers}.yaml", job)))
        assert result.returncode == 0, result.stderr[-3000:]
        run_dir = tmp_path / f"out{workers}" / "run"
        frame = rows(run_dir)
        rejected = rows(run_dir, "rejected")
        if len(rejected):
            frame = frame._append(rejected)
        results[workers] = frame.set_index("prompt_id").sort_index()
    one, three = results[1], results[3]
    assert list(one.index) == list(three.index) == [f"p{i:05d}" for i in range(40)]
    assert [list(t) for t in one.toolsets] == [list(t) for t in three.toolsets]
    assert list(one.config_hash) == list(three.config_hash)

    def calls(messages: object) -> list[tuple[str, str]]:
        return [
            (c["function"]["name"], c["function"]["arguments"])
            for m in messages  # type: ignore[attr-defined]
            if m["role"] == "assistant" and m["tool_calls"] is not None
            for c in m["tool_calls"]
        ]

    # The embedded endpoint is deterministic, so the trajectories' calls match too.
    assert [calls(m) for m in one.messages] == [calls(m) for m in three.messages]


def test_observed_toolset_frequencies_match_the_distribution(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    total = 2000
    spec = {
        "description": "skewed",
        "toolsets": {"terminal": 70, "file": 30, "todo": 8, "code_execution": 3},
    }
    job = job_dict(
        prompts(total),
        tmp_path / "out",
        endpoint={"seed": 3, "min_tool_turns": 0, "max_tool_turns": 0},
    )
    job["distributions"] = {"skewed": spec}
    job["distribution"] = "skewed"
    job["runner"].update(num_workers=2, concurrency=64, batch_size=250)
    result = run_cli("--job", str(write_job(tmp_path / "job.yaml", job)), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    frame = rows(tmp_path / "out" / "run")
    assert len(frame) == total
    expected = inclusion_probabilities(load_distributions({"skewed": spec}).get("skewed"))
    for toolset, p in expected.items():
        observed = sum(toolset in list(ts) for ts in frame.toolsets) / total
        sigma = (p * (1 - p) / total) ** 0.5
        assert abs(observed - p) <= 4.5 * sigma + 1e-9, (toolset, observed, p)
    assert all(len(ts) >= 1 for ts in frame.toolsets)
    stats = json.loads((tmp_path / "out" / "run" / "statistics.json").read_text())
    assert stats["totals"]["kept"] == total
