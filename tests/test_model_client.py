"""The model client against scripted loopback servers: classification, retries, bodies.

Every HTTP-level test talks to a real aiohttp server on 127.0.0.1 that answers from a
script (one reply per request, the last one repeating) and records what it received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import pytest
from aiohttp import web

from hermes.errors import ModelAPIError
from hermes.model_client import (
    Completion,
    ModelClient,
    ModelSettings,
    PermanentModelError,
    TransientModelError,
    classify,
)
from hermes.outage import OutagePolicy

Reply = Callable[[dict[str, Any]], Awaitable[web.StreamResponse]]
USER = [{"role": "user", "content": "hello"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "terminal",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


# -- a scripted server -----------------------------------------------------------------


@dataclass
class Script:
    """Answers request ``i`` with ``replies[i]`` (the last reply repeats); records bodies."""

    replies: list[Reply]
    bodies: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.bodies.append(json.loads(await request.read()))
        self.arrivals.append(time.monotonic())
        reply = self.replies[min(len(self.bodies), len(self.replies)) - 1]
        return await reply(self.bodies[-1])


@contextlib.asynccontextmanager
async def serving(script: Script) -> AsyncIterator[str]:
    runner = web.ServerRunner(web.Server(script.handle), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


def completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }


def ok(content: str = "done") -> Reply:
    return answer(web.json_response, completion({"role": "assistant", "content": content}))


def answer(make: Callable[..., web.StreamResponse], *args: Any, **kwargs: Any) -> Reply:
    async def reply(_body: dict[str, Any]) -> web.StreamResponse:
        return make(*args, **kwargs)

    return reply


def status(code: int, message: str = "nope", headers: dict[str, str] | None = None) -> Reply:
    error = {"error": {"message": message, "type": "test_error", "code": None}}
    return answer(web.json_response, error, status=code, headers=headers)


def hang(seconds: float) -> Reply:
    async def reply(_body: dict[str, Any]) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return web.json_response(completion({"role": "assistant", "content": "late"}))

    return reply


def sse(*chunks: dict[str, Any], done: bool = True) -> Reply:
    """A streamed answer: each chunk is a ``chat.completion.chunk`` object's fields."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    events = [f"data: {json.dumps({**head, **chunk})}\n\n" for chunk in chunks]
    if done:
        events.append("data: [DONE]\n\n")
    payload = "".join(events).encode()
    return answer(web.Response, body=payload, content_type="text/event-stream")


def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


def settings(base_url: str, **overrides: Any) -> ModelSettings:
    values: dict[str, Any] = {
        "model": "m",
        "base_url": base_url,
        "api_key": "test-key",
        "max_retries": 3,
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.001,
        "request_timeout_s": 5.0,
    }
    return ModelSettings(**{**values, **overrides})


def run_client(
    script: Script,
    action: Callable[[ModelClient], Coroutine[Any, Any, Completion]],
    **overrides: Any,
) -> Completion:
    """Serve ``script``, build a client for it, run ``action`` and close both."""

    async def scenario() -> Completion:
        async with serving(script) as url:
            client = ModelClient(settings(url, **overrides))
            try:
                return await action(client)
            finally:
                await client.close()

    return asyncio.run(scenario())


def complete(script: Script, *, deadline_in: float | None = None, **overrides: Any) -> Completion:
    async def action(client: ModelClient) -> Completion:
        deadline = None if deadline_in is None else time.monotonic() + deadline_in
        return await client.complete(USER, [TOOL], deadline=deadline)

    return run_client(script, action, **overrides)


# -- classify ------------------------------------------------------------------------------

REQUEST = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")


