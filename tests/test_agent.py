"""Whole agent episodes over real HTTP: the embedded endpoint with every fault, real tools.

Each episode runs ``run_episode`` against the embedded endpoint (its SYNTHETIC scripted
policy) in a background thread, with the built-in tools running for real in a scratch
directory under ``tmp_path``. ``check_record`` holds every invariant a record must keep
whatever happened, and is applied to every episode of this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hermes.agent import EpisodeRecord, EpisodeSettings, run_episode
from hermes.endpoint import EmbeddedEndpoint, EndpointConfig, FaultRates
from hermes.model_client import ModelClient, ModelSettings
from hermes.trajectory import (
    parse_arguments,
    parse_tool_calls,
    parse_tool_responses,
    parse_tools_block,
    validate_messages,
)
from tools.discovery import discover_tools
from tools.dispatch import ToolDispatcher
from tools.registry import RegistrySnapshot, ToolRegistry, registry, tool_result
from tools.settings import ToolContext, ToolSettings

PROMPT = "Write some notes about the project and show me what is in them."
# The file tools' results hold no absolute paths or timestamps, so an episode using only
# them is byte-for-byte reproducible: faulty and clean runs can be compared whole.
FILE_TOOLS = ("file",)
SHELL_TOOLS = ("terminal", "file")
CLIENT = {
    "model": "hermes-embedded",
    "api_key": "test-key",
    "max_retries": 8,
    "backoff_base_s": 0.005,
    "backoff_max_s": 0.02,
    "request_timeout_s": 2.0,
}
# finish_reason -> (completed, partial, has an error message)
OUTCOMES = {
    "stop": (True, False, False),
    "length": (True, False, False),
    "max_turns": (False, True, False),
    "max_turns_summary": (True, True, False),
    "invalid_tool_calls": (False, True, True),
    "deadline": (False, True, True),
    "error": (False, False, True),
}


@pytest.fixture(scope="module")
def snapshot() -> RegistrySnapshot:
    discover_tools()
    return registry.snapshot(ToolSettings(env={"PATH": os.environ["PATH"]}))


@contextlib.contextmanager
def endpoint(**config: Any) -> Iterator[EmbeddedEndpoint]:
    config.setdefault("seed", 1)
    with EmbeddedEndpoint(EndpointConfig(**config)) as ep:
        yield ep


def faults(**rates: Any) -> FaultRates:
    params = {"retry_after_s": 0.01, "hang_s": 1.0, "huge_output_bytes": 2_000_000}
    return FaultRates(**{**params, **rates})


def model_client(base_url: str, **overrides: Any) -> ModelClient:
    return ModelClient(ModelSettings(**{**CLIENT, "base_url": base_url, **overrides}))


async def episode_with(
    model: ModelClient,
    dispatcher: ToolDispatcher,
    scratch_root: Path,
    *,
    toolsets: tuple[str, ...] = SHELL_TOOLS,
    prompt: str = PROMPT,
    task_id: str = "t1",
    **settings: Any,
) -> EpisodeRecord:
    return await run_episode(
        prompt,
        task_id=task_id,
        tool_names=dispatcher.snapshot.tools_for(toolsets),
        dispatcher=dispatcher,
        client=model,
        settings=EpisodeSettings(scratch_root=scratch_root, **settings),
    )


async def episode_async(
    base_url: str,
    snapshot: RegistrySnapshot,
    scratch_root: Path,
    *,
    client: dict[str, Any] | None = None,
    **kwargs: Any,
) -> EpisodeRecord:
    """One episode with a client and a dispatcher of its own."""
    model = model_client(base_url, **(client or {}))
    try:
        with ToolDispatcher(snapshot) as dispatcher:
            return await episode_with(model, dispatcher, scratch_root, **kwargs)
    finally:
        await model.close()


def episode(
    base_url: str, snapshot: RegistrySnapshot, scratch_root: Path, **kwargs: Any
) -> EpisodeRecord:
    record = asyncio.run(episode_async(base_url, snapshot, scratch_root, **kwargs))
    check_record(record)
    return record


# -- invariants of every record --------------------------------------------------------------


def calls_of(record: EpisodeRecord) -> list[dict[str, Any]]:
    return [c for m in record.messages if m["role"] == "assistant" for c in m["tool_calls"]]


def tool_messages(record: EpisodeRecord) -> list[dict[str, Any]]:
    return [m for m in record.messages if m["role"] == "tool"]


def check_record(record: EpisodeRecord) -> None:
    """What holds for any episode: counts agree with the messages, pairing, formats."""
    messages = record.messages
    assert validate_messages(messages) == []
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert record.api_calls == len(assistants)
    assert record.num_tool_calls == len(tool_messages(record))
    assert sum(s["count"] for s in record.tool_stats.values()) == record.num_tool_calls
    for stats in record.tool_stats.values():
        assert stats["count"] == stats["success"] + stats["failure"]
    check_pairing(messages)
    usage = record.usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert (usage["prompt_tokens"] > 0) == (record.api_calls > 0)
    completed, partial, failed = OUTCOMES[record.finish_reason]
    assert (record.completed, record.partial, record.error is not None) == (
        completed,
        partial,
        failed,
    )
    kinds = {"transient", "permanent"} if record.finish_reason == "error" else {None, "transient"}
    assert record.error_kind in kinds
    assert record.started_at <= record.finished_at
    assert record.duration_s >= record.model_time_s >= 0
    assert record.tool_time_s >= 0
    check_conversations(record)


def check_pairing(messages: list[dict[str, Any]]) -> None:
    """Each assistant's calls are answered right after it, in call order."""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        calls = message["tool_calls"]
        answers = messages[index + 1 : index + 1 + len(calls)]
        assert [a["role"] for a in answers] == ["tool"] * len(calls)
        assert [a["tool_call_id"] for a in answers] == [c["id"] for c in calls]
        assert [a["name"] for a in answers] == [c["function"]["name"] for c in calls]


