"""ToolRegistry: registration, availability checks, definitions, dispatch, snapshots."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from tools.registry import (
    CHECK_FN_TTL_SECONDS,
    ToolRegistrationError,
    ToolRegistry,
    ToolUnavailable,
    tool_result,
)
from tools.settings import ToolSettings


def schema(name: str, **props: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} tool",
        "parameters": {"type": "object", "properties": props},
    }


def echo(args: dict[str, Any], **kwargs: Any) -> str:
    return tool_result(args=args, task_id=kwargs.get("task_id"))


def test_register_and_lookup_bumps_generation(fresh_registry: ToolRegistry) -> None:
    before = fresh_registry.generation
    fresh_registry.register(name="echo", toolset="basic", schema=schema("echo"), handler=echo)
    entry = fresh_registry.get_entry("echo")
    assert entry is not None
    assert entry.toolset == "basic"
    assert entry.description == "echo tool"
    assert entry.module == __name__
    assert fresh_registry.generation == before + 1
    assert fresh_registry.get_registered_toolset_names() == ["basic"]
    assert fresh_registry.deregister("echo") is True
    assert fresh_registry.deregister("echo") is False
    assert fresh_registry.get_entry("echo") is None
    assert fresh_registry.generation == before + 2


def test_same_name_in_other_toolset_is_an_error_unless_override(
    fresh_registry: ToolRegistry,
) -> None:
    fresh_registry.register(name="echo", toolset="a", schema=schema("echo"), handler=echo)
    with pytest.raises(ToolRegistrationError, match="already registered in toolset 'a'"):
        fresh_registry.register(name="echo", toolset="b", schema=schema("echo"), handler=echo)
    # Re-registering in the same toolset replaces (module reload); override moves it.
    fresh_registry.register(name="echo", toolset="a", schema=schema("echo"), handler=echo)
    fresh_registry.register(
        name="echo", toolset="b", schema=schema("echo"), handler=echo, override=True
    )
    entry = fresh_registry.get_entry("echo")
    assert entry is not None and entry.toolset == "b"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name"}, "letters, digits"),
        ({"toolset": ""}, "non-empty toolset"),
        ({"schema": schema("other")}, "must match"),
        ({"schema": {"name": "t", "parameters": {"type": "array"}}}, "type 'object'"),
        ({"handler": "not callable"}, "not callable"),
        ({"max_result_size_chars": 10}, ">= 200"),
    ],
)
def test_malformed_registrations_are_refused(
    fresh_registry: ToolRegistry, kwargs: dict[str, Any], message: str
) -> None:
    base: dict[str, Any] = {"name": "t", "toolset": "x", "schema": schema("t"), "handler": echo}
    with pytest.raises(ToolRegistrationError, match=message):
        fresh_registry.register(**{**base, **kwargs})


def test_definitions_list_only_available_tools_in_openai_format(
    fresh_registry: ToolRegistry,
) -> None:
    fresh_registry.register(
        name="b_tool", toolset="x", schema=schema("b_tool", n={"type": "integer"}), handler=echo
    )
    fresh_registry.register(name="a_tool", toolset="x", schema=schema("a_tool"), handler=echo)
    fresh_registry.register(
        name="hidden", toolset="x", schema=schema("hidden"), handler=echo, check_fn=lambda: False
    )
    defs = fresh_registry.get_definitions({"b_tool", "a_tool", "hidden", "missing"})
    assert [d["function"]["name"] for d in defs] == ["a_tool", "b_tool"]
    assert defs[1] == {
        "type": "function",
        "function": {
            "name": "b_tool",
            "description": "b_tool tool",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
    }


def test_dynamic_override_is_merged_and_a_failing_one_falls_back(
    fresh_registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    def override(settings: ToolSettings) -> dict[str, Any]:
        return {"description": f"limit={settings.option('dyn', 'limit', default=3)}"}

    def broken() -> dict[str, Any]:
        raise RuntimeError("config unreadable")

    fresh_registry.register(
        name="dyn",
        toolset="x",
        schema=schema("dyn"),
        handler=echo,
        dynamic_schema_overrides=override,
    )
    fresh_registry.register(
        name="brk", toolset="x", schema=schema("brk"), handler=echo, dynamic_schema_overrides=broken
    )
    settings = ToolSettings(options={"dyn": {"limit": 7}}, env={})
    with caplog.at_level(logging.WARNING):
        defs = {
            d["function"]["name"]: d
            for d in fresh_registry.get_definitions({"dyn", "brk"}, settings)
        }
    assert defs["dyn"]["function"]["description"] == "limit=7"
    assert defs["brk"]["function"]["description"] == "brk tool"
    assert "dynamic schema override of tool brk failed" in caplog.text


def test_check_fn_is_cached_for_30_seconds() -> None:
    calls = []

    def check() -> bool:
        calls.append(1)
        return True

    now = [1000.0]
    fresh_registry = ToolRegistry(clock=lambda: now[0])
    fresh_registry.register(name="c", toolset="x", schema=schema("c"), handler=echo, check_fn=check)
    settings = ToolSettings(env={})
    for _ in range(5):
        assert fresh_registry.check_availability("c", settings).available
    assert len(calls) == 1
    now[0] += CHECK_FN_TTL_SECONDS - 1
    fresh_registry.check_availability("c", settings)
    assert len(calls) == 1
    now[0] += 2
    fresh_registry.check_availability("c", settings)
    assert len(calls) == 2
    # Different settings are a different question, answered separately.
    fresh_registry.check_availability("c", ToolSettings(env={"X": "1"}))
    assert len(calls) == 3


def test_unavailability_reasons_are_kept(fresh_registry: ToolRegistry) -> None:
    def raises() -> bool:
        raise OSError("docker socket missing")

    def says_why(settings: ToolSettings) -> bool:
        raise ToolUnavailable("set web.searxng_url or SEARXNG_URL")

    def plain_false() -> bool:
        return False

    def env_ok(settings: ToolSettings) -> bool:
        return bool(settings.env.get("KEY_X"))

    reg = fresh_registry
    reg.register(name="r1", toolset="x", schema=schema("r1"), handler=echo, check_fn=raises)
    reg.register(name="r2", toolset="x", schema=schema("r2"), handler=echo, check_fn=says_why)
    reg.register(name="r3", toolset="x", schema=schema("r3"), handler=echo, check_fn=plain_false)
    reg.register(name="r4", toolset="x", schema=schema("r4"), handler=echo, requires_env=["KEY_X"])
    reg.register(
        name="r5",
        toolset="x",
        schema=schema("r5"),
        handler=echo,
        check_fn=env_ok,
        requires_env=["KEY_X"],
    )
    empty = ToolSettings(env={})
    assert reg.check_availability("r1", empty).reason == (
        "availability check raised OSError: docker socket missing"
    )
    assert reg.check_availability("r2", empty).reason == "set web.searxng_url or SEARXNG_URL"
    assert "plain_false returned False" in reg.check_availability("r3", empty).reason
    assert reg.check_availability("r4", empty).reason == "missing environment variable(s): KEY_X"
    assert reg.check_availability("r5", empty).reason == "missing environment variable(s): KEY_X"
    with_key = ToolSettings(env={"KEY_X": "v"})
    assert reg.check_availability("r4", with_key).available
    assert reg.check_availability("r5", with_key).available
    assert not reg.check_availability("nope", empty).available


def test_dispatch_failure_paths_return_json_errors(fresh_registry: ToolRegistry) -> None:
    def boom(args: dict[str, Any], **kw: Any) -> str:
        raise KeyError("path")

    def not_a_string(args: dict[str, Any], **kw: Any) -> Any:
        return {"ok": True}

    def slow(args: dict[str, Any], **kw: Any) -> str:
        time.sleep(2)
        return "{}"

    reg = fresh_registry
    reg.register(name="echo", toolset="x", schema=schema("echo"), handler=echo)
    reg.register(name="boom", toolset="x", schema=schema("boom"), handler=boom)
    reg.register(name="dict", toolset="x", schema=schema("dict"), handler=not_a_string)
    reg.register(name="slow", toolset="x", schema=schema("slow"), handler=slow)

    assert json.loads(reg.dispatch("echo", {"a": 1}, task_id="t9")) == {
        "args": {"a": 1},
        "task_id": "t9",
    }
    unknown = json.loads(reg.dispatch("nope", {}))
    assert "Unknown tool 'nope'" in unknown["error"] and "echo" in unknown["error"]
    assert json.loads(reg.dispatch("boom", {}))["error"] == "tool 'boom' failed: KeyError: 'path'"
    assert "returned dict instead of a JSON string" in json.loads(reg.dispatch("dict", {}))["error"]
    started = time.monotonic()
    timed = json.loads(reg.dispatch("slow", {}, timeout_s=0.2))
    assert time.monotonic() - started < 1.5
    assert timed["error"] == "tool 'slow' timed out: no result after 0.2 s"


def test_async_handlers_are_bridged_inside_and_outside_a_loop(fresh_registry: ToolRegistry) -> None:
    async def handler(args: dict[str, Any], **kw: Any) -> str:
        await asyncio.sleep(0.01)
        return tool_result(doubled=args["n"] * 2)

    fresh_registry.register(name="a", toolset="x", schema=schema("a"), handler=handler)
    entry = fresh_registry.get_entry("a")
    assert entry is not None and entry.is_async
    assert json.loads(fresh_registry.dispatch("a", {"n": 4})) == {"doubled": 8}

    async def from_inside_a_loop() -> str:
        return fresh_registry.dispatch("a", {"n": 5})

    assert json.loads(asyncio.run(from_inside_a_loop())) == {"doubled": 10}


def test_snapshot_freezes_availability_and_fingerprints_schemas() -> None:
    def build(description: str) -> ToolRegistry:
        reg = ToolRegistry()
        reg.register(
            name="t1",
            toolset="x",
            schema={**schema("t1"), "description": description},
            handler=echo,
        )
        reg.register(
            name="t2", toolset="x", schema=schema("t2"), handler=echo, check_fn=lambda: False
        )
        reg.register_toolset("combo", "x plus y", includes=["x", "y"])
        reg.register(name="t3", toolset="y", schema=schema("t3"), handler=echo)
        return reg

    snap = build("one").snapshot(ToolSettings(env={}))
    assert sorted(snap.entries) == ["t1", "t3"]
    assert "returned False" in snap.unavailable["t2"]
    assert snap.tools_for(["combo"]) == ["t1", "t3"]
    assert snap.toolsets["x"] == ("t1", "t2")
    assert snap.get_definitions(["t2", "t1"]) == [snap.definitions["t1"]]
    assert snap.fingerprint == build("one").snapshot(ToolSettings(env={})).fingerprint
    assert snap.fingerprint != build("two").snapshot(ToolSettings(env={})).fingerprint
    assert snap.toolset_available("x").available
    with pytest.raises(Exception, match="unknown toolset 'zzz'; valid toolsets: combo, x, y"):
        snap.tools_for(["zzz"])
    # The snapshot does not change when the registry does.
    reg = build("one")
    frozen = reg.snapshot(ToolSettings(env={}))
    reg.deregister("t1")
    assert "t1" in frozen.entries


def test_snapshot_reports_why_a_whole_toolset_is_unavailable(fresh_registry: ToolRegistry) -> None:
    def missing_key() -> bool:
        raise ToolUnavailable("set TAVILY_API_KEY")

    fresh_registry.register(
        name="s", toolset="web", schema=schema("s"), handler=echo, check_fn=missing_key
    )
    snap = fresh_registry.snapshot(ToolSettings(env={}))
    state = snap.toolset_available("web")
    assert not state.available and state.reason == "set TAVILY_API_KEY"
    assert snap.tools_for(["web"]) == []
