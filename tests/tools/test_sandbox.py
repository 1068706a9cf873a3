"""The process runner, against real subprocesses."""

from __future__ import annotations

import asyncio
import json
import random
import re
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tools.sandbox import (
    OutputCapture,
    ProcessBackend,
    ProcessResult,
    ResourceLimits,
    SandboxError,
    find_prlimit,
    get_backend,
    result_json,
    run_command,
)
from tools.truncate import marker, truncate_text

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
MIB = 1 << 20


def run(argv: list[str], cwd: Path, **kwargs: Any) -> ProcessResult:
    kwargs.setdefault("env", ENV)
    kwargs.setdefault("timeout_s", 10.0)
    kwargs.setdefault("max_output_chars", 10_000)
    return asyncio.run(run_command(argv, cwd=cwd, **kwargs))


def sh(script: str, cwd: Path, **kwargs: Any) -> ProcessResult:
    return run(["/bin/sh", "-c", script], cwd, **kwargs)


def is_gone(pid: int, wait_s: float = 2.0) -> bool:
    """Dead or a zombie (PID 1 here may never reap orphans)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return True
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


# -- basics --------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 3, 255])
def test_exit_code_is_reported(tmp_path: Path, code: int) -> None:
    result = sh(f"exit {code}", tmp_path)
    assert result.exit_code == code
    assert not result.timed_out
    assert result.signal is None


def test_stdout_and_stderr_are_merged_in_order(tmp_path: Path) -> None:
    result = sh("echo out1; echo err1 >&2; echo out2; echo err2 >&2", tmp_path)
    assert result.output == "out1\nerr1\nout2\nerr2\n"
    assert not result.truncated


def test_environment_is_exactly_the_mapping(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-xyz")
    result = run(["env"], tmp_path, env={**ENV, "FOO": "bar"})
    assert sorted(result.output.splitlines()) == sorted(
        [f"PATH={ENV['PATH']}", f"LANG={ENV['LANG']}", "FOO=bar"]
    )


def test_cwd_is_used(tmp_path: Path) -> None:
    assert run(["pwd"], tmp_path).output.strip() == str(tmp_path)


def test_stdin_is_devnull_unless_data_given(tmp_path: Path) -> None:
    assert run(["cat"], tmp_path, timeout_s=5).output == ""
    assert run(["cat"], tmp_path, stdin_data=b"hello\n").output == "hello\n"


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    result = sh(r"printf '\377\376abc\000def\303'", tmp_path)
    assert result.output == "\ufffd\ufffdabc\x00def\ufffd"


def test_unknown_backend_and_missing_command_raise(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="unknown sandbox backend 'bwrap'"):
        get_backend("bwrap")
    with pytest.raises(SandboxError, match="command not found"):
        run(["no-such-command-xyz"], tmp_path)
    assert get_backend("process").name == "process"


# -- timeouts and process groups ------------------------------------------------------


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    started = time.monotonic()
    result = sh("sleep 100 & echo $!; sleep 100", tmp_path, timeout_s=0.5)
    assert time.monotonic() - started < 1.5
    assert result.timed_out
    assert result.exit_code is None
    assert result.signal_name == "SIGKILL"
    background_pid = int(result.output.split()[0])
    assert is_gone(background_pid)


def test_background_child_holding_the_pipe_does_not_hang(tmp_path: Path) -> None:
    started = time.monotonic()
    result = sh("sleep 100 & echo $!", tmp_path, timeout_s=30)
    assert time.monotonic() - started < 2.0
    assert not result.timed_out
    assert result.exit_code == 0
    assert is_gone(int(result.output.split()[0]))


def test_detached_background_child_is_killed_on_return(tmp_path: Path) -> None:
    started = time.monotonic()
    result = sh("sleep 100 >/dev/null 2>&1 & echo $!", tmp_path, timeout_s=30)
    assert time.monotonic() - started < 1.0
    assert result.exit_code == 0
    assert is_gone(int(result.output.split()[0]))


def test_cancellation_kills_the_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    async def scenario() -> None:
        task = asyncio.create_task(
            run_command(
                ["/bin/sh", "-c", f"echo $$ > {pid_file}; sleep 100"],
                cwd=tmp_path,
                env=ENV,
                timeout_s=60,
                max_output_chars=100,
            )
        )
        for _ in range(100):
            await asyncio.sleep(0.02)
            if pid_file.exists() and pid_file.read_text().strip():
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert is_gone(int(pid_file.read_text()))


# -- bounded output ------------------------------------------------------------------


def test_huge_output_is_bounded_while_reading(tmp_path: Path) -> None:
    total = 200_000_000
    limit = 10_000
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = sh(f"yes | head -c {total}", tmp_path, max_output_chars=limit, timeout_s=30)
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib
    assert result.exit_code == 0
    assert len(result.output) <= limit
    assert result.output.startswith("y\ny\n") and result.output.endswith("y\ny\n")
    assert marker(result.omitted_chars) in result.output
    assert total - limit <= result.omitted_chars < total
    # Storing the output would cost >= 200 MB; the peak RSS must not move by that much.
    assert rss_growth_kib < 64 * 1024


# -- resource limits -----------------------------------------------------------------


def _limit_line(limits_text: str, name: str) -> list[str]:
    match = re.search(rf"^{name}\s+(\S+)\s+(\S+)", limits_text, re.MULTILINE)
    assert match, limits_text
    return [match.group(1), match.group(2)]


@pytest.mark.parametrize("use_prlimit", [True, False])
def test_limits_are_applied(tmp_path: Path, use_prlimit: bool) -> None:
    if use_prlimit and find_prlimit() is None:
        pytest.skip("prlimit is not installed")
    limits = ResourceLimits(cpu_s=30, file_size_bytes=MIB, open_files=256, core_bytes=0)
    result = run(
        ["cat", "/proc/self/limits"], tmp_path, limits=limits, backend=ProcessBackend(use_prlimit)
    )
    assert _limit_line(result.output, "Max cpu time") == ["30", "30"]
    assert _limit_line(result.output, "Max file size") == [str(MIB), str(MIB)]
    assert _limit_line(result.output, "Max open files") == ["256", "256"]
    assert _limit_line(result.output, "Max core file size") == ["0", "0"]
    assert _limit_line(result.output, "Max address space") == [str(4 << 30), str(4 << 30)]


def test_file_size_limit_stops_writes(tmp_path: Path) -> None:
    limits = ResourceLimits(file_size_bytes=MIB)
    result = sh("head -c 3000000 /dev/zero > big; echo rc=$?", tmp_path, limits=limits)
    assert (tmp_path / "big").stat().st_size <= MIB
    assert "rc=0" not in result.output


def test_cpu_limit_kills_a_busy_loop(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "while True: pass"]
    result = run(argv, tmp_path, limits=ResourceLimits(cpu_s=1), timeout_s=20)
    assert not result.timed_out
    assert result.signal in (signal.SIGKILL, signal.SIGXCPU)
    assert result.duration_s < 10


def test_limits_above_our_hard_limit_are_clamped() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    effective = dict(
        (option, value) for _, option, value in ResourceLimits(open_files=hard + 10).effective()
    )
    assert effective["nofile"] == hard


# -- OutputCapture -------------------------------------------------------------------


def _capture(chunks: list[bytes], limit: int) -> tuple[str, int]:
    capture = OutputCapture(limit)
    for chunk in chunks:
        capture.feed(chunk)
    text, omitted, _ = capture.finish()
    return text, omitted


def test_capture_keeps_everything_up_to_the_limit() -> None:
    assert _capture([b"abc", b"def"], 6) == ("abcdef", 0)
    assert _capture([], 6) == ("", 0)


def test_capture_matches_truncate_text_for_any_chunking() -> None:
    rng = random.Random(7)
    text = "".join(rng.choice("abcé漢\n") for _ in range(5_000))
    data = text.encode()
    for limit in (100, 101, 999, 4_999, 5_000, 20_000):
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        expected = truncate_text(text, limit)
        assert _capture(chunks, limit) == (expected.text, expected.omitted)
        assert len(expected.text) <= max(limit, len(marker(len(text))))


def test_capture_decodes_a_character_split_across_reads() -> None:
    euro = "€".encode()
    assert _capture([euro[:1], euro[1:2], euro[2:]], 10) == ("€", 0)
    assert _capture([euro[:2]], 10) == ("\ufffd", 0)


def _result(output: str, omitted: int = 0, head_chars: int | None = None) -> ProcessResult:
    return ProcessResult(
        output=output,
        exit_code=0,
        timed_out=False,
        omitted_chars=omitted,
        head_chars=len(output) if head_chars is None else head_chars,
        duration_s=0.0,
    )


def test_fit_of_a_whole_output_matches_truncate_text() -> None:
    text = "".join(f"line {i}\n" for i in range(1_000))
    fitted = _result(text).fit(500)
    expected = truncate_text(text, 500)
    assert (fitted.output, fitted.omitted_chars) == (expected.text, expected.omitted)
    assert _result(text).fit(len(text)) == _result(text)


def test_fit_of_a_cut_output_keeps_one_marker_and_the_total() -> None:
    capture = OutputCapture(2_000)
    text = "".join(f"line {i}\n" for i in range(10_000))
    capture.feed(text.encode())
    output, omitted, head_chars = capture.finish()
    fitted = _result(output, omitted, head_chars).fit(300)
    assert len(fitted.output) <= 300
    assert fitted.output.count("characters omitted") == 1
    assert fitted.output.startswith("line 0\n") and fitted.output.endswith("line 9999\n")
    kept = len(fitted.output) - len(marker(fitted.omitted_chars))
    assert kept + fitted.omitted_chars == len(text)
    assert fitted.output == truncate_text(text, 300).text


def test_result_json_fits_its_budget_despite_escaping() -> None:
    for output in ("\x00" * 5_000, "a\nb\n" * 5_000, "plain" * 2_000):
        raw = result_json(_result(output), timeout_s=1, max_chars=1_000)
        assert len(raw) <= 1_000
        assert json.loads(raw)["truncated"] is True


def test_endless_output_is_stopped_by_the_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run(["yes"], tmp_path, timeout_s=0.5, max_output_chars=1_000)
    assert time.monotonic() - started < 2.0
    assert result.timed_out and result.truncated
    assert len(result.output) <= 1_000
    assert result.omitted_chars > 1_000_000


def test_negative_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="open_files"):
        ResourceLimits(open_files=-1)
