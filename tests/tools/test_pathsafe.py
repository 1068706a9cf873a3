"""tools.pathsafe: every way out of the scratch directory is refused, inside paths work."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from tools import pathsafe
from tools.pathsafe import (
    PathEscapeError,
    ScratchFileError,
    count_remaining_lines,
    iter_lines,
    open_regular_file,
    read_small_text,
    relative_name,
    resolve_in_scratch,
    walk_regular_files,
    write_atomic,
)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    path = tmp_path / "scratch"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the scratch dir (same filesystem) holding a sentinel file."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret\n")
    return path


def test_relative_path_resolves_inside(scratch: Path) -> None:
    resolved = resolve_in_scratch(scratch, "a/b/../c.txt")
    assert resolved == scratch.resolve() / "a" / "c.txt"
    assert relative_name(scratch, resolved) == "a/c.txt"


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "..", "./../scratch2/x"])
def test_dotdot_escape_is_refused_with_actionable_message(scratch: Path, bad: str) -> None:
    with pytest.raises(PathEscapeError) as info:
        resolve_in_scratch(scratch, bad)
    message = str(info.value)
    assert repr(bad) in message
    assert "outside the episode's working directory" in message
    assert "use a relative path inside it" in message


@pytest.mark.parametrize("bad", ["/etc/passwd", "/proc/self/root/etc/passwd", "//etc"])
def test_absolute_paths_are_refused(scratch: Path, bad: str) -> None:
    with pytest.raises(PathEscapeError, match="is absolute; use a relative path"):
        resolve_in_scratch(scratch, bad)


@pytest.mark.parametrize("bad", ["", "   ", "a\x00b"])
def test_empty_and_nul_paths_are_refused(scratch: Path, bad: str) -> None:
    with pytest.raises(PathEscapeError):
        resolve_in_scratch(scratch, bad)


def test_non_string_path_is_refused(scratch: Path) -> None:
    with pytest.raises(PathEscapeError, match="non-empty string"):
        resolve_in_scratch(scratch, 42)  # type: ignore[arg-type]


def test_symlink_to_outside_file_is_refused(scratch: Path, outside: Path) -> None:
    os.symlink(outside / "secret.txt", scratch / "link")
    for kwargs in ({}, {"must_exist": True}, {"for_write": True}):
        with pytest.raises(PathEscapeError, match="resolves outside"):
            resolve_in_scratch(scratch, "link", **kwargs)


def test_symlink_to_proc_root_is_refused(scratch: Path) -> None:
    os.symlink("/proc/self/root", scratch / "root")
    with pytest.raises(PathEscapeError):
        resolve_in_scratch(scratch, "root/etc/passwd")


def test_symlinked_parent_directory_is_refused(scratch: Path, outside: Path) -> None:
    os.symlink(outside, scratch / "linkdir")
    with pytest.raises(PathEscapeError):
        resolve_in_scratch(scratch, "linkdir/secret.txt", must_exist=True)
    with pytest.raises(PathEscapeError):
        write_atomic(scratch, "linkdir/new.txt", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_dangling_symlink_to_outside_is_refused_for_write(scratch: Path, outside: Path) -> None:
    os.symlink(outside / "created.txt", scratch / "dangling")
    with pytest.raises(PathEscapeError):
        write_atomic(scratch, "dangling", b"pwned")
    assert not (outside / "created.txt").exists()


def test_symlink_inside_scratch_is_followed(scratch: Path) -> None:
    (scratch / "real.txt").write_text("hello\n")
    os.symlink("real.txt", scratch / "alias")
    assert resolve_in_scratch(scratch, "alias") == (scratch / "real.txt").resolve()


def test_scratch_dir_reached_through_a_symlink_works(tmp_path: Path, scratch: Path) -> None:
    os.symlink(scratch, tmp_path / "via-link")
    (scratch / "f.txt").write_text("x")
    resolved = resolve_in_scratch(tmp_path / "via-link", "f.txt", must_exist=True)
    assert resolved == (scratch / "f.txt").resolve()


def test_must_exist_and_for_write_checks(tmp_path: Path, scratch: Path) -> None:
    with pytest.raises(ScratchFileError, match=r"'nope\.txt' does not exist"):
        resolve_in_scratch(scratch, "nope.txt", must_exist=True)
    (scratch / "dir").mkdir()
    with pytest.raises(ScratchFileError, match="is a directory"):
        resolve_in_scratch(scratch, "dir", for_write=True)
    fresh = tmp_path / "not-yet"
    resolve_in_scratch(fresh, "x.txt", for_write=True)
    assert fresh.is_dir()


def test_hardlink_to_outside_file_is_refused(scratch: Path, outside: Path) -> None:
    os.link(outside / "secret.txt", scratch / "hard.txt")
    with pytest.raises(PathEscapeError, match="2 hard links"):
        open_regular_file(scratch, "hard.txt")


def test_open_refuses_directories_and_fifos_without_blocking(scratch: Path) -> None:
    (scratch / "dir").mkdir()
    with pytest.raises(ScratchFileError, match="is a directory"):
        open_regular_file(scratch, "dir")
    with pytest.raises(ScratchFileError, match="is a directory"):
        open_regular_file(scratch, ".")
    os.mkfifo(scratch / "pipe")
    with pytest.raises(ScratchFileError, match="not a regular file"):
        open_regular_file(scratch, "pipe")


def test_open_regular_file_reads_inside_file(scratch: Path) -> None:
    (scratch / "sub").mkdir()
    (scratch / "sub" / "f.txt").write_text("data")
    fd, info, resolved = open_regular_file(scratch, "sub/f.txt")
    try:
        assert os.read(fd, 100) == b"data"
        assert info.st_size == 4
        assert resolved.name == "f.txt"
    finally:
        os.close(fd)


def test_symlink_swapped_in_after_the_check_is_not_followed(scratch: Path, outside: Path) -> None:
    # Simulates a command replacing a checked directory with a symlink before the open:
    # the component-wise O_NOFOLLOW walk must fail instead of following it.
    os.symlink(outside, scratch / "swapped")
    with pytest.raises(PathEscapeError, match="symbolic link"):
        pathsafe._open_dir_chain(scratch.resolve(), ("swapped",), "swapped/x", create=True)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_write_atomic_creates_parents_and_replaces(scratch: Path) -> None:
    resolved = write_atomic(scratch, "a/b/c.txt", b"one")
    assert resolved.read_bytes() == b"one"
    write_atomic(scratch, "a/b/c.txt", b"two")
    assert (scratch / "a/b/c.txt").read_bytes() == b"two"
    assert sorted(p.name for p in (scratch / "a/b").iterdir()) == ["c.txt"]  # no temp left


def test_write_atomic_keeps_permission_bits(scratch: Path) -> None:
    script = scratch / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o750)
    write_atomic(scratch, "run.sh", b"#!/bin/sh\necho hi\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o750


def test_write_atomic_replaces_hardlink_without_touching_outside(
    scratch: Path, outside: Path
) -> None:
    os.link(outside / "secret.txt", scratch / "hard.txt")
    write_atomic(scratch, "hard.txt", b"new content")
    assert (scratch / "hard.txt").read_bytes() == b"new content"
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_write_atomic_parent_is_a_file(scratch: Path) -> None:
    (scratch / "file").write_text("x")
    with pytest.raises(ScratchFileError, match="is a file, not a directory"):
        write_atomic(scratch, "file/child.txt", b"y")


def test_concurrent_writes_never_leave_a_torn_file(scratch: Path) -> None:
    payloads = [bytes([65 + i]) * 200_000 for i in range(4)]
    threads = [
        threading.Thread(target=write_atomic, args=(scratch, "same.bin", data)) for data in payloads
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (scratch / "same.bin").read_bytes() in payloads


def test_iter_lines_cuts_long_lines_and_counts(scratch: Path) -> None:
    long_line = b"y" * (pathsafe.MAX_LINE_BYTES * 3) + b"\n"
    (scratch / "f").write_bytes(b"a\n" + long_line + b"b\nc\nd")
    with (scratch / "f").open("rb") as stream:
        lines = iter_lines(stream)
        assert next(lines) == (b"a\n", False)
        cut_line, cut = next(lines)
        assert cut and len(cut_line) == pathsafe.MAX_LINE_BYTES
        assert next(lines) == (b"b\n", False)
        assert count_remaining_lines(stream) == 2  # "c\n" and "d" without newline


def test_count_remaining_lines_gives_up_past_limit(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pathsafe, "COUNT_LINES_LIMIT", 10)
    (scratch / "f").write_bytes(b"line\n" * 1000)
    with (scratch / "f").open("rb") as stream:
        assert count_remaining_lines(stream) is None


def test_walk_skips_symlinks_and_vcs_dirs(scratch: Path, outside: Path) -> None:
    (scratch / "src").mkdir()
    (scratch / "src" / "a.py").write_text("x")
    (scratch / ".git").mkdir()
    (scratch / ".git" / "HEAD").write_text("ref")
    os.symlink(outside, scratch / "linkdir")
    os.symlink(outside / "secret.txt", scratch / "linkfile")
    found = [p.relative_to(scratch.resolve()).as_posix() for p in walk_regular_files(scratch)]
    assert found == ["src/a.py"]


def test_read_small_text_refusals(scratch: Path) -> None:
    (scratch / "ok.txt").write_text("héllo")
    assert read_small_text(scratch, "ok.txt", 100) == "héllo"
    (scratch / "bin").write_bytes(b"ab\x00cd")
    with pytest.raises(ScratchFileError, match="binary"):
        read_small_text(scratch, "bin", 100)
    (scratch / "latin").write_bytes(b"caf\xe9")
    with pytest.raises(ScratchFileError, match="not valid UTF-8"):
        read_small_text(scratch, "latin", 100)
    with pytest.raises(ScratchFileError, match="too big"):
        read_small_text(scratch, "ok.txt", 3)
