"""Head-and-tail truncation of tool results, with a marker that says what was cut.

Used twice: by process tools while they capture output (so a command printing gigabytes
never costs gigabytes) and by the dispatcher on every result (so each result respects
its tool's ``max_result_size_chars``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MARKER_TEMPLATE = "\n...[truncated: {omitted} characters omitted]...\n"


@dataclass(frozen=True, slots=True)
class Truncation:
    """A possibly shortened text and how many characters were dropped (0 if none)."""

    text: str
    omitted: int = 0

    @property
    def truncated(self) -> bool:
        return self.omitted > 0


def marker(omitted: int) -> str:
    return MARKER_TEMPLATE.format(omitted=omitted)


def join_head_tail(head: str, tail: str, omitted: int) -> str:
    """Glue a kept head and tail around the marker (no marker when nothing was dropped)."""
    return head + tail if omitted <= 0 else head + marker(omitted) + tail


def truncate_text(text: str, limit: int) -> Truncation:
    """Keep the head and the tail of ``text`` so that the result fits in ``limit`` chars."""
    if len(text) <= limit:
        return Truncation(text)
    # The marker's own length depends on the count; size it for the worst case.
    budget = max(limit - len(marker(len(text))), 0)
    head_len = budget // 2
    tail_len = budget - head_len
    omitted = len(text) - head_len - tail_len
    tail = text[len(text) - tail_len :] if tail_len else ""
    return Truncation(join_head_tail(text[:head_len], tail, omitted), omitted)


def _string_leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    if isinstance(node, str):
        return [(path, node)]
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _string_leaves(v, (*path, k))]
    if isinstance(node, list):
        return [leaf for i, v in enumerate(node) for leaf in _string_leaves(v, (*path, i))]
    return []


def _set_path(node: Any, path: tuple[Any, ...], value: str) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def truncate_result(content: str, limit: int) -> Truncation:
    """Fit a tool result into ``limit`` characters.

    A JSON object or array stays valid JSON: its longest string values are shortened
    (head + marker + tail) until the whole fits. Anything else is cut as plain text.
    """
    if len(content) <= limit:
        return Truncation(content)
    stripped = content.lstrip()
    if stripped[:1] in ("{", "["):
        fitted = _truncate_json(content, limit)
        if fitted is not None:
            return fitted
    return truncate_text(content, limit)


def _truncate_json(content: str, limit: int) -> Truncation | None:
    try:
        data = json.loads(content)
    except ValueError:
        return None
    omitted_total = 0
    for _ in range(8):
        text = _dumps(data)
        overflow = len(text) - limit
        if overflow <= 0:
            return Truncation(text, omitted_total)
        leaves = _string_leaves(data)
        if not leaves:
            return None
        path, longest = max(leaves, key=lambda leaf: len(leaf[1]))
        if not path:
            return None
        # JSON escaping makes the encoded string longer than the raw one; aim past it.
        encoded_len = len(_dumps(longest))
        ratio = encoded_len / max(len(longest), 1)
        target = int(len(longest) - overflow / ratio) - len(marker(len(longest))) - 8
        if target <= 0 and len(longest) < 64:
            return None
        cut = truncate_text(longest, max(target, 0))
        if cut.omitted == 0:
            return None
        omitted_total += cut.omitted
        _set_path(data, path, cut.text)
    return None
