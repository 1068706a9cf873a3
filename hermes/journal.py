"""The episode journal: a finished episode is durable as soon as it finishes.

Each writer (a worker, for one run attempt) appends one JSON line per finished episode to
its own file ``<run_dir>/journal/<writer_id>.jsonl``. A line is the output row dict
(``hermes.schema.episode_row``) plus ``shard`` and ``status`` (``kept``, ``rejected`` or
``failed``, with ``reject_reason`` or failure details), and always starts with
``{"shard":N,`` so a reader looking for one shard skips other lines without parsing them.

Durability: a line goes to the kernel in one ``os.write`` on an ``O_APPEND`` descriptor,
so a killed process (SIGKILL included) loses at most the line being written; readers
skip such a torn last line. That does not survive a power loss or kernel crash; with
``fsync=True`` every line is also flushed to the disk, which costs a disk flush (about
1-10 ms on SSDs, more on network storage) per episode - small next to an episode that
takes seconds, but it serialises the writer on the disk.

Compaction (the simplest design that stays correct with live writers): a writer holds a
shared ``flock`` on its file while it is open; :func:`compact` takes an exclusive lock
on each file without blocking, skips files still in use, and rewrites the others keeping
only entries of uncommitted shards (deleting files left empty). Give each writer a fresh
``writer_id`` per run attempt, so the files of finished attempts become compactable.

The journal needs a POSIX filesystem (local disk or a network mount) for ``O_APPEND``
and ``flock``; it cannot live on an object store.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from hermes.schema import sanitize

logger = logging.getLogger(__name__)

JOURNAL_DIR = "journal"
STATUSES = frozenset({"kept", "rejected", "failed"})
_PREFIX = b'{"shard":'
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def journal_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / JOURNAL_DIR


class Journal:
    """Appends finished episodes to ``journal/<writer_id>.jsonl``. One writer per id."""

    def __init__(
        self, run_dir: str | os.PathLike[str], writer_id: str, *, fsync: bool = False
    ) -> None:
        if "://" in str(run_dir) and not str(run_dir).startswith("file://"):
            raise ValueError(
                f"the journal needs a local or mounted filesystem, not {run_dir!r}; "
                "give it a local directory"
            )
        safe_id = _UNSAFE.sub("_", writer_id).strip(".")
        if not safe_id:
            raise ValueError(f"writer_id {writer_id!r} has no usable characters")
        directory = journal_dir(str(run_dir).removeprefix("file://"))
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{safe_id}.jsonl"
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fd = _open_locked(self.path)
        # A torn line from an earlier process must not swallow our first line.
        self._needs_newline = _ends_torn(self.path)

    def append(self, entry: Mapping[str, Any]) -> None:
        """Write one finished episode; returns once the line is in the kernel (or on the
        disk with ``fsync``). Raises ``OSError`` (e.g. disk full) and ``TypeError`` for
        values JSON cannot hold."""
        line = encode_entry(entry)
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"journal {self.path} is closed")
            if self._needs_newline:
                line = b"\n" + line
            try:
                _write_all(self._fd, line)
                if self.fsync:
                    os.fsync(self._fd)
            except OSError as exc:
                self._needs_newline = True  # part of the line may be on disk
                raise OSError(
                    exc.errno, f"could not append to the journal {self.path}: {exc.strerror}"
                ) from exc
            self._needs_newline = False

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)  # also releases the flock
                self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def encode_entry(entry: Mapping[str, Any]) -> bytes:
    """One journal line: ``{"shard":N,"status":...,...}`` and a newline."""
    shard, status, prompt_id = entry.get("shard"), entry.get("status"), entry.get("prompt_id")
    if not isinstance(shard, int) or isinstance(shard, bool) or shard < 0:
        raise ValueError(f"journal entry needs an int shard >= 0, got {shard!r}")
    if status not in STATUSES:
        raise ValueError(f"journal entry status must be one of {sorted(STATUSES)}: {status!r}")
    if not isinstance(prompt_id, str) or not prompt_id:
        raise ValueError(f"journal entry needs a prompt_id, got {prompt_id!r}")
    ordered = {"shard": shard, "status": status, **entry}
    try:
        text = json.dumps(ordered, ensure_ascii=False, separators=(",", ":"))
    except TypeError as exc:
        raise TypeError(f"journal entry for {prompt_id!r} is not JSON-serialisable: {exc}") from exc
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from model output
        text = json.dumps(sanitize(ordered), ensure_ascii=False, separators=(",", ":"))
        return (text + "\n").encode("utf-8")


def read_journal_entries(
    run_dir: str | os.PathLike[str], shard: int | None = None
) -> Iterator[dict[str, Any]]:
    """Stream the entries of all journal files (of one shard if given), first complete
    entry per prompt_id. Torn and corrupt lines are logged and skipped. Memory holds one
    line and the prompt_ids already yielded."""
    seen: set[str] = set()
    for path in journal_files(run_dir):
        for line in _lines(path):
            if shard is not None and _line_shard(line, parse=False) not in (shard, None):
                continue
            entry = _parse(line, path)
            if entry is None or (shard is not None and entry.get("shard") != shard):
                continue
            prompt_id = entry.get("prompt_id")
            if not isinstance(prompt_id, str) or prompt_id in seen:
                continue
            seen.add(prompt_id)
            yield entry


def journaled_shards(run_dir: str | os.PathLike[str]) -> dict[int, int]:
    """Lines per shard across all journal files (duplicates counted), without parsing
    whole entries: which shards have finished episodes waiting to be committed."""
    counts: dict[int, int] = {}
    for path in journal_files(run_dir):
        for line in _lines(path):
            shard = _line_shard(line, parse=True)
            if shard is not None:
                counts[shard] = counts.get(shard, 0) + 1
    return counts


def journal_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    directory = journal_dir(run_dir)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix == ".jsonl" and p.is_file())


def compact(run_dir: str | os.PathLike[str], committed_shards: Collection[int]) -> int:
    """Drop journal entries of committed shards; returns how many lines were dropped.

    ``committed_shards`` is a collection of shard numbers (the dict from
    ``ShardWriter.committed_shards()`` works). Files held open by a live
    :class:`Journal` are skipped; the others are rewritten atomically or deleted. Run one
    compaction at a time (it removes staging files a crashed compaction left).
    """
    committed = set(committed_shards)
    dropped = 0
    directory = journal_dir(run_dir)
    if directory.is_dir():
        for leftover in directory.glob(".*.jsonl.tmp-*"):  # from a compaction that crashed
            leftover.unlink(missing_ok=True)
    for path in journal_files(run_dir):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.debug("journal %s is in use; not compacting it", path)
                continue
            dropped += _compact_file(path, committed)
        finally:
            os.close(fd)
    return dropped


def _compact_file(path: Path, committed: set[int]) -> int:
    staging = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    kept = dropped = 0
    try:
        with staging.open("wb") as out:
            for line in _lines(path):
                shard = _line_shard(line, parse=False)
                entry = None if shard in committed else _parse(line, path, quiet=True)
                if entry is None or entry.get("shard") in committed:
                    dropped += 1
                    continue
                out.write(line if line.endswith(b"\n") else line + b"\n")
                kept += 1
            out.flush()
            os.fsync(out.fileno())
        if not kept:
            path.unlink()  # nothing left to resume from (or an empty file)
            staging.unlink()
        elif dropped:
            os.replace(staging, path)
        else:
            staging.unlink()
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
        raise
    return dropped


def _open_locked(path: Path) -> int:
    """Open for appending with a shared flock on the file that is at ``path`` now."""
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # compaction replaced or removed the file while we waited


def _ends_torn(path: Path) -> bool:
    with path.open("rb") as handle:
        if handle.seek(0, os.SEEK_END) == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _lines(path: Path) -> Iterator[bytes]:
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        yield from handle


def _line_shard(line: bytes, *, parse: bool) -> int | None:
    """The shard of a line from its ``{"shard":N,`` prefix; None when unknown (a line not
    in our layout is parsed in full only when ``parse``)."""
    if line.startswith(_PREFIX):
        end = line.find(b",", len(_PREFIX))
        with contextlib.suppress(ValueError):
            return int(line[len(_PREFIX) : end])
    if not parse:
        return None
    entry = _parse(line, None, quiet=True)
    shard = entry.get("shard") if entry else None
    return shard if isinstance(shard, int) else None


def _parse(line: bytes, path: Path | None, *, quiet: bool = False) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        entry = json.loads(line)
    except ValueError:
        entry = None
    if isinstance(entry, dict):
        return entry
    if not quiet:
        where = "torn last line" if not line.endswith(b"\n") else "corrupt line"
        # Expected after a crash mid-write; the episode is simply run again.
        logger.warning("skipping a %s in journal %s (%d bytes)", where, path, len(line))
    return None


__all__ = [
    "JOURNAL_DIR",
    "STATUSES",
    "Journal",
    "compact",
    "encode_entry",
    "journal_dir",
    "journal_files",
    "journaled_shards",
    "read_journal_entries",
]
