"""The embedded endpoint over real loopback HTTP: the openai client, raw SSE, errors, routes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from hermes.endpoint import EmbeddedEndpoint, EndpointConfig

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str, properties: dict[str, Any], *required: str) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": list(required)}
    function = {"name": name, "description": f"The {name} tool.", "parameters": params}
    return {"type": "function", "function": function}


TOOLS = [
    _tool("terminal", {"command": {"type": "string"}, "timeout": {"type": "integer"}}, "command"),
    _tool(
        "write_file",
        {"path": {"type": "string"}, "content": {"type": "string"}},
        "path",
        "content",
    ),
    _tool("read_file", {"path": {"type": "string"}}, "path"),
]
PROMPT: list[Any] = [
    {"role": "user", "content": "Write a short note about hermes and read it back."}
]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[EmbeddedEndpoint]:
    with EmbeddedEndpoint(EndpointConfig(seed=7, aliases=("alias-model",))) as ep:
        yield ep


async def _create(base_url: str, **kwargs: Any) -> Any:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
        return await client.chat.completions.create(model="hermes-synthetic", **kwargs)


async def _stream_chunks(base_url: str, **kwargs: Any) -> list[Any]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="hermes-synthetic", stream=True, **kwargs
        )
        return [chunk async for chunk in stream]


def _reassemble(chunks: list[Any]) -> dict[str, Any]:
    """What a client that always streams rebuilds: content, tool calls by index, finish."""
    content: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.id or ""
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = choice.finish_reason or finish
    return {
        "content": "".join(content) or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish,
    }


async def _post(url: str, data: bytes | str, **kwargs: Any) -> tuple[int, str, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.post(url, data=data, **kwargs) as r:
        return r.status, await r.text(), dict(r.headers)


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json(content_type=None)


def test_non_streaming_completion_parses_with_openai_client(endpoint: EmbeddedEndpoint) -> None:
    response = asyncio.run(_create(endpoint.base_url, messages=PROMPT, tools=TOOLS))
    assert response.object == "chat.completion"
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.role == "assistant"
    calls = choice.message.tool_calls
    assert calls and 1 <= len(calls) <= 2
    offered = {t["function"]["name"] for t in TOOLS}
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in offered
        assert isinstance(json.loads(call.function.arguments), dict)
    usage = response.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_stream_reassembles_to_the_non_streaming_answer(endpoint: EmbeddedEndpoint) -> None:
    kwargs: dict[str, Any] = {"messages": PROMPT, "tools": TOOLS, "seed": 3}
    plain = asyncio.run(_create(endpoint.base_url, **kwargs))
    chunks = asyncio.run(
        _stream_chunks(endpoint.base_url, stream_options={"include_usage": True}, **kwargs)
    )
    rebuilt = _reassemble(chunks)
    message = plain.choices[0].message
    expected = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in message.tool_calls
    ]
    assert rebuilt["tool_calls"] == expected
    assert rebuilt["content"] == message.content
    assert rebuilt["finish_reason"] == plain.choices[0].finish_reason
    # The usage chunk comes last, with no choices, and matches the non-streaming usage.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(endpoint: EmbeddedEndpoint) -> None:
    chunks = asyncio.run(_stream_chunks(endpoint.base_url, messages=PROMPT))
    assert all(chunk.choices for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert _reassemble(chunks)["content"]


def test_raw_sse_uses_the_standard_incremental_tool_call_format(
    endpoint: EmbeddedEndpoint,
) -> None:
    body = {"model": "m", "messages": PROMPT, "tools": TOOLS, "stream": True}
    status, text, headers = asyncio.run(
        _post(endpoint.base_url + "/chat/completions", json.dumps(body))
    )
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in text.split("\n\n") if line)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    tool_deltas = [
        tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])
    ]
    firsts = [tc for tc in tool_deltas if "id" in tc]
    assert firsts and all(tc["type"] == "function" and tc["function"]["name"] for tc in firsts)
    # Later pieces carry the index and an arguments fragment only, never the name again.
    rest = [tc for tc in tool_deltas if "id" not in tc]
    assert rest and all(set(tc) == {"index", "function"} for tc in rest)
    assert all(set(tc["function"]) == {"arguments"} for tc in rest)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_same_request_gives_the_same_body(endpoint: EmbeddedEndpoint) -> None:
    url = endpoint.base_url + "/chat/completions"
    body = json.dumps({"model": "m", "messages": PROMPT, "tools": TOOLS, "seed": 11})
    first = json.loads(asyncio.run(_post(url, body))[1])
    second = json.loads(asyncio.run(_post(url, body))[1])
    for data in (first, second):
        data.pop("id")
        data.pop("created")
    assert first == second


def test_different_seeds_give_different_plans(endpoint: EmbeddedEndpoint) -> None:
    url = endpoint.base_url + "/chat/completions"
    answers = set()
    for seed in range(6):
        body = json.dumps({"model": "m", "messages": PROMPT, "tools": TOOLS, "seed": seed})
        data = json.loads(asyncio.run(_post(url, body))[1])
        answers.add(json.dumps(data["choices"][0]["message"]["tool_calls"], sort_keys=True))
    assert len(answers) > 1


def test_models_lists_the_configured_names(endpoint: EmbeddedEndpoint) -> None:
    async def names() -> list[str]:
        async with openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="x") as client:
            return [m.id async for m in client.models.list()]

    assert asyncio.run(names()) == ["hermes-synthetic", "alias-model"]


def test_health_stats_and_unknown_paths(endpoint: EmbeddedEndpoint) -> None:
    root = endpoint.base_url.removesuffix("/v1")
    assert asyncio.run(_get(root + "/health")) == (200, {"status": "ok", "policy": "synthetic"})
    status, stats = asyncio.run(_get(root + "/stats"))
    assert status == 200 and stats["requests"] >= 0 and set(stats["faults"]) >= {"http_500"}
    status, body = asyncio.run(_get(root + "/v1/no/such/path"))
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    status, body = asyncio.run(_get(endpoint.base_url + "/chat/completions"))
    assert status == 405 and "POST" in body["error"]["message"]


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"{not json", "Expecting property name"),
        (b"[1, 2]", "JSON object"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": [{"content": "no role"}]}', "role"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": 3}', "tools"),
    ],
)
def test_malformed_requests_get_400_with_an_openai_error_body(
    endpoint: EmbeddedEndpoint, payload: bytes, needle: str
) -> None:
    before = endpoint.stats()["bad_requests"]
    status, text, headers = asyncio.run(_post(endpoint.base_url + "/chat/completions", payload))
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    error = json.loads(text)["error"]
    assert error["type"] == "invalid_request_error" and needle in error["message"]
    assert endpoint.stats()["bad_requests"] == before + 1


def test_long_conversations_over_a_mebibyte_are_accepted(endpoint: EmbeddedEndpoint) -> None:
    messages = [*PROMPT, {"role": "assistant", "content": "x" * 3_000_000}, *PROMPT]
    response = asyncio.run(_create(endpoint.base_url, messages=messages, temperature=0.3))
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.prompt_tokens > 750_000


def test_openai_client_raises_bad_request_for_a_tool_choice_not_offered(
    endpoint: EmbeddedEndpoint,
) -> None:
    choice = {"type": "function", "function": {"name": "missing"}}
    with pytest.raises(openai.BadRequestError, match="missing"):
        asyncio.run(_create(endpoint.base_url, messages=PROMPT, tools=TOOLS, tool_choice=choice))


def test_second_endpoint_on_a_taken_port_fails_to_start(endpoint: EmbeddedEndpoint) -> None:
    with pytest.raises(OSError):
        EmbeddedEndpoint(port=endpoint.port).start()


def test_serve_forever_runs_in_its_own_process_and_stops_on_sigterm() -> None:
    code = (
        "from hermes.endpoint import EndpointConfig, serve_forever\n"
        "serve_forever('127.0.0.1', 0, EndpointConfig(model='proc-model'),"
        " ready=lambda url: print(url, flush=True))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    ) as proc:
        _check_serving_process(proc)


def _check_serving_process(proc: subprocess.Popen[str]) -> None:
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        response = asyncio.run(_create(base_url, messages=PROMPT))
        assert response.choices[0].finish_reason == "stop"
        status, models = asyncio.run(_get(base_url + "/models"))
        assert status == 200 and models["data"][0]["id"] == "proc-model"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
