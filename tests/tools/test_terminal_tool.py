"""The terminal tool, running real shell commands in a scratch directory."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tools.registry import registry
from tools.settings import ToolContext, ToolSettings
from tools.terminal_tool import terminal_handler

SECRET = "sk-secret-xyz"


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ToolContext:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    settings = ToolSettings(
        env={"PATH": os.environ["PATH"], "OPENAI_API_KEY": SECRET}, command_timeout_s=10
    )
    return ToolContext(task_id="t1", scratch_dir=tmp_path / "scratch", settings=settings)


def call(args: dict[str, Any], ctx: ToolContext | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {} if ctx is None else {"task_id": ctx.task_id, "ctx": ctx}
    result = json.loads(asyncio.run(terminal_handler(args, **kwargs)))
    assert isinstance(result, dict)
    return result


def test_runs_a_command(ctx: ToolContext) -> None:
    assert call({"command": "echo hello; echo oops >&2"}, ctx) == {
        "output": "hello\noops\n",
        "exit_code": 0,
    }


def test_nonzero_exit_is_a_normal_result(ctx: ToolContext) -> None:
    result = call({"command": "echo failing; exit 7"}, ctx)
    assert result == {"output": "failing\n", "exit_code": 7}


def test_secrets_are_not_visible(ctx: ToolContext) -> None:
    result = call({"command": "env"}, ctx)
    assert result["exit_code"] == 0
    assert "PATH=" in result["output"]
    assert SECRET not in result["output"]
    assert "OPENAI_API_KEY" not in result["output"]


def test_home_tmpdir_and_cwd_are_the_scratch_dir(ctx: ToolContext) -> None:
    result = call({"command": 'echo "$HOME|$TMPDIR|$(pwd)"; touch made-here'}, ctx)
    scratch = str(ctx.scratch_dir)
    assert result["output"].strip() == f"{scratch}|{scratch}|{scratch}"
    assert (ctx.scratch_dir / "made-here").exists()


def test_file_size_limit_is_set(ctx: ToolContext) -> None:
    # bash reports RLIMIT_FSIZE in 1024-byte blocks: the default limit is 1 GiB.
    assert call({"command": "ulimit -f"}, ctx)["output"].strip() == str(1 << 20)


def test_timeout_is_an_error_with_partial_output(ctx: ToolContext) -> None:
    started = time.monotonic()
    result = call({"command": "echo partial; sleep 100", "timeout": 1}, ctx)
    assert time.monotonic() - started < 2.5
    assert "timed out after 1 s" in result["error"]
    assert result["timed_out"] is True
    assert result["output"] == "partial\n"
    assert result["exit_code"] is None


def test_timeout_is_capped_by_settings(tmp_path: Path) -> None:
    settings = ToolSettings(env={"PATH": os.environ["PATH"]}, command_timeout_s=0.5)
    capped = ToolContext(task_id="t2", scratch_dir=tmp_path, settings=settings)
    started = time.monotonic()
    result = call({"command": "sleep 100", "timeout": 100}, capped)
    assert time.monotonic() - started < 2.0
    assert result["timed_out"] is True


def test_long_output_is_truncated_to_the_budget(ctx: ToolContext) -> None:
    small = ctx.with_limit(2_000)
    raw = asyncio.run(terminal_handler({"command": "seq 1 100000"}, task_id="t1", ctx=small))
    result = json.loads(raw)
    assert len(raw) <= 2_000
    assert result["truncated"] is True
    assert result["output"].startswith("1\n2\n3\n")
    assert result["output"].endswith("99999\n100000\n")
    assert "characters omitted" in result["output"]
    assert result["exit_code"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "'command' is required"),
        ({"command": "  "}, "'command' is required"),
        ({"command": "true", "timeout": 0}, "positive number"),
        ({"command": "true", "timeout": "soon"}, "positive number"),
    ],
)
def test_bad_arguments_are_errors(ctx: ToolContext, args: dict[str, Any], message: str) -> None:
    assert message in call(args, ctx)["error"]


def test_without_context_is_an_error() -> None:
    assert "episode context" in call({"command": "true"}, None)["error"]


def test_dispatch_through_the_registry(ctx: ToolContext) -> None:
    entry = registry.get_entry("terminal")
    assert entry is not None and entry.toolset == "terminal" and entry.is_async
    raw = registry.dispatch("terminal", {"command": "echo via-dispatch"}, task_id="t1", ctx=ctx)
    assert json.loads(raw) == {"output": "via-dispatch\n", "exit_code": 0}


def test_dispatch_from_inside_a_running_loop(ctx: ToolContext) -> None:
    # The registry then runs the handler on a private loop in another thread.
    async def caller() -> str:
        return registry.dispatch("terminal", {"command": "echo threaded"}, task_id="t1", ctx=ctx)

    assert json.loads(asyncio.run(caller())) == {"output": "threaded\n", "exit_code": 0}
