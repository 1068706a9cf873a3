"""The dispatch pipeline: parsing, coercion, hooks, timeouts and truncation."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tools.dispatch import ToolCallResult, ToolDispatcher, ToolHooks
from tools.registry import ToolRegistry, tool_error, tool_result
from tools.settings import ToolContext, ToolSettings
from tools.truncate import marker

TYPED_PARAMS = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "items": {"type": "array", "items": {"type": "integer"}},
        "opts": {"type": "object", "properties": {"depth": {"type": "integer"}}},
        "label": {"type": "string"},
    },
    "required": ["count"],
}


def _schema(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "description": name, "parameters": parameters or {"type": "object"}}


def _echo(args: dict[str, Any], **kw: Any) -> str:
    return tool_result(args)


def _big(args: dict[str, Any], **kw: Any) -> str:
    return tool_result(output="H" * 5000 + "x" * 40_000 + "T" * 5000, exit_code=0)


def _failing_exit(args: dict[str, Any], **kw: Any) -> str:
    return tool_result(output="ls: cannot access 'x'", exit_code=2)


def _explicit_error(args: dict[str, Any], **kw: Any) -> str:
    return tool_error("file not found: a.txt")


async def _slow_async(args: dict[str, Any], **kw: Any) -> str:
    await asyncio.sleep(10)
    return "{}"


def _slow_sync(args: dict[str, Any], **kw: Any) -> str:
    time.sleep(3)
    return "{}"


def _plain_text(args: dict[str, Any], **kw: Any) -> str:
    return "A" * 3000 + "B" * 3000


def _limit_seen(args: dict[str, Any], **kw: Any) -> str:
    ctx: ToolContext = kw["ctx"]
    return tool_result(limit=ctx.max_result_chars, task=kw["task_id"])


def _build(settings: ToolSettings, hooks: ToolHooks | None = None) -> ToolDispatcher:
    reg = ToolRegistry()
    reg.register(name="echo", toolset="t", schema=_schema("echo", TYPED_PARAMS), handler=_echo)
    reg.register(
        name="big", toolset="t", schema=_schema("big"), handler=_big, max_result_size_chars=2000
    )
    reg.register(name="exit2", toolset="t", schema=_schema("exit2"), handler=_failing_exit)
    reg.register(name="err", toolset="t", schema=_schema("err"), handler=_explicit_error)
    reg.register(name="slow_a", toolset="t", schema=_schema("slow_a"), handler=_slow_async)
    reg.register(name="slow_s", toolset="t", schema=_schema("slow_s"), handler=_slow_sync)
    reg.register(name="text", toolset="t", schema=_schema("text"), handler=_plain_text)
    reg.register(
        name="limit",
        toolset="t",
        schema=_schema("limit"),
        handler=_limit_seen,
        max_result_size_chars=777,
    )
    return ToolDispatcher(reg.snapshot(settings), hooks=hooks)


@pytest.fixture
def dispatcher(settings: ToolSettings) -> ToolDispatcher:
    return _build(settings)


def test_arguments_are_coerced_to_the_schema(dispatcher: ToolDispatcher, ctx: ToolContext) -> None:
    raw = json.dumps(
        {
            "count": "42",
            "ratio": "0.5",
            "flag": "true",
            "items": '[1, "2", 3]',
            "opts": '{"depth": "3"}',
            "label": 7,
            "extra": "kept",
        }
    )
    result = dispatcher.call_sync("echo", raw, ctx)
    assert result.ok, result.content
    assert json.loads(result.content) == {
        "count": 42,
        "ratio": 0.5,
        "flag": True,
        "items": [1, 2, 3],
        "opts": {"depth": 3},
        "label": "7",
        "extra": "kept",
    }
    assert result.arguments["count"] == 42


def test_bad_arguments_are_reported_not_raised(
    dispatcher: ToolDispatcher, ctx: ToolContext
) -> None:
    broken = dispatcher.call_sync("echo", '{"count": 1', ctx)
    assert not broken.ok and broken.invalid_arguments
    assert "arguments are not valid JSON" in json.loads(broken.content)["error"]
    not_object = dispatcher.call_sync("echo", "[1, 2]", ctx)
    assert "must be a JSON object, got list" in (not_object.error or "")
    missing = dispatcher.call_sync("echo", "{}", ctx)
    assert missing.error == "Missing required argument(s) for tool 'echo': count"
    # Uncoercible values reach the handler unchanged (its own validation speaks).
    kept = dispatcher.call_sync("echo", {"count": "many"}, ctx)
    assert json.loads(kept.content) == {"count": "many"}


def test_unknown_and_unoffered_tools_name_the_available_ones(
    dispatcher: ToolDispatcher, ctx: ToolContext
) -> None:
    unknown = dispatcher.call_sync("rm_rf", "{}", ctx, offered=["echo", "text"])
    assert unknown.unknown_tool and not unknown.ok
    assert unknown.error == "Unknown tool 'rm_rf'. Available tools: echo, text"
    # Registered but not offered to this episode: the model may not call it.
    unoffered = dispatcher.call_sync("big", "{}", ctx, offered=["echo"])
    assert unoffered.unknown_tool
    assert "Available tools: echo" in (unoffered.error or "")


def test_error_results_are_failures_and_nonzero_exits_are_not(
    dispatcher: ToolDispatcher, ctx: ToolContext
) -> None:
    err = dispatcher.call_sync("err", None, ctx)
    assert not err.ok and err.error == "file not found: a.txt"
    exit2 = dispatcher.call_sync("exit2", None, ctx)
    assert exit2.ok and json.loads(exit2.content)["exit_code"] == 2


def test_pre_hook_blocks_and_post_hook_observes(settings: ToolSettings, ctx: ToolContext) -> None:
    seen: list[ToolCallResult] = []
    called: list[str] = []

    def deny_rm(name: str, args: Any, c: ToolContext) -> str | None:
        called.append(name)
        return (
            "labels starting with rm are not allowed"
            if str(args.get("label", "")).startswith("rm")
            else None
        )

    def observe(result: ToolCallResult, c: ToolContext) -> None:
        seen.append(result)

    def broken_observer(result: ToolCallResult, c: ToolContext) -> None:
        raise RuntimeError("metrics backend down")

    hooks = ToolHooks(pre_tool_call=(deny_rm,), post_tool_call=(observe, broken_observer))
    d = _build(settings, hooks)
    blocked = d.call_sync("echo", {"count": 1, "label": "rm -rf /"}, ctx)
    assert blocked.blocked and not blocked.ok
    assert blocked.error == "Tool call 'echo' blocked: labels starting with rm are not allowed"
    allowed = d.call_sync("echo", {"count": 1, "label": "ls"}, ctx)
    assert allowed.ok
    assert [r.blocked for r in seen] == [True, False]
    assert seen[1].duration_s > 0
    assert called == ["echo", "echo"]


def test_raising_pre_hook_blocks_the_call(settings: ToolSettings, ctx: ToolContext) -> None:
    def broken_policy(name: str, args: Any, c: ToolContext) -> str | None:
        raise ValueError("policy file missing")

    d = _build(settings, ToolHooks(pre_tool_call=(broken_policy,)))
    result = d.call_sync("echo", {"count": 1}, ctx)
    assert result.blocked
    assert "pre_tool_call hook raised ValueError: policy file missing" in (result.error or "")


def test_transform_hook_rewrites_results(settings: ToolSettings, ctx: ToolContext) -> None:
    def redact(name: str, args: Any, content: str, c: ToolContext) -> str | None:
        return content.replace("cannot", "[redacted]") if name == "exit2" else None

    d = _build(settings, ToolHooks(transform_tool_result=(redact,)))
    assert "[redacted]" in d.call_sync("exit2", None, ctx).content
    assert json.loads(d.call_sync("echo", {"count": 1}, ctx).content) == {"count": 1}


def test_hard_timeout_applies_to_async_and_sync_handlers(ctx: ToolContext) -> None:
    quick = ToolSettings(env={}, call_timeout_s=0.3)
    d = _build(quick)
    for name in ("slow_a", "slow_s"):
        started = time.monotonic()
        result = d.call_sync(name, None, ctx)
        assert time.monotonic() - started < 2.0
        assert result.timed_out and not result.ok
        assert result.error == f"tool '{name}' timed out after 0.3 s"


def test_results_are_truncated_to_the_tool_limit_as_valid_json(
    dispatcher: ToolDispatcher, ctx: ToolContext
) -> None:
    result = dispatcher.call_sync("big", None, ctx)
    assert result.ok and result.truncated
    assert len(result.content) <= 2000
    data = json.loads(result.content)  # still valid JSON
    assert data["exit_code"] == 0
    assert data["output"].startswith("HHHH") and data["output"].endswith("TTTT")
    assert "characters omitted]" in data["output"]
    assert result.omitted_chars == 50_000 - len(data["output"]) + len(marker(result.omitted_chars))


def test_default_limit_applies_to_plain_text(ctx: ToolContext) -> None:
    d = _build(ToolSettings(env={}, default_max_result_chars=1000))
    result = d.call_sync("text", None, ctx)
    assert result.truncated and len(result.content) <= 1000
    assert result.content.startswith("AAA") and result.content.endswith("BBB")
    assert marker(result.omitted_chars) in result.content
    assert result.omitted_chars == 6000 - (len(result.content) - len(marker(result.omitted_chars)))
    # The handler is told its budget so it can bound its own capture.
    seen = json.loads(d.call_sync("limit", None, ctx).content)
    assert seen == {"limit": 777, "task": "task-1"}


def test_concurrent_calls_share_one_dispatcher(
    dispatcher: ToolDispatcher, ctx: ToolContext
) -> None:
    async def many() -> list[ToolCallResult]:
        return await asyncio.gather(
            *(dispatcher.call("echo", {"count": i}, ctx) for i in range(200))
        )

    results = asyncio.run(many())
    assert [json.loads(r.content)["count"] for r in results] == list(range(200))
