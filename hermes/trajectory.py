"""Trajectory formats: OpenAI chat ``messages`` and ShareGPT/Hermes ``conversations``.

An episode is recorded as OpenAI chat messages (assistant messages carry ``reasoning``
and structured ``tool_calls``). Output rows also carry the same episode as ShareGPT
turns (``{"from": ..., "value": ...}``) in the Hermes function-calling format used for
SFT; :func:`to_hermes_conversations` builds them. The turn layout is part of the data
format, so every fixed piece of text lives in a module constant:

- ``system``: the system prompt, a blank line, :data:`HERMES_TOOLS_PREAMBLE`, the
  ``<tools>`` block (one JSON object per offered tool, one per line) and
  :data:`HERMES_CALL_INSTRUCTIONS`. With no tools offered, only the system prompt.
- ``human``: a user message's content.
- ``gpt``: ``<think>\\n{reasoning}\\n</think>\\n`` when there is reasoning, then the
  content, then one ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``
  block per call, all joined by newlines.
- ``tool``: one turn per run of consecutive tool messages, one
  ``<tool_response>\\n{"tool_call_id": ..., "name": ..., "content": ...}\\n</tool_response>``
  block per result, joined by newlines.

JSON inside the tags is ``json.dumps(..., ensure_ascii=False)`` on one line, with keys
in the order shown. :func:`parse_tools_block`, :func:`parse_tool_calls` and
:func:`parse_tool_responses` read the blocks back, for sanity checks and tests.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Message = Mapping[str, Any]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Written for this project; changing it changes the training data, so treat it as a
# format version bump.
HERMES_TOOLS_PREAMBLE = (
    "You can call functions to help with the user's request. Their signatures are listed "
    "in the tools block below, one JSON object per line. Call only functions from that "
    "list, as many times as the task needs, and never invent argument values you do not "
    "know."
)
HERMES_CALL_INSTRUCTIONS = (
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags, in this format:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-dict>}\n'
    "</tool_call>\n"
    "Each result comes back in the next turn as a JSON object within "
    "<tool_response></tool_response> XML tags."
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
KNOWN_ROLES = ("system", "user", "assistant", "tool")
_ROLE_TO_FROM = {"system": "system", "user": "human", "assistant": "gpt"}


def dumps(value: Any) -> str:
    """The one JSON encoding of the format: unicode kept, keys in insertion order."""
    return json.dumps(value, ensure_ascii=False)


# ------------------------------------------------------------------------ conversion


def to_hermes_conversations(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    system_prompt: str | None = None,
) -> list[dict[str, str]]:
    """Convert an episode's OpenAI chat messages to Hermes-format ShareGPT turns.

    The system turn uses the episode's leading system message, else ``system_prompt``,
    else :data:`DEFAULT_SYSTEM_PROMPT`; a later system message becomes its own system
    turn in place. Tool results are paired with the calls of the assistant message just
    before them by ``tool_call_id`` and ordered like those calls, whatever order they
    arrived in. A result whose id matches no call is kept, after the paired ones, in
    arrival order (so is a second result for the same id); a call without a result
    simply has no ``<tool_response>``. Nothing is dropped or reordered otherwise.

    Raises ``ValueError`` on a message that is not an object or has an unknown role;
    :func:`validate_messages` reports those (and more) without raising.
    """
    msgs = list(messages)
    if msgs and _role(msgs[0]) == "system":
        head, start = _text(msgs[0].get("content")), 1
    else:
        head = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        start = 0
    turns = [{"from": "system", "value": format_system_turn(head, tools or [])}]
    index = start
    while index < len(msgs):
        message, role = msgs[index], _role(msgs[index])
        if role != "tool":
            value = _gpt_value(message) if role == "assistant" else _text(message.get("content"))
            turns.append({"from": _ROLE_TO_FROM[role], "value": value})
            index += 1
            continue
        end = index
        while end < len(msgs) and _role(msgs[end]) == "tool":
            end += 1
        calls = _calls_answered_by_next(msgs[index - 1]) if index > 0 else []
        turns.append({"from": "tool", "value": _tool_turn(msgs[index:end], calls)})
        index = end
    return turns


def format_system_turn(system_prompt: str, tools: Sequence[Mapping[str, Any]]) -> str:
    """The system turn's text: the prompt, then the function-calling section if any tools."""
    if not tools:
        return system_prompt
    lines = "\n".join(dumps(_as_tool_definition(tool)) for tool in tools)
    section = f"{HERMES_TOOLS_PREAMBLE}\n<tools>\n{lines}\n</tools>\n{HERMES_CALL_INSTRUCTIONS}"
    return f"{system_prompt}\n\n{section}" if system_prompt else section


