"""Tools: the registry, discovery, the dispatch pipeline and the built-in tool modules.

Tool modules (``tools/*.py`` with a top-level ``registry.register(...)`` call, or
``tools/<name>/schema.json`` + ``handler.py``) are imported by discovery, never here.
The helpers below are the seed's public API for adding and trying tools.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tools.registry import (
    ToolEntry,
    ToolRegistrationError,
    ToolRegistry,
    ToolsetError,
    ToolUnavailable,
    registry,
    tool_error,
    tool_result,
)
from tools.settings import ToolContext, ToolSettings

__all__ = [
    "ToolContext",
    "ToolEntry",
    "ToolRegistrationError",
    "ToolRegistry",
    "ToolSettings",
    "ToolUnavailable",
    "ToolsetError",
    "register_tool",
    "register_toolset",
    "registry",
    "run_tool",
    "tool_error",
    "tool_result",
]


def register_tool(
    name: str,
    schema: Mapping[str, Any],
    handler: Any,
    *,
    toolset: str | None = None,
    **options: Any,
) -> None:
    """Register a tool in the process registry; its toolset defaults to its own name."""
    registry.register(name=name, toolset=toolset or name, schema=schema, handler=handler, **options)


def register_toolset(
    definition: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    description: str = "",
    tools: Iterable[str] = (),
    includes: Iterable[str] = (),
) -> None:
    """Define a toolset from a mapping (``{"name", "description", "tools", "includes"}``)
    or from keywords."""
    spec = dict(definition or {})
    unknown = set(spec) - {"name", "description", "tools", "includes"}
    if unknown:
        raise ToolsetError(f"unknown toolset key(s): {', '.join(sorted(unknown))}")
    toolset_name = spec.get("name", name)
    if not toolset_name:
        raise ToolsetError("a toolset definition needs a 'name'")
    registry.register_toolset(
        toolset_name,
        spec.get("description", description),
        tools=spec.get("tools", tools),
        includes=spec.get("includes", includes),
    )


def run_tool(
    tool_name: str,
    params: Mapping[str, Any] | str | None = None,
    *,
    settings: ToolSettings | None = None,
    scratch_dir: Path | None = None,
) -> str:
    """Run one tool through the full dispatch pipeline and return its JSON string.

    For trying a tool by hand: built-in tools are discovered first, and the call gets a
    temporary scratch directory unless one is given.
    """
    from tools.discovery import discover_tools
    from tools.dispatch import ToolDispatcher

    discover_tools()
    snapshot = registry.snapshot(settings)
    with tempfile.TemporaryDirectory(prefix="hermes-tool-") as tmp:
        workdir = Path(scratch_dir) if scratch_dir is not None else Path(tmp)
        ctx = ToolContext(
            task_id=f"run_tool-{uuid.uuid4().hex[:8]}",
            scratch_dir=workdir,
            settings=snapshot.settings,
        )
        with ToolDispatcher(snapshot) as dispatcher:
            return dispatcher.call_sync(tool_name, params, ctx).content
