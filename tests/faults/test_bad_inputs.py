"""Bad input (invariant 4): malformed datasets and job files are reported, never crash a job.

Every job or dataset the runner cannot use at all exits with code 2, a message naming
the problem (with the job file's line for a field error), and writes nothing: the run
directory does not exist afterwards. Bad rows inside a usable dataset are skipped and
counted while the job goes on; a 5 MB prompt simply runs.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from tests.runner.helpers import job_dict, rows, run_cli, write_job, write_prompts

pytestmark = pytest.mark.slow

Job = dict[str, Any]


@dataclass(frozen=True)
class Case:
    """One unusable input: how to build it and what the error must say."""

    mutate: Callable[[Job, Path], None] | None = None
    raw: str | None = None  # the job file's text, instead of a mutated job_dict
    expected: tuple[str, ...] = ()
    line_of: str | None = None  # the error must name the line where this text is
    argv: tuple[str, ...] = ()
    dataset: Callable[[Path], Path] | None = None  # writes the dataset file to use


@dataclass
class Outcome:
    result: subprocess.CompletedProcess[str]
    job_text: str
    run_dir: Path
    case: Case = field(repr=False)


def _set(path: str, value: Any) -> Callable[[Job, Path], None]:
    def mutate(job: Job, _: Path) -> None:
        *parents, last = path.split(".")
        node = job
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return mutate


def _distribution(spec: dict[str, Any]) -> Callable[[Job, Path], None]:
    def mutate(job: Job, _: Path) -> None:
        job["distributions"] = {"custom": {"description": "bad", **spec}}
        job["distribution"] = "custom"

    return mutate


def _strict(mutate: Callable[[Job, Path], None]) -> Callable[[Job, Path], None]:
    def strict(job: Job, tmp: Path) -> None:
        mutate(job, tmp)
        job["strict_toolsets"] = True

    return strict


def _prefill(text: str) -> Callable[[Job, Path], None]:
    def mutate(job: Job, tmp: Path) -> None:
        path = tmp / "prefill.json"
        path.write_text(text, encoding="utf-8")
        job["episode"]["prefill_messages_file"] = str(path)

    return mutate


def _file(name: str, content: bytes) -> Callable[[Path], Path]:
    def write(tmp: Path) -> Path:
        path = tmp / name
        path.write_bytes(content)
        return path

    return write


def _not_a_saved_dataset(tmp: Path) -> Path:
    folder = tmp / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a dataset\n")
    return folder


def _binary(tmp: Path) -> Path:
    path = tmp / "binary.jsonl"
    # Deterministic bytes that are neither UTF-8 nor JSON on any line.
    path.write_bytes(bytes((i * 37 + 128) % 256 | 0x80 for i in range(8192)))
    return path


CASES: dict[str, Case] = {
    # -- job files ------------------------------------------------------------------------
    "not_yaml": Case(raw="run_name: x\ndataset: {path: [unclosed\n", expected=("not valid YAML",)),
    "yaml_list": Case(
        raw="- run_name: x\n- dataset: {path: p.jsonl}\n",
        expected=("must hold a mapping of settings, not list",),
    ),
    "unknown_top_level_key": Case(
        mutate=_set("workers", 4), expected=("workers", "unknown setting"), line_of="workers:"
    ),
    "unknown_nested_key": Case(
        mutate=_set("model.temperture", 0.5),
        expected=("model.temperture", "unknown setting"),
        line_of="temperture:",
    ),
    "wrong_type": Case(
        mutate=_set("runner.batch_size", "ten"),
        expected=("runner.batch_size", "valid integer"),
        line_of="batch_size:",
    ),
    "negative_workers": Case(
        mutate=_set("runner.num_workers", -2),
        expected=("runner.num_workers", "greater than or equal to 1"),
        line_of="num_workers:",
    ),
    "bad_run_name": Case(
        mutate=_set("run_name", "../escape"), expected=("run_name", "pattern"), line_of="run_name:"
    ),
    "probability_over_100": Case(
        mutate=_distribution({"toolsets": {"terminal": 150}}),
        expected=("'terminal' is 150", "percentages from 0 to 100"),
    ),
    "toolsets_and_combinations": Case(
        mutate=_distribution(
            {"toolsets": {"terminal": 50}, "combinations": [{"toolsets": ["file"], "weight": 1}]}
        ),
        expected=("both `toolsets` and `combinations`",),
    ),
    "prefill_not_json": Case(
        mutate=_prefill("[{'role': 'user'"), expected=("prefill_messages_file", "readable JSON")
    ),
    "prefill_wrong_shape": Case(
        mutate=_prefill('[{"role": "wizard", "content": "hi"}]'),
        expected=("prefill_messages_file", "must be a JSON array of objects with a role"),
    ),
    "missing_dataset": Case(
        mutate=_set("dataset.path", "/nonexistent/prompts.jsonl"), expected=("does not exist",)
    ),
    "endpoint_section_without_embedded": Case(
        mutate=_set("model.base_url", "http://127.0.0.1:9/v1"),
        expected=("the endpoint: section configures the embedded endpoint", "base_url"),
    ),
    "unknown_endpoint_fault": Case(
        mutate=_set("endpoint.faults", {"http_999": 0.1}), expected=("unknown fault option",)
    ),
    "strict_toolsets_unavailable": Case(
        mutate=_strict(_distribution({"toolsets": {"terminal": 50, "moa": 50}})),
        expected=("toolset 'moa'", "unavailable", "reference_models", "strict_toolsets is set"),
    ),
    "sandbox_none_without_opt_in": Case(
        mutate=_set("sandbox.backend", "none"),
        expected=("sandbox", "allow_unsafe_none"),
        line_of="backend:",
    ),
    # -- datasets that cannot be read at all ------------------------------------------------
    "json_array_syntax_error": Case(
        dataset=_file("bad.json", b'[{"id": "a", "prompt": "one"}, {"id": "b" "prompt": "two"}]'),
        expected=("is not valid JSON", "line 1 column"),
    ),
    "csv_row_with_extra_field": Case(
        dataset=_file("ragged.csv", b"id,prompt\na,one\nb,two,surplus\nc,three\n"),
        expected=("cannot read csv dataset", "Expected 2 fields in line 3"),
    ),
    "empty_file": Case(dataset=_file("empty.jsonl", b""), expected=("is empty",)),
    "folder_not_saved_with_datasets": Case(
        dataset=_not_a_saved_dataset, expected=("neither a `Dataset` directory",)
    ),
    "binary_file_named_jsonl": Case(
        dataset=_binary, expected=("has no rows", "lines rejected", "invalid UTF-8")
    ),
    "no_prompt_column": Case(
        dataset=_file("cols.jsonl", b'{"id": "a", "question": "q"}\n'),
        expected=("column 'prompt' not found", "question"),
    ),
}


def _run_case(name: str, case: Case, root: Path) -> Outcome:
    tmp = root / name
    tmp.mkdir()
    dataset = case.dataset(tmp) if case.dataset else write_prompts(tmp / "prompts.jsonl", 3)
    job = job_dict(dataset, tmp / "out")
    if case.mutate is not None:
        case.mutate(job, tmp)
    text = case.raw if case.raw is not None else yaml.safe_dump(job, sort_keys=False)
    job_path = tmp / "job.yaml"
    job_path.write_text(text, encoding="utf-8")
    argv = case.argv if "--job" in case.argv else ("--job", str(job_path), *case.argv)
    result = run_cli(*argv, timeout=120)
    return Outcome(result=result, job_text=text, run_dir=tmp / "out" / "run", case=case)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every case, run as a real CLI process; four at a time (each is mostly start-up)."""
    root = tmp_path_factory.mktemp("bad_inputs")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run_case, name, case, root) for name, case in CASES.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_unusable_input_exits_2_names_the_problem_and_writes_nothing(
    name: str, outcomes: dict[str, Outcome]
) -> None:
    outcome = outcomes[name]
    stderr = outcome.result.stderr
    assert outcome.result.returncode == 2, stderr[-3000:]
    assert "error:" in stderr and "Traceback" not in stderr, stderr[-3000:]
    for text in outcome.case.expected:
        assert text in stderr, (text, stderr[-3000:])
    if outcome.case.line_of is not None:
        lines = outcome.job_text.splitlines()
        line = next(i for i, t in enumerate(lines, 1) if t.strip().startswith(outcome.case.line_of))
        assert f"(line {line})" in stderr, (line, stderr[-3000:])
    assert not outcome.run_dir.exists(), sorted(p.name for p in outcome.run_dir.iterdir())


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def test_bad_rows_are_skipped_and_an_enormous_prompt_runs(tmp_path: Path) -> None:
    huge = "Summarise this text. " + "lorem ipsum dolor sit amet " * 200_000  # 5.4 MB
    dataset = tmp_path / "mixed.jsonl"
    dataset.write_bytes(
        _line({"id": "a", "prompt": "write notes.txt and show it"})
        + b'{"id": "b", "prompt": "caf\xe9 au lait \xff\xfe"}\n'  # Latin-1 bytes: not UTF-8
        + _line({"id": "big", "prompt": huge})
        + _line({"id": "c", "prompt": "list the files"})
        + b'{"id": "d", "prompt": "the writer was kil'  # truncated last line, no newline
    )
    job = job_dict(dataset, tmp_path / "out", episode={"max_turns": 3})
    result = run_cli("--job", str(write_job(tmp_path / "job.yaml", job)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "line 2" in result.stderr and "invalid UTF-8" in result.stderr
    assert "line 5" in result.stderr and "invalid JSON" in result.stderr
    run_dir = tmp_path / "out" / "run"
    kept, rejected = rows(run_dir), rows(run_dir, "rejected")
    every = sorted([*kept.prompt_id, *rejected.get("prompt_id", [])])
    assert every == ["a", "big", "c"]
    big = (kept if "big" in set(kept.prompt_id) else rejected).set_index("prompt_id").loc["big"]
    assert big["prompt"] == huge
    assert big["messages"][0]["content"] == huge or big["messages"][1]["content"] == huge
    assert big["usage"]["prompt_tokens"] > 1_000_000
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["bad_rows"]["count"] == 2
    reasons = {b["line"]: b["reason"] for b in stats["bad_rows"]["rows"]}
    assert sorted(reasons) == [2, 5]
    assert reasons[2].startswith("invalid UTF-8") and reasons[5].startswith("invalid JSON")
    assert stats["totals"]["prompts"] == 3 and stats["failed"]["count"] == 0
    for path in (run_dir / "trajectories").glob("*.parquet"):
        pq.read_table(path)

    # A resume with a changed config is refused, the differences listed, nothing touched.
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*.parquet")}
    changed = run_cli(
        "--job", str(tmp_path / "job.yaml"), "--resume", "--seed", "12",
        "--set", "episode.max_turns=5",
    )  # fmt: skip
    assert changed.returncode == 2, changed.stderr[-3000:]
    assert "refusing to resume" in changed.stderr
    assert "seed: 11 -> 12" in changed.stderr and "episode.max_turns: 3 -> 5" in changed.stderr
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*.parquet")} == before
