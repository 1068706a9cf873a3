"""The scripted policy: whole conversations, schema-valid arguments, reasoning, limits."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from hermes.endpoint import EmbeddedEndpoint, EndpointConfig, PolicyConfig, ToolCall, decide
from hermes.endpoint.argsgen import ArgHints, generate_args
from hermes.errors import ConfigError


def _tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "description": f"The {name} tool.", "parameters": parameters}
    return {"type": "function", "function": function}


def _obj(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


STR = {"type": "string"}
BUILTIN_LIKE = [
    _tool(
        "terminal", _obj({"command": STR, "timeout": {"type": "integer", "minimum": 1}}, "command")
    ),
    _tool("write_file", _obj({"path": STR, "content": STR}, "path", "content")),
    _tool("read_file", _obj({"path": STR, "offset": {"type": "integer", "minimum": 1}}, "path")),
    _tool(
        "patch",
        _obj(
            {"path": STR, "old_string": STR, "new_string": STR}, "path", "old_string", "new_string"
        ),
    ),
]

ODD_SCHEMAS: dict[str, dict[str, Any]] = {
    "enums_and_bounds": _obj(
        {
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "level": {"type": "integer", "minimum": 3, "maximum": 5},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "flag": {"type": "boolean"},
            "fixed": {"const": "v1"},
            "name": {"type": "string", "minLength": 5, "maxLength": 8},
            "code": {"type": "string", "pattern": "^[A-Z][0-9]$"},
        },
        "mode",
        "level",
        "ratio",
        "fixed",
        "name",
        "code",
    ),
    "arrays_and_nesting": _obj(
        {
            "urls": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
            "filter": _obj({"field": STR, "op": {"enum": ["eq", "ne"]}}, "field", "op"),
            "points": {
                "type": "array",
                "items": _obj({"x": {"type": "integer"}, "y": {"type": "integer"}}, "x", "y"),
            },
        },
        "urls",
        "filter",
        "points",
    ),
    "refs_and_unions": {
        "type": "object",
        "$defs": {"item": _obj({"id": STR, "qty": {"type": "integer", "minimum": 1}}, "id", "qty")},
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1},
            "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 10}]},
            "limit": {"type": ["integer", "null"], "maximum": 50, "minimum": 10},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["items", "note", "limit", "email"],
    },
    "todo": _obj(
        {
            "todos": {
                "type": "array",
                "items": _obj(
                    {
                        "id": STR,
                        "content": STR,
                        "status": {"type": "string", "enum": ["pending", "completed"]},
                    },
                    "id",
                    "content",
                    "status",
                ),
            },
            "merge": {"type": "boolean"},
        },
    ),
    "empty": {"type": "object", "properties": {}},
}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[EmbeddedEndpoint]:
    config = EndpointConfig(seed=5, min_tool_turns=1, max_tool_turns=3)
    with EmbeddedEndpoint(config) as ep:
        yield ep


async def _converse(
    base_url: str, prompt: str, tools: list[dict[str, Any]], *, seed: int, stream: bool
) -> list[dict[str, Any]]:
    """A minimal agent loop: call, append the assistant turn and fake tool results, repeat."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
        for _ in range(10):
            kwargs = {"model": "m", "messages": messages, "tools": tools, "seed": seed}
            message = await (_streamed(client, kwargs) if stream else _plain(client, kwargs))
            messages.append(message)
            if not message.get("tool_calls"):
                return messages
            for call in message["tool_calls"]:
                name = call["function"]["name"]
                result = f"output of {name}\nsecond line"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise AssertionError("the policy never gave a final answer")


async def _plain(client: openai.AsyncOpenAI, kwargs: dict[str, Any]) -> dict[str, Any]:
    response = await client.chat.completions.create(**kwargs)
    message = response.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            tc.model_dump(include={"id", "type", "function"}) for tc in message.tool_calls
        ]
    return out


