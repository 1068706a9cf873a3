"""The SYNTHETIC scripted policy that answers the embedded endpoint's chat requests.

It is not a model: it exists for smoke runs, the test suite and benchmarks. Each answer is
a pure function of (seed, the conversation so far, the tools offered), so the same request
always gets the same response. For a conversation it plans a number of tool turns from a
hash of the seed and the user's prompt, calls 1-2 of the offered tools per turn with
schema-valid arguments (a coherent sequence for the built-in tools: a file is written
before it is read or patched), then gives a final answer that quotes the last tool result.

Token counts are approximations (``len(text) // 4 + 1`` per message), not a tokenizer's.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hermes.endpoint.argsgen import PATHS, SNIPPETS, ArgHints, generate_args, prompt_words
from hermes.errors import ConfigError

REASONING_MODES = ("auto", "always", "never")
REASONING_STYLES = ("field", "think_tags")
_CLOSERS = (
    "Let me know if you want more detail.",
    "Everything ran in the scratch directory.",
    "The results above are from the tools I called.",
    "This answer comes from a scripted test policy.",
)


class RequestError(ValueError):
    """A chat request the endpoint rejects with HTTP 400; the message names the field."""


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """How the scripted policy behaves; the endpoint builds it from ``EndpointConfig``."""

    seed: int = 0
    min_tool_turns: int = 1
    max_tool_turns: int = 3
    max_calls_per_turn: int = 2
    reasoning: str = "auto"
    reasoning_style: str = "field"

    def __post_init__(self) -> None:
        if not 0 <= self.min_tool_turns <= self.max_tool_turns:
            raise ConfigError(
                f"min_tool_turns ({self.min_tool_turns}) must be >= 0 and <= max_tool_turns "
                f"({self.max_tool_turns})"
            )
        if self.max_calls_per_turn < 1:
            raise ConfigError(f"max_calls_per_turn must be >= 1, got {self.max_calls_per_turn}")
        if self.reasoning not in REASONING_MODES:
            raise ConfigError(f"reasoning must be one of {REASONING_MODES}, got {self.reasoning!r}")
        if self.reasoning_style not in REASONING_STYLES:
            raise ConfigError(
                f"reasoning_style must be one of {REASONING_STYLES}, got {self.reasoning_style!r}"
            )


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One function call of an assistant turn; ``arguments`` is the JSON text sent."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One assistant turn before it is rendered as a completion or a stream."""

    content: str | None
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """What the policy reads from the messages; counts start at the last user message."""

    prompt: str
    user_turns: int
    assistant_turns: int
    tool_turns: int
    called: tuple[str, ...]
    last_tool_result: str | None
    ends_with_tool: bool


def text_of(content: Any) -> str:
    """Plain text of a message's content (a string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def read_conversation(messages: Sequence[Mapping[str, Any]]) -> Conversation:
    """Summarise the messages from the last user message on."""
    start, user_turns = 0, 0
    for index, message in enumerate(messages):
        if message.get("role") == "user":
            start, user_turns = index, user_turns + 1
    prompt = text_of(messages[start].get("content")) if user_turns else ""
    assistant_turns, tool_turns, called, last = 0, 0, [], None
    for message in messages[start + 1 :]:
        role = message.get("role")
        if role == "assistant":
            assistant_turns += 1
            calls = tool_calls_of(message)
            tool_turns += 1 if calls else 0
            called += [_call_name(c) for c in calls]
        elif role == "tool":
            last = text_of(message.get("content"))
    return Conversation(
        prompt=prompt,
        user_turns=user_turns,
        assistant_turns=assistant_turns,
        tool_turns=tool_turns,
        called=tuple(called),
        last_tool_result=last,
        ends_with_tool=messages[-1].get("role") == "tool",
    )


def tool_calls_of(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The well-formed entries of a message's ``tool_calls`` (none when it is not a list)."""
    calls = message.get("tool_calls")
    return [c for c in calls if isinstance(c, Mapping)] if isinstance(calls, list) else []


