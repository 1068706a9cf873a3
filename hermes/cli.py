"""The ``hermes-batch`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from hermes.tools_table import composite_rows, render_json, render_text, tool_rows
from tools.discovery import discover_tools
from tools.registry import registry
from tools.settings import ToolSettings

EXIT_OK = 0
EXIT_USAGE = 2


def cmd_tools(args: argparse.Namespace) -> int:
    """Print every toolset and tool, whether it is available here, and why not."""
    report = discover_tools(args.tools_dir)
    snapshot = registry.snapshot(ToolSettings())
    rows = tool_rows(registry, snapshot)
    render = render_json if args.json else render_text
    composites = composite_rows(registry, snapshot)
    print(render(rows, composites, report, snapshot.fingerprint))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes-batch",
        description="Turn a dataset of prompts into a dataset of tool-using agent trajectories.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    tools_cmd = sub.add_parser("tools", help="list toolsets and tools, available or not, and why")
    tools_cmd.add_argument("--json", action="store_true", help="machine-readable output")
    tools_cmd.add_argument("--tools-dir", "--tools_dir", default=None, help=argparse.SUPPRESS)
    tools_cmd.set_defaults(func=cmd_tools)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
