"""The execute_code tool, running real Python in a scratch directory."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tools.code_execution_tool import execute_code_handler
from tools.registry import registry
from tools.settings import ToolContext, ToolSettings

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
    result = json.loads(asyncio.run(execute_code_handler(args, **kwargs)))
    assert isinstance(result, dict)
    return result


def test_runs_code(ctx: ToolContext) -> None:
    assert call({"code": "print(6 * 7)"}, ctx) == {"output": "42\n", "exit_code": 0}


def test_exception_is_a_result_with_the_traceback(ctx: ToolContext) -> None:
    result = call({"code": "print('before')\nx = 1 / 0\n"}, ctx)
    assert "error" not in result
    assert result["exit_code"] == 1
    output = result["output"]
    assert output.startswith("before\n")  # unbuffered: print comes before the traceback
    assert "Traceback (most recent call last)" in output
    assert "x = 1 / 0" in output and "ZeroDivisionError" in output


def test_exit_status_is_reported(ctx: ToolContext) -> None:
    assert call({"code": "import sys; sys.exit(3)"}, ctx)["exit_code"] == 3


def test_no_secrets_and_scratch_home(ctx: ToolContext) -> None:
    code = (
        "import os, sys\n"
        "print(sorted(os.environ))\n"
        "print(os.environ['HOME'], os.environ['TMPDIR'], os.getcwd(), sep='|')\n"
        "print(sys.flags.isolated)\n"
        f"print({SECRET!r} in repr(dict(os.environ)))\n"
    )
    lines = call({"code": code}, ctx)["output"].splitlines()
    assert "OPENAI_API_KEY" not in lines[0]
    scratch = str(ctx.scratch_dir)
    assert lines[1] == f"{scratch}|{scratch}|{scratch}"
    assert lines[2:] == ["1", "False"]


def test_timeout_is_an_error(ctx: ToolContext) -> None:
    started = time.monotonic()
    code = "import time\nprint('started')\ntime.sleep(100)\n"
    result = call({"code": code, "timeout": 1}, ctx)
    assert time.monotonic() - started < 2.5
    assert result["timed_out"] is True
    assert "timed out" in result["error"]
    assert result["output"] == "started\n"


def test_files_persist_in_the_scratch_dir(ctx: ToolContext) -> None:
    call({"code": "open('data.txt', 'w').write('kept')"}, ctx)
    assert (ctx.scratch_dir / "data.txt").read_text() == "kept"
    assert call({"code": "print(open('data.txt').read())"}, ctx)["output"] == "kept\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [({}, "'code' is required"), ({"code": "print(1)", "timeout": -1}, "positive number")],
)
def test_bad_arguments_are_errors(ctx: ToolContext, args: dict[str, Any], message: str) -> None:
    assert message in call(args, ctx)["error"]


def test_without_context_is_an_error() -> None:
    assert "episode context" in call({"code": "print(1)"}, None)["error"]


def test_registered_in_its_toolset(ctx: ToolContext) -> None:
    entry = registry.get_entry("execute_code")
    assert entry is not None and entry.toolset == "code_execution" and entry.is_async
    raw = registry.dispatch("execute_code", {"code": "print('hi')"}, task_id="t1", ctx=ctx)
    assert json.loads(raw) == {"output": "hi\n", "exit_code": 0}