def status_error(code: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(code, headers=headers, request=REQUEST)
    return openai.APIStatusError(f"status {code}", response=response, body=None)


def _bad_json() -> json.JSONDecodeError:
    try:
        json.loads("{not json")
    except json.JSONDecodeError as exc:
        return exc
    raise AssertionError("unreachable")


TRANSIENT_CASES: list[tuple[BaseException, str]] = [
    (openai.APITimeoutError(request=REQUEST), "timeout"),
    (openai.APIConnectionError(request=REQUEST), "connection"),
    (status_error(429), "rate_limit"),
    *((status_error(code), f"http_{code}") for code in (408, 409, 425, 500, 502, 503, 529)),
    (status_error(599), "http_599"),  # any 5xx, listed or not
    (
        openai.APIResponseValidationError(
            response=httpx2.Response(200, request=REQUEST), body="<html>", message="bad"
        ),
        "bad_body",
    ),
    (_bad_json(), "bad_body"),
    (asyncio.TimeoutError(), "timeout"),
    (openai.APIError("engine died mid-stream", REQUEST, body=None), "stream"),
]


@pytest.mark.parametrize(("exc", "kind"), TRANSIENT_CASES, ids=lambda v: type(v).__name__)
def test_classify_transient(exc: BaseException, kind: str) -> None:
    error = classify(exc)
    assert isinstance(error, TransientModelError)
    assert error.kind == kind


@pytest.mark.parametrize("code", [400, 401, 403, 404, 413, 422])
def test_classify_client_status_codes_are_permanent(code: int) -> None:
    error = classify(status_error(code))
    assert isinstance(error, PermanentModelError)
    assert error.kind == f"http_{code}"
    assert f"HTTP {code}" in str(error)


def test_classify_programming_errors_are_permanent_and_named() -> None:
    error = classify(TypeError("create() got an unexpected keyword argument 'tool'"))
    assert isinstance(error, PermanentModelError)
    assert error.kind == "client_error"
    assert str(error).startswith("TypeError: create() got an unexpected keyword")


def test_classify_passes_own_errors_through() -> None:
    own = TransientModelError("stream ended", kind="truncated_stream")
    assert classify(own) is own
    assert isinstance(classify(PermanentModelError("x")), ModelAPIError)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("2", 2.0), ("0.25", 0.25), ("-3", 0.0), ("Wed, 21 Oct 2015 07:28:00 GMT", None)],
)
def test_classify_reads_retry_after(header: str, expected: float | None) -> None:
    error = classify(status_error(429, {"Retry-After": header}))
    assert isinstance(error, TransientModelError)
    assert error.retry_after_s == expected


def test_classify_shortens_huge_messages() -> None:
    error = classify(ValueError("x" * 10_000))
    assert len(str(error)) < 400
    assert str(error).endswith("...")


# -- retries, backoff, deadline --------------------------------------------------------------


def test_retry_after_is_honoured() -> None:
    script = Script([status(429, "slow down", {"Retry-After": "0.2"}), ok()])
    result = complete(script)
    gap = script.arrivals[1] - script.arrivals[0]
    assert 0.2 <= gap < 0.6
    assert result.attempts == 2
    assert len(result.errors) == 1 and "HTTP 429" in result.errors[0]
    assert result.latency_s >= 0.2


def test_retry_after_is_capped() -> None:
    script = Script([status(429, "slow down", {"Retry-After": "30"}), ok()])
    result = complete(script, retry_after_cap_s=0.1)
    gap = script.arrivals[1] - script.arrivals[0]
    assert 0.1 <= gap < 0.6
    assert result.content == "done"


