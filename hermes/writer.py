"""Atomic Parquet shard commits: readers never see a torn file (design invariant 2).

Layout under the run directory::

    trajectories/part-00003.parquet   kept rows of shard 3 (always written, maybe 0 rows)
    rejected/part-00003.parquet       rejected rows of shard 3 (only when there are some)
    shards/00003.json                 completion marker: its existence means "committed"

A trajectories file is written even for a shard with no kept rows (a valid Parquet file
with the schema and no row group, which pandas, DuckDB and ``datasets`` all accept among
other files), so the glob ``trajectories/*.parquet`` matches a file per committed shard.

Publishing a file: the Parquet bytes are built in memory (a shard is bounded by the batch
size), then

- local or network-mounted filesystem: written to ``.part-00003.parquet.tmp-<uuid>`` in
  the same directory, fsynced, and renamed over the final name with ``os.replace`` (then
  the directory is fsynced, so the rename survives power loss);
- object stores (s3, gcs, azure, memory): written with one put; the object appears whole
  or not at all, and rename there is a copy, not atomic;
- other fsspec filesystems (hdfs, sftp, ...): staging name, then ``mv``.

A commit removes the old marker first, writes the data files, and writes the marker
last, so a crash at any point leaves the shard uncommitted (to be redone) rather than
half-committed. Re-committing replaces the files under the same names: no duplicates.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeAlias

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.local import LocalFileSystem

from hermes.errors import HermesError
from hermes.schema import REJECTED_SCHEMA, ROW_SCHEMA, SCHEMA_VERSION, rows_to_table

logger = logging.getLogger(__name__)

TRAJECTORIES_DIR = "trajectories"
REJECTED_DIR = "rejected"
MARKERS_DIR = "shards"

# Where one put is atomic and rename is a non-atomic copy.
_OBJECT_STORES = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2", "memory"}
)
_ARROW_OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})
_STAGING = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")
_MARKER = re.compile(r"^(\d{5,})\.json$")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

Rows: TypeAlias = "Sequence[Mapping[str, Any]] | pa.Table"


class ShardWriteError(HermesError, OSError):
    """A shard file could not be published (disk full, permission, storage error).

    An ``OSError`` too, with the original ``errno``; nothing torn was left behind.
    """


class ShardWriter:
    """Commits shards of output rows under ``run_dir`` (a path or an fsspec URL).

    ``filesystem`` may be an fsspec or ``pyarrow.fs`` filesystem; ``run_dir`` is then a
    path on it. Several workers may commit different shards at once; one shard is
    committed by one worker at a time.
    """

    def __init__(
        self,
        run_dir: str,
        *,
        filesystem: Any = None,
        fsync: bool = True,
        compression: str = "zstd",
        row_group_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.fs, self.root, self.mode = _resolve(run_dir, filesystem)
        self.fsync = fsync
        self.compression = compression
        self.row_group_bytes = row_group_bytes
        for sub in (TRAJECTORIES_DIR, REJECTED_DIR, MARKERS_DIR):
            self.fs.makedirs(self._path(sub), exist_ok=True)

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def trajectories_path(self, shard: int) -> str:
        return self._path(TRAJECTORIES_DIR, f"part-{shard:05d}.parquet")

    def rejected_path(self, shard: int) -> str:
        return self._path(REJECTED_DIR, f"part-{shard:05d}.parquet")

    def marker_path(self, shard: int) -> str:
        return self._path(MARKERS_DIR, f"{shard:05d}.json")

    def commit(
        self,
        shard: int,
        kept: Rows,
        rejected: Rows = (),
        *,
        failed: Sequence[str] = (),
        config_hash: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Publish one shard's files, then its marker; returns the marker.

        ``kept``/``rejected`` are row dicts (``hermes.schema.episode_row``) or tables with
        the output schema. ``failed`` lists prompt_ids lost to infrastructure failures;
        ``extra`` (JSON-serialisable, e.g. per-shard statistics) is stored in the marker.
        """
        if shard < 0:
            raise ValueError(f"shard must be >= 0, got {shard}")
        kept_table = _as_table(kept, rejected=False)
        rejected_table = _as_table(rejected, rejected=True)
        # Uncommit first: a crash from here on leaves the shard to be redone, never a
        # marker that describes files it did not see written.
        self._remove(self.marker_path(shard))
        kept_path, rejected_path = self.trajectories_path(shard), self.rejected_path(shard)
        files = {kept_path: self._publish_table(kept_path, kept_table)}
        if rejected_table.num_rows:
            files[rejected_path] = self._publish_table(rejected_path, rejected_table)
        else:
            self._remove(rejected_path)  # stale from an earlier attempt
        marker = {
            "shard": shard,
            "kept": kept_table.num_rows,
            "rejected": rejected_table.num_rows,
            "failed": list(failed),
            "failed_count": len(failed),
            "bytes": sum(files.values()),
            "files": {self._relative(path): size for path, size in files.items()},
            "config_hash": config_hash,
            "schema_version": SCHEMA_VERSION,
            "committed_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "extra": dict(extra) if extra else {},
        }
        self._publish(self.marker_path(shard), json.dumps(marker, ensure_ascii=False).encode())
        logger.debug(
            "committed shard %d: %d kept, %d rejected",
            shard,
            kept_table.num_rows,
            rejected_table.num_rows,
        )
        return marker

    def iter_markers(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(shard, marker) of every committed shard, read one at a time (a 1M-prompt run
        has tens of thousands of markers, each carrying its shard's statistics)."""
        for name in self._list(MARKERS_DIR):
            match = _MARKER.match(name)
            if not match:
                continue
            path = self._path(MARKERS_DIR, name)
            try:
                marker = json.loads(self.fs.cat_file(path))
            except FileNotFoundError:
                continue  # being re-committed right now
            except (ValueError, UnicodeDecodeError) as exc:
                # Markers are published atomically, so this is outside damage.
                logger.warning("ignoring unreadable shard marker %s: %s", path, exc)
                continue
            yield int(match.group(1)), marker

    def committed_shards(self) -> dict[int, dict[str, Any]]:
        """Markers of all committed shards, by shard number (all in memory: for tests
        and small runs; the runner uses ``committed_index``)."""
        return dict(self.iter_markers())

    def committed_index(self) -> dict[int, tuple[str, ...]]:
        """Committed shard numbers and their failed prompt_ids, without the statistics."""
        return {shard: tuple(m.get("failed") or ()) for shard, m in self.iter_markers()}

    def is_committed(self, shard: int) -> bool:
        return bool(self.fs.exists(self.marker_path(shard)))

    def read_shard_rows(self, shard: int, *, rejected: bool = False) -> pa.Table:
        """The kept (or rejected) rows of a shard; an empty table if it has none."""
        path = self.rejected_path(shard) if rejected else self.trajectories_path(shard)
        schema = REJECTED_SCHEMA if rejected else ROW_SCHEMA
        try:
            with self.fs.open(path, "rb") as handle:
                return pq.read_table(handle, schema=schema)
        except FileNotFoundError:
            return schema.empty_table()

    def cleanup_staging(self, *, min_age_s: float = 0.0) -> int:
        """Remove staging files left by a crash; returns how many were removed.

        Call it when no other writer is committing (e.g. at the start of a resume), or
        pass ``min_age_s`` longer than a commit can take.
        """
        removed = 0
        now = time.time()
        for sub in (TRAJECTORIES_DIR, REJECTED_DIR, MARKERS_DIR):
            for name in self._list(sub):
                if not _STAGING.match(name):
                    continue
                path = self._path(sub, name)
                if min_age_s > 0 and now - _mtime(self.fs, path, now) < min_age_s:
                    continue
                self._remove(path)
                removed += 1
        if removed:
            logger.info("removed %d leftover staging file(s) under %s", removed, self.root)
        return removed

    def _relative(self, path: str) -> str:
        return path[len(self.root.rstrip("/")) + 1 :]

    def _list(self, sub: str) -> list[str]:
        directory = self._path(sub)
        if self.mode == "local":
            try:
                return sorted(entry.name for entry in os.scandir(directory))
            except FileNotFoundError:
                return []
        try:
            names = self.fs.ls(directory, detail=False)
        except FileNotFoundError:
            return []
        return sorted(str(name).rstrip("/").rsplit("/", 1)[-1] for name in names)

    def _publish_table(self, path: str, table: pa.Table) -> int:
        return self._publish(path, self._parquet_bytes(table))

    def _parquet_bytes(self, table: pa.Table) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        if table.num_rows == 0:
            # No row group at all: `datasets` fails on a file with one empty row group
            # but skips a file with none.
            pq.ParquetWriter(sink, table.schema, compression=self.compression).close()
            return sink.getvalue()
        per_row = max(table.nbytes // table.num_rows, 1)
        pq.write_table(
            table,
            sink,
            compression=self.compression,
            row_group_size=max(1, min(table.num_rows, self.row_group_bytes // per_row)),
        )
        return sink.getvalue()

    def _publish(self, path: str, data: bytes | pa.Buffer) -> int:
        """Make ``path`` hold ``data`` in one visible step; returns the size."""
        size = len(data) if isinstance(data, bytes) else data.size
        try:
            if self.mode == "local":
                _publish_local(path, data, fsync=self.fsync)
            elif self.mode == "put":
                self.fs.pipe_file(path, _as_bytes(data))
            else:
                staging = _staging_name(path)
                try:
                    self.fs.pipe_file(staging, _as_bytes(data))
                    self.fs.mv(staging, path)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm(staging)
        except OSError as exc:
            raise _write_error(path, size, exc) from exc
        return size

    def _remove(self, path: str) -> None:
        if self.mode == "local":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        elif self.fs.exists(path):
            self.fs.rm(path)


def _resolve(run_dir: str, filesystem: Any) -> tuple[Any, str, str]:
    """(fsspec filesystem, root path, publish mode: "local" | "put" | "rename")."""
    if filesystem is None:
        fs, root = fsspec.core.url_to_fs(run_dir)
    elif isinstance(filesystem, pafs.FileSystem):
        if isinstance(filesystem, pafs.LocalFileSystem):
            fs, root = LocalFileSystem(), os.path.abspath(run_dir)
        else:
            put = filesystem.type_name in _ARROW_OBJECT_STORES
            return ArrowFSWrapper(filesystem), run_dir, "put" if put else "rename"
    else:
        fs, root = filesystem, run_dir
    if isinstance(fs, LocalFileSystem):
        return fs, os.path.abspath(root), "local"
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return fs, root, "put" if protocols & _OBJECT_STORES else "rename"


def _staging_name(path: str) -> str:
    directory, name = path.rsplit("/", 1)
    return f"{directory}/.{name}.tmp-{uuid.uuid4().hex}"


def _publish_local(path: str, data: bytes | pa.Buffer, *, fsync: bool) -> None:
    staging = _staging_name(path)
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staging, path)
    except BaseException:
        # Also on KeyboardInterrupt: a staging file is never left behind by us.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        raise
    if fsync:
        _fsync_dir(os.path.dirname(path))


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_error(path: str, size: int, exc: OSError) -> ShardWriteError:
    if exc.errno in _NO_SPACE:
        message = (
            f"no space left on the device while writing {path} ({size} bytes); nothing was "
            "published for this file. Free space or choose another output_dir, then resume."
        )
    else:
        message = f"could not write {path}: {exc}; nothing was published for this file"
    return ShardWriteError(exc.errno or errno.EIO, message)


def _as_bytes(data: bytes | pa.Buffer) -> bytes:
    return data if isinstance(data, bytes) else data.to_pybytes()


def _as_table(rows: Rows, *, rejected: bool) -> pa.Table:
    schema = REJECTED_SCHEMA if rejected else ROW_SCHEMA
    if not isinstance(rows, pa.Table):
        return rows_to_table(rows, rejected=rejected)
    if not rows.schema.equals(schema, check_metadata=False):
        try:
            return rows.select(schema.names).cast(schema)
        except (KeyError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ValueError(f"table does not match the output schema: {exc}") from exc
    return rows.replace_schema_metadata(schema.metadata)


def _mtime(fs: Any, path: str, default: float) -> float:
    try:
        modified = fs.modified(path)
    except (NotImplementedError, FileNotFoundError, OSError):
        return default
    return float(modified.timestamp())


__all__ = [
    "MARKERS_DIR",
    "REJECTED_DIR",
    "TRAJECTORIES_DIR",
    "ShardWriteError",
    "ShardWriter",
]
