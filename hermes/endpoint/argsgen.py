"""Schema-driven tool arguments for the embedded endpoint's SYNTHETIC scripted policy.

``generate_args`` turns a tool's JSON schema (``parameters``) into an argument object
that validates against it: types, ``enum``/``const``, ``required``, ``default``, numeric
bounds, string lengths, arrays and nested objects, local ``$ref``s and ``anyOf``/``oneOf``.
Values are plausible for the property's name (``command`` is a harmless shell command,
``path`` a relative file name, ``url`` a loopback URL, ...). The caller passes a seeded
``random.Random``, so the same schema and seed give the same arguments.

These are smoke-test, test-suite and benchmark arguments, not model output.
"""

from __future__ import annotations

import copy
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 6
MAX_STRING_CHARS = 10_000
MAX_ITEMS = 64
MAX_VALUES = 5_000  # per call: nested arrays with large minItems grow exponentially

SAFE_COMMANDS = (
    "ls -la",
    "pwd",
    "echo hello > notes.txt",
    'python3 -c "print(2+2)"',
    "date +%Y",
    "uname -s",
)
PATHS = ("notes.txt", "src/main.py", "data/output.txt", "README.md")
SNIPPETS = (
    "print(sum(range(10)))",
    "import math\nprint(round(math.pi, 4))",
    "words = ['alpha', 'beta', 'gamma']\nprint(', '.join(sorted(words)))",
    "print({'answer': 6 * 7})",
)
FILLER_WORDS = ("alpha", "beta", "gamma", "delta", "notes", "report", "example", "hermes")
_DEFAULT_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")


@dataclass(frozen=True)
class ArgHints:
    """What the generator knows besides the schema: the user's words and planner picks.

    ``preferred`` maps a top-level property name to the value the planner wants there; it
    is used only when the schema has that property and the value has the right type.
    """

    prompt_words: tuple[str, ...] = ()
    preferred: Mapping[str, Any] = field(default_factory=dict)
    optional_p: float = 0.35


def prompt_words(text: str, limit: int = 6) -> tuple[str, ...]:
    """The first ``limit`` alphanumeric words of a prompt, lower-cased."""
    return tuple(w.lower() for w in re.findall(r"[A-Za-z0-9]{3,}", text)[:limit])


def generate_args(
    parameters: Mapping[str, Any] | None, rng: random.Random, hints: ArgHints | None = None
) -> dict[str, Any]:
    """Arguments valid against ``parameters`` (an object schema); ``{}`` when it has none."""
    hints = hints or ArgHints()
    if not isinstance(parameters, Mapping):
        return {}
    gen = _Generator(parameters, rng, hints)
    return gen.object_value(gen.resolve(parameters), depth=0, top=True)


