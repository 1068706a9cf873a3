"""The model client: one OpenAI-compatible chat call with the runner's retry policy.

The runner owns retries (the openai client's own are off): exponential backoff with full
jitter, Retry-After honoured up to a cap, a per-request timeout and the episode's
deadline. Errors are classified transient (retried) or permanent (recorded, the episode
stops). A garbage body (bare ``JSONDecodeError``) and an empty ``choices`` list are
transient, not crashes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

from hermes.errors import ModelAPIError
from hermes.outage import OutageError, OutageGate, OutagePolicy

logger = logging.getLogger(__name__)

# Status codes worth retrying: timeouts, conflicts, rate limits, server-side failures.
TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """Where and how to call the model. ``api_key``/``base_url`` fall back to
    ``OPENAI_API_KEY``/``OPENAI_BASE_URL`` when unset."""

    model: str
    base_url: str | None = None
    api_key: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    reasoning_effort: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    stream: bool = False
    request_timeout_s: float = 600.0
    max_retries: int = 6
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    retry_after_cap_s: float = 120.0
    outage: OutagePolicy = field(default_factory=OutagePolicy)

    def resolved_base_url(self) -> str | None:
        return self.base_url or os.environ.get("OPENAI_BASE_URL") or None

    def resolved_api_key(self) -> str:
        # Local servers (vLLM, the embedded endpoint) accept any key; the client needs one.
        return self.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"


class TransientModelError(ModelAPIError):
    """A request failed in a way a retry may fix (5xx, 429, timeout, garbage body)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.kind = kind


