"""Run statistics with flat memory: counters and fixed-size histograms, mergeable.

Workers aggregate the rows of a shard into a :class:`RunStats`, send ``to_dict()`` to the
driver (a few KB), and the driver ``merge``\\ s them; ``to_json_dict()`` is what goes into
``statistics.json`` and ``summary_table()`` what the CLI prints at the end of a run.

Memory does not grow with the number of rows:

- distributions (turns, tool calls, tokens, latencies) are :class:`LogHistogram`\\ s:
  a fixed array of logarithmic buckets. A percentile is reported as the middle of its
  bucket, so its relative error is at most ``rel_error`` (1%) for values inside
  ``[min_value, max_value]``; values below ``min_value`` are off by at most ``min_value``,
  values above ``max_value`` are reported as at most the observed max. Percentiles use
  the "lower" rank (``numpy.percentile(..., method="lower")``); mean, min and max are
  exact;
- counters keyed by names (tools, finish reasons, reject reasons, toolsets and their
  combinations) keep :data:`MAX_KEYS` distinct names exactly and add later newcomers
  under ``"(other)"``, so a model inventing tool names cannot grow them without bound;
- failed prompt_ids: the first :data:`MAX_FAILED_IDS` are kept, the count is exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_KEYS = 1000
MAX_FAILED_IDS = 100
TOP_COMBINATIONS = 20
OTHER = "(other)"
PERCENTILES = (50, 90, 99)
_STATUSES = ("kept", "rejected", "failed")
_STATE_VERSION = 1


class LogHistogram:
    """Counts of positive values in logarithmic buckets; zero and negatives counted apart.

    Bucket ``i`` holds values in ``(min_value * g**(i-1), min_value * g**i]`` with
    ``g = (1 + rel_error) / (1 - rel_error)``; its representative value
    ``2 * min_value * g**i / (g + 1)`` is within ``rel_error`` of anything in it.
    """

    def __init__(
        self,
        min_value: float,
        max_value: float,
        *,
        rel_error: float = 0.01,
        integer: bool = False,
    ) -> None:
        if not 0 < min_value < max_value or not 0 < rel_error < 1:
            raise ValueError("need 0 < min_value < max_value and 0 < rel_error < 1")
        self.min_value, self.max_value = float(min_value), float(max_value)
        self.rel_error, self.integer = rel_error, integer
        self._gamma = (1 + rel_error) / (1 - rel_error)
        self._log_gamma = math.log(self._gamma)
        size = math.ceil(math.log(self.max_value / self.min_value) / self._log_gamma) + 1
        self.buckets = [0] * size
        self.zeros = 0
        self.count = 0
        self.total = 0.0
        self.min: float | None = None
        self.max: float | None = None

    def add(self, value: float | None) -> None:
        """Count one value; None and NaN are ignored."""
        if value is None or math.isnan(value):
            return
        self.count += 1
        self.total += value
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)
        if value <= 0:
            self.zeros += 1
            return
        index = math.ceil(math.log(value / self.min_value) / self._log_gamma)
        self.buckets[min(max(index, 0), len(self.buckets) - 1)] += 1

    def _representative(self, index: int) -> float:
        return 2 * self.min_value * self._gamma**index / (self._gamma + 1)

    def percentile(self, q: float) -> float | None:
        """The value at rank ``floor(q/100 * (count-1))``, within the documented error."""
        if self.count == 0 or self.min is None or self.max is None:
            return None
        rank = math.floor(q / 100 * (self.count - 1))
        if rank >= self.count - 1:
            return self.max
        if rank == 0:
            return self.min
        seen = self.zeros
        estimate = 0.0
        if seen <= rank:
            for index, bucket in enumerate(self.buckets):
                seen += bucket
                if seen > rank:
                    estimate = self._representative(index)
                    break
        estimate = min(max(estimate, self.min), self.max)
        return float(round(estimate)) if self.integer else estimate

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def summary(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {"count": self.count, "mean": self.mean}
        for q in PERCENTILES:
            out[f"p{q}"] = self.percentile(q)
        out["min"], out["max"] = self.min, self.max
        return out

    def _params(self) -> tuple[float, float, float, bool]:
        return (self.min_value, self.max_value, self.rel_error, self.integer)

    def merge(self, other: LogHistogram) -> None:
        if self._params() != other._params():
            raise ValueError("cannot merge histograms with different bucket layouts")
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
        self.zeros += other.zeros
        self.count += other.count
        self.total += other.total
        for attr, pick in (("min", min), ("max", max)):
            mine, theirs = getattr(self, attr), getattr(other, attr)
            values = [v for v in (mine, theirs) if v is not None]
            setattr(self, attr, pick(values) if values else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_value": self.min_value,
            "max_value": self.max_value,
            "rel_error": self.rel_error,
            "integer": self.integer,
            "count": self.count,
            "total": self.total,
            "min": self.min,
            "max": self.max,
            "zeros": self.zeros,
            "buckets": [[i, c] for i, c in enumerate(self.buckets) if c],  # sparse
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LogHistogram:
        hist = cls(
            data["min_value"],
            data["max_value"],
            rel_error=data["rel_error"],
            integer=data["integer"],
        )
        hist.count, hist.total, hist.zeros = data["count"], data["total"], data["zeros"]
        hist.min, hist.max = data["min"], data["max"]
        for index, count in data["buckets"]:
            hist.buckets[index] = count
        return hist


def _histograms() -> dict[str, LogHistogram]:
    return {
        "turns": LogHistogram(1, 1e5, integer=True),
        "tool_calls": LogHistogram(1, 1e6, integer=True),
        "prompt_tokens": LogHistogram(1, 1e10, integer=True),
        "completion_tokens": LogHistogram(1, 1e10, integer=True),
        "total_tokens": LogHistogram(1, 1e10, integer=True),
        # 1 ms .. 11.6 days
        "duration_s": LogHistogram(1e-3, 1e6),
        "model_time_s": LogHistogram(1e-3, 1e6),
        "tool_time_s": LogHistogram(1e-3, 1e6),
    }


_HISTOGRAM_LABELS = {
    "turns": "turns (api calls)",
    "tool_calls": "tool calls/episode",
    "prompt_tokens": "prompt tokens",
    "completion_tokens": "completion tokens",
    "total_tokens": "total tokens",
    "duration_s": "duration (s)",
    "model_time_s": "model time (s)",
    "tool_time_s": "tool time (s)",
}

# Integer totals, in the order they are reported.
_TOTALS = (
    "prompts",
    "kept",
    "rejected",
    "failed",
    "completed",
    "partial",
    "has_reasoning",
    "tool_calls",
    "invalid_tool_calls",
    "episodes_with_invalid_tool_calls",
    "truncated_results",
    "episodes_with_truncation",
)
_COUNTERS = (
    "reject_reasons",
    "failure_kinds",
    "error_kinds",
    "request_errors",
    "finish_reasons",
    "toolsets",
    "toolset_combinations",
)


def _bump(counter: dict[str, int], key: str, n: int = 1) -> None:
    if key not in counter and len(counter) >= MAX_KEYS:
        key = OTHER
    counter[key] = counter.get(key, 0) + n


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


@dataclass
class RunStats:
    """Aggregates output rows; see the module docstring for the memory bounds."""

    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_TOTALS, 0))
    counters: dict[str, dict[str, int]] = field(
        default_factory=lambda: {name: {} for name in _COUNTERS}
    )
    tools: dict[str, list[int]] = field(default_factory=dict)  # name -> calls, ok, failed
    failed_ids: list[str] = field(default_factory=list)
    histograms: dict[str, LogHistogram] = field(default_factory=_histograms)

    def add_row(self, row: Mapping[str, Any], status: str) -> None:
        """Count one output row; ``status`` is ``kept``, ``rejected`` or ``failed``
        (infrastructure failure: no episode ran, only the prompt_id is recorded)."""
        if status not in _STATUSES:
            raise ValueError(f"status must be one of {_STATUSES}, got {status!r}")
        t = self.totals
        t["prompts"] += 1
        t[status] += 1
        if status == "failed":
            if len(self.failed_ids) < MAX_FAILED_IDS:
                self.failed_ids.append(str(row.get("prompt_id")))
            _bump(self.counters["failure_kinds"], str(row.get("error_kind") or "unknown"))
            for item in row.get("request_errors") or ():
                _bump(
                    self.counters["request_errors"], str(item.get("kind")), _int(item.get("count"))
                )
            return
        if status == "rejected":
            reason = row.get("reject_reason") or "(unspecified)"
            _bump(self.counters["reject_reasons"], str(reason))
        self._add_episode(row)

    def _add_episode(self, row: Mapping[str, Any]) -> None:
        t, c = self.totals, self.counters
        for flag in ("completed", "partial", "has_reasoning"):
            t[flag] += bool(row.get(flag))
        _bump(c["finish_reasons"], str(row.get("finish_reason") or "(none)"))
        if row.get("error_kind"):
            _bump(c["error_kinds"], str(row["error_kind"]))
        toolsets = sorted(str(name) for name in row.get("toolsets") or ())
        for name in toolsets:
            _bump(c["toolsets"], name)
        _bump(c["toolset_combinations"], "+".join(toolsets) or "(none)")
        invalid, truncated = _int(row.get("invalid_tool_calls")), _int(row.get("truncated_results"))
        t["tool_calls"] += _int(row.get("num_tool_calls"))
        t["invalid_tool_calls"] += invalid
        t["episodes_with_invalid_tool_calls"] += invalid > 0
        t["truncated_results"] += truncated
        t["episodes_with_truncation"] += truncated > 0
        for item in row.get("request_errors") or ():
            _bump(c["request_errors"], str(item.get("kind")), _int(item.get("count")))
        for name, calls, ok, failed in _tool_counts(row.get("tool_stats")):
            self._add_tool(name, calls, ok, failed)
        usage = row.get("usage") or {}
        h = self.histograms
        h["turns"].add(row.get("api_calls"))
        h["tool_calls"].add(row.get("num_tool_calls"))
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            h[key].add(usage.get(key))
        for key in ("duration_s", "model_time_s", "tool_time_s"):
            h[key].add(row.get(key))

    def _add_tool(self, name: str, calls: int, ok: int, failed: int) -> None:
        if name not in self.tools and len(self.tools) >= MAX_KEYS:
            name = OTHER
        counts = self.tools.setdefault(name, [0, 0, 0])
        counts[0] += calls
        counts[1] += ok
        counts[2] += failed

    def merge(self, other: RunStats) -> None:
        """Add ``other`` into this one (e.g. per-shard stats into the run's)."""
        for key, value in other.totals.items():
            self.totals[key] = self.totals.get(key, 0) + value
        for name, counter in other.counters.items():
            mine = self.counters.setdefault(name, {})
            for key, value in counter.items():
                _bump(mine, key, value)
        for tool, (calls, ok, failed) in other.tools.items():
            self._add_tool(tool, calls, ok, failed)
        room = MAX_FAILED_IDS - len(self.failed_ids)
        self.failed_ids.extend(other.failed_ids[: max(room, 0)])
        for key, hist in other.histograms.items():
            self.histograms[key].merge(hist)

    def to_dict(self) -> dict[str, Any]:
        """Complete, JSON-serialisable state; ``from_dict`` restores it exactly."""
        return {
            "version": _STATE_VERSION,
            "totals": dict(self.totals),
            "counters": {name: dict(c) for name, c in self.counters.items()},
            "tools": {name: list(c) for name, c in self.tools.items()},
            "failed_ids": list(self.failed_ids),
            "histograms": {name: h.to_dict() for name, h in self.histograms.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunStats:
        if data.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported statistics state version {data.get('version')!r}")
        return cls(
            totals={**dict.fromkeys(_TOTALS, 0), **data["totals"]},
            counters={**{n: {} for n in _COUNTERS}, **data["counters"]},
            tools={name: list(c) for name, c in data["tools"].items()},
            failed_ids=list(data["failed_ids"]),
            histograms={n: LogHistogram.from_dict(h) for n, h in data["histograms"].items()},
        )

    def to_json_dict(self) -> dict[str, Any]:
        """The content of ``statistics.json``: figures for people, not the raw state."""
        t, c = self.totals, self.counters
        combos = sorted(c["toolset_combinations"].items(), key=lambda kv: (-kv[1], kv[0]))
        return {
            "totals": dict(t),
            "rejected_by_reason": _desc(c["reject_reasons"]),
            "failed": {
                "count": t["failed"],
                "prompt_ids": list(self.failed_ids),
                "prompt_ids_complete": t["failed"] <= len(self.failed_ids),
                "by_kind": _desc(c["failure_kinds"]),
            },
            "errors_by_kind": _desc(c["error_kinds"]),
            "retried_request_errors": _desc(c["request_errors"]),
            "finish_reasons": _desc(c["finish_reasons"]),
            "tools": {name: _tool_summary(*counts) for name, counts in self._tools_by_calls()},
            "toolsets": {
                "offered": _desc(c["toolsets"]),
                "top_combinations": [
                    {"toolsets": key.split("+") if key != "(none)" else [], "count": n}
                    for key, n in combos[:TOP_COMBINATIONS]
                ],
            },
            "distributions": {name: h.summary() for name, h in self.histograms.items()},
            "tokens": {
                key: int(self.histograms[key].total)
                for key in ("prompt_tokens", "completion_tokens", "total_tokens")
            },
            "percentile_error": (
                "percentiles come from log-bucket histograms: relative error at most 1% "
                "(rank = floor(q/100*(n-1))); mean, min, max and counts are exact"
            ),
        }

    def _tools_by_calls(self) -> list[tuple[str, list[int]]]:
        return sorted(self.tools.items(), key=lambda kv: (-kv[1][0], kv[0]))

    def summary_table(self) -> str:
        """A plain-text report for the end of a run."""
        return "\n".join(
            [*self._totals_lines(), "", *self._tool_lines(), "", *self._distribution_lines()]
        )

    def _totals_lines(self) -> list[str]:
        t, c = self.totals, self.counters
        prompts = t["prompts"]
        lines = [f"{'prompts':<10}{prompts:>10}"]
        for status in _STATUSES:
            lines.append(f"{status:<10}{t[status]:>10}  {_pct(t[status], prompts):>6}")
        if c["reject_reasons"]:
            lines.append("rejected by reason: " + _inline(c["reject_reasons"]))
        if t["failed"]:
            shown = ", ".join(self.failed_ids[:5])
            more = f" (+{t['failed'] - 5} more)" if t["failed"] > 5 else ""
            lines.append(f"failed prompt_ids: {shown}{more}")
        if c["finish_reasons"]:
            lines.append("finish reasons: " + _inline(c["finish_reasons"]))
        lines.append(
            f"tool calls {t['tool_calls']}, invalid {t['invalid_tool_calls']}, "
            f"truncated results {t['truncated_results']}, "
            f"episodes with reasoning {t['has_reasoning']}"
        )
        return lines

    def _tool_lines(self) -> list[str]:
        if not self.tools:
            return ["no tool calls"]
        width = max(len("tool"), *(len(name) for name in self.tools))
        lines = [f"{'tool':<{width}}  {'calls':>8}  {'success':>8}  {'failure':>8}  {'rate':>6}"]
        for name, (calls, ok, failed) in self._tools_by_calls():
            rate = _pct(ok, ok + failed)
            lines.append(f"{name:<{width}}  {calls:>8}  {ok:>8}  {failed:>8}  {rate:>6}")
        return lines

    def _distribution_lines(self) -> list[str]:
        width = max(len(label) for label in _HISTOGRAM_LABELS.values())
        heads = ("mean", *(f"p{q}" for q in PERCENTILES), "max")
        lines = [f"{'':<{width}}" + "".join(f"  {h:>10}" for h in heads)]
        for name, label in _HISTOGRAM_LABELS.items():
            hist = self.histograms[name]
            if not hist.count:
                continue
            values = (hist.mean, *(hist.percentile(q) for q in PERCENTILES), hist.max)
            lines.append(f"{label:<{width}}" + "".join(f"  {_num(v):>10}" for v in values))
        return lines


def _tool_counts(stats: Any) -> Iterable[tuple[str, int, int, int]]:
    """(name, calls, success, failure) from a row's list of structs or a record's dict."""
    if isinstance(stats, Mapping):
        stats = [{"name": name, **counts} for name, counts in stats.items()]
    for item in stats or ():
        yield (
            str(item.get("name")),
            _int(item.get("count")),
            _int(item.get("success")),
            _int(item.get("failure")),
        )


def _tool_summary(calls: int, ok: int, failed: int) -> dict[str, Any]:
    rate = round(ok / (ok + failed), 4) if ok + failed else None
    return {"calls": calls, "success": ok, "failure": failed, "success_rate": rate}


def _desc(counter: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def _inline(counter: Mapping[str, int], limit: int = 8) -> str:
    items = list(_desc(counter).items())
    text = ", ".join(f"{key} {n}" for key, n in items[:limit])
    return text + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) >= 10:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


__all__ = ["MAX_FAILED_IDS", "MAX_KEYS", "LogHistogram", "RunStats"]
