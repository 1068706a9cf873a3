"""The output row schema: one explicit Arrow schema shared by every shard.

Every ``trajectories/*.parquet`` file has exactly :data:`ROW_SCHEMA`, and every
``rejected/*.parquet`` file has :data:`REJECTED_SCHEMA` (the same columns plus
``reject_reason``), so all shards load together with ``datasets``, pandas and DuckDB.
No Arrow map type is used (``datasets`` cannot read maps): ``tool_stats`` is a list of
structs. All columns are nullable except ``prompt_id``.

==================== ======================================= =================================
column               type                                    meaning
==================== ======================================= =================================
prompt_id            string, not null                        stable id of the dataset row
prompt_index         int64                                   position of the row in the dataset
prompt               string                                  the user prompt
toolsets             list<string>                            toolsets sampled for this prompt
tools                list<string>                            tool names offered to the model
messages             list<struct<role, content, reasoning,   OpenAI chat messages; assistant
                     tool_calls: list<struct<id, type,       turns carry ``reasoning`` and
                     function: struct<name, arguments>>>,    structured ``tool_calls``; tool
                     tool_call_id, name>> (all strings)      turns ``tool_call_id`` and ``name``
conversations        list<struct<from string, value string>> ShareGPT turns, Hermes format
completed            bool                                    the model gave a final answer
partial              bool                                    stopped early (turns, deadline)
finish_reason        string                                  why the episode ended
api_calls            int32                                   model requests (turns)
num_tool_calls       int32                                   tool calls executed
invalid_tool_calls   int32                                   unknown tools / bad arguments
tool_stats           list<struct<name string, count int32,   per-tool counts, sorted by name
                     success int32, failure int32>>
truncated_results    int32                                   tool results cut to the budget
request_errors       list<struct<kind string, count int32>>  failed model requests that were
                                                             retried, by kind (http_500, ...)
usage                struct<prompt_tokens, completion_tokens, token counts (int64)
                     total_tokens>
error                string                                  error message, if any
error_kind           string                                  ``permanent``, ``transient``, ...
has_reasoning        bool                                    some assistant turn had reasoning
model                string                                  model name sent to the endpoint
seed                 int64                                   job seed
config_hash          string                                  hash of the resolved job config
registry_fingerprint string                                  fingerprint of the tool registry
run_name             string                                  run name
started_at           timestamp[ms, tz=UTC]                   episode start
finished_at          timestamp[ms, tz=UTC]                   episode end
duration_s           float64                                 wall time of the episode
model_time_s         float64                                 time spent waiting on the model
tool_time_s          float64                                 time spent running tools
metadata             string                                  the dataset row's other columns,
                                                             as JSON text
reject_reason        string (rejected files only)            why the row was rejected
==================== ======================================= =================================

Rows travel as plain JSON-serialisable dicts (:func:`episode_row`, :func:`failure_row`),
through the journal and to the writer, and become Arrow only in :func:`rows_to_table`.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from hermes.agent import EpisodeRecord

SCHEMA_VERSION = "1"

_STR = pa.string()
_TOOL_CALL = pa.struct(
    [
        ("id", _STR),
        ("type", _STR),
        ("function", pa.struct([("name", _STR), ("arguments", _STR)])),
    ]
)
MESSAGE_TYPE = pa.struct(
    [
        ("role", _STR),
        ("content", _STR),
        ("reasoning", _STR),
        ("tool_calls", pa.list_(_TOOL_CALL)),
        ("tool_call_id", _STR),
        ("name", _STR),
    ]
)
_TIMESTAMP = pa.timestamp("ms", tz="UTC")

ROW_SCHEMA = pa.schema(
    [
        pa.field("prompt_id", _STR, nullable=False),
        ("prompt_index", pa.int64()),
        ("prompt", _STR),
        ("toolsets", pa.list_(_STR)),
        ("tools", pa.list_(_STR)),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("conversations", pa.list_(pa.struct([("from", _STR), ("value", _STR)]))),
        ("completed", pa.bool_()),
        ("partial", pa.bool_()),
        ("finish_reason", _STR),
        ("api_calls", pa.int32()),
        ("num_tool_calls", pa.int32()),
        ("invalid_tool_calls", pa.int32()),
        (
            "tool_stats",
            pa.list_(
                pa.struct(
                    [
                        ("name", _STR),
                        ("count", pa.int32()),
                        ("success", pa.int32()),
                        ("failure", pa.int32()),
                    ]
                )
            ),
        ),
        ("truncated_results", pa.int32()),
        (
            "request_errors",
            pa.list_(pa.struct([("kind", _STR), ("count", pa.int32())])),
        ),
        (
            "usage",
            pa.struct(
                [
                    ("prompt_tokens", pa.int64()),
                    ("completion_tokens", pa.int64()),
                    ("total_tokens", pa.int64()),
                ]
            ),
        ),
        ("error", _STR),
        ("error_kind", _STR),
        ("has_reasoning", pa.bool_()),
        ("model", _STR),
        ("seed", pa.int64()),
        ("config_hash", _STR),
        ("registry_fingerprint", _STR),
        ("run_name", _STR),
        ("started_at", _TIMESTAMP),
        ("finished_at", _TIMESTAMP),
        ("duration_s", pa.float64()),
        ("model_time_s", pa.float64()),
        ("tool_time_s", pa.float64()),
        ("metadata", _STR),
    ],
    metadata={"hermes_schema_version": SCHEMA_VERSION},
)
REJECTED_SCHEMA = ROW_SCHEMA.append(pa.field("reject_reason", _STR))

_TIMESTAMP_COLUMNS = ("started_at", "finished_at")
_MESSAGE_KEYS = ("role", "content", "reasoning", "tool_call_id", "name")


def sanitize(value: Any) -> Any:
    """Return ``value`` with every string (nested ones too) made valid UTF-8.

    Model output can hold lone surrogates (``"\\ud800"``), which Parquet and JSON-to-UTF-8
    encoding reject: each becomes one U+FFFD, while a split surrogate pair is joined back
    into its character. Mappings and sequences are rebuilt as dicts and lists.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # UTF-16 round trip: pairs recombine, lone halves become U+FFFD.
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, Mapping):
        return {sanitize(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [sanitize(v) for v in value]
    return value


def to_json_text(value: Any) -> str:
    """JSON text of a dataset row's columns; values JSON cannot hold become strings."""
    return json.dumps(sanitize(value), ensure_ascii=False, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return tolist()
    return str(value)


def _text(value: Any) -> str | None:
    """A message field as text: structured content (content parts) becomes JSON."""
    if value is None or isinstance(value, str):
        return value
    return to_json_text(value)


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {key: _text(message.get(key)) for key in _MESSAGE_KEYS}
    calls = message.get("tool_calls")
    out["tool_calls"] = None if calls is None else [_tool_call(c) for c in calls]
    return out


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "id": _text(call.get("id")),
        "type": _text(call.get("type")),
        "function": {
            "name": _text(function.get("name")),
            "arguments": _text(function.get("arguments")),
        },
    }


def _tool_stats(stats: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "count": int(counts.get("count", 0)),
            "success": int(counts.get("success", 0)),
            "failure": int(counts.get("failure", 0)),
        }
        for name, counts in sorted(stats.items())
    ]


def _run_fields(
    *,
    prompt_id: str,
    prompt_index: int | None,
    prompt: str | None,
    toolsets: Sequence[str] | None,
    metadata: Mapping[str, Any] | str | None,
    model: str | None,
    seed: int | None,
    config_hash: str | None,
    registry_fingerprint: str | None,
    run_name: str | None,
) -> dict[str, Any]:
    if not isinstance(prompt_id, str) or not prompt_id:
        raise ValueError(f"prompt_id must be a non-empty string, got {prompt_id!r}")
    meta = metadata if metadata is None or isinstance(metadata, str) else to_json_text(metadata)
    return {
        "prompt_id": prompt_id,
        "prompt_index": prompt_index,
        "prompt": prompt,
        "toolsets": None if toolsets is None else list(toolsets),
        "model": model,
        "seed": seed,
        "config_hash": config_hash,
        "registry_fingerprint": registry_fingerprint,
        "run_name": run_name,
        "metadata": meta,
    }


def episode_row(
    record: EpisodeRecord,
    *,
    prompt_id: str,
    prompt_index: int | None,
    prompt: str | None,
    toolsets: Sequence[str] | None,
    metadata: Mapping[str, Any] | str | None,
    model: str | None,
    seed: int | None,
    config_hash: str | None,
    registry_fingerprint: str | None,
    run_name: str | None,
) -> dict[str, Any]:
    """The output row of a finished episode, as a JSON-serialisable dict.

    ``metadata`` is the dataset row's other columns (a mapping, dumped to JSON) or JSON
    text already. Timestamps stay ISO strings until :func:`rows_to_table`.
    """
    row = _run_fields(
        prompt_id=prompt_id,
        prompt_index=prompt_index,
        prompt=prompt,
        toolsets=toolsets,
        metadata=metadata,
        model=model,
        seed=seed,
        config_hash=config_hash,
        registry_fingerprint=registry_fingerprint,
        run_name=run_name,
    )
    row.update(
        tools=list(record.tools),
        messages=[_message(m) for m in record.messages],
        conversations=[
            {"from": t.get("from"), "value": t.get("value")} for t in record.conversations
        ],
        completed=record.completed,
        partial=record.partial,
        finish_reason=record.finish_reason,
        api_calls=record.api_calls,
        num_tool_calls=record.num_tool_calls,
        invalid_tool_calls=record.invalid_tool_calls,
        tool_stats=_tool_stats(record.tool_stats),
        truncated_results=record.truncated_results,
        request_errors=[
            {"kind": kind, "count": count} for kind, count in sorted(record.request_errors.items())
        ],
        usage=dict(record.usage),
        error=record.error,
        error_kind=record.error_kind,
        has_reasoning=record.has_reasoning,
        started_at=record.started_at,
        finished_at=record.finished_at,
        duration_s=record.duration_s,
        model_time_s=record.model_time_s,
        tool_time_s=record.tool_time_s,
    )
    clean: dict[str, Any] = sanitize({name: row.get(name) for name in ROW_SCHEMA.names})
    return clean


def failure_row(
    *,
    prompt_id: str,
    error: str,
    error_kind: str,
    prompt_index: int | None = None,
    prompt: str | None = None,
    toolsets: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | str | None = None,
    model: str | None = None,
    seed: int | None = None,
    config_hash: str | None = None,
    registry_fingerprint: str | None = None,
    run_name: str | None = None,
    finish_reason: str = "error",
) -> dict[str, Any]:
    """A row for a prompt that produced no episode (bad dataset row, worker failure).

    Episode columns are null; ``completed`` and ``partial`` are False.
    """
    row = _run_fields(
        prompt_id=prompt_id,
        prompt_index=prompt_index,
        prompt=prompt,
        toolsets=toolsets,
        metadata=metadata,
        model=model,
        seed=seed,
        config_hash=config_hash,
        registry_fingerprint=registry_fingerprint,
        run_name=run_name,
    )
    row.update(
        completed=False,
        partial=False,
        finish_reason=finish_reason,
        error=error,
        error_kind=error_kind,
    )
    clean: dict[str, Any] = sanitize({name: row.get(name) for name in ROW_SCHEMA.names})
    return clean


def _timestamp(value: Any, column: str) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError as exc:
            raise ValueError(f"{column}: not an ISO 8601 timestamp: {value!r}") from exc
    else:
        raise ValueError(f"{column}: expected an ISO 8601 string, got {type(value).__name__}")
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)  # our timestamps are always UTC
    return parsed


