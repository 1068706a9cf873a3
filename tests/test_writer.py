"""Row schema and atomic shard commits: real Parquet files read back by datasets, pandas
and DuckDB; crashes by real SIGKILL; disk full on a real 1 MiB tmpfs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from hermes.agent import EpisodeRecord
from hermes.schema import (
    REJECTED_SCHEMA,
    ROW_SCHEMA,
    episode_row,
    failure_row,
    rows_to_table,
)
from hermes.trajectory import to_hermes_conversations
from hermes.writer import ShardWriteError, ShardWriter

ROOT = Path(__file__).resolve().parent.parent
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def make_record(i: int, *, content: str = "Listing files") -> EpisodeRecord:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"Prompt {i}: 数えて 🚀 \u00e9"},
        {
            "role": "assistant",
            "content": content,
            "reasoning": f"I should list files ({i})",
            "tool_calls": [
                {
                    "id": f"call_{i}_0",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"call_{i}_0", "name": "terminal", "content": "a\nb"},
        {"role": "assistant", "content": "Two files.", "reasoning": None, "tool_calls": []},
    ]
    return EpisodeRecord(
        task_id=f"task-{i}",
        tools=["terminal"],
        messages=messages,
        conversations=to_hermes_conversations(messages, TOOLS),
        completed=True,
        partial=False,
        finish_reason="stop",
        api_calls=2,
        num_tool_calls=1,
        tool_stats={"terminal": {"count": 1, "success": 1, "failure": 0}},
        truncated_results=0,
        invalid_tool_calls=0,
        usage={"prompt_tokens": 100 + i, "completion_tokens": 20, "total_tokens": 120 + i},
        error=None,
        error_kind=None,
        has_reasoning=True,
        started_at="2025-03-01T12:00:00.123+00:00",
        finished_at="2025-03-01T12:00:02.500+00:00",
        duration_s=2.377,
        model_time_s=1.5,
        tool_time_s=0.2,
    )


def make_row(i: int, **record_kwargs: Any) -> dict[str, Any]:
    return episode_row(
        make_record(i, **record_kwargs),
        prompt_id=f"p{i:04d}",
        prompt_index=i,
        prompt=f"Prompt {i}: 数えて 🚀 \u00e9",
        toolsets=["terminal", "file"],
        metadata={"source": "unit", "when": dt.date(2025, 3, 1), "blob": b"\x00\x01"},
        model="scripted",
        seed=7,
        config_hash="abc123",
        registry_fingerprint="fp1",
        run_name="run",
    )


def make_failure(i: int) -> dict[str, Any]:
    return failure_row(prompt_id=f"p{i:04d}", error="worker died", error_kind="infrastructure")


def test_episode_row_is_plain_json_with_sorted_tool_stats() -> None:
    record = make_record(1)
    stats = {"zeta": {"count": 2, "success": 1, "failure": 1}, **record.tool_stats}
    row = episode_row(
        dataclasses.replace(record, tool_stats=stats),
        prompt_id="p1",
        prompt_index=1,
        prompt="hi",
        toolsets=["terminal"],
        metadata={"source": "unit", "when": dt.date(2025, 3, 1), "blob": b"\x00\x01"},
        model="m",
        seed=1,
        config_hash="h",
        registry_fingerprint="f",
        run_name="r",
    )
    assert set(row) == set(ROW_SCHEMA.names)
    assert json.loads(json.dumps(row)) == row
    assert [s["name"] for s in row["tool_stats"]] == ["terminal", "zeta"]
    assert row["started_at"] == "2025-03-01T12:00:00.123+00:00"
    assert json.loads(row["metadata"]) == {"source": "unit", "when": "2025-03-01", "blob": "AAE="}
    assert row["messages"][1]["tool_calls"] is None
    assert row["messages"][2]["tool_calls"][0]["function"]["name"] == "terminal"


def test_lone_surrogates_become_replacement_characters(tmp_path: Path) -> None:
    row = make_row(1, content="bad \ud800 half, pair \ud83d\ude00")
    assert row["messages"][2]["content"] == "bad \ufffd half, pair \U0001f600"
    raw = make_row(2) | {"prompt": "x\udcff"}  # a row built elsewhere, unsanitised
    writer = ShardWriter(str(tmp_path))
    writer.commit(0, [row, raw])
    table = writer.read_shard_rows(0)
    assert table.column("prompt").to_pylist()[1] == "x\ufffd"


def test_rows_to_table_rejects_a_row_without_prompt_id() -> None:
    with pytest.raises(ValueError, match="prompt_id"):
        rows_to_table([{"prompt": "x"}], rejected=False)


def _write_three_shards(run_dir: Path) -> ShardWriter:
    writer = ShardWriter(str(run_dir))
    writer.commit(0, [make_row(i) for i in range(5)], [make_row(5) | {"reject_reason": "no"}])
    writer.commit(1, [make_failure(i) for i in range(6, 9)])  # episode columns all null
    writer.commit(2, [], [make_row(9) | {"reject_reason": "error"}])  # no kept rows
    return writer


def test_shards_load_together_in_datasets_pandas_and_duckdb(tmp_path: Path) -> None:
    import datasets

    run = tmp_path / "run"
    _write_three_shards(run)
    glob = str(run / "trajectories" / "*.parquet")
    ds = datasets.load_dataset(
        "parquet", data_files=glob, cache_dir=str(tmp_path / "cache"), split="train"
    )
    assert ds.num_rows == 8
    by_id = {r["prompt_id"]: r for r in ds}
    first = by_id["p0001"]
    assert first["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'
    assert first["messages"][3]["tool_call_id"] == "call_1_0"
    assert first["conversations"][0]["from"] == "system"
    assert first["tool_stats"] == [{"name": "terminal", "count": 1, "success": 1, "failure": 0}]
    assert first["prompt"] == "Prompt 1: 数えて 🚀 \u00e9"
    assert first["started_at"] == dt.datetime(2025, 3, 1, 12, 0, 0, 123000, tzinfo=dt.timezone.utc)
    assert by_id["p0006"]["messages"] is None and by_id["p0006"]["error"] == "worker died"

    frame = pd.read_parquet(run / "trajectories")
    assert len(frame) == 8 and sorted(frame["prompt_id"]) == sorted(by_id)

    con = duckdb.connect()
    totals = con.execute(
        f"SELECT count(*), sum(num_tool_calls), "
        f"max(messages[3].tool_calls[1].function.name), sum(usage.total_tokens) FROM '{glob}'"
    ).fetchone()
    assert totals == (8, 5, "terminal", sum(120 + i for i in range(5)))
    rejected = con.execute(
        f"SELECT reject_reason FROM '{run}/rejected/*.parquet' ORDER BY prompt_id"
    ).fetchall()
    assert rejected == [("no",), ("error",)]


def test_every_shard_has_the_exact_schema(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_three_shards(run)
    for path in (run / "trajectories").glob("*.parquet"):
        assert pq.read_schema(path).equals(ROW_SCHEMA, check_metadata=False), path
    for path in (run / "rejected").glob("*.parquet"):
        assert pq.read_schema(path).equals(REJECTED_SCHEMA, check_metadata=False), path
    assert pq.ParquetFile(run / "trajectories" / "part-00002.parquet").metadata.num_rows == 0


def test_markers_describe_the_commit(tmp_path: Path) -> None:
    writer = ShardWriter(str(tmp_path))
    marker = writer.commit(
        3,
        [make_row(1)],
        [make_row(2) | {"reject_reason": "r"}],
        failed=["p0009"],
        config_hash="cfg",
        extra={"stats": {"kept": 1}},
    )
    on_disk = json.loads((tmp_path / "shards" / "00003.json").read_text())
    assert on_disk == marker == writer.committed_shards()[3]
    assert (marker["kept"], marker["rejected"], marker["failed"]) == (1, 1, ["p0009"])
    sizes = {rel: (tmp_path / rel).stat().st_size for rel in marker["files"]}
    assert sizes == marker["files"] and marker["bytes"] == sum(sizes.values())
    assert marker["config_hash"] == "cfg" and marker["extra"] == {"stats": {"kept": 1}}
    assert writer.is_committed(3) and not writer.is_committed(4)


def test_recommit_replaces_files_without_duplicates(tmp_path: Path) -> None:
    writer = ShardWriter(str(tmp_path))
    writer.commit(0, [make_row(i) for i in range(3)], [make_row(3) | {"reject_reason": "x"}])
    writer.commit(0, [make_row(i) for i in range(4)])
    assert writer.read_shard_rows(0).column("prompt_id").to_pylist() == [
        f"p{i:04d}" for i in range(4)
    ]
    assert not (tmp_path / "rejected" / "part-00000.parquet").exists()
    assert writer.read_shard_rows(0, rejected=True).num_rows == 0
    assert writer.committed_shards()[0]["kept"] == 4
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "00000.json",
        "part-00000.parquet",
    ]


def test_commit_accepts_a_table_and_refuses_a_wrong_one(tmp_path: Path) -> None:
    writer = ShardWriter(str(tmp_path))
    writer.commit(0, rows_to_table([make_row(1)], rejected=False))
    assert writer.read_shard_rows(0).num_rows == 1
    with pytest.raises(ValueError, match="output schema"):
        writer.commit(1, pa.table({"prompt_id": ["a"]}))
    assert not writer.is_committed(1)


_CRASHING_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[2])
    from hermes import writer as w
    from hermes.schema import failure_row

    def rows(ids):
        return [failure_row(prompt_id=f"p{i}", error="e", error_kind="k") for i in ids]

    sw = w.ShardWriter(sys.argv[1])
    sw.commit(0, rows(range(3)))
    sw.commit(1, rows(range(3, 6)))

    real_write = os.write

    def die_mid_write(fd, data):  # half the bytes reach the staging file, then SIGKILL
        real_write(fd, bytes(data)[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

    def die_before_replace(src, dst):
        os.kill(os.getpid(), signal.SIGKILL)

    if sys.argv[4] == "write":
        w.os.write = die_mid_write
    else:
        w.os.replace = die_before_replace
    sw.commit(int(sys.argv[3]), rows(range(10, 20)))
    """
)


