"""The run command line: the reference tool's flags, unchanged, plus ours.

Precedence, lowest first: built-in defaults, the job file (``--job``), flags, ``--set``.
Both spellings work (``--dataset_file`` and ``--dataset-file``), as do ``--flag=value``
and ``--flag value``; booleans accept a bare flag or ``=true/false`` (as fire does).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hermes.config import JobConfig, apply_override, build_config, read_job_file, set_path
from hermes.errors import ConfigError

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")

# Reference tool defaults, applied only when no job file is given, so its command lines
# keep meaning what they meant.
REFERENCE_DEFAULTS = {
    "model.name": "anthropic/claude-sonnet-4.6",
    "model.base_url": "https://openrouter.ai/api/v1",
}

# flag -> dotted config key
FLAG_TO_KEY = {
    "dataset_file": "dataset.path",
    "batch_size": "runner.batch_size",
    "run_name": "run_name",
    "distribution": "distribution",
    "model": "model.name",
    "api_key": "model.api_key",
    "base_url": "model.base_url",
    "max_turns": "episode.max_turns",
    "num_workers": "runner.num_workers",
    "ephemeral_system_prompt": "episode.ephemeral_system_prompt",
    "log_prefix_chars": "log_prefix_chars",
    "max_tokens": "model.max_tokens",
    "prefill_messages_file": "episode.prefill_messages_file",
    "max_samples": "dataset.max_samples",
    "output_dir": "output_dir",
    "seed": "seed",
    "concurrency": "runner.concurrency",
    "ray_address": "runner.ray_address",
    "request_timeout": "model.request_timeout_s",
}


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _flag(parser: argparse._ActionsContainer, name: str, **kwargs: Any) -> None:
    spellings = [f"--{name}"]
    if "_" in name:
        spellings.append(f"--{name.replace('_', '-')}")
    parser.add_argument(*spellings, dest=name, **kwargs)


def _switch(parser: argparse._ActionsContainer, name: str, help_text: str) -> None:
    _flag(parser, name, nargs="?", const=True, default=None, type=parse_bool, help=help_text)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """All flags of ``run`` (and of ``python batch_runner.py``)."""
    ref = parser.add_argument_group("reference tool flags")
    _flag(ref, "dataset_file", help="prompt dataset (JSONL, JSON, Parquet, CSV, folder, hub name)")
    _flag(ref, "batch_size", type=int, help="prompts per output shard")
    _flag(ref, "run_name", help="output goes to <output_dir>/<run_name>/")
    _flag(ref, "distribution", help="toolset distribution name (see `distributions`)")
    _flag(ref, "model", help="model name sent to the endpoint")
    _flag(ref, "api_key", help="API key (prefer the OPENAI_API_KEY variable)")
    _flag(ref, "base_url", help="OpenAI-compatible base URL, or 'embedded'")
    _flag(ref, "max_turns", type=int, help="model calls per episode")
    _flag(ref, "num_workers", type=int, help="Ray worker actors")
    _switch(ref, "resume", "finish the prompts of an existing run that have no row yet")
    _switch(ref, "verbose", "debug logging")
    _switch(ref, "list_distributions", "list toolset distributions and exit")
    _flag(ref, "ephemeral_system_prompt", help="system prompt used but not saved")
    _flag(ref, "log_prefix_chars", type=int, help="characters of tool I/O shown in debug logs")
    for name in ("providers_allowed", "providers_ignored", "providers_order", "provider_sort"):
        _flag(ref, name, help="OpenRouter provider routing (sent in extra_body.provider)")
    _flag(ref, "max_tokens", type=int, help="max tokens per model response")
    _flag(ref, "reasoning_effort", choices=REASONING_EFFORTS, help="reasoning effort")
    _switch(ref, "reasoning_disabled", "ask the model not to reason (effort none)")
    _flag(ref, "prefill_messages_file", help="JSON array of messages prepended, not saved")
    _flag(ref, "max_samples", type=int, help="only the first N prompts")
    ours = parser.add_argument_group("hermes-batch flags")
    _flag(ours, "job", type=Path, help="YAML job file")
    _flag(ours, "output_dir", help="parent of the run directory (default: data)")
    _flag(ours, "seed", type=int, help="job seed (toolset sampling, shuffling)")
    _flag(ours, "concurrency", type=int, help="episodes in flight per worker")
    _flag(ours, "ray_address", help="join this Ray cluster instead of starting one")
    _flag(ours, "request_timeout", type=float, help="seconds per model request")
    _switch(ours, "force", "resume even though the config changed")
    _switch(ours, "list_tools", "list toolsets and tools and exit")
    ours.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any job field, e.g. --set episode.max_turns=4",
    )


def _provider_routing(args: argparse.Namespace) -> dict[str, Any]:
    routing: dict[str, Any] = {}
    for flag, key in (
        ("providers_allowed", "only"),
        ("providers_ignored", "ignore"),
        ("providers_order", "order"),
    ):
        value = getattr(args, flag, None)
        if value:
            routing[key] = [p.strip() for p in str(value).split(",") if p.strip()]
    if getattr(args, "provider_sort", None):
        routing["sort"] = args.provider_sort
    return routing


def config_from_args(args: argparse.Namespace) -> JobConfig:
    """The validated job config these arguments describe (raises ``ConfigError``)."""
    root = None
    if args.job is not None:
        data, root = read_job_file(args.job)
        source = str(args.job)
    else:
        data, source = {}, "command line"
        for key, value in REFERENCE_DEFAULTS.items():
            set_path(data, key, value)
        missing = [
            f"--{f}" for f in ("dataset_file", "batch_size", "run_name") if not getattr(args, f)
        ]
        if missing:
            raise ConfigError(f"{', '.join(missing)} required (or give a job file with --job FILE)")
    for flag, key in FLAG_TO_KEY.items():
        flag_value = getattr(args, flag, None)
        if flag_value is not None:
            set_path(data, key, flag_value)
    routing = _provider_routing(args)
    if routing:
        extra = data.setdefault("model", {}).setdefault("extra_body", {})
        extra["provider"] = {**extra.get("provider", {}), **routing}
    if args.reasoning_disabled:
        set_path(data, "model.reasoning_effort", "none")
    elif args.reasoning_effort:
        set_path(data, "model.reasoning_effort", args.reasoning_effort)
    for assignment in args.overrides:
        apply_override(data, assignment)
    return build_config(data, source=source, root=root)
