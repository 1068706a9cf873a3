"""Run statistics: percentile accuracy against numpy, merging, round trips, the report."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from hermes.stats import MAX_FAILED_IDS, MAX_KEYS, OTHER, LogHistogram, RunStats

TOOLSETS = [["terminal"], ["terminal", "file"], ["web"], []]


def make_row(i: int, rng: random.Random) -> dict[str, Any]:
    calls = rng.randint(0, 6)
    ok = rng.randint(0, calls)
    prompt_tokens, completion_tokens = rng.randint(50, 5000), rng.randint(1, 800)
    return {
        "prompt_id": f"p{i}",
        "toolsets": TOOLSETS[i % len(TOOLSETS)],
        "finish_reason": rng.choice(["stop", "stop", "max_turns", "error"]),
        "completed": i % 3 != 0,
        "partial": i % 3 == 0,
        "has_reasoning": i % 2 == 0,
        "api_calls": calls + 1,
        "num_tool_calls": calls,
        "invalid_tool_calls": int(i % 10 == 0),
        "truncated_results": int(i % 7 == 0),
        "tool_stats": [{"name": "terminal", "count": calls, "success": ok, "failure": calls - ok}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "error_kind": "transient" if i % 11 == 0 else None,
        # Multiples of 1/8 add up exactly in any order, so merged totals compare equal.
        "duration_s": rng.randint(1, 4000) / 8,
        "model_time_s": rng.randint(1, 400) / 8,
        "tool_time_s": 0.0 if calls == 0 else rng.randint(1, 80) / 8,
    }


def make_rows(n: int, seed: int = 0) -> list[tuple[dict[str, Any], str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        status = "kept" if i % 5 else rng.choice(["rejected", "failed"])
        row = make_row(i, rng)
        if status == "rejected":
            row["reject_reason"] = rng.choice(["no_tool_calls", "error"])
        out.append((row, status))
    return out


def aggregate(rows: list[tuple[dict[str, Any], str]]) -> RunStats:
    stats = RunStats()
    for row, status in rows:
        stats.add_row(row, status)
    return stats


@pytest.mark.parametrize("dist", ["lognormal", "uniform", "exponential"])
def test_percentiles_are_within_the_documented_error(dist: str) -> None:
    gen = np.random.default_rng(42)
    data = {
        "lognormal": gen.lognormal(0.0, 2.0, 50_000),
        "uniform": gen.uniform(0.01, 500.0, 50_000),
        "exponential": gen.exponential(3.0, 50_000) + 1e-3,
    }[dist]
    hist = LogHistogram(1e-3, 1e6)
    for value in data:
        hist.add(float(value))
    for q in (0, 1, 10, 25, 50, 75, 90, 99, 99.9, 100):
        expected = float(np.percentile(data, q, method="lower"))
        got = hist.percentile(q)
        assert got is not None
        assert abs(got - expected) <= 0.01 * expected * (1 + 1e-9), (q, got, expected)
    assert hist.mean == pytest.approx(float(data.mean()), rel=1e-9)
    assert (hist.min, hist.max) == (float(data.min()), float(data.max()))


def test_integer_histogram_is_exact_for_small_counts_and_handles_zeros() -> None:
    gen = np.random.default_rng(1)
    data = gen.integers(0, 40, 10_000)
    hist = LogHistogram(1, 1e5, integer=True)
    for value in data:
        hist.add(int(value))
    for q in (5, 50, 90, 99):
        assert hist.percentile(q) == float(np.percentile(data, q, method="lower"))
    zeros = LogHistogram(1, 10)
    for value in (0, 0, 0, 5, None, float("nan")):
        zeros.add(value)
    assert (zeros.count, zeros.percentile(50), zeros.percentile(100)) == (4, 0.0, 5)
    assert LogHistogram(1, 10).percentile(50) is None


def test_memory_is_bounded_whatever_the_number_of_rows() -> None:
    hist = LogHistogram(1e-3, 1e6)
    size = len(hist.buckets)
    for i in range(200_000):
        hist.add((i % 997) * 3.7 + 1e9 * (i == 5))  # one value far above max_value
    assert len(hist.buckets) == size < 1100
    assert len(hist.to_dict()["buckets"]) <= size
    assert hist.percentile(100) == 1e9 + 5 * 3.7
    stats = RunStats()
    for i in range(MAX_KEYS + 500):
        stats.add_row({"tool_stats": [{"name": f"made_up_{i}", "count": 1, "success": 0}]}, "kept")
    for i in range(MAX_FAILED_IDS + 50):
        stats.add_row({"prompt_id": f"f{i}"}, "failed")
    assert len(stats.tools) == MAX_KEYS + 1 and stats.tools[OTHER][0] == 500
    assert len(stats.failed_ids) == MAX_FAILED_IDS and stats.totals["failed"] == 150


def test_merge_of_parts_equals_the_aggregate_of_all() -> None:
    rows = make_rows(3000)
    whole = aggregate(rows)
    merged = RunStats()
    for part in (rows[:1000], rows[1000:1200], rows[1200:]):
        merged.merge(aggregate(part))
    assert merged.to_dict() == whole.to_dict()
    assert merged.to_json_dict() == whole.to_json_dict()


def test_to_dict_round_trips_through_json() -> None:
    stats = aggregate(make_rows(500))
    restored = RunStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert restored.to_dict() == stats.to_dict()
    assert restored.summary_table() == stats.summary_table()
    with pytest.raises(ValueError, match="version"):
        RunStats.from_dict({**stats.to_dict(), "version": 99})


def test_json_dict_reports_the_figures() -> None:
    rows = make_rows(1000)
    report = aggregate(rows).to_json_dict()
    kept = sum(status == "kept" for _, status in rows)
    failed = [row["prompt_id"] for row, status in rows if status == "failed"]
    assert report["totals"]["prompts"] == 1000 and report["totals"]["kept"] == kept
    assert report["failed"]["count"] == len(failed)
    assert report["failed"]["prompt_ids"] == failed[:MAX_FAILED_IDS]
    ran = [row for row, status in rows if status != "failed"]
    terminal = report["tools"]["terminal"]
    assert terminal["calls"] == sum(r["num_tool_calls"] for r in ran)
    assert terminal["success_rate"] == pytest.approx(
        terminal["success"] / (terminal["success"] + terminal["failure"]), abs=1e-4
    )
    assert report["toolsets"]["offered"]["terminal"] == sum(
        "terminal" in r["toolsets"] for r in ran
    )
    combos = report["toolsets"]["top_combinations"]
    assert combos[0]["count"] >= combos[-1]["count"] and len(combos) <= 20
    assert {"toolsets": [], "count": sum(not r["toolsets"] for r in ran)} in combos
    assert report["tokens"]["total_tokens"] == sum(r["usage"]["total_tokens"] for r in ran)
    assert report["distributions"]["turns"]["max"] == max(r["api_calls"] for r in ran)
    assert report["totals"]["truncated_results"] == sum(r["truncated_results"] for r in ran)
    json.dumps(report)


def test_summary_table_shows_key_figures_in_plain_text() -> None:
    stats = aggregate(make_rows(200))
    stats.add_row({"tool_stats": {"web_search": {"count": 2, "success": 2, "failure": 0}}}, "kept")
    table = stats.summary_table()
    assert table.isascii()
    t = stats.totals
    assert f"prompts   {t['prompts']:>10}" in table
    assert f"kept      {t['kept']:>10}" in table
    assert "terminal" in table and "web_search" in table and "100.0%" in table
    for label in ("turns (api calls)", "total tokens", "duration (s)", "p50", "p99"):
        assert label in table
    p50 = stats.histograms["duration_s"].percentile(50)
    assert p50 is not None and f"{p50:.1f}" in table
    assert "finish reasons:" in table and "failed prompt_ids:" in table


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="status"):
        RunStats().add_row({}, "lost")