def _call_name(call: Mapping[str, Any]) -> str:
    function = call.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    return name if isinstance(name, str) else "?"


def check_messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The request's messages, or RequestError when they are not a list of role objects."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array of message objects")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{index}] must be an object with a string 'role'")
    return messages


def offered_tools(body: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Function tools of the request: name -> parameters schema (RequestError if malformed)."""
    tools = body.get("tools")
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise RequestError("'tools' must be an array of tool objects")
    out: dict[str, Mapping[str, Any]] = {}
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise RequestError(f"tools[{index}] must be {{'type': 'function', 'function': ...}}")
        params = function.get("parameters")
        out[function["name"]] = params if isinstance(params, Mapping) else {}
    return out


def select_tools(
    tools: dict[str, Mapping[str, Any]], tool_choice: Any
) -> tuple[dict[str, Mapping[str, Any]], bool]:
    """The tools the policy may call under ``tool_choice``, and whether it must call one."""
    if tool_choice == "none":
        return {}, False
    if tool_choice == "required":
        return tools, bool(tools)
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if name not in tools:
            raise RequestError(f"tool_choice names {name!r}, which is not in 'tools'")
        return {name: tools[name]}, True
    return tools, False


def wants_reasoning(body: Mapping[str, Any], mode: str) -> bool:
    """Reasoning is on for ``reasoning_effort``, ``reasoning: {...}`` or ``include_reasoning``."""
    if mode != "auto":
        return mode == "always"
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort != "none":
        return True
    reasoning = body.get("reasoning")
    if reasoning is True:
        return True
    if isinstance(reasoning, Mapping):
        off = reasoning.get("enabled") is False or reasoning.get("exclude") is True
        return not off and reasoning.get("effort") != "none"
    return body.get("include_reasoning") is True


def seeded_rng(*parts: object) -> random.Random:
    """A private RNG seeded by a hash of ``parts`` (never the global one)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def request_seed(body: Mapping[str, Any], config: PolicyConfig) -> int:
    seed = body.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else config.seed


def decide(body: Mapping[str, Any], config: PolicyConfig) -> Decision:
    """The assistant turn for this request (RequestError when the body is unusable)."""
    conv = read_conversation(check_messages(body))
    tools, forced = select_tools(offered_tools(body), body.get("tool_choice"))
    seed = request_seed(body, config)
    rng = seeded_rng(seed, "turn", conv.prompt, conv.user_turns, conv.assistant_turns)
    reasoning_on = wants_reasoning(body, config.reasoning)
    if tools:
        planner = Planner(
            tools,
            rng=seeded_rng(seed, "plan", conv.prompt, conv.user_turns),
            turns=(config.min_tool_turns, config.max_tool_turns),
            words=prompt_words(conv.prompt),
        )
        planned = planner.planned_turns
        failed = conv.ends_with_tool and looks_failed(conv.last_tool_result or "")
        give_up = failed and rng.random() < 0.5
        if forced or (conv.tool_turns < planned and not give_up):
            calls = planner.calls_for(conv.tool_turns, config.max_calls_per_turn)
            return _tool_turn(conv, calls, rng, planned, reasoning_on, config.reasoning_style)
    decision = _final_turn(conv, rng, reasoning_on, config.reasoning_style)
    return _limit(decision, body)


def _tool_turn(
    conv: Conversation,
    calls: list[tuple[str, dict[str, Any]]],
    rng: random.Random,
    planned: int,
    reasoning_on: bool,
    style: str,
) -> Decision:
    tool_calls = tuple(
        ToolCall(id=f"call_{rng.getrandbits(64):016x}", name=name, arguments=json.dumps(args))
        for name, args in calls
    )
    names = ", ".join(name for name, _ in calls)
    preface = f"Let me use {names} for this." if rng.random() < 0.5 else None
    thought = (
        f'The user asked: "{_snippet(conv.prompt)}". Step {conv.tool_turns + 1} of '
        f"{max(planned, conv.tool_turns + 1)}: I will call {names}."
    )
    return _with_reasoning(
        Decision(content=preface, tool_calls=tool_calls, finish_reason="tool_calls"),
        thought if reasoning_on else None,
        style,
    )


def _final_turn(conv: Conversation, rng: random.Random, reasoning_on: bool, style: str) -> Decision:
    snippet = _snippet(conv.prompt)
    if conv.called:
        result = conv.last_tool_result or ""
        first_line = _snippet(result.strip().split("\n", 1)[0], 120)
        used = ", ".join(sorted(set(conv.called)))
        answer = (
            f'I worked on "{snippet}" with {len(conv.called)} tool call(s) ({used}). '
            f"The last tool result had {len(result)} characters; its first line was: "
            f"{first_line}"
        )
        thought = f"I have seen {len(conv.called)} tool result(s); time to answer."
    else:
        answer = f'Here is a direct answer to "{snippet}": it depends on the details given.'
        thought = f'No tool is needed for "{snippet}"; I will answer directly.'
    closers = rng.sample(_CLOSERS, rng.randint(1, 3))
    content = " ".join([answer, *closers])
    return _with_reasoning(Decision(content=content), thought if reasoning_on else None, style)


def _with_reasoning(decision: Decision, thought: str | None, style: str) -> Decision:
    if thought is None:
        return decision
    if style == "think_tags":
        inline = f"<think>\n{thought}\n</think>\n\n{decision.content or ''}"
        return replace(decision, content=inline)
    return replace(decision, reasoning=thought)


def _limit(decision: Decision, body: Mapping[str, Any]) -> Decision:
    """Apply ``stop`` sequences and a rough ``max_tokens`` to a final answer."""
    content = decision.content or ""
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    cuts = [content.find(s) for s in stops if isinstance(s, str) and s and s in content]
    if cuts:
        content = content[: min(cuts)]
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and limit > 0 and estimate_tokens(content) > limit:
        return replace(decision, content=content[: limit * 4], finish_reason="length")
    return replace(decision, content=content) if cuts else decision


def _snippet(text: str, limit: int = 80) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def estimate_tokens(text: str) -> int:
    """Deterministic token estimate: a quarter of the characters, plus one."""
    return len(text) // 4 + 1


def prompt_tokens(
    messages: Sequence[Mapping[str, Any]], tools: Mapping[str, Mapping[str, Any]]
) -> int:
    """Approximate prompt size: per message, per tool call and per tool offered."""
    total = 0
    for message in messages:
        total += estimate_tokens(text_of(message.get("content")))
        for call in tool_calls_of(message):
            function = call.get("function")
            if isinstance(function, Mapping):
                total += estimate_tokens(str(function.get("arguments") or ""))
    for name, params in tools.items():
        props = params.get("properties")
        total += estimate_tokens(name) + 10 * (len(props) if isinstance(props, Mapping) else 1)
    return total


def completion_tokens(decision: Decision) -> int:
    total = estimate_tokens(decision.content or "")
    total += estimate_tokens(decision.reasoning) if decision.reasoning else 0
    for call in decision.tool_calls:
        total += estimate_tokens(call.name + call.arguments)
    return total


def schema_args(
    params: Mapping[str, Any], rng: random.Random, prompt: str, **preferred: Any
) -> dict[str, Any]:
    """Schema-valid arguments with some values chosen; used by fault injection."""
    hints = ArgHints(prompt_words=prompt_words(prompt), preferred=preferred, optional_p=0.0)
    return generate_args(params, rng, hints)


# -- the tool plan -------------------------------------------------------------------------

# Relative weights of the built-in tools; any other tool offered weighs 1.
_WEIGHTS = {"terminal": 2.0, "execute_code": 1.5, "search_files": 1.0, "todo": 1.0}
_ECHO_TARGET = "hello.txt"  # written by a terminal call; write_file never picks it


def looks_failed(result: str) -> bool:
    """Whether a tool result reads as an error (``{"error": ...}`` or ``Error: ...``)."""
    head = result[:200].lower()
    return head.startswith("error") or '"error"' in head


@dataclass
class _Workspace:
    """What the planned calls so far have left in the scratch directory."""

    files: dict[str, str] = field(default_factory=dict)
    todos: list[dict[str, str]] = field(default_factory=list)


class Planner:
    """The deterministic sequence of tool calls for one conversation.

    Turn ``k`` of a conversation replays turns ``0..k`` from the same seeded RNG, so the
    plan never depends on what the tools returned and a file is written (in an earlier
    turn) before it is read, patched or cat-ed.
    """

    def __init__(
        self,
        tools: Mapping[str, Mapping[str, Any]],
        *,
        rng: random.Random,
        turns: tuple[int, int],
        words: tuple[str, ...] = (),
    ) -> None:
        self.tools = {name: tools[name] for name in sorted(tools)}
        self.rng = rng
        self.words = words
        self.planned_turns = rng.randint(*turns)

    def calls_for(self, turn: int, max_calls: int) -> list[tuple[str, dict[str, Any]]]:
        """The calls of tool turn ``turn`` (0-based): 1 to ``max_calls`` distinct tools."""
        ws = _Workspace()
        calls: list[tuple[str, dict[str, Any]]] = []
        for _ in range(turn + 1):
            count = self.rng.randint(1, min(max_calls, len(self.tools)))
            names = self._pick(ws, count)
            calls = [(name, self._arguments(name, ws)) for name in names]
            # Effects land after the turn: calls of one turn may run concurrently.
            for name, args in calls:
                _apply(name, args, ws)
        return calls

    def _pick(self, ws: _Workspace, count: int) -> list[str]:
        names = list(self.tools)
        weights = [_weight(name, ws) for name in names]
        picked: list[str] = []
        while len(picked) < count:
            if sum(weights) <= 0:
                weights = [0.0 if n in picked else 1.0 for n in names]
            index = self.rng.choices(range(len(names)), weights=weights)[0]
            picked.append(names[index])
            weights[index] = 0.0
        return picked

    def _arguments(self, name: str, ws: _Workspace) -> dict[str, Any]:
        maker = _KNOWN.get(name)
        preferred = maker(self.rng, ws) if maker else {}
        hints = ArgHints(
            prompt_words=self.words,
            preferred=preferred,
            # Optional arguments of the built-in tools (offset, timeout...) could make a
            # call fail for no reason; other tools get some, to exercise their schemas.
            optional_p=0.0 if maker else 0.35,
        )
        return generate_args(self.tools[name], self.rng, hints)


def _weight(name: str, ws: _Workspace) -> float:
    if name == "write_file":
        return 1.0 if ws.files else 3.0
    if name in ("read_file", "patch"):
        return 2.0 if ws.files else 0.0
    return _WEIGHTS.get(name, 1.0)


def _written(ws: _Workspace) -> list[str]:
    return sorted(path for path in ws.files if path != _ECHO_TARGET) or sorted(ws.files)


def _write_file(rng: random.Random, ws: _Workspace) -> dict[str, Any]:
    fresh = [p for p in PATHS if p not in ws.files]
    path = fresh[0] if fresh else f"notes_{len(ws.files)}.txt"
    if path.endswith(".py"):
        body = "".join(f"print('step {i}')\n" for i in range(1, rng.randint(2, 4) + 1))
    else:
        topic = rng.choice(("draft", "summary", "todo", "results"))
        body = "".join(f"line {i}: {topic} item {i}\n" for i in range(1, rng.randint(2, 4) + 1))
    return {"path": path, "content": body}


def _read_file(rng: random.Random, ws: _Workspace) -> dict[str, Any]:
    return {"path": rng.choice(_written(ws))} if ws.files else {}


def _patch(rng: random.Random, ws: _Workspace) -> dict[str, Any]:
    if not ws.files:
        return {}
    path = rng.choice(_written(ws))
    lines = [line for line in ws.files[path].splitlines() if line.strip()]
    old = rng.choice(lines) if lines else ws.files[path]
    new = old + ("  # updated" if path.endswith(".py") else " (updated)")
    return {"path": path, "old_string": old, "new_string": new}


def _search_files(rng: random.Random, ws: _Workspace) -> dict[str, Any]:
    pattern = rng.choice(("line \\d+", "print", "hello")) if ws.files else "hello"
    return {"pattern": pattern, "path": ".", "target": "content"}


def _terminal(rng: random.Random, ws: _Workspace) -> dict[str, Any]:
    commands = ["ls -la", "pwd", 'python3 -c "print(2+2)"', "uname -s"]
    if _ECHO_TARGET not in ws.files:
        commands.append(f"echo hello > {_ECHO_TARGET}")
    if ws.files:
        path = rng.choice(sorted(ws.files))
        commands += [f"cat {path}", f"wc -l {path}", f"head -n 3 {path}"]
        if any(p.endswith(".txt") and "/" not in p for p in ws.files):
            commands.append("wc -l *.txt")
    return {"command": rng.choice(commands)}


def _execute_code(rng: random.Random, ws: _Workspace) -> dict[str, Any]:
    snippets = list(SNIPPETS)
    if ws.files:
        path = rng.choice(sorted(ws.files))
        snippets.append(f"with open({path!r}) as f:\n    print(len(f.readlines()), 'lines')")
    return {"code": rng.choice(snippets)}


def _todo(rng: random.Random, ws: _Workspace) -> dict[str, Any]:
    if not ws.todos:
        steps = ("Understand the request", "Do the work", "Check the result")
        statuses = ("completed", "in_progress", "pending")
        items = [
            {"id": str(i + 1), "content": step, "status": status}
            for i, (step, status) in enumerate(zip(steps, statuses, strict=True))
        ]
        return {"todos": items, "merge": False}
    open_items = [item for item in ws.todos if item["status"] != "completed"]
    if not open_items:
        return {}
    return {"todos": [{"id": open_items[0]["id"], "status": "completed"}], "merge": True}


_KNOWN = {
    "write_file": _write_file,
    "read_file": _read_file,
    "patch": _patch,
    "search_files": _search_files,
    "terminal": _terminal,
    "execute_code": _execute_code,
    "todo": _todo,
}


def _apply(name: str, args: Mapping[str, Any], ws: _Workspace) -> None:
    """Record what a planned call will leave behind, as far as later calls care."""
    path = args.get("path")
    if name == "write_file" and isinstance(path, str) and isinstance(args.get("content"), str):
        ws.files[path] = args["content"]
    elif name == "patch" and isinstance(path, str) and path in ws.files:
        old, new = args.get("old_string"), args.get("new_string")
        if isinstance(old, str) and isinstance(new, str) and old:
            ws.files[path] = ws.files[path].replace(old, new, 1)
    elif name == "terminal" and args.get("command") == f"echo hello > {_ECHO_TARGET}":
        ws.files[_ECHO_TARGET] = "hello\n"
    elif name == "todo" and isinstance(args.get("todos"), list):
        _apply_todos(args["todos"], bool(args.get("merge")), ws)


def _apply_todos(todos: list[Any], merge: bool, ws: _Workspace) -> None:
    items = [dict(t) for t in todos if isinstance(t, Mapping) and "id" in t]
    if not merge:
        ws.todos = items
        return
    by_id = {item["id"]: item for item in ws.todos}
    for item in items:
        if item["id"] in by_id:
            by_id[item["id"]].update(item)
        else:
            ws.todos.append(item)