def test_backoff_is_exponential_jittered_and_bounded() -> None:
    client = ModelClient(
        settings("http://127.0.0.1:9/v1", backoff_base_s=0.5, backoff_max_s=4.0),
        rng=random.Random(7),
    )
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)]:
        delays = [client._backoff(attempt, None) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # full jitter spans the whole range
    assert client._backoff(1, 3.0) == 3.0  # Retry-After beats a shorter backoff
    asyncio.run(client.close())


def test_transient_errors_are_retried_until_max_retries() -> None:
    script = Script([status(503, "overloaded")])
    with pytest.raises(TransientModelError) as info:
        complete(script, max_retries=2)
    assert len(script.bodies) == 3
    assert "gave up after 3 attempt(s)" in str(info.value)
    assert "HTTP 503" in str(info.value) and "overloaded" in str(info.value)
    assert info.value.kind == "http_503"


def test_transient_then_success_reports_attempts_and_errors() -> None:
    garbage = answer(web.Response, body=b"{not json", content_type="application/json")
    script = Script([status(500), garbage, ok("finally")])
    result = complete(script)
    assert result.content == "finally"
    assert result.attempts == 3
    assert "HTTP 500" in result.errors[0]
    assert "unparseable response body" in result.errors[1]
    assert (result.prompt_tokens, result.completion_tokens) == (7, 3)


def test_permanent_error_is_not_retried() -> None:
    script = Script([status(400, "model 'm' does not exist"), ok()])
    with pytest.raises(PermanentModelError) as info:
        complete(script, max_retries=5)
    assert len(script.bodies) == 1
    assert "HTTP 400" in str(info.value) and "does not exist" in str(info.value)


def test_deadline_stops_retries_early() -> None:
    script = Script([status(500)])
    started = time.monotonic()
    with pytest.raises(TransientModelError) as info:
        # The outage gate would (rightly) pause a run of 500s; this test is about the
        # deadline alone, so the gate never closes here.
        complete(
            script,
            deadline_in=0.4,
            max_retries=1000,
            backoff_base_s=0.05,
            outage=OutagePolicy(failure_threshold=10**6),
        )
    elapsed = time.monotonic() - started
    assert elapsed < 1.0
    assert 1 < len(script.bodies) < 1000
    # Either no backoff fitted before the deadline, or a backoff sleep overshot it.
    attempts = re.search(r"after (\d+) (?:failed )?attempt\(s\)", str(info.value))
    assert attempts is not None and int(attempts.group(1)) == len(script.bodies)
    assert "HTTP 500" in str(info.value)


def test_retry_after_beyond_the_deadline_gives_up_at_once() -> None:
    script = Script([status(429, "later", {"Retry-After": "5"}), ok()])
    started = time.monotonic()
    with pytest.raises(TransientModelError) as info:
        complete(script, deadline_in=2.0)
    assert time.monotonic() - started < 1.0
    assert len(script.bodies) == 1
    assert info.value.kind == "rate_limit"


def test_deadline_bounds_a_hanging_request() -> None:
    script = Script([hang(5.0)])
    started = time.monotonic()
    with pytest.raises(TransientModelError) as info:
        complete(script, deadline_in=0.3, request_timeout_s=30.0)
    assert time.monotonic() - started < 1.5
    assert "timed out" in str(info.value)


def test_request_timeout_is_transient_and_retried() -> None:
    script = Script([hang(5.0), ok("second try")])
    result = complete(script, request_timeout_s=0.2)
    assert result.content == "second try"
    assert result.attempts == 2
    assert "timed out" in result.errors[0]


def test_a_passed_deadline_fails_before_any_request() -> None:
    script = Script([ok()])
    with pytest.raises(TransientModelError) as info:
        complete(script, deadline_in=-1.0)
    assert info.value.kind == "deadline"
    assert script.bodies == []


# -- request bodies ------------------------------------------------------------------------


def test_request_body_carries_sampling_params_extra_body_and_stream_options() -> None:
    client = ModelClient(
        settings(
            "http://127.0.0.1:9/v1",
            temperature=0.3,
            top_p=0.9,
            max_tokens=128,
            seed=11,
            stop=("END",),
            reasoning_effort="low",
            extra_body={"top_k": 20, "chat_template_kwargs": {"enable_thinking": True}},
            stream=True,
        )
    )
    body = client.request_body(USER, [TOOL])
    assert body == {
        "model": "m",
        "messages": USER,
        "tools": [TOOL],
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 128,
        "seed": 11,
        "reasoning_effort": "low",
        "stop": ["END"],
        "extra_body": {"top_k": 20, "chat_template_kwargs": {"enable_thinking": True}},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    plain = ModelClient(settings("http://127.0.0.1:9/v1")).request_body(USER, [])
    assert plain == {"model": "m", "messages": USER}  # unset options are not sent
    asyncio.run(client.close())


def test_request_body_reaches_the_server_with_extra_body_merged() -> None:
    script = Script([sse(delta(content="hi"), delta("stop"))])
    complete(
        script,
        stream=True,
        temperature=0.0,
        seed=3,
        stop=("END",),
        extra_body={"top_k": 5, "repetition_penalty": 1.1},
    )
    sent = script.bodies[0]
    assert sent["top_k"] == 5 and sent["repetition_penalty"] == 1.1
    assert sent["temperature"] == 0.0 and sent["seed"] == 3 and sent["stop"] == ["END"]
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["tools"] == [TOOL]
    assert "extra_body" not in sent


# -- responses -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_is_read_from_either_field(key: str) -> None:
    message = {"role": "assistant", "content": "4", key: "2 + 2 is 4."}
    script = Script([answer(web.json_response, completion(message))])
    result = complete(script)
    assert result.reasoning == "2 + 2 is 4."
    assert result.content == "4"


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_streamed_reasoning_is_read_from_either_field(key: str) -> None:
    script = Script(
        [
            sse(
                delta(role="assistant", content=""),
                delta(**{key: "2 + 2 "}),
                delta(**{key: "is 4."}),
                delta(content="4"),
                delta("stop"),
            )
        ]
    )
    result = complete(script, stream=True)
    assert result.reasoning == "2 + 2 is 4."
    assert result.content == "4"


def test_no_reasoning_is_none() -> None:
    result = complete(Script([ok("plain")]))
    assert result.reasoning is None


def test_tool_calls_are_normalised() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "terminal", "arguments": ""}},
            {
                "id": "b",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
            },
        ],
    }
    script = Script([answer(web.json_response, completion(message, "tool_calls"))])
    result = complete(script)
    assert result.finish_reason == "tool_calls"
    assert [c["function"]["arguments"] for c in result.tool_calls] == ["", '{"command": "ls"}']
    assert all(c["type"] == "function" for c in result.tool_calls)


