"""The ``todo`` tool: a per-episode task list (folder form: schema in ``schema.json``).

The list lives in ``ctx.state["todo"]``, owned by the episode, so two episodes on one
worker never see each other's tasks and nothing accumulates in module globals.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tools.registry import tool_error, tool_result
from tools.settings import ToolContext

logger = logging.getLogger(__name__)

STATE_KEY = "todo"
STATUSES = ("pending", "in_progress", "completed", "cancelled")
MAX_ITEMS = 200
MAX_CONTENT_CHARS = 2000


class TodoError(ValueError):
    """Raised for an invalid ``todos`` argument; the message goes back to the model."""


def _item_id(index: int, raw: Mapping[str, Any]) -> str:
    value = raw.get("id")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # models often number their tasks
    if not isinstance(value, str) or not value.strip():
        raise TodoError(f"todos[{index}] needs an 'id' (a non-empty string)")
    return value.strip()


def _validate(index: int, raw: Any, existing: Mapping[str, str] | None) -> dict[str, str]:
    """One checked item; ``existing`` is the stored item of that id when merging."""
    if not isinstance(raw, Mapping):
        raise TodoError(f"todos[{index}] must be an object with id, content and status")
    item_id = _item_id(index, raw)
    content = raw.get("content")
    if content is None and existing is not None:
        content = existing["content"]
    if not isinstance(content, str) or not content.strip():
        raise TodoError(f"todos[{index}] (id {item_id!r}) needs a 'content' (a non-empty string)")
    if len(content) > MAX_CONTENT_CHARS:
        raise TodoError(f"todos[{index}] content is over {MAX_CONTENT_CHARS} characters")
    status = raw.get("status")
    if status is None:
        status = existing["status"] if existing is not None else "pending"
    if status not in STATUSES:
        raise TodoError(f"todos[{index}] has status {status!r}; use one of: {', '.join(STATUSES)}")
    return {"id": item_id, "content": content.strip(), "status": status}


def _check_unique(todos: list[Any]) -> None:
    seen: set[str] = set()
    for index, raw in enumerate(todos):
        if isinstance(raw, Mapping):
            item_id = _item_id(index, raw)
            if item_id in seen:
                raise TodoError(f"id {item_id!r} appears more than once in todos")
            seen.add(item_id)


def _replace(todos: list[Any]) -> list[dict[str, str]]:
    return [_validate(i, raw, None) for i, raw in enumerate(todos)]


def _merge(current: list[dict[str, str]], todos: list[Any]) -> list[dict[str, str]]:
    merged = [dict(item) for item in current]
    position = {item["id"]: i for i, item in enumerate(merged)}
    for index, raw in enumerate(todos):
        item_id = _item_id(index, raw) if isinstance(raw, Mapping) else None
        at = position.get(item_id) if item_id is not None else None
        item = _validate(index, raw, merged[at] if at is not None else None)
        if at is None:
            position[item["id"]] = len(merged)
            merged.append(item)
        else:
            merged[at] = item
    return merged


def _render(todos: list[dict[str, str]]) -> str:
    summary = {status: 0 for status in STATUSES}
    for item in todos:
        summary[item["status"]] += 1
    summary["total"] = len(todos)
    return tool_result(todos=[dict(item) for item in todos], summary=summary)


def handler(args: dict[str, Any], **kwargs: Any) -> str:
    """Read the list (no ``todos``), replace it, or merge into it (``merge=true``)."""
    ctx = kwargs.get("ctx")
    if not isinstance(ctx, ToolContext):
        return tool_error("the todo tool needs an episode context (ctx); none was given")
    current: list[dict[str, str]] = ctx.state.get(STATE_KEY, [])
    todos, merge = args.get("todos"), args.get("merge")
    merge = False if merge is None else merge
    if not isinstance(merge, bool):
        return tool_error("argument 'merge' must be true or false")
    if todos is None:
        return _render(current)
    if not isinstance(todos, list):
        return tool_error("argument 'todos' must be an array of {id, content, status} objects")
    try:
        _check_unique(todos)
        updated = _merge(current, todos) if merge else _replace(todos)
    except TodoError as exc:
        return tool_error(str(exc))
    if len(updated) > MAX_ITEMS:
        return tool_error(f"the list would hold {len(updated)} items; the limit is {MAX_ITEMS}")
    ctx.state[STATE_KEY] = updated
    logger.debug("task %s: todo list now has %d items", ctx.task_id, len(updated))
    return _render(updated)
