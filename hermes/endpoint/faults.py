"""Switchable faults of the embedded endpoint (a SYNTHETIC policy for tests and benchmarks).

Each fault kind has a probability in [0, 1]. Whether a request gets a fault is decided
from a hash of (fault seed, the request body's bytes, the attempt number of that exact
body), so a fixed sequence of requests always gets the same faults, and a retry of a
request (same body, next attempt) may get a different outcome. Attempts are counted per
body in a bounded table on the server; keying on the body rather than a global request
counter keeps a conversation's faults independent of how other conversations interleave.

Per request, one draw per kind is made in the order of ``FAULT_KINDS``; the first
applicable kind whose draw is under its rate wins among the transport faults (no
completion is produced) and, separately, among the content faults (the completion is
altered). A transport fault wins over a content fault.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from hermes.endpoint.policy import Decision, ToolCall, schema_args
from hermes.errors import ConfigError

TRANSPORT_FAULTS = ("hang", "http_500", "http_429", "html_200", "empty_choices", "truncated_stream")
CONTENT_FAULTS = ("unknown_tool", "malformed_tool_call", "huge_output")
FAULT_KINDS = TRANSPORT_FAULTS + CONTENT_FAULTS
UNKNOWN_TOOL_NAME = "nonexistent_tool"


@dataclass(frozen=True, kw_only=True)
class FaultRates:
    """Probability of each fault kind per request, plus the faults' parameters."""

    http_500: float = 0.0
    http_429: float = 0.0
    html_200: float = 0.0
    hang: float = 0.0
    empty_choices: float = 0.0
    malformed_tool_call: float = 0.0
    unknown_tool: float = 0.0
    huge_output: float = 0.0
    truncated_stream: float = 0.0
    seed: int = 0
    retry_after_s: float = 1.0
    hang_s: float = 3600.0
    huge_output_bytes: int = 5_000_000

    def __post_init__(self) -> None:
        for kind in FAULT_KINDS:
            rate = getattr(self, kind)
            if not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
                raise ConfigError(f"fault rate {kind} must be a number in [0, 1], got {rate!r}")
        if self.retry_after_s < 0 or self.hang_s < 0 or self.huge_output_bytes < 1:
            raise ConfigError("retry_after_s and hang_s must be >= 0, huge_output_bytes >= 1")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultRates:
        """Build from a config mapping; unknown keys are a ConfigError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown fault option(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    @property
    def enabled(self) -> bool:
        return any(getattr(self, kind) > 0 for kind in FAULT_KINDS)


@dataclass(frozen=True)
class FaultDraw:
    """The faults chosen for one request (None: that group is not injected)."""

    transport: str | None = None
    content: str | None = None


NO_FAULT = FaultDraw()


def draw_faults(
    rates: FaultRates, body: bytes, attempt: int, *, stream: bool, has_tools: bool
) -> FaultDraw:
    """Pick this request's faults; a pure function of its arguments."""
    if not rates.enabled:
        return NO_FAULT
    digest = hashlib.sha256(b"%d:%d:" % (rates.seed, attempt) + body).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    transport: str | None = None
    content: str | None = None
    for kind in FAULT_KINDS:
        hit = rng.random() < getattr(rates, kind)  # always drawn: keeps the sequence fixed
        if not hit or not _applies(kind, stream=stream, has_tools=has_tools):
            continue
        if kind in TRANSPORT_FAULTS and transport is None:
            transport = kind
        elif kind in CONTENT_FAULTS and content is None:
            content = kind
    return FaultDraw(transport=transport, content=None if transport else content)


def _applies(kind: str, *, stream: bool, has_tools: bool) -> bool:
    if kind == "truncated_stream":
        return stream
    if kind == "malformed_tool_call":
        return has_tools
    return True


class AttemptCounter:
    """How many times each exact request body was seen (bounded, oldest forgotten)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[bytes, int] = OrderedDict()

    def next(self, body: bytes) -> int:
        """The attempt number of this body: 0 the first time, then 1, 2, ..."""
        key = hashlib.sha256(body).digest()
        attempt = self._seen.pop(key, -1) + 1
        self._seen[key] = attempt
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return attempt


def apply_content_fault(
    kind: str,
    decision: Decision,
    tools: Mapping[str, Mapping[str, Any]],
    rates: FaultRates,
    prompt: str,
    call_id: str,
) -> Decision:
    """Alter a completion to show one content fault; ``call_id`` names a call it adds."""
    call_id = decision.tool_calls[0].id if decision.tool_calls else call_id
    rng = random.Random(call_id)
    if kind == "unknown_tool":
        call = ToolCall(id=call_id, name=UNKNOWN_TOOL_NAME, arguments='{"input": "anything"}')
        return replace(decision, content=None, tool_calls=(call,), finish_reason="tool_calls")
    if kind == "malformed_tool_call":
        first = decision.tool_calls[0] if decision.tool_calls else None
        if first is None:
            name = next(iter(tools))
            first = ToolCall(
                id=call_id, name=name, arguments=json.dumps(schema_args(tools[name], rng, prompt))
            )
        # Any strict prefix of a JSON object is invalid JSON: the object is never closed.
        broken = replace(first, arguments=first.arguments[: max(1, len(first.arguments) // 2)])
        calls = (broken, *decision.tool_calls[1:])
        return replace(decision, tool_calls=calls, finish_reason="tool_calls")
    if kind == "huge_output":
        return _huge_output(decision, tools, rates, rng, prompt, call_id)
    raise ValueError(f"not a content fault: {kind!r}")


def _huge_output(
    decision: Decision,
    tools: Mapping[str, Mapping[str, Any]],
    rates: FaultRates,
    rng: random.Random,
    prompt: str,
    call_id: str,
) -> Decision:
    """A terminal call printing megabytes when ``terminal`` is offered, else huge content."""
    size = rates.huge_output_bytes
    if "terminal" in tools:
        command = f"yes hermes | head -c {size}"
        args = schema_args(tools["terminal"], rng, prompt, command=command)
        call = ToolCall(id=call_id, name="terminal", arguments=json.dumps(args))
        return replace(decision, content=None, tool_calls=(call,), finish_reason="tool_calls")
    content = ("hermes " * (size // 7 + 1))[:size]
    return replace(decision, content=content, tool_calls=(), finish_reason="stop")
