"""Coerce model-written tool arguments to the types their JSON schema asks for.

Models send ``"42"`` for an integer, ``"true"`` for a boolean and a JSON string for an
array. Coercion only converts values that convert losslessly; anything else is left
as it was for the handler to reject with its own message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})
_MISSING = object()


def _types_of(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            return [
                t for option in options if isinstance(option, Mapping) for t in _types_of(option)
            ]
    return []


def _to_integer(value: Any) -> Any:
    if isinstance(value, bool):
        return _MISSING
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                return _MISSING
            return int(number) if number.is_integer() else _MISSING
    return _MISSING


def _to_number(value: Any) -> Any:
    if isinstance(value, bool):
        return _MISSING
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return _MISSING
        if not math.isfinite(number):
            return _MISSING
        return int(number) if number.is_integer() and "." not in value else number
    return _MISSING


def _to_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return _MISSING


def _to_string(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return _MISSING


def _parse_json_as(value: Any, kind: type) -> Any:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return _MISSING
        if isinstance(parsed, kind):
            return parsed
    return _MISSING


def _to_null(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("null", "none", ""):
        return None
    return _MISSING


_CONVERTERS = {
    "integer": _to_integer,
    "number": _to_number,
    "boolean": _to_boolean,
    "string": _to_string,
    "array": lambda v: _parse_json_as(v, list),
    "object": lambda v: _parse_json_as(v, dict),
    "null": _to_null,
}


def coerce_value(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` converted to the first type of ``schema`` it converts to, else unchanged."""
    kinds = _types_of(schema)
    # A value that already has one of the allowed types is kept as it is.
    for kind in kinds:
        converted = _CONVERTERS.get(kind, lambda v: _MISSING)(value)
        if converted is not _MISSING and type(converted) is type(value):
            return _coerce_children(converted, schema)
    for kind in kinds:
        converted = _CONVERTERS.get(kind, lambda v: _MISSING)(value)
        if converted is not _MISSING:
            return _coerce_children(converted, schema)
    return _coerce_children(value, schema)


def _coerce_children(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [coerce_value(item, schema["items"]) for item in value]
    if isinstance(value, dict) and isinstance(schema.get("properties"), Mapping):
        return coerce_args(value, schema)
    return value


def coerce_args(args: Mapping[str, Any], parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Coerce every argument that has a property schema; unknown keys pass through."""
    properties = parameters.get("properties")
    if not isinstance(properties, Mapping):
        return dict(args)
    out: dict[str, Any] = {}
    for key, value in args.items():
        prop = properties.get(key)
        out[key] = coerce_value(value, prop) if isinstance(prop, Mapping) else value
    return out


def missing_required(args: Mapping[str, Any], parameters: Mapping[str, Any]) -> list[str]:
    """Names listed in the schema's ``required`` that ``args`` lacks."""
    required = parameters.get("required")
    if not isinstance(required, list):
        return []
    return [name for name in required if isinstance(name, str) and name not in args]
