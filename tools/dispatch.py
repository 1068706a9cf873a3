"""The tool-call pipeline an agent episode uses (the seed's ``handle_function_call``).

parse arguments -> check the tool was offered -> coerce against the schema -> check
required arguments -> ``pre_tool_call`` hooks (may block) -> run under a hard timeout ->
``transform_tool_result`` hooks -> truncate to the tool's size limit -> ``post_tool_call``
hooks. Every failure becomes an ``{"error": ...}`` result the model sees, and the
returned ``ToolCallResult`` says what happened so rows and statistics can count it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tools.coerce import coerce_args, missing_required
from tools.registry import RegistrySnapshot, ToolEntry, ensure_json_string, tool_error
from tools.settings import ToolContext
from tools.truncate import truncate_result

logger = logging.getLogger(__name__)

PreToolHook = Callable[[str, Mapping[str, Any], ToolContext], "str | None"]
TransformHook = Callable[[str, Mapping[str, Any], str, ToolContext], "str | None"]
PostToolHook = Callable[["ToolCallResult", ToolContext], None]


@dataclass(frozen=True, kw_only=True)
class ToolHooks:
    """Plug-in points. A pre hook returns a message to block the call, or None to allow it;
    a transform hook returns a replacement result, or None to keep it."""

    pre_tool_call: tuple[PreToolHook, ...] = ()
    post_tool_call: tuple[PostToolHook, ...] = ()
    transform_tool_result: tuple[TransformHook, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ToolCallResult:
    """The outcome of one tool call, as the episode records it."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    content: str
    ok: bool
    error: str | None = None
    blocked: bool = False
    unknown_tool: bool = False
    invalid_arguments: bool = False
    timed_out: bool = False
    truncated: bool = False
    omitted_chars: int = 0
    duration_s: float = 0.0


def error_of(content: str) -> str | None:
    """The ``error`` message of a JSON object result, if it has one."""
    if not content.startswith("{") or '"error"' not in content:
        return None
    try:
        data = json.loads(content)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("error"):
        return str(data["error"])
    return None