def check_conversations(record: EpisodeRecord) -> None:
    turns = record.conversations
    assert turns[0]["from"] == "system"
    offered = [t["function"]["name"] for t in parse_tools_block(turns[0]["value"])]
    assert offered == record.tools
    gpt = [t["value"] for t in turns if t["from"] == "gpt"]
    assistants = [m for m in record.messages if m["role"] == "assistant"]
    assert len(gpt) == len(assistants)
    for value, message in zip(gpt, assistants, strict=True):
        calls = [
            {
                "name": c["function"]["name"],
                "arguments": parse_arguments(c["function"]["arguments"]),
            }
            for c in message["tool_calls"]
        ]
        assert parse_tool_calls(value) == calls
        assert value.startswith("<think>\n") == bool(message["reasoning"])
    responses = [r for t in turns if t["from"] == "tool" for r in parse_tool_responses(t["value"])]
    results = tool_messages(record)
    assert [(r["tool_call_id"], r["name"]) for r in responses] == [
        (m["tool_call_id"], m["name"]) for m in results
    ]


# -- clean episodes --------------------------------------------------------------------------


def test_clean_episode(snapshot: RegistrySnapshot, tmp_path: Path) -> None:
    with endpoint(min_tool_turns=2, max_tool_turns=2) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, system_prompt="You are a test agent.")
        stats = ep.stats()
    assert (record.completed, record.partial, record.finish_reason) == (True, False, "stop")
    assert record.error is None and record.error_kind is None
    roles = [m["role"] for m in record.messages]
    assert roles[:3] == ["system", "user", "assistant"]
    assert record.messages[0]["content"] == "You are a test agent."
    assert record.messages[1]["content"] == PROMPT
    assert record.messages[2]["tool_calls"]
    assert record.messages[-1]["role"] == "assistant"
    assert not record.messages[-1]["tool_calls"] and record.messages[-1]["content"]
    assert record.api_calls == 3 == stats["requests"]
    assert record.num_tool_calls >= 2
    assert record.tools == snapshot.tools_for(SHELL_TOOLS)
    assert all(s["failure"] == 0 for s in record.tool_stats.values())
    by_name: dict[str, int] = {}
    for call in calls_of(record):
        by_name[call["function"]["name"]] = by_name.get(call["function"]["name"], 0) + 1
    assert {k: v["count"] for k, v in record.tool_stats.items()} == by_name
    assert record.usage["prompt_tokens"] > 0 and record.usage["completion_tokens"] > 0
    assert (record.invalid_tool_calls, record.truncated_results) == (0, 0)
    assert record.has_reasoning is False
    turns = record.conversations
    assert turns[0]["value"].startswith("You are a test agent.\n\n")
    assert [t["from"] for t in turns[1:3]] == ["human", "gpt"]
    assert "<tool_call>" in turns[2]["value"] and turns[3]["from"] == "tool"
    assert "<tool_response>" in turns[3]["value"]
    assert record.duration_s > 0 and record.model_time_s > 0 and record.tool_time_s > 0
    assert record.started_at.endswith("+00:00")
    assert record.scratch_dir is None
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone


