"""Episode journal: real files, real concurrent processes, real SIGKILL."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from hermes.journal import (
    Journal,
    compact,
    journal_files,
    journaled_shards,
    read_journal_entries,
)
from hermes.schema import failure_row

ROOT = Path(__file__).resolve().parent.parent


def entry(i: int, shard: int, status: str = "kept", **extra: Any) -> dict[str, Any]:
    row = failure_row(prompt_id=f"p{i}", error="e", error_kind="k", prompt=f"prompt {i} ü")
    return {**row, "shard": shard, "status": status, **extra}


def test_append_then_read_back_all_and_by_shard(tmp_path: Path) -> None:
    with Journal(tmp_path, "w0") as journal:
        for i in range(6):
            journal.append(entry(i, shard=i % 2))
        journal.append(entry(6, shard=1, status="rejected", reject_reason="no_tools"))
    entries = list(read_journal_entries(tmp_path))
    assert [e["prompt_id"] for e in entries] == [f"p{i}" for i in range(7)]
    assert entries[0]["prompt"] == "prompt 0 ü" and entries[6]["reject_reason"] == "no_tools"
    assert [e["prompt_id"] for e in read_journal_entries(tmp_path, shard=1)] == [
        "p1",
        "p3",
        "p5",
        "p6",
    ]
    assert journaled_shards(tmp_path) == {0: 3, 1: 4}
    first_line = (tmp_path / "journal" / "w0.jsonl").read_bytes().split(b"\n")[0]
    assert first_line.startswith(b'{"shard":0,"status":"kept",')


def test_lone_surrogates_are_written_as_valid_utf8(tmp_path: Path) -> None:
    with Journal(tmp_path, "w0") as journal:
        journal.append(entry(1, 0, prompt="half \ud800"))
    (only,) = read_journal_entries(tmp_path)
    assert only["prompt"] == "half \ufffd"


def test_bad_entries_are_refused(tmp_path: Path) -> None:
    with Journal(tmp_path, "w0") as journal:
        with pytest.raises(ValueError, match="shard"):
            journal.append({"prompt_id": "p", "status": "kept"})
        with pytest.raises(ValueError, match="status"):
            journal.append({"prompt_id": "p", "shard": 0, "status": "done"})
        with pytest.raises(ValueError, match="prompt_id"):
            journal.append({"shard": 0, "status": "kept"})
        with pytest.raises(TypeError, match="p1"):
            journal.append(entry(1, 0, when=object()))
    assert list(read_journal_entries(tmp_path)) == []
    with pytest.raises(ValueError, match="local"):
        Journal("s3://bucket/run", "w0")


def test_duplicates_keep_the_first_complete_entry(tmp_path: Path) -> None:
    with Journal(tmp_path, "a") as a, Journal(tmp_path, "b") as b:
        a.append(entry(1, 0, note="first"))
        a.append(entry(1, 0, note="again"))
        b.append(entry(1, 0, note="other file"))
        b.append(entry(2, 0))
    entries = list(read_journal_entries(tmp_path, shard=0))
    assert [(e["prompt_id"], e.get("note")) for e in entries] == [("p1", "first"), ("p2", None)]


def test_torn_last_line_is_skipped_and_does_not_swallow_the_next_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Journal(tmp_path, "w0") as journal:
        journal.append(entry(1, 0))
    path = tmp_path / "journal" / "w0.jsonl"
    with path.open("ab") as handle:
        handle.write(b'{"shard":0,"status":"kept","prompt_id":"p2","pro')  # crash mid-line
    with caplog.at_level(logging.WARNING, logger="hermes.journal"):
        assert [e["prompt_id"] for e in read_journal_entries(tmp_path)] == ["p1"]
    assert "torn last line" in caplog.text
    with Journal(tmp_path, "w0") as journal:  # the same writer id, next attempt
        journal.append(entry(3, 0))
    assert [e["prompt_id"] for e in read_journal_entries(tmp_path)] == ["p1", "p3"]


_APPENDER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from hermes.journal import Journal
    from hermes.schema import failure_row

    run_dir, writer_id, start, count, size = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
    with Journal(run_dir, writer_id) as journal:
        for i in range(start, start + count if count else 10**9):
            row = failure_row(prompt_id=f"p{i}", error="e", error_kind="k")
            pad = str(i % 10) * size
            journal.append({**row, "shard": i % 7, "status": "kept", "i": i, "pad": pad})
    """
)