def test_stream_accumulates_tool_calls_by_index_and_usage() -> None:
    def call_delta(index: int, **fields: Any) -> dict[str, Any]:
        return delta(tool_calls=[{"index": index, **fields}])

    usage = {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
    script = Script(
        [
            sse(
                delta(role="assistant", content="Let me look."),
                call_delta(0, id="c0", type="function", function={"name": "terminal"}),
                call_delta(1, id="c1", type="function", function={"name": "terminal"}),
                call_delta(0, function={"arguments": '{"comm'}),
                call_delta(1, function={"arguments": '{"command": "pwd"}'}),
                call_delta(0, function={"arguments": 'and": "ls"}'}),
                delta("tool_calls"),
                {"choices": [], "usage": usage},
            )
        ]
    )
    result = complete(script, stream=True)
    assert result.content == "Let me look."
    assert [(c["id"], c["function"]["arguments"]) for c in result.tool_calls] == [
        ("c0", '{"command": "ls"}'),
        ("c1", '{"command": "pwd"}'),
    ]
    assert result.finish_reason == "tool_calls"
    assert (result.prompt_tokens, result.completion_tokens) == (40, 12)


def test_stream_without_finish_reason_is_transient() -> None:
    whole = sse(delta(content="whole answer"), delta("stop"))
    script = Script([sse(delta(content="half an ans")), whole])
    result = complete(script, stream=True)
    assert result.content == "whole answer"
    assert result.attempts == 2
    assert "stream ended before a finish_reason" in result.errors[0]


def test_stream_without_choices_is_transient() -> None:
    script = Script([sse({"choices": []})])
    with pytest.raises(TransientModelError) as info:
        complete(script, stream=True, max_retries=1)
    assert info.value.kind == "empty_choices"
    assert len(script.bodies) == 2


def test_error_event_inside_a_stream_is_retried() -> None:
    broken = answer(
        web.Response,
        body=b'data: {"error": {"message": "engine died", "type": "server_error"}}\n\n',
        content_type="text/event-stream",
    )
    script = Script([broken, sse(delta(content="ok"), delta("stop"))])
    result = complete(script, stream=True)
    assert result.content == "ok"
    assert "engine died" in result.errors[0]


def test_empty_choices_is_transient() -> None:
    empty = {**completion({"role": "assistant", "content": "x"}), "choices": []}
    script = Script([answer(web.json_response, empty), ok()])
    result = complete(script)
    assert result.attempts == 2
    assert result.errors == ("response had no choices",)


def test_html_body_with_status_200_is_transient() -> None:
    html = answer(web.Response, text="<html>gateway</html>", content_type="text/html")
    script = Script([html, ok()])
    result = complete(script)
    assert result.attempts == 2
    assert "not a chat completion" in result.errors[0]
