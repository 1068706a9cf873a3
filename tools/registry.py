"""The central tool registry: self-registration, availability checks, toolsets, dispatch.

Tool modules call ``registry.register(...)`` at top level and are found by
``tools.discovery.discover_builtin_tools``. This module knows nothing of any specific
tool; tool modules import it, never the reverse.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tools.settings import ToolSettings

logger = logging.getLogger(__name__)

CHECK_FN_TTL_SECONDS = 30.0

Handler = Callable[..., Any]
CheckFn = Callable[..., Any]
SchemaOverride = Callable[..., Mapping[str, Any]]


class ToolRegistrationError(ValueError):
    """Raised by ``register`` for a malformed entry or a name clash across toolsets."""


class ToolsetError(ValueError):
    """Raised for an unknown toolset name, an include cycle or a toolset clash."""


class ToolUnavailable(Exception):
    """Raised by a ``check_fn`` to say why its tool cannot run here (kept as the reason)."""


def tool_error(message: str, **extra: Any) -> str:
    """The JSON string a handler returns for a failure the model should see."""
    return json.dumps({"error": message, **extra}, ensure_ascii=False)


def tool_result(data: Any = None, **fields: Any) -> str:
    """The JSON string a handler returns on success."""
    payload = fields if data is None else data
    return json.dumps(payload, ensure_ascii=False, default=str)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolEntry:
    """Metadata of one registered tool (the seed's fields plus the registering module)."""

    name: str
    toolset: str
    schema: Mapping[str, Any]
    handler: Handler
    check_fn: CheckFn | None = None
    requires_env: tuple[str, ...] = ()
    is_async: bool = False
    description: str = ""
    emoji: str = ""
    max_result_size_chars: int | None = None
    dynamic_schema_overrides: SchemaOverride | None = None
    module: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolsetDef:
    """A named group of tools; ``includes`` names other toolsets, resolved recursively."""

    name: str
    description: str = ""
    tools: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Availability:
    available: bool
    reason: str = ""


def _accepts_argument(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` can take one positional argument (the settings)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )


def _call_flexible(fn: Callable[..., Any], settings: ToolSettings) -> Any:
    return fn(settings) if _accepts_argument(fn) else fn()


def run_coroutine_sync(awaitable: Any, timeout_s: float | None = None) -> Any:
    """Run an awaitable to completion from synchronous code, inside a running loop or not."""

    async def _bounded() -> Any:
        return await asyncio.wait_for(awaitable, timeout_s)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_bounded())
    # A loop already runs in this thread: block on a private loop in another thread.
    box: dict[str, Any] = {}

    def _target() -> None:
        try:
            box["value"] = asyncio.run(_bounded())
        except BaseException as exc:  # re-raised in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=_target, name="tool-async-bridge", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _call_with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> Any:
    """Call ``fn`` and give up after ``timeout_s``. A sync handler cannot be killed, so a
    timed-out call keeps its daemon thread; process tools enforce their own limits."""
    if timeout_s is None:
        return fn()
    box: dict[str, Any] = {}

    def _target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=_target, name="tool-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no result after {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class ToolRegistry:
    """Thread-safe store of tools and toolsets. Every change bumps ``generation``."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tools: dict[str, ToolEntry] = {}
        self._toolsets: dict[str, ToolsetDef] = {}
        self._aliases: dict[str, str] = {}
        self._lock = threading.RLock()
        self._generation = 0
        self._check_cache: dict[tuple[int, str], tuple[float, Availability]] = {}

    @property
    def generation(self) -> int:
        return self._generation

    def _bump(self) -> None:
        self._generation += 1
        self._check_cache.clear()

    # -- registration -----------------------------------------------------------------

    def register(
        self,
        name: str,
        toolset: str,
        schema: Mapping[str, Any],
        handler: Handler,
        check_fn: CheckFn | None = None,
        requires_env: Iterable[str] | None = None,
        is_async: bool = False,
        description: str = "",
        emoji: str = "",
        max_result_size_chars: int | None = None,
        dynamic_schema_overrides: SchemaOverride | None = None,
        override: bool = False,
    ) -> None:
        """Add a tool. Re-registering a name from another toolset needs ``override=True``."""
        _validate_registration(name, toolset, schema, handler, max_result_size_chars)
        entry = ToolEntry(
            name=name,
            toolset=toolset,
            schema=MappingProxyType(dict(schema)),
            handler=handler,
            check_fn=check_fn,
            requires_env=tuple(requires_env or ()),
            is_async=is_async or inspect.iscoroutinefunction(handler),
            description=description or str(schema.get("description", "")),
            emoji=emoji,
            max_result_size_chars=max_result_size_chars,
            dynamic_schema_overrides=dynamic_schema_overrides,
            module=getattr(handler, "__module__", "") or "",
        )
        with self._lock:
            existing = self._tools.get(name)
            if existing is not None and existing.toolset != toolset and not override:
                raise ToolRegistrationError(
                    f"tool {name!r} is already registered in toolset {existing.toolset!r} "
                    f"(by {existing.module or 'unknown module'}); refusing to register it again "
                    f"in toolset {toolset!r}. Rename the tool or pass override=True."
                )
            self._tools[name] = entry
            self._bump()

    def deregister(self, name: str) -> bool:
        """Remove a tool; returns whether it existed."""
        with self._lock:
            removed = self._tools.pop(name, None) is not None
            if removed:
                self._bump()
            return removed

    def register_toolset(
        self,
        name: str,
        description: str = "",
        tools: Iterable[str] = (),
        includes: Iterable[str] = (),
        override: bool = False,
    ) -> None:
        """Define a toolset. Tools registered with ``toolset=name`` join it automatically."""
        if not name or not isinstance(name, str):
            raise ToolsetError("a toolset needs a non-empty string name")
        definition = ToolsetDef(
            name=name, description=description, tools=tuple(tools), includes=tuple(includes)
        )
        with self._lock:
            if name in self._aliases:
                raise ToolsetError(f"toolset {name!r} clashes with an alias of the same name")
            old = self._toolsets.get(name)
            if old is not None and old != definition and not override:
                raise ToolsetError(
                    f"toolset {name!r} is already defined differently; pass override=True"
                )
            self._toolsets[name] = definition
            self._bump()

    def register_toolset_alias(self, alias: str, target: str) -> None:
        """Make ``alias`` resolve to toolset ``target``."""
        with self._lock:
            if alias in self._toolsets or alias in self._toolset_names_from_tools():
                raise ToolsetError(f"alias {alias!r} clashes with an existing toolset")
            self._aliases[alias] = target
            self._bump()

    # -- queries -----------------------------------------------------------------------

    def get_entry(self, name: str) -> ToolEntry | None:
        with self._lock:
            return self._tools.get(name)

    def entries(self) -> list[ToolEntry]:
        with self._lock:
            return sorted(self._tools.values(), key=lambda e: e.name)

    def tool_names(self) -> list[str]:
        with self._lock:
            return sorted(self._tools)

    def _toolset_names_from_tools(self) -> set[str]:
        return {entry.toolset for entry in self._tools.values()}

    def get_registered_toolset_names(self) -> list[str]:
        """Every toolset name: defined ones and those named by registered tools."""
        with self._lock:
            return sorted(set(self._toolsets) | self._toolset_names_from_tools())

    def aliases(self) -> dict[str, str]:
        with self._lock:
            return dict(self._aliases)

    def get_toolset(self, name: str) -> ToolsetDef:
        """The definition of ``name`` (aliases followed), merged with its registered tools."""
        with self._lock:
            canonical = self._aliases.get(name, name)
            base = self._toolsets.get(canonical)
            members = sorted(e.name for e in self._tools.values() if e.toolset == canonical)
            if base is None and not members:
                valid = ", ".join(self.get_registered_toolset_names()) or "(none registered)"
                raise ToolsetError(f"unknown toolset {name!r}; valid toolsets: {valid}")
            base = base or ToolsetDef(name=canonical)
            tools = tuple(dict.fromkeys((*base.tools, *members)))
            return ToolsetDef(
                name=canonical, description=base.description, tools=tools, includes=base.includes
            )

    def resolve_toolset(self, name: str) -> list[str]:
        """All tool names of ``name`` and, recursively, its includes (sorted)."""
        tools: set[str] = set()
        self._resolve_into(name, [], tools)
        return sorted(tools)

    def _resolve_into(self, name: str, path: list[str], out: set[str]) -> None:
        toolset = self.get_toolset(name)
        if toolset.name in path:
            cycle = " -> ".join([*path[path.index(toolset.name) :], toolset.name])
            raise ToolsetError(f"toolset include cycle: {cycle}")
        out.update(toolset.tools)
        for included in toolset.includes:
            self._resolve_into(included, [*path, toolset.name], out)

    def validate_toolsets(self) -> list[str]:
        """Problems in the toolset definitions: cycles, unknown includes, unknown tools."""
        problems: list[str] = []
        known_tools = set(self.tool_names())
        for name in self.get_registered_toolset_names():
            try:
                resolved = self.resolve_toolset(name)
            except ToolsetError as exc:
                problems.append(f"{name}: {exc}")
                continue
            missing = sorted(set(resolved) - known_tools)
            if missing:
                problems.append(f"{name}: names unregistered tools {', '.join(missing)}")
        return problems

    # -- availability ------------------------------------------------------------------

    def check_availability(self, name: str, settings: ToolSettings | None = None) -> Availability:
        """Whether tool ``name`` can run with ``settings``; cached for 30 s per settings."""
        entry = self.get_entry(name)
        if entry is None:
            return Availability(False, f"unknown tool {name!r}")
        settings = settings or ToolSettings()
        key = (id(entry), settings.cache_key())
        now = self._clock()
        with self._lock:
            cached = self._check_cache.get(key)
        if cached is not None and now - cached[0] < CHECK_FN_TTL_SECONDS:
            return cached[1]
        result = _evaluate_availability(entry, settings)
        with self._lock:
            self._check_cache[key] = (now, result)
        return result

    def get_definitions(
        self, tool_names: Iterable[str], settings: ToolSettings | None = None
    ) -> list[dict[str, Any]]:
        """OpenAI tool schemas for the named tools that are available (sorted by name)."""
        settings = settings or ToolSettings()
        definitions = []
        for name in sorted(set(tool_names)):
            entry = self.get_entry(name)
            if entry is None or not self.check_availability(name, settings).available:
                continue
            definitions.append(openai_definition(entry, settings))
        return definitions

    # -- dispatch ----------------------------------------------------------------------

    def dispatch(
        self, name: str, args: Mapping[str, Any], *, timeout_s: float | None = None, **kwargs: Any
    ) -> str:
        """Run a tool's handler and return its JSON string; every failure is ``{"error"}``."""
        entry = self.get_entry(name)
        if entry is None:
            valid = ", ".join(self.tool_names()) or "(none)"
            return tool_error(f"Unknown tool {name!r}. Registered tools: {valid}")
        try:
            result = _call_with_timeout(lambda: _invoke_sync(entry, args, kwargs), timeout_s)
        except TimeoutError as exc:
            return tool_error(f"tool {name!r} timed out: {exc}")
        except Exception as exc:
            logger.debug("tool %s raised", name, exc_info=True)
            return tool_error(f"tool {name!r} failed: {type(exc).__name__}: {exc}")
        return ensure_json_string(name, result)

    def snapshot(self, settings: ToolSettings | None = None) -> RegistrySnapshot:
        """Freeze the current tools for a worker: checks evaluated once, fingerprinted."""
        settings = settings or ToolSettings()
        with self._lock:
            entries = list(self._tools.values())
            toolset_names = self.get_registered_toolset_names()
            aliases = dict(self._aliases)
        unavailable: dict[str, str] = {}
        available: dict[str, ToolEntry] = {}
        definitions: dict[str, dict[str, Any]] = {}
        for entry in sorted(entries, key=lambda e: e.name):
            state = _evaluate_availability(entry, settings)
            if not state.available:
                unavailable[entry.name] = state.reason
                continue
            available[entry.name] = entry
            definitions[entry.name] = openai_definition(entry, settings)
        toolsets: dict[str, tuple[str, ...]] = {}
        for ts in toolset_names:
            toolsets[ts] = tuple(self.resolve_toolset(ts))
        for alias, target in aliases.items():
            toolsets[alias] = toolsets.get(target, ())
        descriptions = {ts: self.get_toolset(ts).description for ts in toolset_names}
        return RegistrySnapshot(
            entries=MappingProxyType(available),
            definitions=MappingProxyType(definitions),
            unavailable=MappingProxyType(unavailable),
            toolsets=MappingProxyType(toolsets),
            toolset_descriptions=MappingProxyType(descriptions),
            settings=settings,
        )


def _validate_registration(
    name: str,
    toolset: str,
    schema: Mapping[str, Any],
    handler: Handler,
    max_result_size_chars: int | None,
) -> None:
    if (
        not isinstance(name, str)
        or not name
        or not name.replace("_", "").replace("-", "").isalnum()
    ):
        raise ToolRegistrationError(
            f"tool name {name!r} must be a non-empty string of letters, digits, '_' or '-'"
        )
    if not isinstance(toolset, str) or not toolset:
        raise ToolRegistrationError(f"tool {name!r} needs a non-empty toolset name")
    if not isinstance(schema, Mapping):
        raise ToolRegistrationError(f"tool {name!r}: schema must be a mapping")
    if schema.get("name", name) != name:
        raise ToolRegistrationError(
            f"tool {name!r}: schema names it {schema.get('name')!r}; the two must match"
        )
    params = schema.get("parameters", {"type": "object"})
    if not isinstance(params, Mapping) or params.get("type") != "object":
        raise ToolRegistrationError(
            f"tool {name!r}: schema 'parameters' must be a JSON schema of type 'object'"
        )
    if not callable(handler):
        raise ToolRegistrationError(f"tool {name!r}: handler is not callable")
    if max_result_size_chars is not None and max_result_size_chars < 200:
        raise ToolRegistrationError(f"tool {name!r}: max_result_size_chars must be >= 200")


def _evaluate_availability(entry: ToolEntry, settings: ToolSettings) -> Availability:
    missing = [var for var in entry.requires_env if not settings.env.get(var)]
    if missing and entry.check_fn is None:
        return Availability(False, f"missing environment variable(s): {', '.join(missing)}")
    if entry.check_fn is None:
        return Availability(True)
    try:
        ok = bool(_call_flexible(entry.check_fn, settings))
    except ToolUnavailable as exc:
        return Availability(False, str(exc) or "unavailable")
    except Exception as exc:
        return Availability(False, f"availability check raised {type(exc).__name__}: {exc}")
    if ok:
        return Availability(True)
    if missing:
        return Availability(False, f"missing environment variable(s): {', '.join(missing)}")
    check_name = getattr(entry.check_fn, "__qualname__", repr(entry.check_fn))
    return Availability(False, f"availability check {check_name} returned False")


def openai_definition(entry: ToolEntry, settings: ToolSettings) -> dict[str, Any]:
    """The OpenAI ``tools`` item for ``entry``, with dynamic overrides merged in."""
    function = {
        "name": entry.name,
        "description": entry.schema.get("description", entry.description),
        "parameters": entry.schema.get("parameters", {"type": "object", "properties": {}}),
    }
    if entry.dynamic_schema_overrides is not None:
        try:
            extra = dict(_call_flexible(entry.dynamic_schema_overrides, settings))
        except Exception:
            logger.warning(
                "dynamic schema override of tool %s failed; using its static schema",
                entry.name,
                exc_info=True,
            )
        else:
            extra.pop("name", None)
            function.update(extra)
    return {"type": "function", "function": json.loads(json.dumps(function))}


def _invoke_sync(entry: ToolEntry, args: Mapping[str, Any], kwargs: dict[str, Any]) -> Any:
    result = entry.handler(dict(args), **kwargs)
    if inspect.isawaitable(result):
        result = run_coroutine_sync(result)
    return result


def ensure_json_string(name: str, result: Any) -> str:
    """Pass a handler's string through; anything else is a contract breach the model sees."""
    if isinstance(result, str):
        return result
    return tool_error(
        f"tool {name!r} returned {type(result).__name__} instead of a JSON string "
        "(handlers must return json.dumps(...))"
    )


@dataclass(frozen=True, kw_only=True)
class RegistrySnapshot:
    """An immutable view of the tools available to one worker, and its fingerprint."""

    entries: Mapping[str, ToolEntry]
    definitions: Mapping[str, dict[str, Any]]
    unavailable: Mapping[str, str]
    toolsets: Mapping[str, tuple[str, ...]]
    toolset_descriptions: Mapping[str, str] = field(default_factory=dict)
    settings: ToolSettings = field(default_factory=ToolSettings)

    @property
    def fingerprint(self) -> str:
        canonical = [
            {
                "definition": self.definitions[name],
                "limit": self.entries[name].max_result_size_chars,
            }
            for name in sorted(self.entries)
        ]
        blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def tools_for(self, toolsets: Iterable[str]) -> list[str]:
        """Available tools of the named toolsets; unknown names raise ``ToolsetError``."""
        names: set[str] = set()
        for ts in toolsets:
            if ts not in self.toolsets:
                valid = ", ".join(sorted(self.toolsets))
                raise ToolsetError(f"unknown toolset {ts!r}; valid toolsets: {valid}")
            names.update(t for t in self.toolsets[ts] if t in self.entries)
        return sorted(names)

    def toolset_available(self, toolset: str) -> Availability:
        """A toolset is available when at least one of its tools is; else say why not."""
        tools = self.toolsets.get(toolset)
        if tools is None:
            return Availability(False, f"unknown toolset {toolset!r}")
        if any(t in self.entries for t in tools):
            return Availability(True)
        reasons = sorted({self.unavailable.get(t, f"tool {t!r} is not registered") for t in tools})
        return Availability(False, "; ".join(reasons) or "toolset has no tools")

    def get_definitions(self, tool_names: Iterable[str]) -> list[dict[str, Any]]:
        return [self.definitions[n] for n in sorted(set(tool_names)) if n in self.definitions]


# The process-wide registry tool modules register into (the seed's singleton).
registry = ToolRegistry()