def _calls_answered_by_next(message: Message) -> list[Mapping[str, Any]]:
    # Only the assistant message right before a run of results is what they answer.
    return _tool_calls(message) if _role(message) == "assistant" else []


def _as_tool_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    # Accept a bare function schema too, so every row's <tools> block has one shape.
    if "function" in tool:
        return dict(tool)
    return {"type": "function", "function": dict(tool)}


def _role(message: Any) -> str:
    if not isinstance(message, Mapping):
        raise ValueError(f"message is not an object: {message!r:.80}")
    role = message.get("role")
    if role not in KNOWN_ROLES:
        raise ValueError(f"unknown message role {role!r}; expected one of {KNOWN_ROLES}")
    return str(role)


def _text(content: Any) -> str:
    """Message content as text; list content (OpenAI content parts) is flattened."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part) for part in content)
    return dumps(content)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping) and part.get("type") == "text":
        return str(part.get("text") or "")
    return dumps(part)


def _gpt_value(message: Message) -> str:
    reasoning = message.get("reasoning")
    prefix = ""
    if isinstance(reasoning, str) and reasoning.strip():
        prefix = f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n"
    pieces = []
    content = _text(message.get("content"))
    if content:
        pieces.append(content)
    pieces.extend(_tool_call_block(call) for call in _tool_calls(message))
    return prefix + "\n".join(pieces)


def _tool_calls(message: Message) -> list[Mapping[str, Any]]:
    calls = message.get("tool_calls") or []
    kept = [call for call in calls if isinstance(call, Mapping)]
    if len(kept) != len(calls):
        logger.warning("skipped %d tool call(s) that are not objects", len(calls) - len(kept))
    return kept


def _function_of(call: Mapping[str, Any]) -> Mapping[str, Any]:
    function = call.get("function")
    return function if isinstance(function, Mapping) else {}


def _tool_call_block(call: Mapping[str, Any]) -> str:
    function = _function_of(call)
    name = function.get("name")
    payload = {
        "name": name if isinstance(name, str) else "",
        "arguments": parse_arguments(function.get("arguments")),
    }
    return f"<tool_call>\n{dumps(payload)}\n</tool_call>"


def parse_arguments(raw: Any) -> Any:
    """Call arguments for the ``<tool_call>`` block: a dict when they are a JSON object.

    Empty or missing arguments become ``{}`` (servers send ``""`` for no-argument calls);
    anything else that is not a JSON object (garbage, a list, a bare number) is kept as
    the raw string so the model's actual output stays visible in the data.
    """
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        return raw
    if not raw.strip():
        return {}
    ok, parsed = _loads_strict(raw)
    return parsed if ok and isinstance(parsed, dict) else raw


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _loads_strict(text: str) -> tuple[bool, Any]:
    """Parse standard JSON only: NaN/Infinity would re-encode as invalid JSON."""
    try:
        return True, json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        # RecursionError: model garbage such as "[[[[..." nested thousands deep.
        return False, None


def _tool_turn(results: Sequence[Message], calls: Sequence[Mapping[str, Any]]) -> str:
    call_names: dict[str, str] = {}
    for call in calls:
        call_id, name = call.get("id"), _function_of(call).get("name")
        if isinstance(call_id, str) and call_id not in call_names:
            call_names[call_id] = name if isinstance(name, str) else ""
    paired: dict[str, Message] = {}
    unpaired: list[Message] = []
    for result in results:
        call_id = result.get("tool_call_id")
        if isinstance(call_id, str) and call_id in call_names and call_id not in paired:
            paired[call_id] = result
        else:
            unpaired.append(result)
    ordered = [paired[call_id] for call_id in call_names if call_id in paired] + unpaired
    return "\n".join(_tool_response_block(result, call_names) for result in ordered)


def _tool_response_block(result: Message, call_names: Mapping[str, str]) -> str:
    call_id = result.get("tool_call_id")
    call_id = call_id if isinstance(call_id, str) else None
    name = result.get("name")
    if not isinstance(name, str) or not name:
        name = call_names.get(call_id or "", "")
    payload = {"tool_call_id": call_id, "name": name, "content": _result_content(result)}
    return f"<tool_response>\n{dumps(payload)}\n</tool_response>"


def _result_content(result: Message) -> Any:
    # Only JSON objects/arrays are embedded parsed: a bare "42" or "true" stays text, so
    # a plain-text result never changes type.
    text = _text(result.get("content"))
    ok, parsed = _loads_strict(text)
    return parsed if ok and isinstance(parsed, (dict, list)) else text


# ------------------------------------------------------------------------- reasoning


def split_inline_reasoning(content: str | None) -> tuple[str | None, str | None]:
    """Split ``<think>...</think>`` blocks out of assistant content: ``(reasoning, rest)``.

    Use when the server returned reasoning inline instead of in a separate field. Handles
    several blocks (joined by a blank line), a block anywhere in the text, a final block
    left unterminated (everything after ``<think>`` is reasoning) and a leading
    ``...</think>`` without an opening tag (chat templates that open the block in the
    prompt). Empty parts become ``None``. Without any tag, content comes back unchanged;
    otherwise the pieces outside the blocks are stripped and joined by a newline.
    """
    if content is None:
        return None, None
    if THINK_OPEN not in content and THINK_CLOSE not in content:
        return None, content
    thoughts: list[str] = []
    outside: list[str] = []
    pos = 0
    first_close, first_open = content.find(THINK_CLOSE), content.find(THINK_OPEN)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        thoughts.append(content[:first_close])
        pos = first_close + len(THINK_CLOSE)
    while True:
        start = content.find(THINK_OPEN, pos)
        if start == -1:
            outside.append(content[pos:])
            break
        outside.append(content[pos:start])
        body = start + len(THINK_OPEN)
        end = content.find(THINK_CLOSE, body)
        if end == -1:
            thoughts.append(content[body:])
            break
        thoughts.append(content[body:end])
        pos = end + len(THINK_CLOSE)
    reasoning = "\n\n".join(_non_empty_stripped(thoughts)) or None
    rest = "\n".join(_non_empty_stripped(outside)) or None
    return reasoning, rest


def _non_empty_stripped(parts: Iterable[str]) -> list[str]:
    return [part.strip() for part in parts if part.strip()]


# ------------------------------------------------------------------------ validation


def validate_messages(messages: Any) -> list[str]:
    """Structural problems of a recorded episode, as readable strings (empty when sound).

    Checks roles, content types, tool calls (object, ``id``, ``function.name``, JSON-text
    ``arguments``, unique ids) and tool messages (``tool_call_id`` present and answering a
    call of an earlier assistant message). Invalid JSON inside ``arguments`` is not a
    structural problem: it is what the model produced, recorded as such. Fields set to
    ``None`` are treated as absent, as Parquet struct columns fill every field.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        return [f"messages: expected a list of message objects, got {type(messages).__name__}"]
    problems: list[str] = []
    call_ids: set[str] = set()
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            problems.append(f"message {index}: expected an object, got {type(message).__name__}")
            continue
        role = message.get("role")
        if role not in KNOWN_ROLES:
            expected = ", ".join(KNOWN_ROLES)
            problems.append(f"message {index}: unknown role {role!r} (expected {expected})")
            continue
        if role == "assistant":
            found = _check_assistant(message, call_ids)
        elif role == "tool":
            found = _check_tool(message, call_ids)
        else:
            found = _check_text(message, "content", required=True)
        problems.extend(f"message {index} ({role}): {problem}" for problem in found)
    return problems


