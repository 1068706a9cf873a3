"""Settings and per-call context handed to tools.

Tools never read global configuration: the batch job builds one frozen ``ToolSettings``
per worker and one ``ToolContext`` per episode, and the dispatcher passes the context to
every handler as the ``ctx`` keyword (plus ``task_id``, as in the seed contract).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MAX_RESULT_CHARS = 100_000
DEFAULT_CALL_TIMEOUT_S = 300.0
DEFAULT_COMMAND_TIMEOUT_S = 60.0

# Variables a tool subprocess may inherit. Everything else (API keys, cloud credentials,
# the runner's own settings) is withheld. Jobs may add names with ``env_passthrough``.
BASE_ENV_ALLOWLIST: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")

SANDBOX_BACKENDS: tuple[str, ...] = ("auto", "bwrap", "process", "none")
NOBODY_UID = 65534


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, kw_only=True)
class SandboxSettings:
    """Where and under which limits the process tools (terminal, execute_code) run.

    ``backend``: ``bwrap`` (bubblewrap: namespaces, private filesystem view), ``process``
    (a plain child process), ``none`` (not even rlimits; needs ``allow_unsafe_none``) or
    ``auto`` (bwrap when a trial command works on this machine, else process). Limits are
    per process; ``None`` leaves one as inherited. ``run_as_uid`` is the host uid (gid:
    the same number) commands run as when the runner is root; ``None`` keeps root, inside
    a user namespace with bwrap. See ``tools.sandbox`` for what each backend protects.
    """

    backend: str = "auto"
    allow_unsafe_none: bool = False
    allow_network: bool = False
    tmpfs_size_mb: int = 64
    run_as_uid: int | None = NOBODY_UID
    strip_ansi: bool = False
    cpu_s: int | None = 60
    address_space_mb: int | None = 4096
    file_size_mb: int | None = 1024
    open_files: int | None = 1024
    processes: int | None = 512

    def __post_init__(self) -> None:
        if self.backend not in SANDBOX_BACKENDS:
            raise ValueError(
                f"sandbox backend must be one of {', '.join(SANDBOX_BACKENDS)}, "
                f"got {self.backend!r}"
            )
        if self.backend == "none" and not self.allow_unsafe_none:
            raise ValueError(
                "sandbox backend 'none' runs model-written commands with no isolation and "
                "no resource limits; set allow_unsafe_none to true to accept that"
            )
        if self.tmpfs_size_mb < 1:
            raise ValueError("tmpfs_size_mb must be at least 1")
        if self.run_as_uid is not None and self.run_as_uid <= 0:
            raise ValueError("run_as_uid must be a positive uid (or None to keep the runner's)")


@dataclass(frozen=True, kw_only=True)
class ToolSettings:
    """Configuration that decides which tools are available and how they behave.

    ``options`` holds one mapping per toolset (``{"web": {"searxng_url": ...}}``);
    ``env`` is the environment the availability checks consult for provider keys (a copy
    of ``os.environ`` by default, so a job can pin it); ``sandbox`` says how the process
    tools run commands.
    """

    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    default_max_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    env_passthrough: tuple[str, ...] = ()
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)

    def __post_init__(self) -> None:
        if self.default_max_result_chars < 200:
            raise ValueError("default_max_result_chars must be at least 200")
        if self.call_timeout_s <= 0 or self.command_timeout_s <= 0:
            raise ValueError("call_timeout_s and command_timeout_s must be positive")
        object.__setattr__(
            self, "options", _frozen({k: _frozen(v) for k, v in self.options.items()})
        )
        object.__setattr__(self, "env", _frozen(self.env))

    def option(self, toolset: str, key: str, *, env: str | None = None, default: Any = None) -> Any:
        """``options[toolset][key]``, else the environment variable ``env``, else ``default``."""
        value = self.options.get(toolset, {}).get(key)
        if value is None and env is not None:
            value = self.env.get(env) or None
        return default if value is None else value

    def child_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a tool subprocess: allowlisted names only, never secrets."""
        allowed = set(BASE_ENV_ALLOWLIST) | set(self.env_passthrough)
        env = {name: value for name, value in self.env.items() if name in allowed}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.setdefault("LANG", "C.UTF-8")
        env.update(extra or {})
        return env

    def cache_key(self) -> str:
        """A stable digest of everything that can change an availability check."""
        blob = json.dumps(
            {"options": self.options, "env": self.env},
            sort_keys=True,
            default=lambda o: dict(o) if isinstance(o, Mapping) else repr(o),
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What one episode gives its tools: identity, a scratch directory, settings, state.

    ``state`` is a mutable mapping owned by the episode (the todo list lives there), so
    per-episode state dies with the episode instead of piling up in module globals. A
    tool that holds a resource (a browser page) registers its release with ``on_close``;
    the episode calls ``close`` when it ends.
    """

    task_id: str
    scratch_dir: Path
    settings: ToolSettings = field(default_factory=ToolSettings)
    state: MutableMapping[str, Any] = field(default_factory=dict)
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    cleanups: list[Callable[[], Any]] = field(default_factory=list)

    def on_close(self, release: Callable[[], Any]) -> None:
        """Run ``release`` when the episode ends (once, in registration order reversed)."""
        self.cleanups.append(release)

    def close(self) -> list[str]:
        """Release what tools registered; returns the failures (also logged)."""
        failures = []
        while self.cleanups:
            release = self.cleanups.pop()
            try:
                release()
            except Exception as exc:
                logger.warning("episode %s: cleanup %r failed: %s", self.task_id, release, exc)
                failures.append(f"{type(exc).__name__}: {exc}")
        return failures

    def with_limit(self, max_result_chars: int) -> ToolContext:
        """A copy whose result budget is ``max_result_chars`` (state is shared)."""
        return ToolContext(
            task_id=self.task_id,
            scratch_dir=self.scratch_dir,
            settings=self.settings,
            state=self.state,
            max_result_chars=max_result_chars,
            cleanups=self.cleanups,
        )
