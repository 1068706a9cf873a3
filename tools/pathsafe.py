"""Confine file access to an episode's scratch directory.

Not a tool module: the file tools use it. The file tools run in the worker process with
the runner's own permissions, not inside the command sandbox, so anything a model-run
command leaves in the scratch directory (a symlink to ``/etc``, a symlinked parent
directory, a hard link to a file outside) must not let a file tool reach outside.

Two layers do that. ``resolve_in_scratch`` rejects absolute paths and any path whose
fully resolved form (every symlink followed) leaves the scratch directory; it gives the
model a message it can act on. The ``open_*`` helpers then walk from the scratch root one
component at a time with ``O_NOFOLLOW`` directory descriptors, so a symlink swapped in
between the check and the open (a command running in the background) fails the open
instead of being followed.

It also holds the bounded reading helpers the file tools share (line iteration with a
per-line cap, binary sniffing, a symlink-free walk), so no tool loads a huge file whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO a command created would otherwise block the worker forever.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

BINARY_PROBE_BYTES = 8192
MAX_LINE_BYTES = 4000  # longer lines are cut, so one giant line cannot fill a result
COUNT_LINES_LIMIT = 128 * 1024 * 1024  # past this, counting lines is not worth the time
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__"})


class PathEscapeError(ValueError):
    """Raised when a path is absolute, malformed, or would reach outside the scratch dir."""


class ScratchFileError(ValueError):
    """Raised when a path inside the scratch dir cannot be used: missing, a directory,
    not a regular file, or a parent that is not a directory."""


def scratch_root(scratch_dir: Path, *, create: bool = False) -> Path:
    """The fully resolved scratch directory (created first when ``create``)."""
    if create:
        Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    return Path(os.path.realpath(scratch_dir))


def resolve_in_scratch(
    scratch_dir: Path, user_path: str, *, must_exist: bool = False, for_write: bool = False
) -> Path:
    """Resolve ``user_path`` (relative to the scratch dir) to an absolute path inside it.

    Raises ``PathEscapeError`` for absolute paths, NUL bytes and anything that resolves
    outside; ``ScratchFileError`` when ``must_exist`` and nothing is there, or when
    ``for_write`` and the path names a directory.
    """
    if not isinstance(user_path, str) or not user_path.strip():
        raise PathEscapeError("path must be a non-empty string relative to the working directory")
    if "\x00" in user_path:
        raise PathEscapeError("path contains a NUL byte; use a plain relative path")
    if os.path.isabs(user_path):
        raise PathEscapeError(
            f"path {user_path!r} is absolute; use a relative path inside the episode's "
            "working directory"
        )
    root = scratch_root(scratch_dir, create=for_write)
    resolved = Path(os.path.realpath(root / user_path))
    if not resolved.is_relative_to(root):
        raise PathEscapeError(
            f"path {user_path!r} resolves outside the episode's working directory; "
            "use a relative path inside it"
        )
    if must_exist and not resolved.exists():
        raise ScratchFileError(f"file {user_path!r} does not exist")
    if for_write and (resolved == root or resolved.is_dir()):
        raise ScratchFileError(f"{user_path!r} is a directory; give a file path to write")
    return resolved


def relative_name(scratch_dir: Path, resolved: Path) -> str:
    """How to show ``resolved`` to the model: relative to the scratch dir, '/'-separated."""
    rel = resolved.relative_to(scratch_root(scratch_dir)).as_posix()
    return rel or "."


def _open_dir_chain(root: Path, parts: tuple[str, ...], shown: str, *, create: bool) -> int:
    """A descriptor of ``root/parts...``, opened one component at a time without
    following symlinks; with ``create``, missing directories are made on the way."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            # Reopening with O_NOFOLLOW re-checks a just-created directory too: if a
            # command replaced it with a symlink meanwhile, this fails instead of following.
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _translate(exc, shown, _is_symlink(fd, part)) from exc
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _translate(exc: OSError, shown: str, symlink: bool = False) -> Exception:
    # O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR, not ELOOP, hence the flag.
    if exc.errno == errno.ELOOP or symlink:
        return PathEscapeError(
            f"path {shown!r} goes through a symbolic link that changed while it was being "
            "opened; use a path inside the episode's working directory"
        )
    if exc.errno == errno.ENOENT:
        return ScratchFileError(f"file {shown!r} does not exist")
    if exc.errno == errno.ENOTDIR:
        return ScratchFileError(f"a parent of {shown!r} is a file, not a directory")
    return exc