def _check_text(message: Message, key: str, *, required: bool) -> list[str]:
    value = message.get(key)
    if value is None and not required:
        return []
    if isinstance(value, str):
        return []
    return [f"{key} must be a string, got {type(value).__name__}"]


def _check_assistant(message: Message, call_ids: set[str]) -> list[str]:
    problems = _check_text(message, "content", required=False)
    problems += _check_text(message, "reasoning", required=False)
    calls = message.get("tool_calls")
    if calls is None:
        return problems
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        return [*problems, f"tool_calls must be a list, got {type(calls).__name__}"]
    seen: set[str] = set()
    for position, call in enumerate(calls):
        problems += [f"tool_calls[{position}] {p}" for p in _check_call(call, seen)]
    call_ids |= seen
    return problems


def _check_call(call: Any, seen: set[str]) -> list[str]:
    if not isinstance(call, Mapping):
        return [f"is not an object (got {type(call).__name__})"]
    problems = []
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        problems.append("has no id")
    elif call_id in seen:
        problems.append(f"repeats id {call_id!r} of an earlier call in the same message")
    else:
        seen.add(call_id)
    if call.get("type") not in (None, "function"):
        problems.append(f"has type {call.get('type')!r}, expected 'function'")
    function = call.get("function")
    if not isinstance(function, Mapping):
        return [*problems, "has no function object"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        problems.append("has no function name")
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str):
        problems.append(f"arguments must be JSON text, got {type(arguments).__name__}")
    return problems