async def _streamed(client: openai.AsyncOpenAI, kwargs: dict[str, Any]) -> dict[str, Any]:
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(
                    tc.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                slot["id"] += tc.id or ""
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
    out: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


def _wire(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    """Tool calls as an assistant message carries them."""
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def _body(tools: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "Do the task."}],
        "tools": tools,
        **extra,
    }


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_conversation_ends_with_a_final_answer_within_the_planned_turns(
    endpoint: EmbeddedEndpoint, seed: int
) -> None:
    prompt = f"Summarise the project files, attempt {seed}"
    messages = asyncio.run(
        _converse(endpoint.base_url, prompt, BUILTIN_LIKE, seed=seed, stream=False)
    )
    tool_turns = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    assert 1 <= len(tool_turns) <= 3
    final = messages[-1]
    assert final["role"] == "assistant" and "tool_calls" not in final
    # The answer quotes the prompt and the last tool result it saw.
    last_result = [m for m in messages if m["role"] == "tool"][-1]["content"]
    assert prompt in final["content"]
    assert f"{len(last_result)} characters" in final["content"]
    assert "output of" in final["content"]


def test_streamed_conversation_matches_the_plain_one(endpoint: EmbeddedEndpoint) -> None:
    prompt = "Build a tiny report"
    plain = asyncio.run(_converse(endpoint.base_url, prompt, BUILTIN_LIKE, seed=9, stream=False))
    streamed = asyncio.run(_converse(endpoint.base_url, prompt, BUILTIN_LIKE, seed=9, stream=True))
    assert streamed == plain


def test_known_tools_are_called_in_a_coherent_order() -> None:
    """Over many conversations, files are only read or patched after being written."""
    config = PolicyConfig(min_tool_turns=3, max_tool_turns=3)
    for seed in range(40):
        files: dict[str, str] = {}
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {seed}"}]
        while True:
            decision = decide({"messages": messages, "tools": BUILTIN_LIKE, "seed": seed}, config)
            if not decision.tool_calls:
                break
            pending = dict(files)  # calls of one turn see the files of earlier turns only
            for call in decision.tool_calls:
                args = json.loads(call.arguments)
                if call.name == "write_file":
                    pending[args["path"]] = args["content"]
                elif call.name == "terminal" and " > " in args["command"]:
                    pending[args["command"].rsplit(" > ", 1)[1]] = "hello\n"
                elif call.name in ("read_file", "patch"):
                    assert args["path"] in files, (seed, call)
                if call.name == "patch":
                    assert files[args["path"]].count(args["old_string"]) == 1
                    pending[args["path"]] = files[args["path"]].replace(
                        args["old_string"], args["new_string"]
                    )
            files = pending
            calls = _wire(decision.tool_calls)
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            messages += [
                {"role": "tool", "tool_call_id": c.id, "content": "{}"} for c in decision.tool_calls
            ]


@pytest.mark.parametrize("name", sorted(ODD_SCHEMAS))
def test_generated_arguments_validate_against_their_schema(name: str) -> None:
    schema = ODD_SCHEMAS[name]
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for seed in range(60):
        args = generate_args(schema, random.Random(seed), ArgHints(optional_p=0.5))
        errors = [e.message for e in validator.iter_errors(args)]
        assert not errors, (seed, args, errors)


def test_draft4_bounds_and_schema_values_are_not_aliased() -> None:
    schema = _obj(
        {
            "level": {"type": "integer", "minimum": 1, "maximum": 3, "exclusiveMaximum": True},
            "share": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
            "opts": {"type": "object", "default": {"a": 1}},
        },
        "level",
        "share",
        "opts",
    )
    pristine = json.loads(json.dumps(schema))
    for seed in range(30):
        args = generate_args(schema, random.Random(seed))
        jsonschema.Draft4Validator(schema).validate(args)
        args["opts"]["mutated"] = True
    assert schema == pristine


def test_policy_arguments_for_an_unknown_tool_validate() -> None:
    schema = ODD_SCHEMAS["arrays_and_nesting"]
    seen = 0
    for seed in range(20):
        decision = decide(_body([_tool("odd_tool", schema)], seed=seed), PolicyConfig())
        for call in decision.tool_calls:
            assert call.name == "odd_tool"
            jsonschema.validate(json.loads(call.arguments), schema)
            seen += 1
    assert seen >= 20