class _Generator:
    def __init__(self, root: Mapping[str, Any], rng: random.Random, hints: ArgHints) -> None:
        self.root = root
        self.rng = rng
        self.hints = hints
        self.budget = MAX_VALUES

    def resolve(self, schema: Any) -> Mapping[str, Any]:
        """Follow local ``$ref``s and pick one branch of ``anyOf``/``oneOf``/``allOf``."""
        for _ in range(MAX_DEPTH):
            if not isinstance(schema, Mapping):
                return {}
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/"):
                schema = self._lookup(ref)
                continue
            if "anyOf" in schema or "oneOf" in schema:
                raw = schema.get("anyOf") or schema.get("oneOf")
                raw = raw if isinstance(raw, list) else []
                branches = [b for b in raw if isinstance(b, Mapping)]
                # Prefer a non-null branch: optional fields are usually "X or null".
                typed = [b for b in branches if b.get("type") != "null"] or branches
                rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
                schema = {**rest, **typed[0]} if typed else rest
                continue
            parts = schema.get("allOf")
            if isinstance(parts, list):
                merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
                for part in parts:
                    merged = _merge(merged, self.resolve(part))
                return merged
            return schema
        return {}

    def _lookup(self, ref: str) -> Any:
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node

    def value(self, schema: Mapping[str, Any], name: str, depth: int) -> Any:
        self.budget -= 1
        # Copies: a value taken from the schema must not alias the caller's schema.
        if "const" in schema:
            return copy.deepcopy(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return copy.deepcopy(self.rng.choice(enum))
        if "default" in schema and self.rng.random() < 0.5:
            return copy.deepcopy(schema["default"])
        kind = _schema_type(schema)
        if depth >= MAX_DEPTH and kind in ("array", "object"):
            return [] if kind == "array" else {}
        maker = _MAKERS[kind]
        return maker(self, schema, name, depth)

    def object_value(
        self, schema: Mapping[str, Any], depth: int, *, top: bool = False
    ) -> dict[str, Any]:
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        raw_required = schema.get("required")
        listed = raw_required if isinstance(raw_required, list) else []
        required = [r for r in listed if isinstance(r, str)]
        out: dict[str, Any] = {}
        for name, raw in props.items():
            sub = self.resolve(raw)
            preferred = self.hints.preferred if top else {}
            if name in preferred and _fits(preferred[name], sub):
                out[name] = preferred[name]
            elif name in required or self.rng.random() < self.hints.optional_p:
                out[name] = self.value(sub, name, depth + 1)
        for name in required:
            if name not in out:  # required but not described: any string is the best guess
                out[name] = self.string_value({}, name, depth + 1)
        return out

    def string_value(self, schema: Mapping[str, Any], name: str, depth: int) -> str:
        text = _format_value(schema.get("format")) or _string_hint(name, self.rng, self.hints)
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and not _matches(pattern, text):
            candidates = [text, *self.hints.prompt_words, "example", "abc", "a", "1", "A1"]
            text = next((c for c in candidates if _matches(pattern, c)), text)
        low, high = schema.get("minLength"), schema.get("maxLength")
        if isinstance(low, int) and len(text) < low:
            text = text.ljust(min(low, MAX_STRING_CHARS), "x")
        if isinstance(high, int) and len(text) > high:
            text = text[: max(high, 0)]
        return text

    def integer_value(self, schema: Mapping[str, Any], name: str, depth: int) -> int:
        hint = _INT_HINTS.get(name.lower())
        low, high = _bounds(schema, integer=True, hint=hint)
        value = hint if hint is not None else self.rng.randint(int(low), int(high))
        value = int(min(max(value, low), high))
        step = schema.get("multipleOf")
        if isinstance(step, int) and step > 0 and value % step:
            value = value + step - value % step
            value = value if value <= high else value - step
        return value

    def number_value(self, schema: Mapping[str, Any], name: str, depth: int) -> float:
        low, high = _bounds(schema, integer=False)
        return round(self.rng.uniform(low, high), 2) if high > low else float(low)

    def boolean_value(self, schema: Mapping[str, Any], name: str, depth: int) -> bool:
        return self.rng.random() < 0.5

    def array_value(self, schema: Mapping[str, Any], name: str, depth: int) -> list[Any]:
        items = self.resolve(schema.get("items", {}))
        low = _int_or(schema.get("minItems"), 0)
        high = _int_or(schema.get("maxItems"), 3)
        # Absurd bounds in a client's schema must not exhaust the server's memory.
        count = min(max(self.rng.randint(1, 3), low), max(high, low), MAX_ITEMS)
        # "urls" holds urls, "paths" paths: the singular name picks the value style.
        item_name = name[:-1] if name.endswith("s") and len(name) > 3 else name
        props = items.get("properties")
        id_schema = props.get("id") if isinstance(props, Mapping) else None
        # Items with a free-form string id get "1", "2", ...: ids are meant to be unique.
        renumber = isinstance(id_schema, Mapping) and set(id_schema) <= {"type", "description"}
        out: list[Any] = []
        for _ in range(count * 3):
            if len(out) >= count or self.budget <= 0:
                break
            item = self.value(items, item_name, depth + 1)
            if renumber and isinstance(item, dict) and isinstance(item.get("id"), str):
                item["id"] = str(len(out) + 1)
            if schema.get("uniqueItems") and item in out:
                continue
            out.append(item)
        return out

    def object_any(self, schema: Mapping[str, Any], name: str, depth: int) -> dict[str, Any]:
        return self.object_value(schema, depth)

    def null_value(self, schema: Mapping[str, Any], name: str, depth: int) -> None:
        return None


_MAKERS: dict[str, Callable[[_Generator, Mapping[str, Any], str, int], Any]] = {
    "string": _Generator.string_value,
    "integer": _Generator.integer_value,
    "number": _Generator.number_value,
    "boolean": _Generator.boolean_value,
    "array": _Generator.array_value,
    "object": _Generator.object_any,
    "null": _Generator.null_value,
}

_INT_HINTS: dict[str, int] = {
    "timeout": 30,
    "limit": 20,
    "offset": 1,
    "max_results": 10,
    "count": 3,
    "num_results": 5,
    "line": 1,
    "start_line": 1,
    "page": 1,
}


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**base, **extra}
    for key in ("properties",):
        if isinstance(base.get(key), Mapping) and isinstance(extra.get(key), Mapping):
            merged[key] = {**base[key], **extra[key]}
    if isinstance(base.get("required"), list) and isinstance(extra.get("required"), list):
        merged["required"] = [*base["required"], *extra["required"]]
    return merged