def _float(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _prepare(row: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    out = {name: sanitize(row.get(name)) for name in names}
    prompt_id = out["prompt_id"]
    if not isinstance(prompt_id, str) or not prompt_id:
        raise ValueError(f"row without a prompt_id (got {prompt_id!r}); every row needs one")
    for column in _TIMESTAMP_COLUMNS:
        out[column] = _timestamp(out[column], column)
    if out["messages"] is not None:
        out["messages"] = [_message(m) for m in out["messages"]]
    tool_stats = out["tool_stats"]
    if isinstance(tool_stats, Mapping):
        out["tool_stats"] = _tool_stats(tool_stats)
    for column in ("duration_s", "model_time_s", "tool_time_s"):
        out[column] = _float(out[column])
    return out


def rows_to_table(rows: Iterable[Mapping[str, Any]], *, rejected: bool) -> pa.Table:
    """Convert row dicts to a table with exactly :data:`ROW_SCHEMA` (or
    :data:`REJECTED_SCHEMA` when ``rejected``). Missing keys become nulls; extra keys
    (``shard``, ``status`` from the journal) are dropped."""
    schema = REJECTED_SCHEMA if rejected else ROW_SCHEMA
    prepared = [_prepare(row, schema.names) for row in rows]
    return pa.Table.from_pylist(prepared, schema=schema)


def empty_table(*, rejected: bool) -> pa.Table:
    """A table with no rows and the output schema."""
    return (REJECTED_SCHEMA if rejected else ROW_SCHEMA).empty_table()


__all__ = [
    "MESSAGE_TYPE",
    "REJECTED_SCHEMA",
    "ROW_SCHEMA",
    "SCHEMA_VERSION",
    "empty_table",
    "episode_row",
    "failure_row",
    "rows_to_table",
    "sanitize",
    "to_json_text",
]
