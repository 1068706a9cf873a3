"""hermes.dataset: every input format, bad rows, ordering, resume, fingerprints, caching."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hermes.dataset import BadRow, DatasetSpec, PromptRow, PromptSource
from hermes.errors import DatasetError

ROOT = Path(__file__).resolve().parent.parent


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def open_source(tmp_path: Path, path: Path | str, **spec: Any) -> PromptSource:
    return PromptSource(DatasetSpec(path=str(path), **spec), cache_dir=tmp_path / "cache")


def good(source: PromptSource, start: int = 0) -> list[PromptRow]:
    return [row for row in source.iter_rows(start) if isinstance(row, PromptRow)]


def make_old(path: Path) -> None:
    """Backdate a file past the racy window so stat-keyed results are cached."""
    past = time.time() - 3600
    os.utime(path, (past, past))


# -- one test per format ----------------------------------------------------------------


def test_jsonl_rows_ids_and_metadata(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "data.jsonl",
        [
            {"id": 7, "prompt": "What is 2+2?", "level": 1, "tags": ["math"]},
            {"id": "b", "prompt": "Name a colour.", "extra": {"x": None}},
        ],
    )
    source = open_source(tmp_path, path)
    assert source.format == "jsonl"
    assert len(source) == 2
    assert list(source.iter_rows()) == [
        PromptRow(
            prompt_id="7",
            prompt_index=0,
            prompt="What is 2+2?",
            metadata='{"level": 1, "tags": ["math"]}',
        ),
        PromptRow(
            prompt_id="b",
            prompt_index=1,
            prompt="Name a colour.",
            metadata='{"extra": {"x": null}}',
        ),
    ]
    assert source.bad_rows_before_load == []


def test_json_array_derives_ids_from_row_index(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    items = [{"prompt": "first", "source": "a"}, 42, {"prompt": "third", "source": "b"}]
    path.write_text(json.dumps(items, indent=2), encoding="utf-8")
    source = open_source(tmp_path, path)
    assert source.format == "json"
    assert source.bad_rows_before_load == [BadRow(1, None, "not a JSON object (a JSON number)")]
    assert [(r.prompt_id, r.prompt_index, r.prompt, r.metadata) for r in good(source)] == [
        ("row-000000000", 0, "first", '{"source": "a"}'),
        ("row-000000002", 2, "third", '{"source": "b"}'),
    ]


def test_json_file_of_json_lines_is_read_as_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "data.json", [{"prompt": "a"}, {"prompt": "b"}])
    source = open_source(tmp_path, path)
    assert source.format == "jsonl"
    assert [r.prompt for r in good(source)] == ["a", "b"]


def test_parquet_typed_columns_and_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    table = pa.table(
        {
            "id": pa.array([10, 11, 10, 12], pa.int64()),
            "prompt": ["alpha", None, "gamma", "   "],
            "when": pa.array([dt.datetime(2024, 5, 1, 12, 30)] * 4, pa.timestamp("s")),
            "blob": pa.array([b"\x00\x01"] * 4, pa.binary()),
        }
    )
    pq.write_table(table, path)
    rows = list(open_source(tmp_path, path).iter_rows())
    assert rows[0] == PromptRow(
        prompt_id="10",
        prompt_index=0,
        prompt="alpha",
        metadata='{"blob": "AAE=", "when": "2024-05-01T12:30:00"}',
    )
    assert rows[1:] == [
        BadRow(1, None, "prompt is null"),
        BadRow(2, None, "duplicate id '10': first used by row 0 (kept)"),
        BadRow(3, None, "prompt is empty or whitespace-only"),
    ]


def test_csv_values_stay_strings(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text(
        'id,prompt,score\n007,"multi\nline question",1.50\n008,,2\n009,plain,\n',
        encoding="utf-8",
    )
    rows = list(open_source(tmp_path, path).iter_rows())
    assert rows == [
        PromptRow(
            prompt_id="007",
            prompt_index=0,
            prompt="multi\nline question",
            metadata='{"score": "1.50"}',
        ),
        BadRow(1, None, "prompt is null"),
        PromptRow(prompt_id="009", prompt_index=2, prompt="plain", metadata='{"score": null}'),
    ]


def test_save_to_disk_dataset_and_dataset_dict(tmp_path: Path) -> None:
    single = tmp_path / "single"
    datasets.Dataset.from_dict({"prompt": ["p0", "p1"], "n": [1, 2]}).save_to_disk(str(single))
    source = open_source(tmp_path, single)
    assert source.format == "disk"
    assert [(r.prompt_id, r.prompt, r.metadata) for r in good(source)] == [
        ("row-000000000", "p0", '{"n": 1}'),
        ("row-000000001", "p1", '{"n": 2}'),
    ]
    both = tmp_path / "dict"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"prompt": ["t"]}),
            "test": datasets.Dataset.from_dict({"prompt": ["x", "y"]}),
        }
    ).save_to_disk(str(both))
    assert [r.prompt for r in good(open_source(tmp_path, both, split="test"))] == ["x", "y"]
    with pytest.raises(DatasetError, match=r"split 'dev' not found .*splits are: train, test"):
        open_source(tmp_path, both, split="dev")


# -- bad rows -----------------------------------------------------------------------------


def test_every_kind_of_bad_jsonl_line_is_reported_and_skipped(tmp_path: Path) -> None:
    lines = [
        b'{"id": "a", "prompt": "good one"}',  # line 1, index 0
        b"",  # blank lines are skipped and are not rows
        b'{"id": "b", "prompt": "unterminated',  # line 3, index 1
        b'["not", "an", "object"]',  # 4, 2
        b'{"id": "c", "prompt": "caf\xe9"}',  # 5, 3: Latin-1, not UTF-8
        b'{"id": "d", "prompt": "\\ud800 lone"}',  # 6, 4
        b'{"id": "e", "question": "no prompt"}',  # 7, 5
        b'{"id": "f", "prompt": ""}',  # 8, 6
        b'{"id": "g", "prompt": " \\n\\t"}',  # 9, 7
        b'{"id": "h", "prompt": 12}',  # 10, 8
        b'{"id": "i", "prompt": null}',  # 11, 9
        b'{"id": "a", "prompt": "same id as line 1"}',  # 12, 10
        b'{"prompt": "no id although the column exists"}',  # 13, 11
        b'{"x": ' + b"[" * 100_000 + b"}",  # 14, 12
        b"   ",
        b'{"id": "j", "prompt": "good two"}',  # 16, 13
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    source = open_source(tmp_path, path)
    assert source.bad_rows_before_load_count == 5
    assert [(b.index, b.line) for b in source.bad_rows_before_load] == [
        (1, 3),
        (2, 4),
        (3, 5),
        (4, 6),
        (12, 14),
    ]
    reasons = [b.reason for b in source.bad_rows_before_load]
    assert reasons[0] == "invalid JSON at column 23: Unterminated string starting at"
    assert reasons[1] == "not a JSON object (a JSON array)"
    assert reasons[2].startswith("invalid UTF-8")
    assert "surrogate" in reasons[3]
    assert reasons[4] == "invalid JSON: nested too deeply"
    assert len(source) == 9  # rejected lines are not positions
    assert list(source.iter_rows()) == [
        PromptRow(prompt_id="a", prompt_index=0, prompt="good one", metadata="{}"),
        BadRow(5, 7, "prompt column 'prompt' is missing"),
        BadRow(6, 8, "prompt is empty or whitespace-only"),
        BadRow(7, 9, "prompt is empty or whitespace-only"),
        BadRow(8, 10, "prompt is a number, not a string"),
        BadRow(9, 11, "prompt is null"),
        BadRow(10, 12, "duplicate id 'a': first used by row 0 (kept)"),
        BadRow(11, 13, "id column 'id' is missing or empty"),
        PromptRow(prompt_id="j", prompt_index=13, prompt="good two", metadata="{}"),
    ]


def test_only_bad_lines_is_an_error_naming_the_first(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("nope\n[1]\n", encoding="utf-8")
    with pytest.raises(
        DatasetError,
        match=r"has no rows \(2 lines rejected; first: line 1: invalid JSON at column 1",
    ):
        open_source(tmp_path, path)


def test_mixed_type_columns_across_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "a", "level": 1, "meta": {"k": [1, 2]}},
            {"prompt": "b", "level": "hard", "meta": "text"},
            {"prompt": "c", "level": None, "meta": [True, 1.5]},
            {"prompt": "d"},
        ],
    )
    assert [json.loads(r.metadata) for r in good(open_source(tmp_path, path))] == [
        {"level": 1, "meta": {"k": [1, 2]}},
        {"level": "hard", "meta": "text"},
        {"level": None, "meta": [True, 1.5]},
        {},
    ]


def test_identical_prompts_at_different_rows_are_different_prompts(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "same.jsonl", [{"prompt": "hi"}] * 3)
    assert [r.prompt_id for r in good(open_source(tmp_path, path))] == [
        "row-000000000",
        "row-000000001",
        "row-000000002",
    ]


# -- order, sampling, resume ----------------------------------------------------------------


@pytest.fixture
def numbered(tmp_path: Path) -> Path:
    """2,500 rows: more than one read batch, so batch edges are exercised."""
    return write_jsonl(tmp_path / "n.jsonl", [{"prompt": f"p{i}"} for i in range(2500)])


def indices(source: PromptSource, start: int = 0) -> list[int]:
    return [r.prompt_index for r in good(source, start)]


def test_max_samples_takes_the_first_rows(tmp_path: Path, numbered: Path) -> None:
    source = open_source(tmp_path, numbered, max_samples=5)
    assert len(source) == 5
    assert indices(source) == [0, 1, 2, 3, 4]


def test_seeded_shuffle_is_deterministic(tmp_path: Path, numbered: Path) -> None:
    first = indices(open_source(tmp_path, numbered, shuffle=True, seed=1))
    again = indices(open_source(tmp_path, numbered, shuffle=True, seed=1))
    other = indices(open_source(tmp_path, numbered, shuffle=True, seed=2))
    assert first == again
    assert first != other
    assert sorted(first) == list(range(2500)) != first


def test_shuffle_with_max_samples_picks_a_subset(tmp_path: Path, numbered: Path) -> None:
    full = indices(open_source(tmp_path, numbered, shuffle=True, seed=3))
    sample = open_source(tmp_path, numbered, shuffle=True, seed=3, max_samples=100)
    picked = indices(sample)
    assert len(sample) == 100
    assert picked == full[:100]
    assert picked != list(range(100))
    assert [r.prompt for r in good(sample)] == [f"p{i}" for i in picked]


@pytest.mark.parametrize("shuffle", [False, True])
def test_iter_rows_start_equals_the_tail(tmp_path: Path, numbered: Path, shuffle: bool) -> None:
    source = open_source(tmp_path, numbered, shuffle=shuffle, seed=5)
    full = list(source.iter_rows())
    for start in (0, 1, 1023, 1024, 1500, 2499, 2500, 4000):
        assert list(source.iter_rows(start)) == full[start:]
    assert list(source.iter_rows(1000, 1100)) == full[1000:1100]


def test_bad_rows_keep_their_positions(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}, {"prompt": ""}, {"prompt": "c"}])
    rows = list(open_source(tmp_path, path).iter_rows(1))
    assert rows == [
        BadRow(1, 2, "prompt is empty or whitespace-only"),
        PromptRow(prompt_id="row-000000002", prompt_index=2, prompt="c", metadata="{}"),
    ]


# -- fingerprint and caching ---------------------------------------------------------------


def test_fingerprint_tracks_content_and_spec_only(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", [{"prompt": "a", "alt": "x"}, {"prompt": "b"}])

    def fingerprint(**spec: Any) -> str:
        return open_source(tmp_path, path, **spec).fingerprint()

    base = fingerprint(shuffle=True, seed=1)
    assert fingerprint(shuffle=True, seed=1) == base
    make_old(path)  # a touched file with the same bytes is the same dataset
    assert fingerprint(shuffle=True, seed=1) == base
    assert fingerprint(shuffle=True, seed=2) != base
    assert fingerprint(shuffle=True, seed=1, prompt_column="alt") != base
    assert fingerprint(shuffle=True, seed=1, max_samples=1) != base
    write_jsonl(path, [{"prompt": "a", "alt": "x"}, {"prompt": "B"}])
    assert fingerprint(shuffle=True, seed=1) != base


def test_fingerprint_of_parquet_and_directories(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"]}), path)
    base = open_source(tmp_path, path).fingerprint()
    make_old(path)
    assert open_source(tmp_path, path).fingerprint() == base
    assert open_source(tmp_path, path).fingerprint() == base  # now from the digest memo
    pq.write_table(pa.table({"prompt": ["a", "c"]}), path)
    assert open_source(tmp_path, path).fingerprint() != base
    folder = tmp_path / "disk"
    datasets.Dataset.from_dict({"prompt": ["a"]}).save_to_disk(str(folder))
    disk = open_source(tmp_path, folder).fingerprint()
    assert open_source(tmp_path, folder).fingerprint() == disk != base


def test_validated_jsonl_is_cached_once_the_file_is_settled(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": "a"}\nbroken\n', encoding="utf-8")
    cache = tmp_path / "cache" / "hermes"
    first = open_source(tmp_path, path)
    assert list(cache.glob("records-*.json")) == []  # just written: may still change
    make_old(path)
    open_source(tmp_path, path)
    reports = list(cache.glob("records-*.json"))
    assert len(reports) == 1
    reused = open_source(tmp_path, path)
    assert reused.bad_rows_before_load == first.bad_rows_before_load
    assert list(reused.iter_rows()) == list(first.iter_rows())
    assert reused.fingerprint() == first.fingerprint()


# -- errors -------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"^dataset file data/x\.jsonl does not exist$"):
        open_source(tmp_path, "data/x.jsonl")


def test_unknown_format_and_extension(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"unknown dataset format 'xml'; use one of: auto"):
        DatasetSpec(path="x.xml", format="xml")
    path = tmp_path / "notes.txt"
    path.write_text("hello\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"from its extension '\.txt'; set dataset\.format"):
        open_source(tmp_path, path)


def test_missing_prompt_column_lists_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("question,answer\nwhy?,because\n", encoding="utf-8")
    expected = (
        f"column 'prompt' not found in {path}; columns are: question, answer; "
        "set dataset.prompt_column"
    )
    with pytest.raises(DatasetError) as caught:
        open_source(tmp_path, path)
    assert str(caught.value) == expected
    jsonl = write_jsonl(tmp_path / "q.jsonl", [{"question": "a"}, {"answer": "b"}])
    with pytest.raises(DatasetError, match=r"columns are: question, answer; set dataset\."):
        open_source(tmp_path, jsonl)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "", r"dataset file .*empty\.jsonl is empty"),
        ("blank.jsonl", "\n  \n", r"has no rows \(0 lines rejected\)"),
        ("header.csv", "prompt,id\n", r"has no rows"),
        ("empty.parquet", None, r"has no rows"),
    ],
)
def test_empty_datasets(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    path = tmp_path / name
    if content is None:
        pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError, match=message):
        open_source(tmp_path, path)


def test_invalid_spec_values() -> None:
    with pytest.raises(DatasetError, match="max_samples must be at least 1"):
        DatasetSpec(path="x.jsonl", max_samples=0)
    with pytest.raises(DatasetError, match="seed must be a non-negative"):
        DatasetSpec(path="x.jsonl", seed=-1)


# -- isolation: a real process with its own HOME and no network ----------------------------

_ISOLATED = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import pyarrow as pa, pyarrow.parquet as pq
    from hermes.dataset import DatasetSpec, PromptSource
    from hermes.errors import DatasetError

    work = Path(sys.argv[1])
    (work / "d.jsonl").write_text('{"prompt": "a"}\\n', encoding="utf-8")
    (work / "d.csv").write_text("prompt\\nb\\n", encoding="utf-8")
    pq.write_table(pa.table({"prompt": ["c"]}), work / "d.parquet")
    out = {}
    for name in ("d.jsonl", "d.csv", "d.parquet"):
        source = PromptSource(DatasetSpec(path=str(work / name)), cache_dir=work / "cache")
        out[name] = [row.prompt for row in source.iter_rows()]
    try:
        PromptSource(DatasetSpec(path="some-org/not-a-dataset"), cache_dir=work / "cache")
    except DatasetError as exc:
        out["hub"] = str(exc)
    print(json.dumps(out))
    """
)


def test_cache_dir_is_used_and_home_is_untouched(tmp_path: Path) -> None:
    home, default_cache = tmp_path / "home", tmp_path / "hf-default"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HF_DATASETS_CACHE": str(default_cache),
        "HF_HUB_OFFLINE": "1",  # no network here: fail fast instead of retrying
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-c", _ISOLATED, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["d.jsonl"] == ["a"] and out["d.csv"] == ["b"] and out["d.parquet"] == ["c"]
    assert out["hub"].startswith("cannot read hub dataset 'some-org/not-a-dataset'")
    assert list(home.iterdir()) == []
    assert not default_cache.exists() or list(default_cache.iterdir()) == []
    cache = tmp_path / "cache"
    assert list((cache / "hermes").glob("records-*.arrow"))
    assert list((cache / "hf").glob("csv/*")) and list((cache / "hf").glob("parquet/*"))
