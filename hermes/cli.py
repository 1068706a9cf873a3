"""The ``hermes-batch`` command line.

    hermes-batch run --job jobs/quickstart.yaml     (or the reference tool's flags)
    hermes-batch tools                              toolsets and tools, and why some are hidden
    hermes-batch distributions                      toolset distributions
    hermes-batch serve                              the embedded synthetic endpoint
    hermes-batch schema                             JSON schema of job files

``python batch_runner.py ...`` is ``hermes-batch run ...`` with the reference spellings.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from hermes.errors import ConfigError, DatasetError, HermesError

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def cmd_tools(args: argparse.Namespace) -> int:
    """Print every toolset and tool, whether it is available here, and why not."""
    from hermes.tools_table import composite_rows, render_json, render_text, tool_rows
    from tools.discovery import discover_tools
    from tools.registry import registry
    from tools.settings import ToolSettings

    report = discover_tools(args.tools_dir)
    snapshot = registry.snapshot(ToolSettings())
    rows = tool_rows(registry, snapshot)
    render = render_json if args.json else render_text
    composites = composite_rows(registry, snapshot)
    print(render(rows, composites, report, snapshot.fingerprint))
    return EXIT_OK


def cmd_distributions(args: argparse.Namespace) -> int:
    """Print the toolset distributions (built-in and the job's own) with probabilities."""
    from tools.discovery import discover_tools
    from tools.registry import registry
    from tools.settings import ToolSettings
    from toolset_distributions import (
        distributions_as_json,
        format_distributions,
        load_distributions,
    )

    inline: dict[str, object] = {}
    file = args.distributions_file
    if args.job is not None:
        from hermes.config import read_job_file

        data, _ = read_job_file(args.job)
        inline = data.get("distributions") or {}
        file = file or data.get("distributions_file")
    catalog = load_distributions(inline, file)
    discover_tools()
    snapshot = registry.snapshot(ToolSettings())
    available = [t for t in snapshot.toolsets if snapshot.toolset_available(t).available]
    if args.json:
        print(distributions_as_json(catalog, available))
    else:
        print(format_distributions(catalog, available))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Run or resume a job."""
    if args.list_distributions:
        return cmd_distributions(
            argparse.Namespace(job=args.job, distributions_file=None, json=False)
        )
    if args.list_tools:
        return cmd_tools(argparse.Namespace(tools_dir=None, json=False))
    from hermes.cli_args import config_from_args
    from hermes.runner import run_job

    config = config_from_args(args)
    return run_job(config, resume=bool(args.resume), force=bool(args.force))


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the embedded synthetic endpoint until interrupted."""
    from hermes.endpoint import config_from_args, serve_forever

    print(
        f"serving the embedded SYNTHETIC endpoint on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
    )
    serve_forever(args.host, args.port, config_from_args(args))
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from hermes.config import job_json_schema

    print(json.dumps(job_json_schema(), indent=2))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    from hermes.cli_args import add_run_arguments
    from hermes.endpoint import SERVE_HELP, add_serve_arguments

    parser = argparse.ArgumentParser(
        prog="hermes-batch",
        description="Turn a dataset of prompts into a dataset of tool-using agent trajectories.",
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run or resume a job", allow_abbrev=False)
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)
    tools_cmd = sub.add_parser("tools", help="list toolsets and tools, available or not, and why")
    tools_cmd.add_argument("--json", action="store_true", help="machine-readable output")
    tools_cmd.add_argument("--tools-dir", "--tools_dir", default=None, help=argparse.SUPPRESS)
    tools_cmd.set_defaults(func=cmd_tools)
    dist = sub.add_parser("distributions", help="list toolset distributions")
    dist.add_argument("--job", type=str, default=None, help="include this job file's own")
    dist.add_argument("--distributions-file", "--distributions_file", default=None)
    dist.add_argument("--json", action="store_true")
    dist.set_defaults(func=cmd_distributions)
    serve = sub.add_parser("serve", help=SERVE_HELP)
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    schema = sub.add_parser("schema", help="print the JSON schema of job files")
    schema.set_defaults(func=cmd_schema)
    for p in (tools_cmd, dist, serve, schema):
        p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code: int = args.func(args)
    except (ConfigError, DatasetError) as exc:
        # Raised before anything is written: the message says what to fix.
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except HermesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return code


if __name__ == "__main__":
    sys.exit(main())
