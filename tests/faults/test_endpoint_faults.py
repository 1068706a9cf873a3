"""Every fault of the embedded endpoint at once, against a real run (invariants 1 and 4).

The endpoint runs as its own `hermes-batch serve` process so its /stats (faults injected,
by kind) can be read after the job and compared with what the run reports: every
injected fault must show up once, under its kind, in statistics.json and in the rows.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.faults.conftest import EndpointProcess
from tests.runner.helpers import job_dict, rows, run_cli, write_job

pytestmark = pytest.mark.slow

# Enough retries that no request plausibly exhausts them (a request fails with p ~ 0.23,
# so 11 failures in a row is ~1e-7): then every injected fault is retried and counted.
RETRIES = 10


def _fault_args(faults: dict[str, float]) -> list[str]:
    return [arg for kind, value in faults.items() for arg in ("--fault", f"{kind}={value:g}")]


def _run(
    endpoint: EndpointProcess, dataset: Path, tmp_path: Path, **model: Any
) -> tuple[int, dict[str, Any], pd.DataFrame, str]:
    job = job_dict(dataset, tmp_path / "out")
    job.pop("endpoint")  # the job talks to the separate process, not an embedded one
    job["model"].update(
        base_url=endpoint.base_url,
        max_retries=RETRIES,
        backoff_base_s=0.02,
        backoff_max_s=0.2,
        **model,
    )
    # terminal on every prompt: a huge_output fault is then always a huge tool result.
    job["distributions"]["coding_mix"]["toolsets"] = {"terminal": 100, "file": 50}
    job["runner"].update(num_workers=2, concurrency=32, batch_size=50)
    job["tool_limits"] = {"default_max_result_chars": 4000}
    result = run_cli("--job", str(write_job(tmp_path / "job.yaml", job)), timeout=600)
    run_dir = tmp_path / "out" / "run"
    stats = json.loads((run_dir / "statistics.json").read_text())
    frame = pd.concat([rows(run_dir), rows(run_dir, "rejected")], ignore_index=True)
    return result.returncode, stats, frame, result.stderr


def _assert_each_prompt_once(frame: pd.DataFrame, stats: dict[str, Any], total: int) -> None:
    """Exactly one row per prompt, or the prompt listed as failed; never both, never lost."""
    ids = list(frame.prompt_id)
    assert len(ids) == len(set(ids)), "a prompt has two rows"
    failed = {f["prompt_id"] for f in stats["failed_prompts_this_attempt"]}
    assert not failed & set(ids)
    assert sorted(set(ids) | failed) == [f"p{i:05d}" for i in range(total)]
    assert stats["totals"]["prompts"] == total
    assert stats["failed"]["count"] == len(failed)


def _row_request_errors(frame: pd.DataFrame) -> Counter[str]:
    counts: Counter[str] = Counter()
    for items in frame.request_errors:
        for item in items:
            counts[item["kind"]] += item["count"]
    return counts


def _tool_errors(frame: pd.DataFrame, needle: str) -> int:
    return sum(
        1
        for messages in frame.messages
        for m in messages
        if m["role"] == "tool" and m["content"].startswith('{"error"') and needle in m["content"]
    )


def test_every_endpoint_fault_at_once_is_survived_and_counted(
    tmp_path: Path,
    prompts: Callable[[int], Path],
    endpoint_process: Callable[..., EndpointProcess],
) -> None:
    total = 300
    faults = {
        "http_500": 0.05,
        "http_429": 0.05,
        "retry_after_s": 0.1,
        "html_200": 0.05,
        "hang": 0.03,
        "hang_s": 30,
        "empty_choices": 0.05,
        "malformed_tool_call": 0.05,
        "unknown_tool": 0.05,
        "huge_output": 0.03,
        "huge_output_bytes": 200_000,
    }
    endpoint = endpoint_process("--latency-ms", "5", *_fault_args(faults))
    code, stats, frame, stderr = _run(endpoint, prompts(total), tmp_path, request_timeout_s=2)
    served = endpoint.stats()
    injected = served["faults"]

    assert code == 0, stderr[-3000:]
    _assert_each_prompt_once(frame, stats, total)
    assert stats["failed"]["count"] == 0
    for kind in ("http_500", "http_429", "html_200", "hang", "empty_choices"):
        assert injected[kind] > 0, injected
    for kind in ("malformed_tool_call", "unknown_tool", "huge_output"):
        assert injected[kind] > 0, injected

    # Transport faults: each one failed a request that was retried, counted by its kind.
    expected = {
        "http_500": injected["http_500"],
        "rate_limit": injected["http_429"],
        "bad_body": injected["html_200"],
        "timeout": injected["hang"],
        "empty_choices": injected["empty_choices"],
    }
    assert stats["retried_request_errors"] == expected
    assert dict(_row_request_errors(frame)) == expected  # the rows say the same
    transport = sum(injected[k] for k in ("http_500", "http_429", "html_200", "hang"))
    transport += injected["empty_choices"]
    assert served["requests"] == served["completions"] + transport
    # Every answered request is one model turn of some row: none lost, none run twice.
    assert int(frame.api_calls.sum()) == served["completions"]

    # Content faults: one invalid call each, reported to the model and counted.
    unknown, malformed = injected["unknown_tool"], injected["malformed_tool_call"]
    assert stats["totals"]["invalid_tool_calls"] == unknown + malformed
    assert stats["tools"]["nonexistent_tool"] == {
        "calls": unknown,
        "success": 0,
        "failure": unknown,
        "success_rate": 0.0,
    }
    assert _tool_errors(frame, "Unknown tool 'nonexistent_tool'") == unknown
    assert _tool_errors(frame, "arguments are not valid JSON") == malformed
    # A huge output is a terminal call printing 200 kB: cut to the 4,000-character limit.
    assert stats["totals"]["truncated_results"] == injected["huge_output"]
    assert int(frame.truncated_results.sum()) == injected["huge_output"]
    assert max(len(m["content"]) for ms in frame.messages for m in ms if m["role"] == "tool") < 5000


def test_truncated_streams_are_retried_and_counted(
    tmp_path: Path,
    prompts: Callable[[int], Path],
    endpoint_process: Callable[..., EndpointProcess],
) -> None:
    total = 80
    faults = {"truncated_stream": 0.1, "http_500": 0.05, "malformed_tool_call": 0.05}
    endpoint = endpoint_process("--latency-ms", "5", *_fault_args(faults))
    code, stats, frame, stderr = _run(
        endpoint, prompts(total), tmp_path, request_timeout_s=5, stream=True
    )
    served = endpoint.stats()
    injected = served["faults"]

    assert code == 0, stderr[-3000:]
    _assert_each_prompt_once(frame, stats, total)
    assert injected["truncated_stream"] > 0 and injected["http_500"] > 0
    assert served["streamed"] == served["completions"]
    # A stream cut mid-event drops the connection: the client sees a connection error.
    expected = {"connection": injected["truncated_stream"], "http_500": injected["http_500"]}
    assert stats["retried_request_errors"] == expected
    assert dict(_row_request_errors(frame)) == expected
    # Truncated streams are counted as completions by the server but are not turns.
    assert int(frame.api_calls.sum()) == served["completions"] - injected["truncated_stream"]
    assert stats["totals"]["invalid_tool_calls"] == injected["malformed_tool_call"]
    assert _tool_errors(frame, "arguments are not valid JSON") == injected["malformed_tool_call"]
