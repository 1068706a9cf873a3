"""End-to-end runs: output contract, reference CLI, bad rows, config errors, resume rules."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from tests.runner.helpers import ROOT, job_dict, rows, run_cli, write_job

pytestmark = pytest.mark.slow


def test_quickstart_job_produces_loadable_parquet(tmp_path: Path) -> None:
    import datasets

    result = run_cli("--job", "jobs/quickstart.yaml", "--output_dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "quickstart"
    prompts = [json.loads(line) for line in (ROOT / "jobs/data/quickstart_prompts.jsonl").open()]
    kept = rows(run_dir)
    rejected = rows(run_dir, "rejected")
    assert len(kept) + len(rejected) == len(prompts)
    assert sorted([*kept.prompt_id, *rejected.get("prompt_id", [])]) == sorted(
        p["id"] for p in prompts
    )
    ds = datasets.load_dataset(
        "parquet",
        data_files=str(run_dir / "trajectories" / "*.parquet"),
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    assert len(ds) == len(kept)
    first = ds[0]
    assert (
        first["conversations"][0]["from"] == "system"
        and "<tools>" in first["conversations"][0]["value"]
    )
    assert first["messages"][1]["role"] == "user"
    assert first["registry_fingerprint"] and first["config_hash"]
    count = duckdb.sql(
        f"SELECT count(*), count(DISTINCT prompt_id) FROM '{run_dir}/trajectories/*.parquet'"
    ).fetchall()
    assert count == [(len(kept), len(kept))]
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["totals"]["prompts"] == len(prompts)
    assert "output:" in result.stdout and "tool" in result.stdout
    assert (run_dir / "config.yaml").exists() and not (run_dir / "journal").exists()


def test_reference_command_line_works_unchanged(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    dataset = prompts(12)
    result = run_cli(
        f"--dataset_file={dataset}",
        "--batch_size=5",
        "--run_name=ref_run",
        "--distribution=terminal_only",
        "--model=hermes-embedded",
        "--base_url=embedded",
        "--max_turns=3",
        "--num-workers",
        "1",
        "--max_samples=9",
        "--reasoning_disabled",
        "--verbose=false",
        "--output_dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    kept, rejected = rows(tmp_path / "ref_run"), rows(tmp_path / "ref_run", "rejected")
    every = [*kept.prompt_id, *rejected.prompt_id]
    assert sorted(every) == [f"p{i:05d}" for i in range(9)]
    assert set(rejected.reject_reason) <= {"partial:max_turns"}
    assert all(list(ts) == ["file", "terminal"] for ts in [*kept.toolsets, *rejected.toolsets])
    assert len(list((tmp_path / "ref_run" / "trajectories").glob("*.parquet"))) == 2
    config = (tmp_path / "ref_run" / "config.yaml").read_text()
    assert "reasoning_effort: none" in config and "max_turns: 3" in config


def test_bad_rows_are_reported_and_skipped(tmp_path: Path) -> None:
    dataset = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps({"id": "a", "prompt": "first good prompt"}),
        "{not json",
        json.dumps({"id": "b", "prompt": ""}),
        json.dumps({"id": "c", "prompt": 42}),
        json.dumps({"id": "a", "prompt": "duplicate id"}),
        json.dumps({"id": "d", "prompt": "second good prompt", "topic": "x"}),
    ]
    dataset.write_text("\n".join(lines) + "\n")
    job = write_job(tmp_path / "job.yaml", job_dict(dataset, tmp_path / "out"))
    result = run_cli("--job", str(job))
    assert result.returncode == 0, result.stderr[-3000:]
    kept = rows(tmp_path / "out" / "run")
    assert sorted(kept.prompt_id) == ["a", "d"]
    assert json.loads(kept.set_index("prompt_id").loc["d", "metadata"]) == {"topic": "x"}
    stats = json.loads((tmp_path / "out" / "run" / "statistics.json").read_text())
    assert stats["bad_rows"]["count"] == 4
    reported = {(b["line"], b["reason"].split(":")[0]) for b in stats["bad_rows"]["rows"]}
    assert {line for line, _ in reported} == {2, 3, 4, 5}
    assert "line 2" in result.stderr and "skipping bad dataset row" in result.stderr


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda j: j["episode"].update(max_turnz=3), "episode.max_turnz (line"),
        (lambda j: j.update(distribution="nope"), "nope"),
        (lambda j: j["dataset"].update(path="/nonexistent/prompts.jsonl"), "does not exist"),
        (lambda j: j["endpoint"].update(latency="5"), "unknown endpoint option"),
        (lambda j: j["runner"].update(batch_size=0), "runner.batch_size"),
        (lambda j: j.update(tools={"web": {"api_key": "sk-123"}}), "secrets do not belong"),
    ],
)
def test_config_errors_exit_2_and_write_nothing(
    tmp_path: Path, prompts: Callable[[int], Path], mutate: Callable[[dict], None], expected: str
) -> None:
    job = job_dict(prompts(3), tmp_path / "out")
    mutate(job)
    result = run_cli("--job", str(write_job(tmp_path / "job.yaml", job)))
    assert result.returncode == 2, result.stderr[-3000:]
    assert expected in result.stderr
    assert not (tmp_path / "out" / "run").exists()


def test_reference_mode_requires_its_flags(tmp_path: Path) -> None:
    result = run_cli("--run_name", "x", "--output_dir", str(tmp_path))
    assert result.returncode == 2
    assert "--dataset_file, --batch_size required" in result.stderr
    assert not (tmp_path / "x").exists()


def test_existing_run_refuses_without_resume_and_on_changed_config(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    dataset = prompts(6)
    job_path = write_job(tmp_path / "job.yaml", job_dict(dataset, tmp_path / "out"))
    assert run_cli("--job", str(job_path)).returncode == 0
    before = sorted((tmp_path / "out" / "run" / "trajectories").iterdir())

    again = run_cli("--job", str(job_path))
    assert again.returncode == 2 and "pass --resume" in again.stderr

    changed = run_cli("--job", str(job_path), "--resume", "--set", "episode.max_turns=2")
    assert changed.returncode == 2
    assert "episode.max_turns: 4 -> 2" in changed.stderr and "--force" in changed.stderr
    assert sorted((tmp_path / "out" / "run" / "trajectories").iterdir()) == before

    # Worker count and concurrency are not part of the config identity.
    same = run_cli("--job", str(job_path), "--resume", "--num_workers", "2", "--concurrency", "3")
    assert same.returncode == 0, same.stderr[-2000:]
    assert len(rows(tmp_path / "out" / "run")) == 6

    forced = run_cli("--job", str(job_path), "--resume", "--force", "--set", "episode.max_turns=2")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert len(rows(tmp_path / "out" / "run")) == 6  # nothing left to do; nothing duplicated


def test_unreachable_endpoint_fails_prompts_then_resume_completes(
    tmp_path: Path, prompts: Callable[[int], Path]
) -> None:
    dataset = prompts(8)
    job = job_dict(dataset, tmp_path / "out")
    # The outage gate would wait for the endpoint for max_outage_s before failing them.
    job["model"].update(base_url="http://127.0.0.1:9/v1", max_retries=1, max_outage_s=2)
    job.pop("endpoint")
    job_path = write_job(tmp_path / "job.yaml", job)
    failed = run_cli("--job", str(job_path))
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "8 prompt(s) failed for infrastructure reasons" in failed.stderr
    stats = json.loads((tmp_path / "out" / "run" / "statistics.json").read_text())
    assert stats["totals"]["failed"] == 8
    assert len(rows(tmp_path / "out" / "run")) == 0

    # The endpoint comes back (here: the embedded one). base_url is part of the config
    # identity, so the switch needs --force; the failed prompts are retried once each.
    job["model"]["base_url"] = "embedded"
    job["endpoint"] = {"seed": 3}
    write_job(job_path, job)
    resumed = run_cli("--job", str(job_path), "--resume", "--force")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    kept = rows(tmp_path / "out" / "run")
    assert sorted(kept.prompt_id) == [f"p{i:05d}" for i in range(8)]
    stats = json.loads((tmp_path / "out" / "run" / "statistics.json").read_text())
    assert stats["totals"]["failed"] == 0 and stats["totals"]["kept"] == 8
    shutil.rmtree(tmp_path / "out")
