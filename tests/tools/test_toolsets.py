"""Toolsets: recursive resolution, cycles, unknown names, aliases and seed helpers."""

from __future__ import annotations

import json
from typing import Any

import pytest

import tools
from tools.registry import ToolRegistry, ToolsetError, registry, tool_result


def _echo(args: dict[str, Any], **kwargs: Any) -> str:
    return tool_result(args)


def _add(reg: ToolRegistry, name: str, toolset: str) -> None:
    schema = {"name": name, "description": name, "parameters": {"type": "object", "properties": {}}}
    reg.register(name=name, toolset=toolset, schema=schema, handler=_echo)


def test_resolve_toolset_follows_includes_recursively(fresh_registry: ToolRegistry) -> None:
    _add(fresh_registry, "a1", "a")
    _add(fresh_registry, "b1", "b")
    _add(fresh_registry, "c1", "c")
    fresh_registry.register_toolset("mid", "a and b", includes=["a", "b"])
    fresh_registry.register_toolset("top", "mid and c", tools=["extra"], includes=["mid", "c"])
    assert fresh_registry.resolve_toolset("top") == ["a1", "b1", "c1", "extra"]
    assert fresh_registry.resolve_toolset("a") == ["a1"]
    assert fresh_registry.validate_toolsets() == ["top: names unregistered tools extra"]


def test_include_cycle_is_an_error_naming_the_cycle(fresh_registry: ToolRegistry) -> None:
    fresh_registry.register_toolset("one", includes=["two"])
    fresh_registry.register_toolset("two", includes=["three"])
    fresh_registry.register_toolset("three", includes=["one"])
    with pytest.raises(ToolsetError, match="include cycle: one -> two -> three -> one"):
        fresh_registry.resolve_toolset("one")
    problems = fresh_registry.validate_toolsets()
    assert len(problems) == 3 and all("include cycle" in p for p in problems)
    with pytest.raises(ToolsetError, match="include cycle"):
        fresh_registry.snapshot()


def test_unknown_toolset_lists_valid_names(fresh_registry: ToolRegistry) -> None:
    _add(fresh_registry, "t", "real")
    fresh_registry.register_toolset("combo", includes=["real", "ghost"])
    with pytest.raises(ToolsetError, match="unknown toolset 'nope'; valid toolsets: combo, real"):
        fresh_registry.resolve_toolset("nope")
    with pytest.raises(ToolsetError, match="unknown toolset 'ghost'"):
        fresh_registry.resolve_toolset("combo")


def test_aliases_resolve_and_cannot_shadow(fresh_registry: ToolRegistry) -> None:
    _add(fresh_registry, "t", "real")
    fresh_registry.register_toolset_alias("my-real", "real")
    assert fresh_registry.resolve_toolset("my-real") == ["t"]
    assert fresh_registry.snapshot().tools_for(["my-real"]) == ["t"]
    with pytest.raises(ToolsetError, match="clashes"):
        fresh_registry.register_toolset_alias("real", "other")
    with pytest.raises(ToolsetError, match="clashes"):
        fresh_registry.register_toolset("my-real")


def test_redefining_a_toolset_differently_needs_override(fresh_registry: ToolRegistry) -> None:
    fresh_registry.register_toolset("s", "first", tools=["x"])
    fresh_registry.register_toolset("s", "first", tools=["x"])  # identical: fine
    with pytest.raises(ToolsetError, match="already defined differently"):
        fresh_registry.register_toolset("s", "second", tools=["y"])
    fresh_registry.register_toolset("s", "second", tools=["y"], override=True)
    assert fresh_registry.get_toolset("s").tools == ("y",)


def test_seed_helpers_register_and_run_a_tool() -> None:
    schema = {
        "name": "helper_echo",
        "description": "echo",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    }
    tools.register_tool("helper_echo", schema, _echo)
    try:
        tools.register_toolset({"name": "helper_set", "description": "d", "tools": ["helper_echo"]})
        assert registry.resolve_toolset("helper_set") == ["helper_echo"]
        # run_tool goes through the whole pipeline: "7" is coerced to 7.
        assert json.loads(tools.run_tool("helper_echo", {"n": "7"})) == {"n": 7}
        missing = json.loads(tools.run_tool("helper_echo", {}))
        assert "Missing required argument(s)" in missing["error"]
        with pytest.raises(ToolsetError, match="unknown toolset key"):
            tools.register_toolset({"name": "x", "tool": []})
    finally:
        registry.deregister("helper_echo")