@pytest.mark.parametrize("point", ["write", "replace"])
@pytest.mark.parametrize("shard", [2, 0])
def test_sigkill_before_publish_leaves_no_torn_or_half_committed_shard(
    tmp_path: Path, shard: int, point: str
) -> None:
    """Killed mid-write or just before the rename. Shard 2: a new shard dies unpublished.
    Shard 0: a re-commit dies after uncommitting; the old complete file stays readable
    and the shard is to be redone."""
    result = subprocess.run(
        [sys.executable, "-c", _CRASHING_CHILD, str(tmp_path), str(ROOT), str(shard), point],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == -9, result.stderr.decode()
    writer = ShardWriter(str(tmp_path))
    assert sorted(writer.committed_shards()) == sorted({0, 1} - {shard})
    staging = [p for p in (tmp_path / "trajectories").iterdir() if ".tmp-" in p.name]
    assert len(staging) == 1
    for path in (tmp_path / "trajectories").glob("*.parquet"):
        assert pq.read_table(path).num_rows == 3  # complete old files only
    assert not (tmp_path / "trajectories" / "part-00002.parquet").exists()
    assert writer.cleanup_staging() == 1
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    writer.commit(shard, [make_row(i) for i in range(10, 20)])  # resume redoes the shard
    assert writer.read_shard_rows(shard).num_rows == 10


def test_cleanup_staging_respects_min_age(tmp_path: Path) -> None:
    writer = ShardWriter(str(tmp_path))
    leftover = tmp_path / "rejected" / f".part-00001.parquet.tmp-{uuid.uuid4().hex}"
    leftover.write_bytes(b"half a file")
    assert writer.cleanup_staging(min_age_s=3600) == 0
    assert writer.cleanup_staging() == 1 and not leftover.exists()


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Any:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_disk_full_raises_a_clear_error_and_leaves_nothing_torn(tiny_tmpfs: Path) -> None:
    writer = ShardWriter(str(tiny_tmpfs / "run"))
    writer.commit(0, [make_row(1)])
    noise = [make_row(i, content=os.urandom(200_000).hex()) for i in range(10)]
    with pytest.raises(ShardWriteError, match="no space left") as info:
        writer.commit(1, noise)
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    names = sorted(p.name for p in (tiny_tmpfs / "run").rglob("*") if p.is_file())
    assert names == ["00000.json", "part-00000.parquet"]
    assert sorted(writer.committed_shards()) == [0]


def test_memory_filesystem_url(tmp_path: Path) -> None:
    url = f"memory://hermes-test-{uuid.uuid4().hex}/run"
    writer = ShardWriter(url)
    writer.commit(0, [make_row(1)], [make_row(2) | {"reject_reason": "r"}], config_hash="h")
    writer.commit(1, [make_row(3)])
    writer.commit(1, [make_row(4), make_row(5)])
    assert sorted(writer.committed_shards()) == [0, 1]
    assert writer.read_shard_rows(1).column("prompt_id").to_pylist() == ["p0004", "p0005"]
    assert writer.read_shard_rows(0, rejected=True).column("reject_reason").to_pylist() == ["r"]
    fs = MemoryFileSystem()
    assert len(fs.glob(writer.root + "/trajectories/*.parquet")) == 2


class _FailingMove(MemoryFileSystem):
    """A filesystem whose rename fails: stands for a storage error mid-publish."""

    protocol = "failingmove"

    def mv(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "storage backend error")


def test_rename_publish_failure_leaves_no_final_or_staging_file() -> None:
    root = f"/hermes-test-{uuid.uuid4().hex}"
    fs = _FailingMove()
    writer = ShardWriter(root, filesystem=fs)
    assert writer.mode == "rename"
    with pytest.raises(ShardWriteError, match="storage backend error"):
        writer.commit(0, [make_row(1)])
    assert fs.find(root) == []


def test_pyarrow_filesystems(tmp_path: Path) -> None:
    local = ShardWriter(str(tmp_path / "a"), filesystem=pafs.LocalFileSystem())
    assert local.mode == "local"
    local.commit(0, [make_row(1)])
    (tmp_path / "b").mkdir()
    subtree = pafs.SubTreeFileSystem(str(tmp_path / "b"), pafs.LocalFileSystem())
    renaming = ShardWriter("run", filesystem=subtree)
    assert renaming.mode == "rename"
    renaming.commit(0, [make_row(1), make_row(2)])
    renaming.commit(0, [make_row(3)])
    assert pq.read_table(tmp_path / "b/run/trajectories/part-00000.parquet").num_rows == 1
    assert sorted(renaming.committed_shards()) == [0]
    assert not [p for p in (tmp_path / "b").rglob("*") if ".tmp-" in p.name]
