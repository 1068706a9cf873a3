"""Process and system faults against real runs: endpoint outages, SIGKILL of workers and
driver at random points, SIGINT/SIGTERM, a full disk, two runs on one directory.

After each, a run (or its ``--resume``) must end with exactly one row per prompt, every
Parquet file readable, and no staging or journal files left (invariants 1 and 2).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.faults.conftest import EndpointProcess
from tests.runner.helpers import job_dict, run_cli, start_cli, wait_for, worker_pids, write_job

pytestmark = pytest.mark.slow

OUTPUT_DIRS = ("trajectories", "rejected", "shards")


def _markers(run_dir: Path) -> int:
    shards = run_dir / "shards"
    return len(list(shards.glob("*.json"))) if shards.is_dir() else 0


def _ids(run_dir: Path) -> list[str]:
    """prompt_ids of every row; reading each file also proves none is torn."""
    ids: list[str] = []
    for kind in ("trajectories", "rejected"):
        for path in sorted((run_dir / kind).glob("*.parquet")):
            ids += pq.read_table(path, columns=["prompt_id"]).column("prompt_id").to_pylist()
    return ids


def _assert_complete(run_dir: Path, total: int, context: str = "") -> None:
    ids = _ids(run_dir)
    assert len(ids) == len(set(ids)), f"duplicate rows {context}"
    assert sorted(ids) == [f"p{i:05d}" for i in range(total)], f"missing rows {context}"
    hidden = [p for d in OUTPUT_DIRS for p in (run_dir / d).iterdir() if p.name[0] == "."]
    hidden += [p for p in run_dir.iterdir() if p.name[0] == "." and p.name != ".lock"]
    leftovers = [str(p.relative_to(run_dir)) for p in hidden]
    assert not leftovers, f"staging files left: {leftovers} {context}"
    assert not (run_dir / "journal").exists(), f"journal left behind {context}"
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["totals"]["prompts"] == total and stats["failed"]["count"] == 0, context


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _outage_job(
    dataset: Path, out: Path, endpoint: EndpointProcess, **model: Any
) -> dict[str, Any]:
    job = job_dict(dataset, out)
    job.pop("endpoint")
    job["model"].update(
        base_url=endpoint.base_url,
        max_retries=2,  # without the outage gate, an 8 s outage would fail prompts
        request_timeout_s=5,
        outage_failure_threshold=3,
        outage_probe_interval_s=0.5,
        **model,
    )
    job["runner"].update(num_workers=2, concurrency=4, batch_size=10)
    return job


def test_outage_pauses_requests_until_the_endpoint_returns(
    tmp_path: Path,
    prompts: Callable[[int], Path],
    endpoint_process: Callable[..., EndpointProcess],
) -> None:
    total = 150
    endpoint = endpoint_process("--latency-ms", "20")
    job = _outage_job(prompts(total), tmp_path / "out", endpoint, max_outage_s=120)
    run_dir = tmp_path / "out" / "run"
    log = tmp_path / "run.log"
    proc = start_cli("--job", str(write_job(tmp_path / "job.yaml", job)), log=log)
    try:
        wait_for(lambda: _markers(run_dir) >= 3 or proc.poll() is not None, 120, "3 shards")
        endpoint.kill()
        down = time.monotonic()
        at_kill = _markers(run_dir)
        time.sleep(8)
        assert proc.poll() is None, "the job must wait for the endpoint, not finish or fail"
        endpoint.start()
        outage_s = time.monotonic() - down
        code = proc.wait(timeout=180)
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert 3 <= at_kill < total // 10, "the outage must hit mid-run"
    assert code == 0, text[-3000:]
    assert "pausing requests" in text and "endpoint is back" in text
    _assert_complete(run_dir, total)
    stats = json.loads((run_dir / "statistics.json").read_text())
    # Requests burned while down: those in flight (2 workers x 4 episodes x 3 attempts at
    # most), then one probe per worker every 0.5 s; not retries of every waiting prompt.
    burned = sum(stats["retried_request_errors"].values())
    assert 0 < burned <= 2 * 4 * 3 + 2 * (outage_s / 0.5 + 2), (outage_s, stats)


def test_outage_beyond_max_outage_fails_prompts_then_resume_completes(
    tmp_path: Path,
    prompts: Callable[[int], Path],
    endpoint_process: Callable[..., EndpointProcess],
) -> None:
    total = 150
    endpoint = endpoint_process("--latency-ms", "20")
    job = _outage_job(prompts(total), tmp_path / "out", endpoint, max_outage_s=4)
    job_path = write_job(tmp_path / "job.yaml", job)
    run_dir = tmp_path / "out" / "run"
    log = tmp_path / "run.log"
    proc = start_cli("--job", str(job_path), log=log)
    try:
        wait_for(lambda: _markers(run_dir) >= 3 or proc.poll() is not None, 120, "3 shards")
        endpoint.kill()
        code = proc.wait(timeout=180)
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert "pausing requests" in text and "failed for infrastructure reasons" in text
    assert "--resume" in text
    done = _ids(run_dir)
    stats = json.loads((run_dir / "statistics.json").read_text())
    failed = {f["prompt_id"] for f in stats["failed_prompts_this_attempt"]}
    assert failed, "the prompts left when the endpoint stayed down are listed as failed"
    assert sorted([*done, *failed]) == [f"p{i:05d}" for i in range(total)]
    assert stats["failed"]["count"] == len(failed)
    assert stats["failed"]["by_kind"] == {"transient": len(failed)}
    assert any("max_outage_s=4" in f["error"] for f in stats["failed_prompts_this_attempt"])

    endpoint.start()  # the same port: the resumed job's config is unchanged
    resumed = run_cli("--job", str(job_path), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_complete(run_dir, total)
    assert set(done) <= set(_ids(run_dir))


def _working_or_exited(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None or bool(worker_pids(proc.pid))


def _kill_loop(
    job_path: Path, logs: Path, rng: random.Random
) -> list[tuple[str, float, int | None]]:
    """Start (then resume) the job and SIGKILL a random worker or the driver after a
    random delay, six times; returns (what was killed, delay, exit code if it exited)."""
    history: list[tuple[str, float, int | None]] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        for attempt in range(6):
            if proc is None or proc.poll() is not None:
                resume = ("--resume",) if attempt else ()
                proc = start_cli("--job", str(job_path), *resume, log=logs / f"{attempt}.log")
            # Kill points are measured from when the workers exist, so they land in the
            # work (episodes, journal appends, commits) rather than in Ray's start-up.
            wait_for(partial(_working_or_exited, proc), 120, "workers")
            delay = rng.uniform(0.5, 3.0)
            time.sleep(delay)
            if proc.poll() is not None:
                history.append(("nothing: it had exited", delay, proc.returncode))
                if proc.returncode == 0:
                    break
                continue
            workers = sorted(worker_pids(proc.pid))
            if workers and rng.random() < 0.5:
                os.kill(rng.choice(workers), signal.SIGKILL)
                history.append(("worker", delay, None))
            else:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                history.append(("driver", delay, None))
        if proc is not None and proc.poll() is None:
            proc.wait(timeout=300)  # after a worker kill the driver carries on
            history.append(("nothing: it finished", 0.0, proc.returncode))
    finally:
        if proc is not None:
            _stop(proc)
    return history


def test_random_sigkills_of_workers_and_driver_then_resume_is_exactly_once(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    seed = int(os.environ.get("HERMES_FAULT_SEED", random.randrange(2**32)))
    print(f"kill-point seed: {seed} (rerun with HERMES_FAULT_SEED={seed})")
    total = 200
    job = job_dict(prompts(total), tmp_path / "out", endpoint={"seed": 3, "latency_ms": 60})
    job["runner"].update(num_workers=2, concurrency=3, batch_size=10)
    job_path = write_job(tmp_path / "job.yaml", job)
    run_dir = tmp_path / "out" / "run"
    logs = tmp_path / "logs"
    logs.mkdir()
    history = _kill_loop(job_path, logs, random.Random(seed))
    context = f"(seed {seed}, kills {history})"
    print(context)
    assert any(what in ("worker", "driver") for what, _, _ in history), context

    final = run_cli("--job", str(job_path), "--resume")
    assert final.returncode == 0, f"{context}\n{final.stderr[-3000:]}"
    _assert_complete(run_dir, total, context)
    assert _markers(run_dir) == total // 10, context


def _interrupt_mid_run(job_path: Path, run_dir: Path, log: Path, signum: int, *resume: str) -> None:
    """Run until two more shards are committed, send ``signum`` to the driver, and check
    that it stops within seconds with code 130 and says how to resume."""
    target = _markers(run_dir) + 2
    proc = start_cli("--job", str(job_path), *resume, log=log)
    try:
        wait_for(lambda: _markers(run_dir) >= target or proc.poll() is not None, 120, "shards")
        os.kill(proc.pid, signum)
        sent = time.monotonic()
        code = proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert code == 130, text[-3000:]
    assert took < 10, f"took {took:.1f} s to stop"
    assert "interrupted" in text and "--resume" in text and "Traceback" not in text
    assert not list(run_dir.glob("*/.*.tmp-*")), "staging files left"


def test_sigint_and_sigterm_stop_within_seconds_and_resume_completes(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    total = 100
    job = job_dict(prompts(total), tmp_path / "out", endpoint={"seed": 3, "latency_ms": 60})
    job["runner"].update(concurrency=4, batch_size=10)
    job_path = write_job(tmp_path / "job.yaml", job)
    run_dir = tmp_path / "out" / "run"
    _interrupt_mid_run(job_path, run_dir, tmp_path / "int.log", signal.SIGINT)
    after_int = _ids(run_dir)
    _interrupt_mid_run(job_path, run_dir, tmp_path / "term.log", signal.SIGTERM, "--resume")
    after_term = _ids(run_dir)
    assert set(after_int) < set(after_term) and len(after_term) < total, "signals land mid-run"

    resumed = run_cli("--job", str(job_path), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_complete(run_dir, total)


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")


def _write_blob_prompts(path: Path, count: int) -> Path:
    """Prompts carrying 20 kB of incompressible metadata each, to fill a small disk."""
    rng = random.Random(5)
    with path.open("w", encoding="utf-8") as f:
        for i in range(count):
            blob = rng.randbytes(15_000).hex()[:20_000]
            row = {"id": f"p{i:05d}", "prompt": f"Task {i}: write notes{i}.txt", "blob": blob}
            f.write(json.dumps(row) + "\n")
    return path


def test_disk_full_is_reported_then_resume_completes(tmp_path: Path) -> None:
    total = 120
    dataset = _write_blob_prompts(tmp_path / "prompts.jsonl", total)  # 2.4 MB
    # Older than the reader's 2 s "racy" window, so its validated copy is cached once and
    # a resume on the still-full disk gets past reading the dataset.
    os.utime(dataset, (time.time() - 60, time.time() - 60))
    mount = tmp_path / "disk"
    _mount_tmpfs(mount, "3m")  # room for the dataset's validated copy, not for the output
    try:
        job = job_dict(dataset, mount)
        job["runner"].update(concurrency=8, batch_size=10)
        job_path = write_job(tmp_path / "job.yaml", job)
        run_dir = mount / "run"
        full = run_cli("--job", str(job_path))
        assert full.returncode == 1, full.stderr[-3000:]
        assert "no space left" in full.stderr.lower()
        assert "--resume" in full.stderr and "Traceback" not in full.stderr
        before = _ids(run_dir)  # every committed file reads: none is torn
        assert len(before) < total

        still_full = run_cli("--job", str(job_path), "--resume")
        assert still_full.returncode == 1, still_full.stderr[-3000:]
        assert "no space left" in still_full.stderr.lower()
        assert "Traceback" not in still_full.stderr
        assert (run_dir / "run.json").exists(), "a failed resume must keep the run resumable"

        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
        resumed = run_cli("--job", str(job_path), "--resume")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        _assert_complete(run_dir, total)
        assert set(before) <= set(_ids(run_dir))
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def test_second_run_on_the_same_directory_is_refused(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    total = 60
    job = job_dict(prompts(total), tmp_path / "out", endpoint={"seed": 3, "latency_ms": 60})
    job["runner"].update(concurrency=4, batch_size=10)
    job_path = write_job(tmp_path / "job.yaml", job)
    procs = [start_cli("--job", str(job_path), log=tmp_path / f"{i}.log") for i in range(2)]
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for proc in procs:
            _stop(proc)
    logs = [(tmp_path / f"{i}.log").read_text(errors="replace") for i in range(2)]
    assert sorted(codes) == [0, 2], logs
    refused = logs[codes.index(2)]
    assert "is in use by pid" in refused and "Traceback" not in refused
    _assert_complete(tmp_path / "out" / "run", total)
