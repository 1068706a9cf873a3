"""File tools: read, write, patch and search files in the episode's scratch directory.

Every path goes through ``tools.pathsafe``, so nothing outside the scratch directory is
read or changed, even through symlinks or hard links a command created mid-episode.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from tools.pathsafe import (
    PathEscapeError,
    ScratchFileError,
    count_remaining_lines,
    is_binary,
    iter_lines,
    open_regular_file,
    read_small_text,
    relative_name,
    resolve_in_scratch,
    walk_regular_files,
    write_atomic,
)
from tools.registry import registry, tool_error, tool_result
from tools.settings import ToolContext
from tools.truncate import truncate_text

logger = logging.getLogger(__name__)

MAX_WRITE_BYTES = 10 * 1024 * 1024
MAX_SEARCH_FILE_BYTES = 2 * 1024 * 1024
MAX_SEARCH_FILES = 20_000
MAX_DIFF_CHARS = 4000
NO_CONTEXT = "this tool needs an episode context (ctx with a scratch directory); none was given"

ToolFn = Callable[[dict[str, Any], ToolContext], str]


class ArgError(ValueError):
    """Raised for a missing or malformed argument; becomes an ``{"error"}`` result."""


def _file_tool(fn: ToolFn) -> Callable[..., str]:
    """Adapt ``fn(args, ctx)`` to the handler contract; expected failures become errors."""

    @functools.wraps(fn)
    def handler(args: dict[str, Any], **kwargs: Any) -> str:
        ctx = kwargs.get("ctx")
        if not isinstance(ctx, ToolContext):
            return tool_error(NO_CONTEXT)
        try:
            return fn(args, ctx)
        except (ArgError, PathEscapeError, ScratchFileError) as exc:
            return tool_error(str(exc))
        except OSError as exc:
            logger.debug("%s failed", fn.__name__, exc_info=True)
            return tool_error(f"{fn.__name__} failed: {exc.strerror or exc}")

    return handler


def _str_arg(args: dict[str, Any], key: str, *, required: bool = True) -> str:
    value = args.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ArgError(f"argument {key!r} is required and must be a string")
    return value


def _int_arg(args: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ArgError(f"argument {key!r} must be an integer from {low} to {high}")
    return value


def _schema(
    name: str, description: str, properties: dict[str, Any], *required: str
) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": list(required)}
    return {"name": name, "description": description, "parameters": params}


_PATH = {"type": "string", "description": "File path relative to the working directory."}


# -- read_file ----------------------------------------------------------------------------


def _read_range(stream: BinaryIO, offset: int, limit: int, budget: int) -> dict[str, Any]:
    shown: list[str] = []
    used, consumed, cut_any, over_budget, at_eof = 0, 0, False, False, True
    for raw, cut in iter_lines(stream):
        consumed += 1
        if consumed < offset:
            continue
        text = raw.decode("utf-8", errors="replace").removesuffix("\n").removesuffix("\r")
        rendered = f"{consumed:6d}|{text}" + (" [line cut]" if cut else "")
        cost = len(json.dumps(rendered, ensure_ascii=False))
        if used + cost > budget and shown:
            over_budget, at_eof = True, False
            break
        if used + cost > budget:  # a first line alone over budget is cut, not dropped
            rendered, cut, over_budget = rendered[: budget // 6] + " [line cut]", True, True
        shown.append(rendered)
        used, cut_any = used + cost, cut_any or cut
        if len(shown) >= limit or over_budget:
            at_eof = False
            break
    rest = 0 if at_eof else count_remaining_lines(stream)
    total = None if rest is None else consumed + rest
    end_line = offset + len(shown) - 1
    result: dict[str, Any] = {
        "content": "\n".join(shown),
        "total_lines": total,
        "start_line": offset,
        "end_line": end_line,
        "truncated": cut_any or total is None or end_line < total,
    }
    if over_budget:
        result["hint"] = f"output budget reached; continue with offset={end_line + 1}"
    return result


@_file_tool
def read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path = _str_arg(args, "path")
    offset = _int_arg(args, "offset", 1, 1, 10**9)
    limit = _int_arg(args, "limit", 500, 1, 5000)
    fd, _info, _resolved = open_regular_file(ctx.scratch_dir, path)
    with os.fdopen(fd, "rb") as stream:
        if is_binary(fd):
            return tool_error(f"{path!r} is a binary file; read_file only reads text")
        result = _read_range(stream, offset, limit, max(ctx.max_result_chars - 400, 100))
    total = result["total_lines"]
    if not result["content"] and offset > 1 and total is not None and offset > total:
        return tool_error(f"offset {offset} is past the end of {path!r} ({total} lines)")
    return tool_result({"path": path, **result})


registry.register(
    name="read_file",
    toolset="file",
    emoji="📖",
    handler=read_file,
    schema=_schema(
        "read_file",
        "Read a text file with line numbers ('    12|text'): `limit` lines from line "
        "`offset`. Page through long files with offset. Binary files are refused.",
        {
            "path": _PATH,
            "offset": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "Lines (default 500)."},
        },
        "path",
    ),
)


# -- write_file and patch ----------------------------------------------------------------


@_file_tool
def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path = _str_arg(args, "path")
    content = _str_arg(args, "content")
    # Characters never outnumber UTF-8 bytes, so a huge string is refused before encoding.
    data = b"" if len(content) > MAX_WRITE_BYTES else content.encode("utf-8", errors="replace")
    if len(content) > MAX_WRITE_BYTES or len(data) > MAX_WRITE_BYTES:
        raise ArgError(
            f"content is over {MAX_WRITE_BYTES} bytes; write_file accepts at most that. "
            "Write a smaller file, or generate large files with a command"
        )
    resolved = write_atomic(ctx.scratch_dir, path, data)
    return tool_result(path=relative_name(ctx.scratch_dir, resolved), bytes_written=len(data))


registry.register(
    name="write_file",
    toolset="file",
    emoji="✍️",
    handler=write_file,
    schema=_schema(
        "write_file",
        "Create or overwrite a text file with `content`, creating parent directories. "
        "Replaces the whole file; use patch for small edits. At most 10 MB.",
        {"path": _PATH, "content": {"type": "string", "description": "The full new content."}},
        "path",
        "content",
    ),
)


def _not_found_hint(text: str, old: str) -> str:
    if " ".join(old.split()) in " ".join(text.split()):
        return "it matches only if whitespace is ignored: indentation and spaces must match exactly"
    wanted = next((line.strip() for line in old.splitlines() if line.strip()), "")
    lines = [line.strip() for line in text.splitlines()[:20_000]]
    close = difflib.get_close_matches(wanted, lines, n=1, cutoff=0.6) if wanted else []
    if not close:
        return "no similar line found; read the file first and copy the text exactly"
    return f"closest line is {close[0]!r} (line {lines.index(close[0]) + 1}); match it exactly"


def _diff(path: str, before: str, after: str) -> str:
    if len(before) + len(after) > 2_000_000:
        return "(diff omitted: file too large)"
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
        n=2,
    )
    return truncate_text("".join(lines), MAX_DIFF_CHARS).text


@_file_tool
def patch(args: dict[str, Any], ctx: ToolContext) -> str:
    path = _str_arg(args, "path")
    old, new = _str_arg(args, "old_string"), _str_arg(args, "new_string")
    replace_all = args.get("replace_all", False)
    if not isinstance(replace_all, bool):
        raise ArgError("argument 'replace_all' must be true or false")
    if not old:
        raise ArgError("old_string is empty; give the exact text to replace")
    if old == new:
        raise ArgError("old_string and new_string are identical; nothing to change")
    text = read_small_text(ctx.scratch_dir, path, MAX_WRITE_BYTES)
    count = text.count(old)
    if count == 0:
        return tool_error(f"old_string not found in {path!r}; {_not_found_hint(text, old)}")
    if count > 1 and not replace_all:
        return tool_error(
            f"old_string occurs {count} times in {path!r}; add surrounding lines to make it "
            "unique, or set replace_all to true to replace every occurrence"
        )
    updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    resolved = write_atomic(ctx.scratch_dir, path, updated.encode("utf-8", errors="replace"))
    shown = relative_name(ctx.scratch_dir, resolved)
    return tool_result(path=shown, replacements=count, diff=_diff(shown, text, updated))


registry.register(
    name="patch",
    toolset="file",
    emoji="🩹",
    handler=patch,
    schema=_schema(
        "patch",
        "Replace exact text in a file and return a diff. `old_string` must match exactly, "
        "whitespace included, and be unique unless replace_all is true.",
        {
            "path": _PATH,
            "old_string": {"type": "string", "description": "Exact text to replace."},
            "new_string": {"type": "string", "description": "Replacement text."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence."},
        },
        "path",
        "old_string",
        "new_string",
    ),
)


# -- search_files -------------------------------------------------------------------------


def _grep_file(
    ctx: ToolContext, rel: str, regex: re.Pattern[str], room: int
) -> list[dict[str, Any]]:
    """Up to ``room`` matching lines of one file; unreadable files give none."""
    try:
        fd, info, _resolved = open_regular_file(ctx.scratch_dir, rel)
    except (PathEscapeError, ScratchFileError, OSError):
        return []  # hard-linked, vanished or swapped for a symlink: not searched
    hits: list[dict[str, Any]] = []
    with os.fdopen(fd, "rb") as stream:
        if info.st_size > MAX_SEARCH_FILE_BYTES or is_binary(fd):
            return []
        for number, (raw, _cut) in enumerate(iter_lines(stream), start=1):
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if regex.search(text):
                hits.append({"file": rel, "line": number, "text": text[:300]})
                if len(hits) >= room:
                    break
    return hits


def _search(ctx: ToolContext, top: Path, regex: re.Pattern[str], args: dict[str, Any]) -> str:
    target = args.get("target", "content")
    if target not in ("content", "files"):
        raise ArgError("argument 'target' must be 'content' or 'files'")
    glob = _str_arg(args, "file_glob", required=False)
    max_results = _int_arg(args, "max_results", 50, 1, 1000)
    budget = max(ctx.max_result_chars - 400, 100)
    found: list[Any] = []
    used, visited, truncated = 0, 0, False
    for file in walk_regular_files(top):
        visited += 1
        rel = relative_name(ctx.scratch_dir, file)
        if glob and not fnmatch.fnmatch(rel if "/" in glob else file.name, glob):
            continue
        if target == "files":
            hits: list[Any] = [rel] if regex.search(rel) else []
        else:
            hits = _grep_file(ctx, rel, regex, max_results - len(found) + 1)
        # One hit past the limit proves there are more, so the walk stops right there.
        for hit in hits:
            used += len(json.dumps(hit, ensure_ascii=False)) + 2
            truncated = len(found) >= max_results or used > budget
            if truncated:
                break
            found.append(hit)
        truncated = truncated or visited >= MAX_SEARCH_FILES
        if truncated:
            break
    key = "files" if target == "files" else "matches"
    return tool_result({key: found, "count": len(found), "truncated": truncated})


@_file_tool
def search_files(args: dict[str, Any], ctx: ToolContext) -> str:
    pattern = _str_arg(args, "pattern")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ArgError(f"invalid regular expression {pattern!r}: {exc}") from exc
    path = _str_arg(args, "path", required=False) or "."
    top = resolve_in_scratch(ctx.scratch_dir, path, must_exist=True)
    if not top.is_dir():
        raise ArgError(f"{path!r} is not a directory; search_files searches a directory")
    return _search(ctx, top, regex, args)


registry.register(
    name="search_files",
    toolset="file",
    emoji="🔎",
    handler=search_files,
    schema=_schema(
        "search_files",
        "Search the working directory. target 'content' (default): lines matching a regex, "
        "as file, line, text. target 'files': file paths matching the regex.",
        {
            "pattern": {"type": "string", "description": "Python regular expression."},
            "path": {"type": "string", "description": "Directory to search (default '.')."},
            "target": {"type": "string", "enum": ["content", "files"]},
            "file_glob": {"type": "string", "description": "Only files matching, e.g. '*.py'."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        "pattern",
    ),
)
