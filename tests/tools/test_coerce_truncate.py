"""Argument coercion and head/tail truncation as units."""

from __future__ import annotations

import json

import pytest

from tools.coerce import coerce_value, missing_required
from tools.truncate import marker, truncate_result, truncate_text


@pytest.mark.parametrize(
    ("value", "schema", "expected"),
    [
        ("42", {"type": "integer"}, 42),
        ("42.0", {"type": "integer"}, 42),
        (3.0, {"type": "integer"}, 3),
        ("4.5", {"type": "integer"}, "4.5"),
        ("abc", {"type": "integer"}, "abc"),
        (True, {"type": "integer"}, True),
        ("2.5", {"type": "number"}, 2.5),
        ("nan", {"type": "number"}, "nan"),
        ("TRUE", {"type": "boolean"}, True),
        ("no", {"type": "boolean"}, False),
        (1, {"type": "boolean"}, True),
        ("maybe", {"type": "boolean"}, "maybe"),
        (12, {"type": "string"}, "12"),
        (False, {"type": "string"}, "false"),
        ('["a", "b"]', {"type": "array"}, ["a", "b"]),
        ("[1, 2", {"type": "array"}, "[1, 2"),
        ('{"a": 1}', {"type": "object"}, {"a": 1}),
        ('{"a": 1}', {"type": "array"}, '{"a": 1}'),
        ("null", {"type": ["integer", "null"]}, None),
        ("5", {"type": ["integer", "null"]}, 5),
        ("5", {"type": ["string", "integer"]}, "5"),
        ("7", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, 7),
        ('["1", "2"]', {"type": "array", "items": {"type": "integer"}}, [1, 2]),
        ("x", {}, "x"),
    ],
)
def test_coerce_value(value: object, schema: dict[str, object], expected: object) -> None:
    result = coerce_value(value, schema)
    assert result == expected and type(result) is type(expected)


def test_missing_required() -> None:
    params = {"type": "object", "required": ["a", "b"]}
    assert missing_required({"a": 1}, params) == ["b"]
    assert missing_required({}, {"type": "object"}) == []


def test_truncate_text_keeps_head_and_tail_with_count() -> None:
    text = "".join(f"{i:05d}\n" for i in range(10_000))
    cut = truncate_text(text, 1000)
    assert len(cut.text) <= 1000 and cut.truncated
    assert cut.text.startswith("00000\n") and cut.text.endswith("09999\n")
    head, tail = cut.text.split(marker(cut.omitted))
    assert len(head) + len(tail) + cut.omitted == len(text)
    assert truncate_text("short", 1000).text == "short"
    assert not truncate_text("short", 1000).truncated


def test_truncate_result_keeps_json_valid_and_cuts_the_longest_field() -> None:
    payload = {"stdout": "o" * 20_000, "stderr": "e" * 300, "exit_code": 1, "nested": ["\n" * 5000]}
    content = json.dumps(payload)
    cut = truncate_result(content, 3000)
    assert len(cut.text) <= 3000
    data = json.loads(cut.text)
    assert data["exit_code"] == 1 and data["stderr"] == "e" * 300
    assert "characters omitted" in data["stdout"]
    assert cut.omitted > 17_000


def test_truncate_result_falls_back_to_text_for_non_json() -> None:
    cut = truncate_result("{not json" + "z" * 5000, 500)
    assert len(cut.text) <= 500 and cut.text.startswith("{not json")
