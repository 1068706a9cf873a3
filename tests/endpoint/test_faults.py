"""Fault injection: each kind at probability 1.0 shows exactly its symptom and is counted."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from hermes.endpoint import (
    FAULT_KINDS,
    EmbeddedEndpoint,
    EndpointConfig,
    FaultRates,
    add_serve_arguments,
    config_from_args,
)
from hermes.endpoint.faults import AttemptCounter, draw_faults
from hermes.errors import ConfigError


def _tool(name: str, *props: str) -> dict[str, Any]:
    params = {
        "type": "object",
        "properties": {p: {"type": "string"} for p in props},
        "required": list(props),
    }
    return {"type": "function", "function": {"name": name, "parameters": params}}


TERMINAL = _tool("terminal", "command")
WRITE = _tool("write_file", "path", "content")
MESSAGES: list[Any] = [{"role": "user", "content": "List the files please."}]


def _body(tools: list[dict[str, Any]] | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES, **extra}
    if tools:
        body["tools"] = tools
    return json.dumps(body).encode()


def _endpoint(**rates: Any) -> EmbeddedEndpoint:
    return EmbeddedEndpoint(EndpointConfig(faults=FaultRates(**rates)))


@pytest.fixture
def faulty(request: pytest.FixtureRequest) -> Iterator[EmbeddedEndpoint]:
    with _endpoint(**request.param) as ep:
        yield ep


async def _post(
    url: str, body: bytes, timeout_s: float = 10.0
) -> tuple[int, bytes, dict[str, str]]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url + "/chat/completions", data=body) as response,
    ):
        return response.status, await response.read(), dict(response.headers)


def _only_fault(ep: EmbeddedEndpoint, kind: str, count: int = 1) -> None:
    faults = ep.stats()["faults"]
    assert faults[kind] == count
    assert sum(faults.values()) == count, faults


def _sse_chunks(raw: bytes) -> list[Any]:
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.parametrize("faulty", [{"http_500": 1.0}], indirect=True)
def test_http_500(faulty: EmbeddedEndpoint) -> None:
    status, raw, _ = asyncio.run(_post(faulty.base_url, _body([TERMINAL])))
    assert status == 500 and json.loads(raw)["error"]["type"] == "server_error"
    _only_fault(faulty, "http_500")


def test_http_429_has_a_retry_after_header() -> None:
    with _endpoint(http_429=1.0, retry_after_s=2) as ep:
        status, raw, headers = asyncio.run(_post(ep.base_url, _body()))
        assert status == 429 and headers["Retry-After"] == "2"
        assert json.loads(raw)["error"]["type"] == "rate_limit_error"

        async def via_openai() -> None:
            async with openai.AsyncOpenAI(base_url=ep.base_url, api_key="x", max_retries=0) as c:
                await c.chat.completions.create(model="m", messages=MESSAGES)

        with pytest.raises(openai.RateLimitError) as caught:
            asyncio.run(via_openai())
        assert caught.value.response.headers["retry-after"] == "2"
        _only_fault(ep, "http_429", 2)


@pytest.mark.parametrize("faulty", [{"html_200": 1.0}], indirect=True)
def test_html_200(faulty: EmbeddedEndpoint) -> None:
    status, raw, headers = asyncio.run(_post(faulty.base_url, _body()))
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert raw.startswith(b"<!DOCTYPE html>")
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    _only_fault(faulty, "html_200")


@pytest.mark.parametrize("faulty", [{"hang": 1.0, "hang_s": 60}], indirect=True)
def test_hang_trips_a_short_client_timeout(faulty: EmbeddedEndpoint) -> None:
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(_post(faulty.base_url, _body(), timeout_s=0.3))

    async def via_openai() -> None:
        async with openai.AsyncOpenAI(
            base_url=faulty.base_url, api_key="x", max_retries=0, timeout=0.3
        ) as client:
            await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)

    with pytest.raises(openai.APITimeoutError):
        asyncio.run(via_openai())
    _only_fault(faulty, "hang", 2)


def test_stop_ends_hung_requests_promptly() -> None:
    ep = _endpoint(hang=1.0, hang_s=3600).start()
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(_post(ep.base_url, _body(), timeout_s=0.2))
    started = time.monotonic()
    ep.stop()
    # Generous bound: the point is that stop() does not wait for the hour-long sleep.
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("faulty", [{"empty_choices": 1.0}], indirect=True)
def test_empty_choices_both_ways(faulty: EmbeddedEndpoint) -> None:
    status, raw, _ = asyncio.run(_post(faulty.base_url, _body([TERMINAL])))
    assert status == 200 and json.loads(raw)["choices"] == []
    status, raw, _ = asyncio.run(_post(faulty.base_url, _body([TERMINAL], stream=True)))
    assert status == 200 and [c["choices"] for c in _sse_chunks(raw)] == [[]]
    _only_fault(faulty, "empty_choices", 2)


@pytest.mark.parametrize("faulty", [{"malformed_tool_call": 1.0}], indirect=True)
def test_malformed_tool_call_arguments_are_invalid_json(faulty: EmbeddedEndpoint) -> None:
    status, raw, _ = asyncio.run(_post(faulty.base_url, _body([TERMINAL, WRITE])))
    call = json.loads(raw)["choices"][0]["message"]["tool_calls"][0]
    assert status == 200 and call["function"]["name"] in {"terminal", "write_file"}
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["function"]["arguments"])
    # Streamed, the reassembled arguments are just as broken.
    _, raw, _ = asyncio.run(_post(faulty.base_url, _body([TERMINAL, WRITE], stream=True)))
    pieces = [
        tc["function"].get("arguments", "")
        for chunk in _sse_chunks(raw)
        for choice in chunk["choices"]
        for tc in choice["delta"].get("tool_calls", [])
        if tc["index"] == 0
    ]
    with pytest.raises(json.JSONDecodeError):
        json.loads("".join(pieces))
    # Without tools there is nothing to break: no fault, and none counted.
    _, raw, _ = asyncio.run(_post(faulty.base_url, _body()))
    assert json.loads(raw)["choices"][0]["finish_reason"] == "stop"
    _only_fault(faulty, "malformed_tool_call", 2)


@pytest.mark.parametrize("faulty", [{"unknown_tool": 1.0}], indirect=True)
def test_unknown_tool_names_a_tool_not_offered(faulty: EmbeddedEndpoint) -> None:
    _, raw, _ = asyncio.run(_post(faulty.base_url, _body([TERMINAL])))
    choice = json.loads(raw)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["nonexistent_tool"]
    _only_fault(faulty, "unknown_tool")


def test_huge_output_with_and_without_a_terminal_tool() -> None:
    with _endpoint(huge_output=1.0, huge_output_bytes=200_000) as ep:
        _, raw, _ = asyncio.run(_post(ep.base_url, _body([TERMINAL])))
        call = json.loads(raw)["choices"][0]["message"]["tool_calls"][0]
        assert call["function"]["name"] == "terminal"
        assert json.loads(call["function"]["arguments"]) == {
            "command": "yes hermes | head -c 200000"
        }
        _, raw, _ = asyncio.run(_post(ep.base_url, _body([WRITE])))
        message = json.loads(raw)["choices"][0]["message"]
        assert len(message["content"]) == 200_000 and "tool_calls" not in message
        _, raw, _ = asyncio.run(_post(ep.base_url, _body(stream=True)))
        content = "".join(
            c["choices"][0]["delta"].get("content", "") for c in _sse_chunks(raw) if c["choices"]
        )
        assert len(content) == 200_000
        _only_fault(ep, "huge_output", 3)


@pytest.mark.parametrize("faulty", [{"truncated_stream": 1.0}], indirect=True)
def test_truncated_stream_drops_the_connection_before_done(faulty: EmbeddedEndpoint) -> None:
    async def read_raw() -> bytes:
        received = b""
        async with aiohttp.ClientSession() as session:
            url = faulty.base_url + "/chat/completions"
            async with session.post(url, data=_body([TERMINAL], stream=True)) as response:
                assert response.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for piece in response.content.iter_any():
                        received += piece
        return received

    received = asyncio.run(read_raw())
    assert received.startswith(b"data: {") and b"[DONE]" not in received

    async def via_openai() -> None:
        async with openai.AsyncOpenAI(base_url=faulty.base_url, api_key="x", max_retries=0) as c:
            stream: Any = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            async for _ in stream:
                pass

    with pytest.raises(openai.APIConnectionError):
        asyncio.run(via_openai())
    # Non-streaming requests cannot be truncated this way: untouched and not counted.
    status, raw, _ = asyncio.run(_post(faulty.base_url, _body()))
    assert status == 200 and json.loads(raw)["choices"]
    _only_fault(faulty, "truncated_stream", 2)


def test_latency_delays_every_request() -> None:
    with EmbeddedEndpoint(EndpointConfig(latency_ms=80, jitter_ms=20)) as ep:
        started = time.monotonic()
        status, _, _ = asyncio.run(_post(ep.base_url, _body()))
        assert status == 200 and time.monotonic() - started >= 0.08


def test_retries_of_one_request_can_differ_and_sequences_reproduce() -> None:
    def outcomes() -> list[int]:
        with _endpoint(http_500=0.5, seed=3) as ep:
            statuses = [asyncio.run(_post(ep.base_url, _body()))[0] for _ in range(16)]
            assert ep.stats()["faults"]["http_500"] == statuses.count(500)
            assert ep.stats()["requests"] == 16
            return statuses

    first = outcomes()
    assert set(first) == {200, 500}  # the same body, retried, gets both outcomes
    assert outcomes() == first  # a fresh server replays the same sequence


def test_draw_faults_is_pure_and_transport_wins() -> None:
    rates = FaultRates(http_500=1.0, unknown_tool=1.0, truncated_stream=1.0)
    draw = draw_faults(rates, b"body", 0, stream=False, has_tools=True)
    assert (draw.transport, draw.content) == ("http_500", None)
    content_only = FaultRates(unknown_tool=1.0, malformed_tool_call=1.0)
    draw = draw_faults(content_only, b"body", 0, stream=True, has_tools=True)
    assert (draw.transport, draw.content) == (None, "unknown_tool")
    half = FaultRates.from_dict(dict.fromkeys(FAULT_KINDS, 0.3))
    draws = [draw_faults(half, b"x", n, stream=True, has_tools=True) for n in range(50)]
    assert draws == [draw_faults(half, b"x", n, stream=True, has_tools=True) for n in range(50)]
    assert len(set(draws)) > 3


def test_attempt_counter_counts_per_body_and_forgets_the_oldest() -> None:
    counter = AttemptCounter(capacity=2)
    assert [counter.next(b"a"), counter.next(b"a"), counter.next(b"b")] == [0, 1, 0]
    counter.next(b"c")  # evicts "a", the least recently seen
    assert counter.next(b"a") == 0 and counter.next(b"c") == 1


def test_fault_config_validation_and_cli_options() -> None:
    with pytest.raises(ConfigError, match="http_500"):
        FaultRates(http_500=1.5)
    with pytest.raises(ConfigError, match="unknown fault option"):
        FaultRates.from_dict({"http_501": 0.1})
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--fault", "http_429=0.25", "--fault", "hang", "--port", "0"])
    config = config_from_args(args)
    assert config.faults.http_429 == 0.25 and config.faults.hang == 1.0
    with pytest.raises(ConfigError, match="KIND=NUMBER"):
        config_from_args(parser.parse_args(["--fault", "hang=lots"]))