def parse_arguments(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Arguments as a dict; raises ``ValueError`` with a message the model can act on."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        excerpt = raw if len(raw) <= 200 else raw[:200] + "..."
        raise ValueError(f"arguments are not valid JSON ({exc}): {excerpt}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(parsed).__name__}")
    return parsed


class ToolDispatcher:
    """Runs tool calls against a registry snapshot. One per worker; safe to share between
    concurrent episodes (sync handlers run in its thread pool, async ones on the loop)."""

    def __init__(
        self,
        snapshot: RegistrySnapshot,
        *,
        hooks: ToolHooks | None = None,
        max_threads: int = 32,
    ) -> None:
        self.snapshot = snapshot
        self.hooks = hooks or ToolHooks()
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="tool")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ToolDispatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def call_sync(
        self,
        name: str,
        raw_arguments: str | Mapping[str, Any] | None,
        ctx: ToolContext,
        *,
        offered: Collection[str] | None = None,
    ) -> ToolCallResult:
        """``call`` for synchronous callers (scripts, ``run_tool``)."""
        return asyncio.run(self.call(name, raw_arguments, ctx, offered=offered))

    async def call(
        self,
        name: str,
        raw_arguments: str | Mapping[str, Any] | None,
        ctx: ToolContext,
        *,
        offered: Collection[str] | None = None,
    ) -> ToolCallResult:
        """Run one tool call. ``offered`` is the episode's tool list (default: all)."""
        started = time.perf_counter()
        offered_names = self.snapshot.entries.keys() if offered is None else offered
        entry = self.snapshot.entries.get(name) if name in offered_names else None
        if entry is None:
            valid = ", ".join(sorted(offered_names)) or "(no tools offered)"
            message = f"Unknown tool {name!r}. Available tools: {valid}"
            return self._failure(name, {}, message, started, ctx, unknown_tool=True)
        try:
            args = parse_arguments(raw_arguments)
        except ValueError as exc:
            message = f"Invalid arguments for tool {name!r}: {exc}"
            return self._failure(name, {}, message, started, ctx, invalid_arguments=True)
        parameters = entry.schema.get("parameters", {})
        args = coerce_args(args, parameters)
        missing = missing_required(args, parameters)
        if missing:
            message = f"Missing required argument(s) for tool {name!r}: {', '.join(missing)}"
            return self._failure(name, args, message, started, ctx, invalid_arguments=True)
        block = self._run_pre_hooks(name, args, ctx)
        if block is not None:
            message = f"Tool call {name!r} blocked: {block}"
            return self._failure(name, args, message, started, ctx, blocked=True)
        return await self._execute(entry, args, ctx, started)

    async def _execute(
        self, entry: ToolEntry, args: dict[str, Any], ctx: ToolContext, started: float
    ) -> ToolCallResult:
        limit = entry.max_result_size_chars or self.snapshot.settings.default_max_result_chars
        call_ctx = ctx.with_limit(limit)
        timeout = self.snapshot.settings.call_timeout_s
        timed_out = False
        try:
            raw = await asyncio.wait_for(self._invoke(entry, args, call_ctx), timeout)
            content = ensure_json_string(entry.name, raw)
        except asyncio.TimeoutError:
            timed_out = True
            content = tool_error(f"tool {entry.name!r} timed out after {timeout:g} s")
        except Exception as exc:
            logger.debug("tool %s raised", entry.name, exc_info=True)
            content = tool_error(f"tool {entry.name!r} failed: {type(exc).__name__}: {exc}")
        content = self._run_transform_hooks(entry.name, args, content, ctx)
        cut = truncate_result(content, limit)
        error = error_of(cut.text)
        result = ToolCallResult(
            name=entry.name,
            arguments=args,
            content=cut.text,
            ok=error is None,
            error=error,
            timed_out=timed_out,
            truncated=cut.truncated,
            omitted_chars=cut.omitted,
            duration_s=time.perf_counter() - started,
        )
        self._run_post_hooks(result, ctx)
        return result

    async def _invoke(self, entry: ToolEntry, args: dict[str, Any], ctx: ToolContext) -> Any:
        kwargs = {"task_id": ctx.task_id, "ctx": ctx}
        if entry.is_async:
            return await entry.handler(args, **kwargs)
        loop = asyncio.get_running_loop()
        call = functools.partial(entry.handler, args, **kwargs)
        result = await loop.run_in_executor(self._executor, call)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    def _failure(
        self,
        name: str,
        args: Mapping[str, Any],
        message: str,
        started: float,
        ctx: ToolContext,
        **flags: bool,
    ) -> ToolCallResult:
        result = ToolCallResult(
            name=name,
            arguments=args,
            content=tool_error(message),
            ok=False,
            error=message,
            duration_s=time.perf_counter() - started,
            **flags,
        )
        self._run_post_hooks(result, ctx)
        return result

    def _run_pre_hooks(self, name: str, args: Mapping[str, Any], ctx: ToolContext) -> str | None:
        for hook in self.hooks.pre_tool_call:
            try:
                verdict = hook(name, args, ctx)
            except Exception as exc:
                # A broken policy hook must not silently allow what it meant to block.
                logger.exception("pre_tool_call hook %r raised; blocking the call", hook)
                return f"pre_tool_call hook raised {type(exc).__name__}: {exc}"
            if verdict:
                return str(verdict)
        return None

    def _run_transform_hooks(
        self, name: str, args: Mapping[str, Any], content: str, ctx: ToolContext
    ) -> str:
        for hook in self.hooks.transform_tool_result:
            try:
                replaced = hook(name, args, content, ctx)
            except Exception as exc:
                logger.exception("transform_tool_result hook %r raised", hook)
                return tool_error(f"transform_tool_result hook raised {type(exc).__name__}: {exc}")
            if replaced is not None:
                content = ensure_json_string(name, replaced)
        return content

    def _run_post_hooks(self, result: ToolCallResult, ctx: ToolContext) -> None:
        for hook in self.hooks.post_tool_call:
            try:
                hook(result, ctx)
            except Exception:
                # Observers only: a failing one is logged and the call's result stands.
                logger.exception("post_tool_call hook %r raised", hook)