def test_argument_values_follow_property_names() -> None:
    schema = _obj(
        {
            "command": STR,
            "path": STR,
            "url": STR,
            "query": STR,
            "urls": {"type": "array", "items": STR},
        },
        "command",
        "path",
        "url",
        "query",
        "urls",
    )
    args = generate_args(schema, random.Random(1), ArgHints(prompt_words=("weather", "paris")))
    assert args["path"] and not args["path"].startswith("/")
    assert args["url"].startswith("http://127.0.0.1/")
    assert all(u.startswith("http://127.0.0.1/") for u in args["urls"])
    assert "weather" in args["query"]
    timeout = {"timeout": {"type": "integer", "minimum": 1}}
    assert generate_args(_obj(timeout, "timeout"), random.Random(0)) == {"timeout": 30}
    assert args["command"] in {
        "ls -la",
        "pwd",
        "echo hello > notes.txt",
        'python3 -c "print(2+2)"',
        "date +%Y",
        "uname -s",
    }


def test_no_tools_gives_a_direct_answer() -> None:
    decision = decide({"messages": [{"role": "user", "content": "What is 2+2?"}]}, PolicyConfig())
    assert decision.tool_calls == () and decision.finish_reason == "stop"
    assert decision.content is not None and "What is 2+2?" in decision.content


def test_tool_choice_none_required_and_named() -> None:
    config = PolicyConfig()
    assert decide(_body(BUILTIN_LIKE, tool_choice="none"), config).tool_calls == ()
    named = {"type": "function", "function": {"name": "read_file"}}
    decision = decide(_body(BUILTIN_LIKE, tool_choice=named), config)
    assert [c.name for c in decision.tool_calls] == ["read_file"]
    # "required" calls a tool even once the plan is done.
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x"}]
    for _ in range(4):
        calls = decide(
            {"messages": messages, "tools": BUILTIN_LIKE, "tool_choice": "required"}, config
        ).tool_calls
        assert calls
        wire = _wire(calls)
        messages = [
            *messages,
            {"role": "assistant", "tool_calls": wire},
            {"role": "tool", "content": "ok"},
        ]


def test_decisions_are_pure_and_ignore_tool_order() -> None:
    config = PolicyConfig()
    body = _body(BUILTIN_LIKE, seed=4)
    assert decide(body, config) == decide(json.loads(json.dumps(body)), config)
    assert decide(_body(list(reversed(BUILTIN_LIKE)), seed=4), config) == decide(body, config)
    # The request seed wins over the config seed.
    assert decide(body, PolicyConfig(seed=99)) == decide(body, config)


@pytest.mark.parametrize(
    "extra",
    [
        {"reasoning_effort": "low"},
        {"reasoning": {"effort": "high"}},
        {"reasoning": {"enabled": True}},
        {"include_reasoning": True},
    ],
)
def test_reasoning_when_asked(extra: dict[str, Any]) -> None:
    config = PolicyConfig()
    assert decide(_body(BUILTIN_LIKE, **extra), config).reasoning
    assert decide(_body([], **extra), config).reasoning
    assert decide(_body(BUILTIN_LIKE), config).reasoning is None
    assert decide(_body(BUILTIN_LIKE, **extra), PolicyConfig(reasoning="never")).reasoning is None


def test_reasoning_off_switches_and_always_mode() -> None:
    config = PolicyConfig()
    assert decide(_body([], reasoning_effort="none"), config).reasoning is None
    assert decide(_body([], reasoning={"enabled": False}), config).reasoning is None
    assert decide(_body([]), PolicyConfig(reasoning="always")).reasoning


def test_think_tags_put_reasoning_inline() -> None:
    config = PolicyConfig(reasoning="always", reasoning_style="think_tags")
    final = decide(_body([]), config)
    assert final.reasoning is None and final.content is not None
    assert final.content.startswith("<think>\n") and "\n</think>\n\n" in final.content
    turn = decide(_body(BUILTIN_LIKE), config)
    assert turn.tool_calls and turn.content is not None and turn.content.startswith("<think>")