def _check_tool(message: Message, call_ids: set[str]) -> list[str]:
    problems = _check_text(message, "content", required=True)
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        problems.append("has no tool_call_id")
    elif call_id not in call_ids:
        problems.append(f"tool_call_id {call_id!r} answers no tool call of an earlier message")
    return problems


# ----------------------------------------------------------------------- reading back


def parse_tools_block(system_value: str) -> list[dict[str, Any]]:
    """The tool definitions of a system turn's ``<tools>`` block (``[]`` when it has none)."""
    # The block follows the user-written system prompt, so the last opening tag is ours.
    start = system_value.rfind("\n<tools>\n")
    if start == -1:
        start = 0 if system_value.startswith("<tools>\n") else -1
    if start == -1:
        return []
    body_start = system_value.index("<tools>\n", start) + len("<tools>\n")
    end = system_value.find("\n</tools>", body_start)
    if end == -1:
        raise ValueError("the <tools> block is not closed")
    # json.dumps never emits a raw newline, so each line is exactly one definition.
    return [json.loads(line) for line in system_value[body_start:end].split("\n")]


def parse_tool_calls(gpt_value: str) -> list[dict[str, Any]]:
    """The ``{"name", "arguments"}`` objects of a gpt turn's ``<tool_call>`` blocks."""
    start = 0
    if gpt_value.startswith(f"{THINK_OPEN}\n"):
        # Reasoning may talk about <tool_call> tags; only what follows it is parsed.
        close = gpt_value.find(f"\n{THINK_CLOSE}\n")
        start = 0 if close == -1 else close + len(THINK_CLOSE) + 2
    return _parse_tagged_json(gpt_value, "tool_call", start)


def parse_tool_responses(tool_value: str) -> list[dict[str, Any]]:
    """The ``{"tool_call_id", "name", "content"}`` objects of a tool turn."""
    return _parse_tagged_json(tool_value, "tool_response", 0)


def _parse_tagged_json(text: str, tag: str, start: int) -> list[dict[str, Any]]:
    opening, closing = f"<{tag}>\n", f"\n</{tag}>"
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    pos = text.find(opening, start)
    while pos != -1:
        # Decoding from the tag (not splitting on the closing tag) keeps a payload that
        # itself contains "</tag>" inside a JSON string intact.
        value, end = decoder.raw_decode(text, pos + len(opening))
        if not text.startswith(closing, end) or not isinstance(value, dict):
            raise ValueError(f"malformed <{tag}> block at offset {pos}")
        found.append(value)
        pos = text.find(opening, end + len(closing))
    return found