def open_regular_file(scratch_dir: Path, user_path: str) -> tuple[int, os.stat_result, Path]:
    """Open a regular file of the scratch dir for reading: ``(fd, stat, resolved path)``.

    The caller owns (and must close) the descriptor. Files with more than one hard link
    are refused: a command can hard-link a file from outside into the scratch dir, and
    no path check can tell such a link from a local file, so reading it could leak data
    the episode must not see.
    """
    resolved = resolve_in_scratch(scratch_dir, user_path, must_exist=True)
    root = scratch_root(scratch_dir)
    parts = resolved.relative_to(root).parts
    if not parts:
        raise ScratchFileError(f"{user_path!r} is a directory, not a file")
    dir_fd = _open_dir_chain(root, parts[:-1], user_path, create=False)
    try:
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _translate(exc, user_path) from exc
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        _check_readable(info, user_path)
    except BaseException:
        os.close(fd)
        raise
    return fd, info, resolved


def _check_readable(info: os.stat_result, shown: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise ScratchFileError(f"{shown!r} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise ScratchFileError(f"{shown!r} is not a regular file (device, socket or pipe)")
    if info.st_nlink > 1:
        raise PathEscapeError(
            f"file {shown!r} has {info.st_nlink} hard links; hard-linked files are refused "
            "because a link may point at a file outside the episode's working directory. "
            "Copy it to a new file first."
        )


def write_atomic(scratch_dir: Path, user_path: str, data: bytes) -> Path:
    """Replace (or create) a scratch file with ``data`` in one step; returns its path.

    A temporary file in the same directory is renamed over the target, so readers never
    see half a file, and a hard link or symlink at the target is replaced, never written
    through. Missing parent directories are created inside the scratch dir only. An
    existing file keeps its permission bits (an edited script stays executable).
    """
    resolved = resolve_in_scratch(scratch_dir, user_path, for_write=True)
    root = scratch_root(scratch_dir)
    parts = resolved.relative_to(root).parts
    dir_fd = _open_dir_chain(root, parts[:-1], user_path, create=True)
    try:
        name = parts[-1]
        try:
            old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise ScratchFileError(f"{user_path!r} is a directory; give a file path to write")
        _replace_with(dir_fd, name, data, None if old is None else stat.S_IMODE(old.st_mode))
    finally:
        os.close(dir_fd)
    return resolved


def _replace_with(dir_fd: int, name: str, data: bytes, mode: int | None) -> None:
    # No fsync: atomicity here protects concurrent readers; a crashed worker loses the
    # whole episode anyway.
    temp = f".hermes-{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, _TEMP_FLAGS, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as stream:
            if mode is not None:
                os.fchmod(stream.fileno(), mode)
            stream.write(data)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


# -- bounded reading: the file tools must not load a multi-gigabyte file ----------------


def is_binary(fd: int) -> bool:
    """Whether the file starts with a NUL byte in its first 8 KB (text never has one)."""
    return b"\x00" in os.pread(fd, BINARY_PROBE_BYTES, 0)


def iter_lines(stream: BinaryIO) -> Iterator[tuple[bytes, bool]]:
    """Yield ``(line, was_cut)``; over-long lines are cut and their rest skipped."""
    while line := stream.readline(MAX_LINE_BYTES):
        cut = len(line) == MAX_LINE_BYTES and not line.endswith(b"\n")
        while cut and (rest := stream.readline(MAX_LINE_BYTES)):
            if rest.endswith(b"\n"):
                break
        yield line, cut


def count_remaining_lines(stream: BinaryIO) -> int | None:
    """Lines left in ``stream`` (positioned at a line start); None once past the limit."""
    count, seen, last = 0, 0, b"\n"
    while chunk := stream.read(1 << 20):
        count, seen, last = count + chunk.count(b"\n"), seen + len(chunk), chunk[-1:]
        if seen > COUNT_LINES_LIMIT:
            return None
    return count + (last != b"\n")


def walk_regular_files(top: Path) -> Iterator[Path]:
    """Regular files under ``top`` in a stable order. Symlinks (to files or directories)
    are neither followed nor listed, and VCS/cache directories are skipped."""
    for current, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            candidate = Path(current, name)
            if not candidate.is_symlink() and candidate.is_file():
                yield candidate


def read_small_text(scratch_dir: Path, user_path: str, max_bytes: int) -> str:
    """The whole content of a UTF-8 text file of at most ``max_bytes`` (for editing)."""
    fd, info, _resolved = open_regular_file(scratch_dir, user_path)
    with os.fdopen(fd, "rb") as stream:
        if info.st_size > max_bytes:
            raise ScratchFileError(
                f"{user_path!r} is larger than {max_bytes} bytes; too big to edit"
            )
        data = stream.read(max_bytes + 1)
    if b"\x00" in data[:BINARY_PROBE_BYTES]:
        raise ScratchFileError(f"{user_path!r} is a binary file; only text files can be edited")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScratchFileError(
            f"{user_path!r} is not valid UTF-8 text; it cannot be edited"
        ) from exc