def test_keep_scratch_keeps_what_the_tools_wrote(
    snapshot: RegistrySnapshot, tmp_path: Path
) -> None:
    with endpoint(min_tool_turns=3, max_tool_turns=3) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, toolsets=FILE_TOOLS, keep_scratch=True)
    assert record.finish_reason == "stop"
    assert record.scratch_dir is not None
    scratch = Path(record.scratch_dir)
    assert scratch.is_dir() and scratch.parent == tmp_path
    # Replay the file calls to know what the scratch directory must hold now.
    expected: dict[str, str] = {}
    for call in calls_of(record):
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
        if name == "write_file":
            expected[args["path"]] = args["content"]
        elif name == "patch":
            old, new = args["old_string"], args["new_string"]
            expected[args["path"]] = expected[args["path"]].replace(old, new, 1)
    assert expected, "the plan for this seed writes files"
    assert all(s["failure"] == 0 for s in record.tool_stats.values())
    for path, text in expected.items():
        assert (scratch / path).read_text() == text


# -- reasoning ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_field_is_recorded(
    snapshot: RegistrySnapshot, tmp_path: Path, stream: bool
) -> None:
    with endpoint(reasoning="always", reasoning_style="field") as ep:
        record = episode(ep.base_url, snapshot, tmp_path, client={"stream": stream})
    assistants = [m for m in record.messages if m["role"] == "assistant"]
    assert all(isinstance(m["reasoning"], str) and m["reasoning"] for m in assistants)
    assert assistants[0]["reasoning"].startswith(f'The user asked: "{PROMPT[:40]}')
    assert record.has_reasoning
    gpt = [t["value"] for t in record.conversations if t["from"] == "gpt"]
    assert all(v.startswith("<think>\n") and "\n</think>\n" in v for v in gpt)
    assert assistants[-1]["reasoning"] in gpt[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_inline_think_tags_are_split_out(
    snapshot: RegistrySnapshot, tmp_path: Path, stream: bool
) -> None:
    with endpoint(reasoning="always", reasoning_style="think_tags") as ep:
        record = episode(ep.base_url, snapshot, tmp_path, client={"stream": stream})
    assistants = [m for m in record.messages if m["role"] == "assistant"]
    assert record.has_reasoning
    assert assistants[0]["reasoning"].startswith(f'The user asked: "{PROMPT[:40]}')
    for message in assistants:
        assert message["reasoning"] and "<think>" not in message["reasoning"]
        assert "<think>" not in (message["content"] or "")
        assert "</think>" not in (message["content"] or "")
    assert assistants[-1]["content"].startswith("I worked on")
    gpt = [t["value"] for t in record.conversations if t["from"] == "gpt"]
    assert all(v.count("<think>") == 1 for v in gpt)


# -- what reaches the model --------------------------------------------------------------------


@dataclass
class Recorder:
    """A loopback proxy that keeps every request body and forwards it to ``upstream``;
    without an upstream it answers ``status`` with an OpenAI-style error itself."""

    upstream: str | None = None
    status: int = 400
    bodies: list[dict[str, Any]] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raw = await request.read()
        self.bodies.append(json.loads(raw))
        if self.upstream is None or self.session is None:
            error = {"error": {"message": "invalid api key", "type": "auth", "code": None}}
            return web.json_response(error, status=self.status)
        url = self.upstream + "/chat/completions"
        headers = {"Content-Type": "application/json"}
        async with self.session.post(url, data=raw, headers=headers) as upstream:
            body = await upstream.read()
            return web.Response(status=upstream.status, body=body, headers=upstream.headers)


@contextlib.asynccontextmanager
async def recording(recorder: Recorder) -> AsyncIterator[str]:
    runner = web.ServerRunner(web.Server(recorder.handle), shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    async with aiohttp.ClientSession() as session:
        recorder.session = session
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        finally:
            await runner.cleanup()


def recorded_episode(
    recorder: Recorder, snapshot: RegistrySnapshot, scratch_root: Path, **kwargs: Any
) -> EpisodeRecord:
    async def scenario() -> EpisodeRecord:
        async with recording(recorder) as url:
            return await episode_async(url, snapshot, scratch_root, **kwargs)

    record = asyncio.run(scenario())
    check_record(record)
    return record


PREFILL = (
    {"role": "user", "content": "Example question: what is 2 + 2?"},
    {"role": "assistant", "content": "Example answer: 4."},
)


@pytest.mark.parametrize("system_prompt", ["Saved system prompt.", None])
def test_ephemeral_prompt_and_prefill_reach_the_model_but_are_not_saved(
    snapshot: RegistrySnapshot, tmp_path: Path, system_prompt: str | None
) -> None:
    with endpoint(min_tool_turns=2, max_tool_turns=2) as ep:
        recorder = Recorder(upstream=ep.base_url)
        record = recorded_episode(
            recorder,
            snapshot,
            tmp_path,
            system_prompt=system_prompt,
            ephemeral_system_prompt="Ephemeral instructions.",
            prefill_messages=PREFILL,
        )
    assert record.finish_reason == "stop"
    assert len(recorder.bodies) == record.api_calls == 3
    expected_system = "Ephemeral instructions."
    if system_prompt:
        expected_system = f"{system_prompt}\n\n{expected_system}"
    saved = record.messages[1:] if system_prompt else record.messages
    for body in recorder.bodies:
        sent = body["messages"]
        assert sent[0] == {"role": "system", "content": expected_system}
        assert sent[1:3] == list(PREFILL)
        assert sent[3] == {"role": "user", "content": PROMPT}
        assert all("reasoning" not in m for m in sent)
        assert [m["role"] for m in sent[3:]] == [m["role"] for m in saved[: len(sent) - 3]]
    everything = json.dumps([record.messages, record.conversations])
    assert "Ephemeral" not in everything and "Example" not in everything
    if system_prompt:
        assert record.messages[0] == {"role": "system", "content": system_prompt}
    else:
        assert record.messages[0]["role"] == "user"


@pytest.mark.parametrize("status", [400, 401])
def test_permanent_error_ends_the_episode_without_retries(
    snapshot: RegistrySnapshot, tmp_path: Path, status: int
) -> None:
    recorder = Recorder(status=status)
    record = recorded_episode(recorder, snapshot, tmp_path)
    assert len(recorder.bodies) == 1
    assert (record.finish_reason, record.error_kind) == ("error", "permanent")
    assert record.error is not None
    assert f"HTTP {status}" in record.error and "invalid api key" in record.error
    assert record.api_calls == 0 and record.messages == [{"role": "user", "content": PROMPT}]
    assert list(tmp_path.iterdir()) == []


def test_streaming_and_non_streaming_give_the_same_episode(
    snapshot: RegistrySnapshot, tmp_path: Path
) -> None:
    records = []
    for stream in (False, True):
        with endpoint(seed=5, min_tool_turns=3, max_tool_turns=3, reasoning="always") as ep:
            client = {"stream": stream}
            record = episode(ep.base_url, snapshot, tmp_path, toolsets=FILE_TOOLS, client=client)
            assert ep.stats()["streamed"] == (record.api_calls if stream else 0)
        records.append(record)
    plain, streamed = records
    assert plain.api_calls == 4 and plain.has_reasoning
    assert calls_of(plain) == calls_of(streamed)
    assert plain.messages == streamed.messages
    assert plain.usage == streamed.usage


# -- faults, one kind at a time ----------------------------------------------------------------

TRANSPORT_RETRIED = [
    ("http_500", False),
    ("http_429", False),
    ("html_200", False),
    ("html_200", True),
    ("empty_choices", False),
    ("empty_choices", True),
    ("truncated_stream", True),
    ("hang", False),
]


@pytest.mark.parametrize(("kind", "stream"), TRANSPORT_RETRIED)
def test_transport_faults_are_retried_and_leave_no_trace(
    snapshot: RegistrySnapshot, tmp_path: Path, kind: str, stream: bool
) -> None:
    # Short timeouts only where a hang needs one: a slow machine must not add retries.
    client = {"stream": stream, "request_timeout_s": 0.5 if kind == "hang" else 5.0}
    plan = {"min_tool_turns": 3, "max_tool_turns": 3}
    with endpoint(**plan) as ep:
        clean = episode(ep.base_url, snapshot, tmp_path, toolsets=FILE_TOOLS, client=client)
    with endpoint(**plan, faults=faults(**{kind: 0.6}, retry_after_s=0.05)) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, toolsets=FILE_TOOLS, client=client)
        stats = ep.stats()
    injected = stats["faults"][kind]
    assert injected > 0 and stats["faults_total"] == injected
    assert stats["requests"] == record.api_calls + injected  # each fault cost one retry
    if kind == "http_429":  # Retry-After (0.05 s) outweighs the 0.02 s backoff ceiling
        assert record.model_time_s >= 0.05 * injected
    assert record.finish_reason == "stop" and record.error is None
    assert record.messages == clean.messages
    assert record.usage == clean.usage


def faulty_episode(
    snapshot: RegistrySnapshot, tmp_path: Path, kind: str, rate: float, **settings: Any
) -> tuple[EpisodeRecord, dict[str, Any]]:
    """One episode with the file tools, whose results (unlike ``ls -la`` or ``pwd``) are
    the same on every run: the fault draws hash the request bodies, so this keeps them
    (and this seed's outcome) reproducible."""
    config = {"seed": 5, "min_tool_turns": 3, "max_tool_turns": 3}
    with endpoint(**config, faults=faults(**{kind: rate})) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, toolsets=FILE_TOOLS, **settings)
        return record, ep.stats()