class PermanentModelError(ModelAPIError):
    """A request failed in a way retrying cannot fix (bad request, auth, unknown model)."""

    def __init__(self, message: str, *, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One assistant turn as returned by the endpoint, normalised."""

    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 1
    latency_s: float = 0.0
    paused_s: float = 0.0
    errors: tuple[str, ...] = ()
    error_kinds: tuple[str, ...] = ()


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None


def classify(exc: BaseException) -> ModelAPIError:
    """Map anything a request can raise to a transient or permanent error."""
    if isinstance(exc, ModelAPIError):
        return exc
    if isinstance(exc, openai.APITimeoutError):
        return TransientModelError(f"request timed out: {exc}", kind="timeout")
    if isinstance(exc, openai.APIConnectionError):
        return TransientModelError(f"connection failed: {exc}", kind="connection")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = f"HTTP {status}: {_short(str(exc))}"
        if status in TRANSIENT_STATUS or status >= 500:
            kind = "rate_limit" if status == 429 else f"http_{status}"
            return TransientModelError(message, retry_after_s=_retry_after(exc), kind=kind)
        return PermanentModelError(message, kind=f"http_{status}")
    if isinstance(exc, (json.JSONDecodeError, openai.APIResponseValidationError)):
        return TransientModelError(
            f"unparseable response body: {_short(str(exc))}", kind="bad_body"
        )
    if isinstance(exc, asyncio.TimeoutError):
        return TransientModelError("request timed out", kind="timeout")
    if isinstance(exc, openai.APIError):
        # What is left is an ``error`` event inside a stream that began with HTTP 200:
        # the server failed mid-answer (vLLM, OpenRouter upstreams), so a retry may work.
        return TransientModelError(f"error event in the stream: {_short(str(exc))}", kind="stream")
    return PermanentModelError(f"{type(exc).__name__}: {_short(str(exc))}", kind="client_error")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class ModelClient:
    """Async chat-completions client with retries; one per worker, shared by episodes."""

    def __init__(self, settings: ModelSettings, *, rng: random.Random | None = None) -> None:
        self.settings = settings
        # Jitter exists to de-synchronise clients, so it is deliberately not seeded.
        self._rng = rng or random.Random()
        self.gate = OutageGate(settings.outage)
        self._client = openai.AsyncOpenAI(
            base_url=settings.resolved_base_url(),
            api_key=settings.resolved_api_key(),
            timeout=settings.request_timeout_s,
            max_retries=0,
        )

    async def close(self) -> None:
        await self._client.close()

    def request_body(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """The keyword arguments of one ``chat.completions.create`` call."""
        s = self.settings
        body: dict[str, Any] = {"model": s.model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        optional = {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
            "seed": s.seed,
            "reasoning_effort": s.reasoning_effort,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if s.stop:
            body["stop"] = list(s.stop)
        if s.extra_body:
            body["extra_body"] = dict(s.extra_body)
        if s.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        *,
        deadline: float | None = None,
    ) -> Completion:
        """One assistant turn, retrying transient failures until ``deadline`` (monotonic).

        While the worker's outage gate is closed the request waits instead of failing;
        that wait moves the deadline and does not use up retries.
        """
        body = self.request_body(messages, tools)
        errors: list[str] = []
        kinds: list[str] = []
        started = time.monotonic()
        attempt = 0
        paused = 0.0
        while True:
            try:
                probe, waited = await self.gate.admit()
            except OutageError as exc:
                raise TransientModelError(
                    f"{exc}; {'; '.join(errors[-2:])}", kind="outage"
                ) from None
            paused += waited
            deadline = None if deadline is None else deadline + waited
            attempt += 0 if probe else 1
            timeout = self._timeout(deadline, errors)
            try:
                completion = await asyncio.wait_for(self._once(body), timeout)
            except Exception as exc:
                error = classify(exc)
                errors.append(str(error))
                if isinstance(error, PermanentModelError):
                    self.gate.success()  # the endpoint answered: it is up
                    raise error from exc
                kind = getattr(error, "kind", "")
                kinds.append(kind or "unknown")
                self.gate.failure(kind, probe=probe)
                if probe or self.gate.closed:
                    continue  # an outage: wait at the gate, do not spend retries
                delay = self._backoff(attempt, getattr(error, "retry_after_s", None))
                if attempt > self.settings.max_retries or not _fits(deadline, delay):
                    raise TransientModelError(
                        f"gave up after {attempt} attempt(s): {'; '.join(errors[-3:])}", kind=kind
                    ) from exc
                logger.debug("attempt %d failed (%s); retrying in %.2f s", attempt, error, delay)
                await asyncio.sleep(delay)
                continue
            self.gate.success()
            return Completion(
                content=completion.content,
                reasoning=completion.reasoning,
                tool_calls=completion.tool_calls,
                finish_reason=completion.finish_reason,
                prompt_tokens=completion.prompt_tokens,
                completion_tokens=completion.completion_tokens,
                attempts=max(attempt, 1),
                latency_s=time.monotonic() - started - paused,
                paused_s=paused,
                errors=tuple(errors),
                error_kinds=tuple(kinds),
            )

    def _timeout(self, deadline: float | None, errors: Sequence[str] = ()) -> float:
        timeout = self.settings.request_timeout_s
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # A backoff sleep can overshoot the deadline: say what was being retried.
                tried = f" after {len(errors)} failed attempt(s): {errors[-1]}" if errors else ""
                raise TransientModelError(f"episode deadline reached{tried}", kind="deadline")
            timeout = min(timeout, remaining)
        return timeout

    def _backoff(self, attempt: int, retry_after_s: float | None) -> float:
        s = self.settings
        ceiling = min(s.backoff_max_s, s.backoff_base_s * 2 ** (attempt - 1))
        delay = self._rng.uniform(0, ceiling)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, s.retry_after_cap_s))
        return delay

    async def _once(self, body: dict[str, Any]) -> Completion:
        if body.get("stream"):
            return await self._once_streaming(body)
        response = await self._client.chat.completions.create(**body)
        if not hasattr(response, "choices"):
            raise TransientModelError(
                f"response body is not a chat completion: {_short(str(response))}", kind="bad_body"
            )
        if not response.choices:
            raise TransientModelError("response had no choices", kind="empty_choices")
        choice = response.choices[0]
        message = choice.message
        usage = response.usage
        return Completion(
            content=message.content,
            reasoning=_reasoning_of(message),
            tool_calls=[_tool_call_dict(tc) for tc in message.tool_calls or []],
            finish_reason=choice.finish_reason,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )

    async def _once_streaming(self, body: dict[str, Any]) -> Completion:
        stream = await self._client.chat.completions.create(**body)
        acc = _StreamAccumulator()
        async for chunk in stream:
            acc.add(chunk)
        return acc.result()


def _fits(deadline: float | None, delay: float) -> bool:
    return deadline is None or time.monotonic() + delay < deadline


def _reasoning_of(message: Any) -> str | None:
    """Reasoning from ``reasoning_content`` (vLLM, DeepSeek) or ``reasoning`` (OpenRouter)."""
    extra = getattr(message, "model_extra", None) or {}
    for key in ("reasoning_content", "reasoning"):
        value = getattr(message, key, None) or extra.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _tool_call_dict(tool_call: Any) -> dict[str, Any]:
    function = getattr(tool_call, "function", None)
    return {
        "id": tool_call.id or "",
        "type": "function",
        "function": {
            "name": getattr(function, "name", "") or "",
            "arguments": getattr(function, "arguments", "") or "",
        },
    }


class _StreamAccumulator:
    """Rebuilds one assistant message from streamed chunks (tool calls by index)."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.saw_choice = False

    def add(self, chunk: Any) -> None:
        if chunk.usage is not None:
            self.prompt_tokens = chunk.usage.prompt_tokens
            self.completion_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices or []:
            self.saw_choice = True
            delta = choice.delta
            if delta.content:
                self.content.append(delta.content)
            reasoning = _reasoning_of(delta)
            if reasoning:
                self.reasoning.append(reasoning)
            for tc in delta.tool_calls or []:
                slot = self.calls.setdefault(tc.index, {"id": "", "name": "", "arguments": []})
                slot["id"] = tc.id or slot["id"]
                if tc.function is not None:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"].append(tc.function.arguments or "")
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def result(self) -> Completion:
        if not self.saw_choice:
            raise TransientModelError("stream carried no choices", kind="empty_choices")
        if self.finish_reason is None:
            raise TransientModelError(
                "stream ended before a finish_reason", kind="truncated_stream"
            )
        calls = [
            {
                "id": slot["id"],
                "type": "function",
                "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])},
            }
            for _, slot in sorted(self.calls.items())
        ]
        return Completion(
            content="".join(self.content) or None,
            reasoning="".join(self.reasoning) or None,
            tool_calls=calls,
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
        )
