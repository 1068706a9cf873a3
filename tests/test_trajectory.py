"""messages -> Hermes conversations, inline reasoning split, message validation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hermes.trajectory import (
    DEFAULT_SYSTEM_PROMPT,
    HERMES_CALL_INSTRUCTIONS,
    HERMES_TOOLS_PREAMBLE,
    parse_tool_calls,
    parse_tool_responses,
    parse_tools_block,
    split_inline_reasoning,
    to_hermes_conversations,
    validate_messages,
)

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}
SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web; returns titles and URLs.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Sökfråga / 検索"}},
            "required": ["query"],
        },
    },
}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _assistant(content: str | None, *calls: Any, reasoning: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "reasoning": reasoning, "tool_calls": [*calls]}


def _tool(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def _values(turns: list[dict[str, str]], who: str) -> list[str]:
    return [turn["value"] for turn in turns if turn["from"] == who]


# ------------------------------------------------------------------- exact format


def test_small_conversation_has_exact_expected_text() -> None:
    messages = [
        {"role": "system", "content": "You do arithmetic."},
        {"role": "user", "content": "What is 2+3?"},
        _assistant(None, _call("c1", "add", '{"a": 2, "b": 3}'), reasoning="\nUse add.\n"),
        _tool("c1", "add", '{"result": 5}'),
        _assistant("It is 5."),
    ]

    turns = to_hermes_conversations(messages, [ADD_TOOL])

    expected_system = (
        "You do arithmetic.\n\n"
        + HERMES_TOOLS_PREAMBLE
        + "\n<tools>\n"
        + '{"type": "function", "function": {"name": "add", "description": "Add two numbers.", '
        + '"parameters": {"type": "object", "properties": {"a": {"type": "number"}, '
        + '"b": {"type": "number"}}, "required": ["a", "b"]}}}\n'
        + "</tools>\n"
        + "For each function call return a json object with function name and arguments "
        + "within <tool_call></tool_call> XML tags, in this format:\n"
        + "<tool_call>\n"
        + '{"name": <function-name>, "arguments": <args-dict>}\n'
        + "</tool_call>\n"
        + "Each result comes back in the next turn as a JSON object within "
        + "<tool_response></tool_response> XML tags."
    )
    assert turns == [
        {"from": "system", "value": expected_system},
        {"from": "human", "value": "What is 2+3?"},
        {
            "from": "gpt",
            "value": "<think>\nUse add.\n</think>\n"
            '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
        },
        {
            "from": "tool",
            "value": '<tool_response>\n{"tool_call_id": "c1", "name": "add", '
            '"content": {"result": 5}}\n</tool_response>',
        },
        {"from": "gpt", "value": "It is 5."},
    ]
    assert expected_system.endswith(HERMES_CALL_INSTRUCTIONS)


def test_gpt_turn_joins_reasoning_content_and_calls_in_that_order() -> None:
    message = _assistant(
        "Let me look.",
        _call("a", "add", '{"a": 1, "b": 1}'),
        _call("b", "add", "{}"),
        reasoning="plan",
    )

    [gpt] = _values(to_hermes_conversations([message], [ADD_TOOL]), "gpt")

    assert gpt == (
        "<think>\nplan\n</think>\nLet me look.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'
    )


# ----------------------------------------------------------- full multi-turn episode


def _episode() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You research things."},
        {"role": "user", "content": "Compare 2+2 and the capital of France."},
        _assistant(
            "Two things at once.",
            _call("call_add", "add", '{"a": 2, "b": 2}'),
            _call("call_search", "web_search", '{"query": "capital of France"}'),
            reasoning="I need both tools.",
        ),
        # Results arrive in the reverse order of the calls.
        _tool("call_search", "web_search", "Paris is the capital of France."),
        _tool("call_add", "add", '{"result": 4}'),
        _assistant(None, _call("call_bad", "add", '{"a": 1, "b": '), reasoning="Once more."),
        _tool("call_bad", "add", '{"error": "arguments are not valid JSON"}'),
        {"role": "user", "content": "Thanks. Anything else?"},
        _assistant("No, that is all.", reasoning="Done."),
    ]


def test_multi_turn_episode_turn_sequence() -> None:
    turns = to_hermes_conversations(_episode(), [ADD_TOOL, SEARCH_TOOL])

    assert [turn["from"] for turn in turns] == [
        "system",
        "human",
        "gpt",
        "tool",
        "gpt",
        "tool",
        "human",
        "gpt",
    ]
    assert turns[0]["value"].startswith("You research things.\n\n")
    assert turns[7]["value"] == "<think>\nDone.\n</think>\nNo, that is all."


def test_parallel_results_pair_by_id_and_follow_call_order() -> None:
    turns = to_hermes_conversations(_episode(), [ADD_TOOL, SEARCH_TOOL])

    responses = parse_tool_responses(turns[3]["value"])

    assert responses == [
        {"tool_call_id": "call_add", "name": "add", "content": {"result": 4}},
        {
            "tool_call_id": "call_search",
            "name": "web_search",
            "content": "Paris is the capital of France.",
        },
    ]
    assert turns[3]["value"].count("<tool_response>\n") == 2
    assert parse_tool_calls(turns[2]["value"]) == [
        {"name": "add", "arguments": {"a": 2, "b": 2}},
        {"name": "web_search", "arguments": {"query": "capital of France"}},
    ]


def test_invalid_json_arguments_keep_the_raw_text_and_the_call() -> None:
    turns = to_hermes_conversations(_episode(), [ADD_TOOL, SEARCH_TOOL])

    assert parse_tool_calls(turns[4]["value"]) == [{"name": "add", "arguments": '{"a": 1, "b": '}]
    assert '"arguments": "{\\"a\\": 1, \\"b\\": "' in turns[4]["value"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", {}),
        ("   ", {}),
        (None, {}),
        ('{"x": [1, 2]}', {"x": [1, 2]}),
        ("[1, 2]", "[1, 2]"),  # valid JSON but not an object: kept as the model wrote it
        ('{"x": NaN}', '{"x": NaN}'),  # would re-encode as invalid JSON
        ("[" * 100_000, "[" * 100_000),  # deep garbage must not crash the conversion
        ("not json at all", "not json at all"),
    ],
    ids=["empty", "blank", "none", "object", "list", "nan", "deep-garbage", "text"],
)
def test_arguments_parsing_edge_cases(raw: str | None, expected: Any) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": raw}}

    [gpt] = _values(to_hermes_conversations([_assistant(None, call)], [ADD_TOOL]), "gpt")

    assert parse_tool_calls(gpt) == [{"name": "add", "arguments": expected}]


def test_tool_content_json_container_is_embedded_and_scalars_stay_text() -> None:
    messages = [
        _assistant(None, _call("a", "add", "{}"), _call("b", "add", "{}"), _call("c", "add", "{}")),
        _tool("a", "add", '[{"n": 1}]'),
        _tool("b", "add", "42"),
        _tool("c", "add", "plain words"),
    ]

    [tool_turn] = _values(to_hermes_conversations(messages, [ADD_TOOL]), "tool")

    contents = [response["content"] for response in parse_tool_responses(tool_turn)]
    assert contents == [[{"n": 1}], "42", "plain words"]


def test_orphan_result_is_kept_after_paired_ones_and_missing_result_yields_nothing() -> None:
    messages = [
        {"role": "user", "content": "go"},
        _assistant(None, _call("x", "add", "{}"), _call("y", "add", "{}")),
        _tool("stray", "web_search", "from nowhere"),
        _tool("y", "add", "second"),
        # no result for "x"
    ]

    [tool_turn] = _values(to_hermes_conversations(messages, [ADD_TOOL]), "tool")

    assert parse_tool_responses(tool_turn) == [
        {"tool_call_id": "y", "name": "add", "content": "second"},
        {"tool_call_id": "stray", "name": "web_search", "content": "from nowhere"},
    ]


def test_duplicate_result_for_one_call_is_kept_as_an_extra() -> None:
    messages = [
        _assistant(None, _call("x", "add", "{}")),
        _tool("x", "add", "first"),
        _tool("x", "add", "again"),
    ]

    [tool_turn] = _values(to_hermes_conversations(messages, [ADD_TOOL]), "tool")

    assert [r["content"] for r in parse_tool_responses(tool_turn)] == ["first", "again"]


def test_result_without_name_takes_the_name_of_its_call() -> None:
    messages = [
        _assistant(None, _call("x", "web_search", '{"query": "q"}')),
        {"role": "tool", "tool_call_id": "x", "content": "ok"},
    ]

    [tool_turn] = _values(to_hermes_conversations(messages, [SEARCH_TOOL]), "tool")

    assert parse_tool_responses(tool_turn)[0]["name"] == "web_search"


# ---------------------------------------------------------------------- system turn


def test_tools_block_parses_back_to_the_given_definitions() -> None:
    tools = [ADD_TOOL, SEARCH_TOOL]
    [system] = _values(to_hermes_conversations(_episode(), tools), "system")

    between = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in between.split("\n")] == tools
    assert parse_tools_block(system) == tools


def test_bare_function_schemas_are_wrapped_like_openai_tools() -> None:
    [system] = _values(to_hermes_conversations([], [ADD_TOOL["function"]]), "system")

    assert parse_tools_block(system) == [ADD_TOOL]


def test_system_prompt_precedence_and_no_tools() -> None:
    user = {"role": "user", "content": "hi"}

    from_messages = to_hermes_conversations(
        [{"role": "system", "content": "S"}, user], [], system_prompt="arg"
    )
    from_argument = to_hermes_conversations([user], [], system_prompt="arg")
    default = to_hermes_conversations([user], None)

    assert from_messages[0] == {"from": "system", "value": "S"}
    assert from_argument[0] == {"from": "system", "value": "arg"}
    assert default[0] == {"from": "system", "value": DEFAULT_SYSTEM_PROMPT}
    assert parse_tools_block(default[0]["value"]) == []
    assert from_messages[1:] == [{"from": "human", "value": "hi"}]


def test_system_prompt_mentioning_tools_tag_does_not_confuse_the_parser() -> None:
    messages = [{"role": "system", "content": "Tags like\n<tools>\nare listed below."}]

    [system] = _values(to_hermes_conversations(messages, [ADD_TOOL]), "system")

    assert parse_tools_block(system) == [ADD_TOOL]


def test_later_system_message_becomes_its_own_turn() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Budget: 1 turn left."},
    ]

    turns = to_hermes_conversations(messages, [])

    assert turns[1:] == [
        {"from": "human", "value": "a"},
        {"from": "system", "value": "Budget: 1 turn left."},
    ]


# ------------------------------------------------------------------ misc content


def test_unicode_round_trips_unescaped() -> None:
    text = "Café 東京 — 🚀 ½"
    messages = [
        {"role": "user", "content": text},
        _assistant(None, _call("u", "web_search", json.dumps({"query": text})), reasoning=text),
        _tool("u", "web_search", json.dumps({"title": text})),
        _assistant(text),
    ]

    turns = to_hermes_conversations(messages, [SEARCH_TOOL])

    assert turns[1]["value"] == text
    assert turns[2]["value"].startswith(f"<think>\n{text}\n</think>\n")
    assert parse_tool_calls(turns[2]["value"]) == [
        {"name": "web_search", "arguments": {"query": text}}
    ]
    assert parse_tool_responses(turns[3]["value"])[0]["content"] == {"title": text}
    assert turns[4]["value"] == text
    assert "\\u" not in "".join(turn["value"] for turn in turns)
    assert "Sökfråga / 検索" in turns[0]["value"]


def test_inline_think_without_reasoning_is_not_double_wrapped() -> None:
    content = "<think>\nalready inline\n</think>\nAnswer"

    [gpt] = _values(to_hermes_conversations([_assistant(content)], []), "gpt")

    assert gpt == content
    assert gpt.count("<think>") == 1


def test_closing_tags_inside_payloads_do_not_break_parsing() -> None:
    messages = [
        _assistant(
            None,
            _call("t", "web_search", '{"query": "</tool_call> <tool_call>\\n"}'),
            reasoning="I will emit <tool_call>\n{} maybe",
        ),
        _tool("t", "web_search", "text with </tool_response> inside"),
    ]

    turns = to_hermes_conversations(messages, [SEARCH_TOOL])

    assert parse_tool_calls(turns[1]["value"]) == [
        {"name": "web_search", "arguments": {"query": "</tool_call> <tool_call>\n"}}
    ]
    assert parse_tool_responses(turns[2]["value"])[0]["content"] == (
        "text with </tool_response> inside"
    )


def test_list_content_parts_are_flattened_to_text() -> None:
    parts = [{"type": "text", "text": "look "}, {"type": "text", "text": "here"}]

    turns = to_hermes_conversations([{"role": "user", "content": parts}], [])

    assert turns[1] == {"from": "human", "value": "look here"}


def test_unknown_role_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown message role 'robot'"):
        to_hermes_conversations([{"role": "robot", "content": "beep"}], [])


# ------------------------------------------------------------ split_inline_reasoning


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, (None, None)),
        ("plain answer", (None, "plain answer")),
        ("  spaced  ", (None, "  spaced  ")),
        ("<think>\nstep 1\n</think>\n\nThe answer.", ("step 1", "The answer.")),
        ("<think>a</think>x<think>b</think>y", ("a\n\nb", "x\ny")),
        ("Answer first.\n<think>still thinking", ("still thinking", "Answer first.")),
        ("<think>only thoughts, cut off", ("only thoughts, cut off", None)),
        ("Before. <think>middle</think> After.", ("middle", "Before.\nAfter.")),
        ("<think>\n\n</think>\n\nNo thinking.", (None, "No thinking.")),
        ("opened by the template</think>Result", ("opened by the template", "Result")),
        ("<think></think>", (None, None)),
    ],
    ids=[
        "none",
        "no-think",
        "no-think-untouched",
        "one-block",
        "two-blocks",
        "unterminated-after-text",
        "unterminated-only",
        "middle",
        "empty-block",
        "close-without-open",
        "empty-everything",
    ],
)
def test_split_inline_reasoning(
    content: str | None, expected: tuple[str | None, str | None]
) -> None:
    assert split_inline_reasoning(content) == expected


# ------------------------------------------------------------------ validate_messages


def test_sound_episode_has_no_problems() -> None:
    assert validate_messages(_episode()) == []


def test_parquet_style_none_fields_are_not_problems() -> None:
    # Struct columns fill every field: a user message comes back with tool_calls=None.
    nulls = {"tool_calls": None, "tool_call_id": None, "name": None, "reasoning": None}
    messages = [
        {"role": "user", "content": "hi", **nulls},
        {**nulls, "role": "assistant", "content": "hello"},
    ]

    assert validate_messages(messages) == []


def test_validate_messages_reports_each_problem() -> None:
    messages: list[Any] = [
        {"role": "robot", "content": "beep"},
        "not a message",
        {"role": "user", "content": None},
        _assistant(
            None,
            {"type": "function", "function": {"name": "add", "arguments": "{}"}},
            {"id": "k1", "type": "function", "function": {"name": "", "arguments": "{}"}},
            {"id": "k1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}},
            {"id": "k2", "type": "function"},
            "garbage call",
        ),
        {"role": "tool", "name": "add", "content": "no id"},
        _tool("ghost", "add", "answers nothing"),
        _tool("k1", "add", '{"ok": true}'),
    ]

    assert validate_messages(messages) == [
        "message 0: unknown role 'robot' (expected system, user, assistant, tool)",
        "message 1: expected an object, got str",
        "message 2 (user): content must be a string, got NoneType",
        "message 3 (assistant): tool_calls[0] has no id",
        "message 3 (assistant): tool_calls[1] has no function name",
        "message 3 (assistant): tool_calls[2] repeats id 'k1' of an earlier call in the "
        "same message",
        "message 3 (assistant): tool_calls[2] arguments must be JSON text, got dict",
        "message 3 (assistant): tool_calls[3] has no function object",
        "message 3 (assistant): tool_calls[4] is not an object (got str)",
        "message 4 (tool): has no tool_call_id",
        "message 5 (tool): tool_call_id 'ghost' answers no tool call of an earlier message",
    ]


def test_validate_messages_rejects_a_non_list() -> None:
    assert validate_messages("hello") == ["messages: expected a list of message objects, got str"]


def test_invalid_json_arguments_are_not_a_structural_problem() -> None:
    messages = [_assistant(None, _call("c", "add", "{oops")), _tool("c", "add", "error")]

    assert validate_messages(messages) == []