def answers(record: EpisodeRecord) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(call, tool message) pairs of the whole episode."""
    by_id = {m["tool_call_id"]: m for m in tool_messages(record)}
    return [(call, by_id[call["id"]]) for call in calls_of(record)]


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def test_malformed_tool_calls_are_reported_and_the_episode_continues(
    snapshot: RegistrySnapshot, tmp_path: Path
) -> None:
    record, stats = faulty_episode(snapshot, tmp_path, "malformed_tool_call", 0.5)
    broken = [(c, m) for c, m in answers(record) if not is_json_object(c["function"]["arguments"])]
    assert len(broken) == stats["faults"]["malformed_tool_call"] == record.invalid_tool_calls == 3
    for call, message in broken:
        error = json.loads(message["content"])["error"]
        assert error.startswith(f"Invalid arguments for tool {call['function']['name']!r}")
        assert "not valid JSON" in error
    failures = sum(s["failure"] for s in record.tool_stats.values())
    assert failures >= len(broken)
    assert record.finish_reason == "stop" and record.completed
    assert record.api_calls > 2  # the model got the errors back and went on


def test_unknown_tool_calls_list_the_offered_tools(
    snapshot: RegistrySnapshot, tmp_path: Path
) -> None:
    record, stats = faulty_episode(snapshot, tmp_path, "unknown_tool", 0.4)
    unknown = [(c, m) for c, m in answers(record) if c["function"]["name"] == "nonexistent_tool"]
    assert len(unknown) == stats["faults"]["unknown_tool"] == record.invalid_tool_calls == 3
    expected = f"Unknown tool 'nonexistent_tool'. Available tools: {', '.join(record.tools)}"
    for _call, message in unknown:
        assert json.loads(message["content"]) == {"error": expected}
    assert record.tool_stats["nonexistent_tool"] == {
        "count": len(unknown),
        "success": 0,
        "failure": len(unknown),
    }
    assert record.finish_reason == "stop"


def test_huge_tool_output_is_truncated_to_the_limit(
    snapshot: RegistrySnapshot, tmp_path: Path
) -> None:
    # At rate 1.0 every turn is a terminal call printing 2 MB, so nothing else runs.
    with endpoint(min_tool_turns=3, max_tool_turns=3, faults=faults(huge_output=1.0)) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, max_turns=3)
        stats = ep.stats()
    limit = snapshot.settings.default_max_result_chars
    huge = [(c, m) for c, m in answers(record) if "yes hermes" in c["function"]["arguments"]]
    assert len(huge) == stats["faults"]["huge_output"] == record.truncated_results == 3
    for _call, message in huge:
        content = message["content"]
        assert len(content) <= limit
        assert "...[truncated: " in content and " characters omitted]..." in content
        result = json.loads(content)
        assert result["truncated"] is True and result["exit_code"] == 0
        assert result["omitted_chars"] > 2_000_000 - limit
        assert result["output"].startswith("hermes\nhermes\n")
    assert record.tool_stats == {"terminal": {"count": 3, "success": 3, "failure": 0}}
    assert record.finish_reason == "max_turns"  # the episode went on after each one


FATAL = [
    ("http_500", False, "HTTP 500"),
    ("http_429", False, "HTTP 429"),
    ("html_200", False, "not a chat completion"),
    ("empty_choices", False, "no choices"),
    ("truncated_stream", True, "connection failed"),
    ("hang", False, "timed out"),
]


@pytest.mark.parametrize(("kind", "stream", "named"), FATAL)
def test_persistent_transport_fault_ends_the_episode_with_a_transient_error(
    snapshot: RegistrySnapshot, tmp_path: Path, kind: str, stream: bool, named: str
) -> None:
    timeout = 0.3 if kind == "hang" else 5.0
    client = {"stream": stream, "max_retries": 2, "request_timeout_s": timeout}
    with endpoint(faults=faults(**{kind: 1.0})) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, client=client)
        stats = ep.stats()
    assert stats["requests"] == stats["faults"][kind] == 3
    assert (record.finish_reason, record.error_kind) == ("error", "transient")
    assert record.error is not None
    assert "gave up after 3 attempt(s)" in record.error and named in record.error
    assert (record.completed, record.partial, record.api_calls) == (False, False, 0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kind", "limit"), [("unknown_tool", 3), ("unknown_tool", 1), ("malformed_tool_call", 2)]
)
def test_consecutive_invalid_turns_stop_the_episode(
    snapshot: RegistrySnapshot, tmp_path: Path, kind: str, limit: int
) -> None:
    config = {"min_tool_turns": 6, "max_tool_turns": 6, "max_calls_per_turn": 1}
    with endpoint(**config, faults=faults(**{kind: 1.0})) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, max_invalid_turns=limit)
    assert record.finish_reason == "invalid_tool_calls"
    assert (record.completed, record.partial) == (False, True)
    assert record.api_calls == record.invalid_tool_calls == record.num_tool_calls == limit
    assert record.error == f"{limit} consecutive turns with only invalid tool calls"
    assert record.messages[-1]["role"] == "tool"


# -- limits ------------------------------------------------------------------------------------


def test_max_turns_stops_a_long_plan(snapshot: RegistrySnapshot, tmp_path: Path) -> None:
    with endpoint(min_tool_turns=8, max_tool_turns=8) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, max_turns=3)
    assert record.finish_reason == "max_turns"
    assert (record.completed, record.partial, record.api_calls) == (False, True, 3)
    assert record.messages[-1]["role"] == "tool"


def test_summary_on_max_turns_asks_once_more_without_tools(
    snapshot: RegistrySnapshot, tmp_path: Path
) -> None:
    with endpoint(min_tool_turns=8, max_tool_turns=8) as ep:
        record = episode(
            ep.base_url,
            snapshot,
            tmp_path,
            max_turns=3,
            summary_on_max_turns=True,
            summary_prompt="Summarise now.",
        )
        requests = ep.stats()["requests"]
    assert record.finish_reason == "max_turns_summary"
    assert (record.completed, record.partial) == (True, True)
    assert record.api_calls == requests == 4
    assert record.messages[-2] == {"role": "user", "content": "Summarise now."}
    last = record.messages[-1]
    # The scripted policy calls a tool whenever tools are offered and its plan is not
    # done, so an answer without calls shows the summary request offered none.
    assert last["role"] == "assistant" and not last["tool_calls"] and last["content"]


def test_deadline_ends_a_slow_episode(snapshot: RegistrySnapshot, tmp_path: Path) -> None:
    with endpoint(min_tool_turns=8, max_tool_turns=8, latency_ms=150) as ep:
        record = episode(ep.base_url, snapshot, tmp_path, toolsets=FILE_TOOLS, deadline_s=0.4)
    assert record.finish_reason == "deadline"
    assert (record.completed, record.partial) == (False, True)
    assert 1 <= record.api_calls <= 2
    assert record.duration_s < 1.0
    assert record.error is not None
    # However the deadline lands (between turns or inside a request), it is a partial
    # episode with a row, not an infrastructure failure to retry.
    assert record.error_kind is None


# -- tool resources ------------------------------------------------------------------------------


def test_cleanups_registered_by_tools_run_at_episode_end(tmp_path: Path) -> None:
    events: list[tuple[str, bool]] = []

    def hold(args: dict[str, Any], **kwargs: Any) -> str:
        ctx = kwargs["ctx"]
        assert isinstance(ctx, ToolContext)
        events.append(("call", ctx.scratch_dir.is_dir()))
        if len(events) == 1:
            ctx.on_close(failing_cleanup)  # a broken release must not stop the others
        ctx.on_close(lambda: events.append(("close", ctx.scratch_dir.is_dir())))
        return tool_result(held=args.get("label", ""))

    def failing_cleanup() -> None:
        raise RuntimeError("release failed")

    fresh = ToolRegistry()
    schema = {
        "name": "hold",
        "description": "Hold a resource until the episode ends.",
        "parameters": {"type": "object", "properties": {"label": {"type": "string"}}},
    }
    fresh.register(name="hold", toolset="probe", schema=schema, handler=hold)
    probe = fresh.snapshot(ToolSettings(env={"PATH": os.environ["PATH"]}))
    with endpoint(min_tool_turns=3, max_tool_turns=3, max_calls_per_turn=1) as ep:
        record = episode(ep.base_url, probe, tmp_path, toolsets=("probe",))
    assert record.finish_reason == "stop"
    assert record.tool_stats == {"hold": {"count": 3, "success": 3, "failure": 0}}
    # Every release ran once, after the last call, while the scratch dir still existed.
    assert events == [("call", True)] * 3 + [("close", True)] * 3
    assert list(tmp_path.iterdir()) == []


# -- every fault at once -----------------------------------------------------------------------

MIXED = {
    "http_500": 0.05,
    "http_429": 0.05,
    "html_200": 0.08,
    "hang": 0.02,
    "empty_choices": 0.1,
    "truncated_stream": 0.1,
    "malformed_tool_call": 0.05,
    "unknown_tool": 0.05,
    "huge_output": 0.04,
}
TRANSPORT = ("http_500", "http_429", "html_200", "hang", "empty_choices", "truncated_stream")


@pytest.mark.slow  # about 5 s: 30 concurrent episodes, a few 3 s request timeouts
def test_every_fault_at_once_over_many_episodes(snapshot: RegistrySnapshot, tmp_path: Path) -> None:
    count = 30

    async def run_all(base_url: str) -> list[EpisodeRecord]:
        # Shared by the episodes, as in a worker. The endpoint shares this process (and its
        # GIL) with them and their tools: a generous timeout keeps slow but sound answers
        # from counting as hangs when the machine is busy.
        models = [model_client(base_url, stream=s, request_timeout_s=3.0) for s in (False, True)]
        try:
            with ToolDispatcher(snapshot) as dispatcher:
                return await asyncio.gather(
                    *(
                        episode_with(
                            models[i % 2],
                            dispatcher,
                            tmp_path,
                            prompt=f"Task {i}: write notes{i}.txt, then check what it holds.",
                            task_id=f"task-{i}",
                            max_turns=8,
                        )
                        for i in range(count)
                    )
                )
        finally:
            for model in models:
                await model.close()

    config = {"min_tool_turns": 1, "max_tool_turns": 4, "faults": faults(**MIXED, hang_s=4.0)}
    with endpoint(**config) as ep:
        records = asyncio.run(run_all(ep.base_url))
        stats = ep.stats()
    for record in records:
        check_record(record)
    injected = stats["faults"]
    # Terminal output (timestamps, scratch paths) feeds the fault draws, so the counts
    # vary a little between runs; the one-kind tests above cover each kind for sure.
    assert sum(injected[kind] > 0 for kind in MIXED) >= len(MIXED) - 1, injected
    assert {r.finish_reason for r in records} <= {"stop", "invalid_tool_calls", "max_turns"}
    assert sum(r.finish_reason == "stop" for r in records) >= count - 3
    transport = sum(injected[kind] for kind in TRANSPORT)
    assert stats["requests"] == sum(r.api_calls for r in records) + transport
    invalid = injected["unknown_tool"] + injected["malformed_tool_call"]
    assert sum(r.invalid_tool_calls for r in records) == invalid
    assert sum(r.truncated_results for r in records) == injected["huge_output"]
    assert stats["streamed"] > 0
    assert len({r.task_id for r in records}) == count
    assert list(tmp_path.iterdir()) == []