def _appender(run_dir: Path, writer_id: str, start: int, count: int, size: int) -> list[str]:
    args = [str(run_dir), writer_id, str(start), str(count), str(size)]
    return [sys.executable, "-c", _APPENDER, str(ROOT), *args]


def test_two_processes_append_to_their_own_files(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(_appender(tmp_path, "w-a", 0, 300, 100)),
        subprocess.Popen(_appender(tmp_path, "w-b", 250, 300, 100)),  # 50 prompts overlap
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert [p.name for p in journal_files(tmp_path)] == ["w-a.jsonl", "w-b.jsonl"]
    entries = list(read_journal_entries(tmp_path))
    assert sorted(e["i"] for e in entries) == list(range(550))
    assert all(e["pad"] == str(e["i"] % 10) * 100 for e in entries)


def test_sigkill_while_appending_leaves_every_complete_line_readable(tmp_path: Path) -> None:
    proc = subprocess.Popen(_appender(tmp_path, "w0", 0, 0, 200_000))  # endless, 200 KB lines
    path = tmp_path / "journal" / "w0.jsonl"
    deadline = time.monotonic() + 30
    while (not path.exists() or path.stat().st_size < 5_000_000) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    data = path.read_bytes()
    complete = data.count(b"\n")
    entries = list(read_journal_entries(tmp_path))
    assert complete >= 20 and len(entries) == complete
    assert [e["i"] for e in entries] == list(range(complete))
    assert all(e["pad"] == str(e["i"] % 10) * 200_000 for e in entries)


def test_compaction_drops_committed_shards_and_empty_files(tmp_path: Path) -> None:
    with Journal(tmp_path, "old") as old, Journal(tmp_path, "mixed") as mixed:
        for i in range(4):
            old.append(entry(i, shard=0))
        for i in range(4, 10):
            mixed.append(entry(i, shard=i % 3))
    with (tmp_path / "journal" / "mixed.jsonl").open("ab") as handle:
        handle.write(b'{"shard":2,"status":"ke')
    crashed = tmp_path / "journal" / ".mixed.jsonl.tmp-0123abcd"  # an earlier crashed compaction
    crashed.write_bytes(b'{"shard":2')
    dropped = compact(tmp_path, {0: {}, 1: {}})  # a committed_shards() dict works
    assert dropped == 4 + 4 + 1  # shard 0 of old, shards 0/1 of mixed, the torn line
    assert [p.name for p in journal_files(tmp_path)] == ["mixed.jsonl"]
    assert [e["prompt_id"] for e in read_journal_entries(tmp_path)] == ["p5", "p8"]
    assert compact(tmp_path, {0, 1}) == 0
    assert not [p for p in (tmp_path / "journal").iterdir() if ".tmp-" in p.name]


def test_compaction_skips_a_journal_still_being_written(tmp_path: Path) -> None:
    live = Journal(tmp_path, "live")
    live.append(entry(1, shard=0))
    assert compact(tmp_path, {0}) == 0
    live.append(entry(2, shard=1))
    live.close()
    assert compact(tmp_path, {0}) == 1
    assert [e["prompt_id"] for e in read_journal_entries(tmp_path)] == ["p2"]
    assert compact(tmp_path, {0, 1}) == 1 and journal_files(tmp_path) == []
    with Journal(tmp_path, "live", fsync=True) as again:  # the file was removed; recreated
        again.append(entry(3, shard=2))
    assert [e["prompt_id"] for e in read_journal_entries(tmp_path)] == ["p3"]


def test_reading_one_shard_streams_instead_of_loading_the_journal(tmp_path: Path) -> None:
    pad = "x" * 3000
    with Journal(tmp_path, "big") as journal:
        for i in range(8_000):
            journal.append(entry(i, shard=i % 40, pad=pad))
    size = (tmp_path / "journal" / "big.jsonl").stat().st_size
    assert size > 20_000_000
    tracemalloc.start()
    try:
        got = [e["prompt_id"] for e in read_journal_entries(tmp_path, shard=7)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [f"p{i}" for i in range(7, 8_000, 40)]
    assert peak < size / 20, (peak, size)
    assert json.loads(json.dumps(got)) == got
    assert os.path.getsize(tmp_path / "journal" / "big.jsonl") == size  # reading never writes
