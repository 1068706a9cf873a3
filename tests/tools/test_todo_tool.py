"""The folder-form todo tool: schema file, per-episode state, replace and merge."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tools.settings import ToolContext

TODO_DIR = Path(__file__).resolve().parents[2] / "tools" / "todo"


def _load_handler_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "todo_handler_under_test", TODO_DIR / "handler.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HANDLER_MODULE = _load_handler_module()
handler: Callable[..., str] = HANDLER_MODULE.handler


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(task_id="t", scratch_dir=tmp_path / "scratch")


def call(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    result = handler(args, task_id=ctx.task_id, ctx=ctx)
    assert isinstance(result, str)
    decoded: dict[str, Any] = json.loads(result)
    return decoded


def test_schema_file_is_an_openai_function_schema_with_toolset() -> None:
    spec = json.loads((TODO_DIR / "schema.json").read_text(encoding="utf-8"))
    assert spec["name"] == "todo" and spec["toolset"] == "todo"
    assert spec["parameters"]["type"] == "object"
    item = spec["parameters"]["properties"]["todos"]["items"]
    assert item["properties"]["status"]["enum"] == [
        "pending",
        "in_progress",
        "completed",
        "cancelled",
    ]
    allowed = {"name", "description", "parameters", "toolset", "requires_env", "emoji"}
    assert set(spec) <= allowed | {"max_result_size_chars"}


def test_handler_module_does_not_register_itself() -> None:
    source = (TODO_DIR / "handler.py").read_text(encoding="utf-8")
    assert "registry.register" not in source and "import registry" not in source


def test_empty_list_is_read_without_arguments(ctx: ToolContext) -> None:
    assert call(ctx) == {
        "todos": [],
        "summary": {"pending": 0, "in_progress": 0, "completed": 0, "cancelled": 0, "total": 0},
    }


def test_replace_sets_the_list_and_defaults_status(ctx: ToolContext) -> None:
    result = call(
        ctx,
        todos=[
            {"id": "1", "content": "write tests", "status": "in_progress"},
            {"id": "2", "content": "fix bug"},
        ],
    )
    assert result["todos"] == [
        {"id": "1", "content": "write tests", "status": "in_progress"},
        {"id": "2", "content": "fix bug", "status": "pending"},
    ]
    assert result["summary"]["in_progress"] == 1 and result["summary"]["pending"] == 1
    assert call(ctx)["todos"] == result["todos"]  # read back from ctx.state
    replaced = call(ctx, todos=[{"id": "9", "content": "only this"}], merge=False)
    assert [t["id"] for t in replaced["todos"]] == ["9"]
    assert ctx.state["todo"] == replaced["todos"]


def test_merge_updates_by_id_and_appends(ctx: ToolContext) -> None:
    call(ctx, todos=[{"id": "a", "content": "first"}, {"id": "b", "content": "second"}])
    result = call(
        ctx,
        merge=True,
        todos=[
            {"id": "a", "status": "completed"},  # content kept
            {"id": "c", "content": "third", "status": "in_progress"},
            {"id": "b", "content": "second, reworded"},  # status kept
        ],
    )
    assert result["todos"] == [
        {"id": "a", "content": "first", "status": "completed"},
        {"id": "b", "content": "second, reworded", "status": "pending"},
        {"id": "c", "content": "third", "status": "in_progress"},
    ]
    assert result["summary"] == {
        "pending": 1,
        "in_progress": 1,
        "completed": 1,
        "cancelled": 0,
        "total": 3,
    }


def test_lists_are_per_context(tmp_path: Path) -> None:
    first = ToolContext(task_id="one", scratch_dir=tmp_path / "1")
    second = ToolContext(task_id="two", scratch_dir=tmp_path / "2")
    call(first, todos=[{"id": "1", "content": "episode one task"}])
    assert call(second)["todos"] == []
    call(second, todos=[{"id": "1", "content": "episode two task"}])
    assert call(first)["todos"][0]["content"] == "episode one task"
    assert call(second)["todos"][0]["content"] == "episode two task"


def test_numeric_ids_are_accepted_as_strings(ctx: ToolContext) -> None:
    assert call(ctx, todos=[{"id": 3, "content": "x"}])["todos"][0]["id"] == "3"


@pytest.mark.parametrize(
    ("todos", "expected"),
    [
        ([{"content": "no id"}], "todos[0] needs an 'id'"),
        ([{"id": "", "content": "blank id"}], "needs an 'id'"),
        ([{"id": "1"}], "needs a 'content'"),
        ([{"id": "1", "content": "   "}], "needs a 'content'"),
        ([{"id": "1", "content": "x", "status": "done"}], "use one of: pending, in_progress"),
        (["just a string"], "todos[0] must be an object"),
        ([{"id": "1", "content": "a"}, {"id": "1", "content": "b"}], "more than once"),
        ([{"id": "1", "content": "x" * 5000}], "over 2000 characters"),
    ],
)
def test_invalid_items_are_errors_and_leave_state_alone(
    ctx: ToolContext, todos: list[Any], expected: str
) -> None:
    call(ctx, todos=[{"id": "keep", "content": "existing"}])
    result = call(ctx, todos=todos)
    assert expected in result["error"]
    assert call(ctx)["todos"] == [{"id": "keep", "content": "existing", "status": "pending"}]


def test_merge_validation_is_all_or_nothing(ctx: ToolContext) -> None:
    call(ctx, todos=[{"id": "a", "content": "first"}])
    result = call(
        ctx, merge=True, todos=[{"id": "a", "status": "completed"}, {"id": "new", "status": "x"}]
    )
    assert "error" in result
    assert call(ctx)["todos"][0]["status"] == "pending"


def test_bad_argument_types(ctx: ToolContext) -> None:
    assert "'todos' must be an array" in call(ctx, todos="buy milk")["error"]
    assert "'merge' must be true or false" in call(ctx, todos=[], merge="yes")["error"]


def test_too_many_items(ctx: ToolContext) -> None:
    limit = HANDLER_MODULE.MAX_ITEMS
    todos = [{"id": str(i), "content": f"task {i}"} for i in range(limit + 1)]
    assert f"limit is {limit}" in call(ctx, todos=todos)["error"]


def test_missing_context_is_an_error() -> None:
    assert "episode context" in json.loads(handler({}))["error"]
    assert "episode context" in json.loads(handler({}, task_id="t"))["error"]


def test_folder_is_discovered_and_dispatched(tmp_path: Path) -> None:
    from tools.discovery import discover_tools
    from tools.registry import ToolRegistry

    target = ToolRegistry()
    report = discover_tools(TODO_DIR.parent, target=target)
    assert not any("todo" in name for name in report.failed), report.failed
    entry = target.get_entry("todo")
    assert entry is not None and entry.toolset == "todo"
    ctx = ToolContext(task_id="t", scratch_dir=tmp_path)
    raw = target.dispatch("todo", {"todos": [{"id": "1", "content": "x"}]}, task_id="t", ctx=ctx)
    assert json.loads(raw)["summary"]["total"] == 1
