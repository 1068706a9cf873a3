"""Helpers for end-to-end runner tests: real subprocesses, real Ray, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]


def write_prompts(path: Path, count: int, *, start: int = 0) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(start, start + count):
            f.write(
                json.dumps(
                    {"id": f"p{i:05d}", "prompt": f"Task {i}: write notes{i}.txt and show it"}
                )
                + "\n"
            )
    return path


def job_dict(dataset: Path, out: Path, **sections: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "run_name": "run",
        "output_dir": str(out),
        "seed": 11,
        "dataset": {"path": str(dataset)},
        "model": {
            "name": "hermes-embedded",
            "base_url": "embedded",
            "max_retries": 2,
            "backoff_base_s": 0.05,
            "backoff_max_s": 0.2,
        },
        "episode": {"max_turns": 4},
        "distribution": "coding_mix",
        "distributions": {
            "coding_mix": {
                "description": "test mix",
                "toolsets": {"terminal": 60, "file": 60, "todo": 30},
            }
        },
        "runner": {"num_workers": 1, "concurrency": 8, "batch_size": 10, "progress": False},
        "endpoint": {"seed": 3},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(job.get(key), dict):
            job[key] = {**job[key], **value}
        else:
            job[key] = value
    return job


def write_job(path: Path, job: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    return path


def run_cli(
    *argv: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "batch_runner.py"), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start_cli(*argv: str, log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    return subprocess.Popen(
        [sys.executable, str(ROOT / "batch_runner.py"), *argv],
        cwd=ROOT,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def rows(run_dir: Path, kind: str = "trajectories") -> pd.DataFrame:
    files = sorted((run_dir / kind).glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = 0
    current: int | None = pid
    while current and current > 1 and seen < 64:
        if current == ancestor:
            return True
        current = _parent(current)
        seen += 1
    return False


def worker_pids(driver_pid: int) -> list[int]:
    """PIDs of live EpisodeWorker actor processes started by the driver ``driver_pid``
    (a local Ray cluster's processes descend from its driver; other runs' do not)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"ray::EpisodeWorker" in cmdline and _descends_from(int(entry.name), driver_pid):
            pids.append(int(entry.name))
    return pids
