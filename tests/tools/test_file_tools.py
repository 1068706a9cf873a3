"""The file toolset: read_file, write_file, patch, search_files on real files."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import tools.file_tools as ft
from tools import pathsafe
from tools.registry import registry
from tools.settings import ToolContext

SENTINEL = "outside sentinel: must never change\n"


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(task_id="t", scratch_dir=tmp_path / "scratch")


@pytest.fixture
def scratch(ctx: ToolContext) -> Path:
    ctx.scratch_dir.mkdir(parents=True, exist_ok=True)
    return ctx.scratch_dir


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the scratch dir, on the same filesystem, with a sentinel file."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text(SENTINEL)
    return path


def call(fn: Any, ctx: ToolContext, **args: Any) -> dict[str, Any]:
    result = fn(args, task_id=ctx.task_id, ctx=ctx)
    assert isinstance(result, str)
    decoded: dict[str, Any] = json.loads(result)
    return decoded


def assert_outside_untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == SENTINEL


# -- registration and context -------------------------------------------------------------


def test_tools_are_registered_in_the_file_toolset() -> None:
    for name in ("read_file", "write_file", "patch", "search_files"):
        entry = registry.get_entry(name)
        assert entry is not None and entry.toolset == "file"
        assert entry.schema["parameters"]["type"] == "object"
        assert entry.module == "tools.file_tools"


@pytest.mark.parametrize("fn", [ft.read_file, ft.write_file, ft.patch, ft.search_files])
def test_missing_context_is_an_error_not_a_crash(fn: Any) -> None:
    assert "episode context" in json.loads(fn({"path": "x"}))["error"]


def test_dispatch_through_the_registry(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "notes.txt").write_text("alpha\nbeta\n")
    result = registry.dispatch("read_file", {"path": "notes.txt"}, task_id="t", ctx=ctx)
    decoded = json.loads(result)
    assert decoded["content"] == "     1|alpha\n     2|beta"
    assert decoded["total_lines"] == 2


# -- read_file -------------------------------------------------------------------------------


def test_read_whole_file(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "a.txt").write_text("one\ntwo\r\nthree")
    result = call(ft.read_file, ctx, path="a.txt")
    assert result["content"] == "     1|one\n     2|two\n     3|three"
    assert (result["total_lines"], result["start_line"], result["end_line"]) == (3, 1, 3)
    assert result["truncated"] is False


def test_read_range_and_paging(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    result = call(ft.read_file, ctx, path="n.txt", offset=10, limit=3)
    assert result["content"].splitlines() == ["    10|line 10", "    11|line 11", "    12|line 12"]
    assert result["total_lines"] == 100 and result["end_line"] == 12
    assert result["truncated"] is True
    tail = call(ft.read_file, ctx, path="n.txt", offset=99, limit=50)
    assert tail["end_line"] == 100 and tail["truncated"] is False


def test_read_empty_file(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "empty").write_text("")
    result = call(ft.read_file, ctx, path="empty")
    assert result["content"] == "" and result["total_lines"] == 0
    assert result["truncated"] is False


def test_read_errors(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "a.txt").write_text("x\n")
    (scratch / "dir").mkdir()
    (scratch / "bin").write_bytes(b"\x7fELF\x00\x00binary")
    assert call(ft.read_file, ctx, path="missing.txt") == {
        "error": "file 'missing.txt' does not exist"
    }
    assert "is a directory" in call(ft.read_file, ctx, path="dir")["error"]
    assert "binary file" in call(ft.read_file, ctx, path="bin")["error"]
    assert "past the end" in call(ft.read_file, ctx, path="a.txt", offset=5)["error"]
    assert "'offset' must be an integer" in call(ft.read_file, ctx, path="a.txt", offset=0)["error"]
    assert "'limit'" in call(ft.read_file, ctx, path="a.txt", limit="many")["error"]
    assert "'path' is required" in call(ft.read_file, ctx)["error"]


def test_read_accepts_numeric_strings(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "a.txt").write_text("x\ny\n")
    assert call(ft.read_file, ctx, path="a.txt", offset="2")["content"] == "     2|y"


def test_read_decodes_invalid_utf8_with_replacement(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "latin.txt").write_bytes(b"caf\xe9\n")
    assert call(ft.read_file, ctx, path="latin.txt")["content"] == "     1|caf\ufffd"


def test_read_respects_the_result_budget(tmp_path: Path, scratch: Path) -> None:
    small = ToolContext(task_id="t", scratch_dir=scratch, max_result_chars=1000)
    (scratch / "big.txt").write_text("".join(f"{'z' * 60} {i}\n" for i in range(500)))
    raw = ft.read_file({"path": "big.txt"}, ctx=small)
    result = json.loads(raw)
    assert len(raw) <= 1000
    assert result["truncated"] is True and result["end_line"] < 500
    assert f"offset={result['end_line'] + 1}" in result["hint"]


def test_read_cuts_a_giant_line(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "one-line.txt").write_bytes(b"q" * 3_000_000)
    result = call(ft.read_file, ctx, path="one-line.txt")
    assert result["content"].endswith("[line cut]")
    assert len(result["content"]) < 5000
    assert result["total_lines"] == 1 and result["truncated"] is True


def test_read_lines_of_a_50mb_file_quickly(ctx: ToolContext, scratch: Path) -> None:
    head = b"".join(b"numbered %d\n" % i for i in range(1, 101))
    with (scratch / "huge.log").open("wb") as stream:
        stream.write(head)
        block = b"filler " * 14 + b"\n"  # 100 bytes a line
        for _ in range(50):
            stream.write(block * 10_000)
    start = time.monotonic()
    result = call(ft.read_file, ctx, path="huge.log", offset=10, limit=11)
    elapsed = time.monotonic() - start
    assert result["content"].splitlines()[0] == "    10|numbered 10"
    assert result["content"].splitlines()[-1] == "    20|numbered 20"
    assert result["total_lines"] == 100 + 500_000
    assert elapsed < 2.0


def test_read_reports_unknown_total_past_count_limit(
    ctx: ToolContext, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pathsafe, "COUNT_LINES_LIMIT", 1024)
    (scratch / "long.txt").write_bytes(b"row\n" * 10_000)
    result = call(ft.read_file, ctx, path="long.txt", limit=2)
    assert result["total_lines"] is None and result["truncated"] is True


# -- escapes, for every tool ----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "/proc/self/root/etc/passwd"])
def test_escaping_paths_are_errors_for_all_tools(ctx: ToolContext, scratch: Path, bad: str) -> None:
    results = [
        call(ft.read_file, ctx, path=bad),
        call(ft.write_file, ctx, path=bad, content="pwned"),
        call(ft.patch, ctx, path=bad, old_string="root", new_string="x"),
        call(ft.search_files, ctx, pattern="root", path=bad),
    ]
    for result in results:
        assert set(result) == {"error"}
        assert "relative path" in result["error"]
    assert not (scratch.parent / "x").exists()


def test_symlink_to_outside_file_is_refused(ctx: ToolContext, scratch: Path, outside: Path) -> None:
    os.symlink(outside / "secret.txt", scratch / "link")  # as `ln -s` in a command would
    assert "outside" in call(ft.read_file, ctx, path="link")["error"]
    assert "outside" in call(ft.write_file, ctx, path="link", content="pwned")["error"]
    patched = call(ft.patch, ctx, path="link", old_string="outside", new_string="pwned")
    assert "outside" in patched["error"]
    assert_outside_untouched(outside)


def test_symlinked_parent_directory_is_refused(
    ctx: ToolContext, scratch: Path, outside: Path
) -> None:
    os.symlink(outside, scratch / "linkdir")
    assert "error" in call(ft.read_file, ctx, path="linkdir/secret.txt")
    assert "error" in call(ft.write_file, ctx, path="linkdir/new.txt", content="x")
    assert "error" in call(ft.write_file, ctx, path="linkdir/sub/new.txt", content="x")
    assert "error" in call(
        ft.patch, ctx, path="linkdir/secret.txt", old_string="sentinel", new_string="x"
    )
    assert "error" in call(ft.search_files, ctx, pattern="sentinel", path="linkdir")
    assert_outside_untouched(outside)


def test_hardlink_to_outside_file_is_refused(
    ctx: ToolContext, scratch: Path, outside: Path
) -> None:
    os.link(outside / "secret.txt", scratch / "hard.txt")
    assert "hard links" in call(ft.read_file, ctx, path="hard.txt")["error"]
    patched = call(ft.patch, ctx, path="hard.txt", old_string="sentinel", new_string="pwned")
    assert "hard links" in patched["error"]
    assert call(ft.search_files, ctx, pattern="sentinel")["matches"] == []
    # Overwriting replaces the directory entry: the outside inode keeps its content.
    assert call(ft.write_file, ctx, path="hard.txt", content="mine")["bytes_written"] == 4
    assert (scratch / "hard.txt").read_text() == "mine"
    assert_outside_untouched(outside)


def test_writing_through_a_dangling_symlink_is_refused(
    ctx: ToolContext, scratch: Path, outside: Path
) -> None:
    os.symlink(outside / "planted.txt", scratch / "dangling")
    assert "outside" in call(ft.write_file, ctx, path="dangling", content="pwned")["error"]
    assert_outside_untouched(outside)


# -- write_file --------------------------------------------------------------------------------


def test_write_creates_parents_and_the_scratch_dir(ctx: ToolContext) -> None:
    assert not ctx.scratch_dir.exists()
    result = call(ft.write_file, ctx, path="src/pkg/mod.py", content="print('é')\n")
    assert result == {"path": "src/pkg/mod.py", "bytes_written": len("print('é')\n".encode())}
    assert (ctx.scratch_dir / "src/pkg/mod.py").read_text() == "print('é')\n"


def test_write_overwrites_and_keeps_mode(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "run.sh").write_text("old")
    (scratch / "run.sh").chmod(0o755)
    call(ft.write_file, ctx, path="run.sh", content="#!/bin/sh\n")
    assert (scratch / "run.sh").read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE((scratch / "run.sh").stat().st_mode) == 0o755
    assert sorted(p.name for p in scratch.iterdir()) == ["run.sh"]


def test_write_errors(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "dir").mkdir()
    (scratch / "file").write_text("x")
    too_big = "x" * (ft.MAX_WRITE_BYTES + 1)
    assert "at most" in call(ft.write_file, ctx, path="big.txt", content=too_big)["error"]
    assert not (scratch / "big.txt").exists()
    assert "'content'" in call(ft.write_file, ctx, path="a.txt", content=5)["error"]
    assert "'content'" in call(ft.write_file, ctx, path="a.txt")["error"]
    assert "is a directory" in call(ft.write_file, ctx, path="dir", content="x")["error"]
    assert "not a directory" in call(ft.write_file, ctx, path="file/x", content="x")["error"]


def test_write_empty_content(ctx: ToolContext, scratch: Path) -> None:
    assert call(ft.write_file, ctx, path="empty", content="")["bytes_written"] == 0
    assert (scratch / "empty").read_bytes() == b""


# -- patch ---------------------------------------------------------------------------------------


def test_patch_replaces_once_and_returns_a_diff(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "m.py").write_text("def f():\n    return 1\n\nprint(f())\n")
    result = call(ft.patch, ctx, path="m.py", old_string="return 1", new_string="return 2")
    assert result["path"] == "m.py" and result["replacements"] == 1
    assert "-    return 1" in result["diff"] and "+    return 2" in result["diff"]
    assert result["diff"].startswith("--- a/m.py\n+++ b/m.py")
    assert (scratch / "m.py").read_text() == "def f():\n    return 2\n\nprint(f())\n"


def test_patch_multiple_occurrences(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "c.txt").write_text("x = 1\nx = 1\nx = 1\n")
    error = call(ft.patch, ctx, path="c.txt", old_string="x = 1", new_string="x = 2")["error"]
    assert "occurs 3 times" in error and "replace_all" in error
    assert (scratch / "c.txt").read_text() == "x = 1\nx = 1\nx = 1\n"
    result = call(
        ft.patch, ctx, path="c.txt", old_string="x = 1", new_string="x = 2", replace_all=True
    )
    assert result["replacements"] == 3
    assert (scratch / "c.txt").read_text() == "x = 2\nx = 2\nx = 2\n"


def test_patch_not_found_hints(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "h.py").write_text("def compute_total(items):\n    return sum(items)\n")
    closest = call(
        ft.patch, ctx, path="h.py", old_string="def compute_totals(items):", new_string="x"
    )["error"]
    assert "not found" in closest and "closest line" in closest and "line 1" in closest
    spacing = call(
        ft.patch, ctx, path="h.py", old_string="def  compute_total(items):", new_string="x"
    )["error"]
    assert "whitespace" in spacing
    nothing = call(ft.patch, ctx, path="h.py", old_string="zzzzqqq", new_string="x")["error"]
    assert "no similar line" in nothing


def test_patch_errors(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "p.txt").write_text("text\n")
    (scratch / "bin").write_bytes(b"\x00\x01text")
    assert "empty" in call(ft.patch, ctx, path="p.txt", old_string="", new_string="x")["error"]
    same = call(ft.patch, ctx, path="p.txt", old_string="text", new_string="text")
    assert "identical" in same["error"]
    missing = call(ft.patch, ctx, path="nope.txt", old_string="a", new_string="b")
    assert missing == {"error": "file 'nope.txt' does not exist"}
    assert "binary" in call(ft.patch, ctx, path="bin", old_string="text", new_string="x")["error"]
    bad_flag = call(
        ft.patch, ctx, path="p.txt", old_string="text", new_string="x", replace_all="yes"
    )
    assert "replace_all" in bad_flag["error"]
    assert "'new_string'" in call(ft.patch, ctx, path="p.txt", old_string="text")["error"]
    assert (scratch / "p.txt").read_text() == "text\n"


def test_patch_diff_is_capped(ctx: ToolContext, scratch: Path) -> None:
    (scratch / "many.txt").write_text("a\n" * 5000)
    result = call(ft.patch, ctx, path="many.txt", old_string="a", new_string="b", replace_all=True)
    assert result["replacements"] == 5000
    assert len(result["diff"]) <= ft.MAX_DIFF_CHARS
    assert "truncated" in result["diff"]


# -- search_files ------------------------------------------------------------------------------


@pytest.fixture
def tree(scratch: Path) -> Path:
    (scratch / "src").mkdir()
    (scratch / "src" / "app.py").write_text("import os\n\ndef main():\n    return os.getcwd()\n")
    (scratch / "src" / "util.py").write_text("def helper():\n    pass\n")
    (scratch / "README.md").write_text("Call main() to start.\n")
    (scratch / "data.bin").write_bytes(b"main\x00\x00")
    return scratch


def test_search_content(ctx: ToolContext, tree: Path) -> None:
    result = call(ft.search_files, ctx, pattern=r"def \w+")
    assert result["matches"] == [
        {"file": "src/app.py", "line": 3, "text": "def main():"},
        {"file": "src/util.py", "line": 1, "text": "def helper():"},
    ]
    assert result["count"] == 2 and result["truncated"] is False


def test_search_skips_binary_and_respects_glob_and_path(ctx: ToolContext, tree: Path) -> None:
    everywhere = call(ft.search_files, ctx, pattern="main")
    assert {m["file"] for m in everywhere["matches"]} == {"README.md", "src/app.py"}
    only_md = call(ft.search_files, ctx, pattern="main", file_glob="*.md")
    assert [m["file"] for m in only_md["matches"]] == ["README.md"]
    in_src = call(ft.search_files, ctx, pattern="main", path="src")
    assert [m["file"] for m in in_src["matches"]] == ["src/app.py"]
    nested_glob = call(ft.search_files, ctx, pattern="def", file_glob="src/u*.py")
    assert [m["file"] for m in nested_glob["matches"]] == ["src/util.py"]


def test_search_file_names(ctx: ToolContext, tree: Path) -> None:
    result = call(ft.search_files, ctx, pattern=r"\.py$", target="files")
    assert result == {"files": ["src/app.py", "src/util.py"], "count": 2, "truncated": False}


def test_search_stops_at_max_results(ctx: ToolContext, scratch: Path) -> None:
    for i in range(5):
        (scratch / f"f{i}.txt").write_text("hit\nhit\n")
    result = call(ft.search_files, ctx, pattern="hit", max_results=3)
    assert result["count"] == 3 and result["truncated"] is True
    exact = call(ft.search_files, ctx, pattern="hit", max_results=10)
    assert exact["count"] == 10 and exact["truncated"] is False


def test_search_does_not_follow_symlinks(ctx: ToolContext, tree: Path, outside: Path) -> None:
    os.symlink(outside, tree / "linkdir")
    os.symlink(outside / "secret.txt", tree / "linkfile")
    assert call(ft.search_files, ctx, pattern="sentinel")["matches"] == []
    names = call(ft.search_files, ctx, pattern="link", target="files")["files"]
    assert names == []


def test_search_errors(ctx: ToolContext, tree: Path) -> None:
    assert "invalid regular expression" in call(ft.search_files, ctx, pattern="(")["error"]
    assert "does not exist" in call(ft.search_files, ctx, pattern="x", path="nope")["error"]
    not_dir = call(ft.search_files, ctx, pattern="x", path="README.md")
    assert "not a directory" in not_dir["error"]
    assert "'target'" in call(ft.search_files, ctx, pattern="x", target="both")["error"]
    assert "'max_results'" in call(ft.search_files, ctx, pattern="x", max_results=0)["error"]
    assert "'pattern'" in call(ft.search_files, ctx)["error"]
