"""Job configuration: a YAML file plus CLI flags, validated once, frozen and hashed.

Every field is declared here with ``extra="forbid"``, so a typo is an error that names
the field and the line of the job file. The resolved config is saved in the run
directory and its hash in every output row: a job can be re-run from its own output.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hermes.errors import ConfigError

EMBEDDED = "embedded"
NOBODY_UID = 65534  # the same default as tools.settings.SandboxSettings


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetConfig(_Section):
    """Where the prompts come from (see hermes.dataset)."""

    path: str = Field(description="JSONL/JSON/Parquet/CSV file, save_to_disk folder or hub name")
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "disk", "hub"] = "auto"
    split: str = "train"
    prompt_column: str = "prompt"
    id_column: str | None = "id"
    max_samples: int | None = Field(default=None, ge=1)
    shuffle: bool = False


class ModelConfig(_Section):
    """The OpenAI-compatible endpoint. ``base_url: embedded`` starts the built-in
    synthetic endpoint (a scripted policy for smoke runs and tests, not a model)."""

    name: str = "hermes-embedded"
    base_url: str | None = None
    api_key: str | None = Field(
        default=None, description="prefer api_key_env: keys in job files get copied"
    )
    api_key_env: str | None = "OPENAI_API_KEY"
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    reasoning_effort: str | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=6, ge=0)
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    retry_after_cap_s: float = Field(default=120.0, ge=0)
    outage_failure_threshold: int = Field(
        default=8, ge=1, description="consecutive failures that pause a worker's requests"
    )
    outage_probe_interval_s: float = Field(default=2.0, gt=0)
    max_outage_s: float = Field(
        default=600.0, gt=0, description="give up (prompts failed, --resume) after this long"
    )


class EpisodeConfig(_Section):
    """How each episode runs (see hermes.agent.EpisodeSettings)."""

    max_turns: int = Field(default=10, ge=1)
    max_invalid_turns: int = Field(default=3, ge=1)
    summary_on_max_turns: bool = False
    deadline_s: float = Field(default=900.0, gt=0)
    system_prompt: str | None = None
    ephemeral_system_prompt: str | None = None
    prefill_messages_file: str | None = None
    keep_scratch: bool = False
    scratch_root: str | None = None


class ToolLimitsConfig(_Section):
    default_max_result_chars: int = Field(default=100_000, ge=200)
    call_timeout_s: float = Field(default=300.0, gt=0)
    command_timeout_s: float = Field(default=60.0, gt=0)
    env_passthrough: tuple[str, ...] = ()


class SandboxLimitsConfig(_Section):
    """Per-process limits of sandboxed commands (``null`` leaves one as inherited)."""

    cpu_s: int | None = Field(default=60, ge=1)
    address_space_mb: int | None = Field(default=4096, ge=16)
    file_size_mb: int | None = Field(default=1024, ge=1)
    open_files: int | None = Field(default=1024, ge=16)
    processes: int | None = Field(default=512, ge=8)


class SandboxConfig(_Section):
    """How the terminal and execute_code tools run model-written commands (see the
    protection table in tools.sandbox). ``auto``: bubblewrap when a trial command works
    here, else the plain process backend with a warning at job start."""

    backend: Literal["auto", "bwrap", "process", "none"] = "auto"
    allow_unsafe_none: bool = Field(
        default=False, description="required to use backend none (no isolation, no limits)"
    )
    allow_network: bool = False
    tmpfs_size_mb: int = Field(default=64, ge=1, description="size of the private /tmp")
    run_as_uid: int | None = Field(
        default=NOBODY_UID,
        ge=1,
        description="host uid (and gid) of commands when the runner is root; null keeps root",
    )
    strip_ansi: bool = Field(default=False, description="remove ANSI escapes from output")
    limits: SandboxLimitsConfig = Field(default_factory=SandboxLimitsConfig)

    @model_validator(mode="after")
    def _none_needs_opt_in(self) -> SandboxConfig:
        if self.backend == "none" and not self.allow_unsafe_none:
            raise ValueError(
                "backend none runs model-written commands with no isolation and no resource "
                "limits; set sandbox.allow_unsafe_none: true to accept that, or use bwrap "
                "or process"
            )
        return self


class RunnerConfig(_Section):
    """Where the work runs. None of these change results, so none is in the hash."""

    num_workers: int = Field(default=2, ge=1)
    concurrency: int = Field(default=32, ge=1, description="episodes in flight per worker")
    batch_size: int = Field(default=50, ge=1, description="prompts per output shard")
    ray_address: str | None = None
    progress: bool = True


class RejectionConfig(_Section):
    require_reasoning: bool = False
    reject_partial: bool = True
    reject_only_invalid_calls: bool = True


class JobConfig(_Section):
    """A whole job. ``hash()`` covers everything that can change the rows."""

    run_name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    output_dir: str = "data"
    seed: int = 0
    dataset: DatasetConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    distribution: str = "default"
    distributions: dict[str, Any] = Field(default_factory=dict)
    distributions_file: str | None = None
    strict_toolsets: bool = False
    tools: dict[str, dict[str, Any]] = Field(default_factory=dict)
    tool_limits: ToolLimitsConfig = Field(default_factory=ToolLimitsConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    rejection: RejectionConfig = Field(default_factory=RejectionConfig)
    endpoint: dict[str, Any] = Field(default_factory=dict)
    log_prefix_chars: int = Field(default=100, ge=0)

    @field_validator("tools")
    @classmethod
    def _no_keys_in_tools(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for toolset, options in value.items():
            for key in options:
                if key.lower().endswith(("api_key", "token", "secret", "password")):
                    raise ValueError(
                        f"tools.{toolset}.{key}: secrets do not belong in a job file (it is "
                        "copied into the output); name an environment variable instead"
                    )
        return value

    def hash(self) -> str:
        """Digest of every setting that can change the output rows."""
        return hashlib.sha256(canonical_json(self.hashed_dict()).encode()).hexdigest()[:16]

    def hashed_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        for key in NOT_HASHED:
            section, _, field = key.partition(".")
            if field:
                data.get(section, {}).pop(field, None)
            else:
                data.pop(section, None)
        return data

    def resolved_output(self) -> Path:
        return Path(self.output_dir) / self.run_name

    def uses_embedded_endpoint(self) -> bool:
        return (self.model.base_url or "") == EMBEDDED


# Settings that decide where and how fast work runs, never what it produces. A resume may
# change them freely (invariant 3: results do not depend on worker count or order).
NOT_HASHED = (
    "runner",
    "output_dir",
    "model.api_key",
    "model.api_key_env",
    "model.request_timeout_s",
    "model.max_retries",
    "model.backoff_base_s",
    "model.backoff_max_s",
    "model.retry_after_cap_s",
    "model.outage_failure_threshold",
    "model.outage_probe_interval_s",
    "model.max_outage_s",
    "episode.keep_scratch",
    "episode.scratch_root",
    "log_prefix_chars",
)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def diff_configs(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Human-readable differences between two hashed config dicts (dotted keys)."""
    changes = []
    for key in sorted(set(old) | set(new)):
        path = f"{prefix}{key}"
        a, b = old.get(key, "<unset>"), new.get(key, "<unset>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changes += diff_configs(a, b, prefix=f"{path}.")
        elif a != b:
            changes.append(f"{path}: {json.dumps(a, default=str)} -> {json.dumps(b, default=str)}")
    return changes


# -- loading -----------------------------------------------------------------------------


def _line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the YAML node at ``loc`` (deepest existing ancestor)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
            if match is None:
                key_match = next((k for k, _ in node.value if k.value == part), None)
                return key_match.start_mark.line + 1 if key_match is not None else line
            node = match
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
        else:
            return line
        line = node.start_mark.line + 1
    return line


def format_validation_error(exc: ValidationError, source: str, root: yaml.Node | None) -> str:
    lines = [f"invalid job configuration ({source}):"]
    for error in exc.errors():
        loc = [p for p in error["loc"] if isinstance(p, (int, str))]
        where = ".".join(str(p) for p in loc) or "(top level)"
        line = _line_of(root, loc)
        at = f" (line {line})" if line is not None else ""
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown setting (check the spelling; see `hermes-batch schema`)"
        lines.append(f"  {where}{at}: {message}")
    return "\n".join(lines)


def read_job_file(path: Path) -> tuple[dict[str, Any], yaml.Node | None]:
    """The job file's mapping and its YAML node tree (for line numbers)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"job file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read job file {path}: {exc}") from None
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"job file {path} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"job file {path} must hold a mapping of settings, not {type(data).__name__}"
        )
    return data, root


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``--set a.b.c=value`` (value parsed as YAML: numbers, booleans, lists)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {assignment!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML: {exc}") from None
    set_path(data, key.strip(), value)


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def build_config(
    data: Mapping[str, Any], *, source: str = "command line", root: yaml.Node | None = None
) -> JobConfig:
    try:
        return JobConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, root)) from None


def load_prefill(path: str | None) -> tuple[dict[str, Any], ...]:
    """Messages from ``prefill_messages_file`` (a JSON array of {role, content})."""
    if not path:
        return ()
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"prefill_messages_file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"prefill_messages_file {path} is not readable JSON: {exc}") from None
    if not isinstance(data, list) or not all(
        isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and "content" in m
        for m in data
    ):
        raise ConfigError(
            f"prefill_messages_file {path} must be a JSON array of objects with a role "
            "(system, user or assistant) and content"
        )
    return tuple(data)


def resolve_api_key(model: ModelConfig) -> str | None:
    if model.api_key:
        return model.api_key
    if model.api_key_env:
        return os.environ.get(model.api_key_env) or None
    return None


def job_json_schema() -> dict[str, Any]:
    """JSON schema of job files, for editors (``hermes-batch schema``)."""
    return JobConfig.model_json_schema()