def test_reasoning_over_http_in_both_modes() -> None:
    async def ask(ep: EmbeddedEndpoint, stream: bool) -> tuple[str | None, str | None]:
        async with openai.AsyncOpenAI(base_url=ep.base_url, api_key="x") as client:
            kwargs: dict[str, Any] = {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "reasoning_effort": "low",
            }
            if not stream:
                message = (await client.chat.completions.create(**kwargs)).choices[0].message
                return message.content, (message.model_extra or {}).get("reasoning_content")
            content, thoughts = [], []
            async for chunk in await client.chat.completions.create(stream=True, **kwargs):
                for choice in chunk.choices:
                    content.append(choice.delta.content or "")
                    thoughts.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            return "".join(content), "".join(thoughts) or None

    with EmbeddedEndpoint(EndpointConfig()) as ep:
        plain, streamed = asyncio.run(ask(ep, False)), asyncio.run(ask(ep, True))
        assert plain[1] and plain == streamed
    with EmbeddedEndpoint(EndpointConfig(reasoning_style="think_tags")) as ep:
        content, thought = asyncio.run(ask(ep, True))
        assert thought is None and content is not None and content.startswith("<think>")


def test_failed_tool_result_may_end_the_conversation_early() -> None:
    config = PolicyConfig(min_tool_turns=3, max_tool_turns=3)
    outcomes: dict[str, set[bool]] = {"error": set(), "ok": set()}
    for seed in range(20):
        first = decide(_body(BUILTIN_LIKE, seed=seed), config)
        wire = _wire(first.tool_calls)
        for kind, result in (("error", '{"error": "boom"}'), ("ok", '{"output": "fine"}')):
            messages = [*_body([])["messages"], {"role": "assistant", "tool_calls": wire}]
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": result} for c in wire]
            decision = decide({"messages": messages, "tools": BUILTIN_LIKE, "seed": seed}, config)
            outcomes[kind].add(bool(decision.tool_calls))
    assert outcomes["ok"] == {True}  # the plan goes on after a success
    assert outcomes["error"] == {True, False}  # after an error it sometimes stops


def test_max_tokens_cuts_the_answer_with_finish_reason_length() -> None:
    config = PolicyConfig()
    full = decide(_body([]), config)
    cut = decide(_body([], max_tokens=5), config)
    assert cut.finish_reason == "length" and full.content is not None and cut.content is not None
    assert len(cut.content) == 20 and full.content.startswith(cut.content)
    assert decide(_body([], max_tokens=10_000), config) == full


def test_stop_sequence_cuts_the_answer() -> None:
    decision = decide(_body([], stop=["direct"]), PolicyConfig())
    assert decision.content == "Here is a "
    assert decision.finish_reason == "stop"


def test_invalid_policy_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="min_tool_turns"):
        PolicyConfig(min_tool_turns=4, max_tool_turns=2)
    with pytest.raises(ConfigError, match="reasoning_style"):
        PolicyConfig(reasoning_style="xml")
    with pytest.raises(ConfigError, match="unknown endpoint option"):
        EndpointConfig.from_dict({"modle": "x"})
    config = EndpointConfig.from_dict({"model": "x", "faults": {"http_500": 0.5}})
    assert config.faults.http_500 == 0.5


def test_calls_succeed_against_the_real_builtin_tools(tmp_path: Path) -> None:
    """Run the policy's calls with the real tools in empty scratch dirs: almost all succeed."""
    from tools.discovery import discover_tools
    from tools.registry import registry
    from tools.settings import ToolContext, ToolSettings

    discover_tools()
    settings = ToolSettings(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    names = ["terminal", "write_file", "read_file", "patch", "search_files", "execute_code", "todo"]
    tools = registry.snapshot(settings).get_definitions(names)
    assert len(tools) == len(names)
    ok = failed = 0
    for episode in range(10):
        ctx = ToolContext(
            task_id=f"e{episode}", scratch_dir=tmp_path / str(episode), settings=settings
        )
        ctx.scratch_dir.mkdir()
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"Organise my notes, run {episode}"}
        ]
        for _ in range(5):
            decision = decide(
                {"messages": messages, "tools": tools, "seed": episode}, PolicyConfig()
            )
            if not decision.tool_calls:
                break
            wire = _wire(decision.tool_calls)
            messages.append({"role": "assistant", "content": decision.content, "tool_calls": wire})
            for call in decision.tool_calls:
                out = registry.dispatch(
                    call.name, json.loads(call.arguments), ctx=ctx, task_id=ctx.task_id
                )
                result = json.loads(out)
                good = "error" not in result and result.get("exit_code", 0) == 0
                ok, failed = ok + good, failed + (not good)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    assert ok >= 15 and failed <= ok // 10, (ok, failed)
