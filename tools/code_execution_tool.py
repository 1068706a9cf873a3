"""The ``execute_code`` tool: run a Python snippet in the episode's scratch directory."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import Any

from tools.registry import registry, tool_error
from tools.sandbox import parse_timeout, run_in_scratch
from tools.settings import ToolContext

logger = logging.getLogger(__name__)

EXECUTE_CODE_SCHEMA: dict[str, Any] = {
    "name": "execute_code",
    "description": (
        "Run a Python 3 program in your private working directory and return what it "
        "prints (stdout and stderr) plus the exit code. An uncaught exception gives exit "
        "code 1 and the traceback in the output. Each call is a fresh interpreter in "
        "isolated mode: nothing is kept in memory between calls, and the working "
        "directory is not on sys.path; files written there persist. Only the standard "
        "library and the runner's installed packages are available; no secrets or API keys."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "code": {
                "type": "string",
                "description": "The complete Python program; use print() to show results.",
            },
            "timeout": {
                "type": "integer",
                "minimum": 1,
                "description": (
                    "Seconds before the program is killed. Optional; defaults to, and is "
                    "capped at, the job's command timeout."
                ),
            },
        },
        "required": ["code"],
    },
}


async def execute_code_handler(args: dict[str, Any], **kwargs: Any) -> str:
    ctx = kwargs.get("ctx")
    if not isinstance(ctx, ToolContext):
        return tool_error("the execute_code tool needs an episode context (ctx) and got none")
    code = args.get("code")
    if not isinstance(code, str) or not code.strip():
        return tool_error("'code' is required and must be a non-empty string of Python")
    try:
        timeout_s = parse_timeout(args.get("timeout"), ctx.settings.command_timeout_s)
    except ValueError as exc:
        return tool_error(str(exc))
    ctx.scratch_dir.mkdir(parents=True, exist_ok=True)
    # A real file (not -c) so tracebacks quote the offending lines.
    fd, path = tempfile.mkstemp(prefix="execute_code_", suffix=".py", dir=ctx.scratch_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(code)
    # -I: ignore PYTHON* variables, user site-packages and the script's directory;
    # -u: unbuffered, so prints and a traceback interleave in the order they happened.
    argv = [sys.executable, "-I", "-u", path]
    return await run_in_scratch(argv, ctx, timeout_s=timeout_s)


registry.register(
    name="execute_code",
    toolset="code_execution",
    schema=EXECUTE_CODE_SCHEMA,
    handler=execute_code_handler,
    is_async=True,
    emoji="🐍",
)