def _schema_type(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind in _DEFAULT_TYPES:
        return str(kind)
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bounds(
    schema: Mapping[str, Any], *, integer: bool, hint: float | None = None
) -> tuple[float, float]:
    """Inclusive bounds from minimum/maximum and exclusive forms (numbers, or draft-4 flags)."""
    step = 1 if integer else 1e-6
    low, high = _number(schema.get("minimum")), _number(schema.get("maximum"))
    ex_low, ex_high = (
        _number(schema.get("exclusiveMinimum")),
        _number(schema.get("exclusiveMaximum")),
    )
    if ex_low is not None:
        low = ex_low + step if low is None else max(low, ex_low + step)
    elif schema.get("exclusiveMinimum") is True and low is not None:
        low += step
    if ex_high is not None:
        high = ex_high - step if high is None else min(high, ex_high - step)
    elif schema.get("exclusiveMaximum") is True and high is not None:
        high -= step
    if low is None:
        low = 0 if high is None or high >= 0 else high - 10
    if high is None:
        high = max(low + 10, hint if hint is not None else low)
    if integer:
        low, high = math.ceil(low), math.floor(high)
    return low, max(high, low)


def _fits(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether a planner's value has the type (and enum) the schema asks for."""
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        return False
    kind = _schema_type(schema)
    checks: dict[str, Callable[[Any], bool]] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    return checks[kind](value)


def _matches(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return True  # a pattern Python cannot compile cannot be honoured either way


def _format_value(fmt: Any) -> str | None:
    formats = {
        "uri": "http://127.0.0.1/index.html",
        "url": "http://127.0.0.1/index.html",
        "email": "user@example.com",
        "date": "2024-01-02",
        "date-time": "2024-01-02T03:04:05Z",
        "time": "03:04:05",
        "uuid": "00000000-0000-4000-8000-000000000001",
        "ipv4": "127.0.0.1",
        "hostname": "localhost",
    }
    return formats.get(fmt) if isinstance(fmt, str) else None


def _words(hints: ArgHints, count: int) -> str:
    pool: Sequence[str] = hints.prompt_words or FILLER_WORDS
    return " ".join(pool[i % len(pool)] for i in range(min(count, max(len(pool), 1))))


def _lines(rng: random.Random, hints: ArgHints) -> str:
    topic = _words(hints, 3)
    count = rng.randint(2, 4)
    return "".join(f"line {i + 1}: {topic} {rng.choice(FILLER_WORDS)}\n" for i in range(count))


def _string_hint(name: str, rng: random.Random, hints: ArgHints) -> str:
    key = name.lower()
    for suffixes, make in _STRING_HINTS:
        if key in suffixes or any(key.endswith("_" + s) for s in suffixes):
            return make(rng, hints)
    return _words(hints, 2) or "example"


_StringMaker = Callable[[random.Random, ArgHints], str]
_STRING_HINTS: tuple[tuple[frozenset[str], _StringMaker], ...] = (
    (frozenset({"command", "cmd"}), lambda r, h: r.choice(SAFE_COMMANDS)),
    (frozenset({"dir", "directory", "cwd", "workdir", "folder"}), lambda r, h: "."),
    (
        frozenset({"path", "file", "filename", "filepath", "file_path", "dest", "destination"}),
        lambda r, h: r.choice(PATHS),
    ),
    (frozenset({"code", "script", "source", "program"}), lambda r, h: r.choice(SNIPPETS)),
    (frozenset({"content", "text", "body", "data"}), _lines),
    (
        frozenset({"query", "q", "search", "prompt", "question", "topic", "goal", "task"}),
        lambda r, h: _words(h, 4) or "example search",
    ),
    (
        frozenset({"url", "link", "href", "uri", "endpoint"}),
        lambda r, h: f"http://127.0.0.1/{(h.prompt_words or FILLER_WORDS)[0]}.html",
    ),
    (frozenset({"pattern", "regex"}), lambda r, h: r.choice(("line \\d+", "hello", "TODO|FIXME"))),
    (frozenset({"glob", "file_glob"}), lambda r, h: "*.txt"),
    (frozenset({"old_string", "old_text"}), lambda r, h: "hello"),
    (frozenset({"new_string", "new_text"}), lambda r, h: "hello world"),
    (frozenset({"language", "lang"}), lambda r, h: "python"),
    (frozenset({"id", "ref"}), lambda r, h: "1"),
    (frozenset({"email"}), lambda r, h: "user@example.com"),
    (frozenset({"selector"}), lambda r, h: "body"),
    (frozenset({"status"}), lambda r, h: "pending"),
    (
        frozenset({"description", "summary", "reason", "message", "note", "instructions"}),
        lambda r, h: f"A short note about {_words(h, 3) or 'the task'}.",
    ),
)
