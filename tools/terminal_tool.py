"""The ``terminal`` tool: run one shell command in the episode's scratch directory."""

from __future__ import annotations

import logging
import shutil
from typing import Any

from tools.registry import registry, tool_error
from tools.sandbox import episode_env, parse_timeout, run_in_scratch
from tools.settings import ToolContext

logger = logging.getLogger(__name__)

TERMINAL_SCHEMA: dict[str, Any] = {
    "name": "terminal",
    "description": (
        "Run a shell command (bash) in your private working directory and return its "
        "combined stdout and stderr plus the exit code. Each call starts a fresh shell: "
        "`cd` and variables do not carry over, and background processes are killed when "
        "the command returns. Files you write in the working directory persist between "
        "calls. Long outputs keep their beginning and end; redirect to a file and read "
        "parts of it to see more. No secrets or API keys are available."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "The shell command to run, e.g. `ls -la` or `python3 script.py`.",
            },
            "timeout": {
                "type": "integer",
                "minimum": 1,
                "description": (
                    "Seconds before the command is killed. Optional; defaults to, and is "
                    "capped at, the job's command timeout."
                ),
            },
        },
        "required": ["command"],
    },
}


def _shell(path: str) -> str:
    """bash when the child's PATH has it, else the POSIX sh every system has."""
    return shutil.which("bash", path=path) or "/bin/sh"


async def terminal_handler(args: dict[str, Any], **kwargs: Any) -> str:
    ctx = kwargs.get("ctx")
    if not isinstance(ctx, ToolContext):
        return tool_error("the terminal tool needs an episode context (ctx) and got none")
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return tool_error("'command' is required and must be a non-empty string")
    try:
        timeout_s = parse_timeout(args.get("timeout"), ctx.settings.command_timeout_s)
    except ValueError as exc:
        return tool_error(str(exc))
    shell = _shell(episode_env(ctx).get("PATH", ""))
    return await run_in_scratch([shell, "-c", command], ctx, timeout_s=timeout_s)


registry.register(
    name="terminal",
    toolset="terminal",
    schema=TERMINAL_SCHEMA,
    handler=terminal_handler,
    is_async=True,
    emoji="💻",
)
