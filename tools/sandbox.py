"""The process runner: the one place where tools start child processes.

``run_command`` starts a command in its own session with an exact environment, resource
limits, a wall-clock timeout and bounded output capture, and always leaves nothing of it
running behind. *Where* the command runs is a backend (``SandboxBackend``), chosen per
job by ``sandbox.backend``; ``check_sandbox`` is the start-up trial and ``run_in_scratch``
is what the process tools call. The last section holds the helpers those tools share.

What each backend protects (``auto`` is ``bwrap`` when a trial command works, else
``process`` with a warning at job start; ``none`` needs ``allow_unsafe_none: true``):

| Protection                      | bwrap             | process            | none             |
|---------------------------------|-------------------|--------------------|------------------|
| Runner's secrets in the env     | withheld (1)      | withheld (1)       | withheld (1)     |
| Runner's /proc/<pid>/environ    | invisible (2)     | readable           | readable         |
| Files outside the scratch dir   | invisible (3)     | read and write     | read and write   |
| Where writes can go             | scratch, tmpfs (4)| anywhere allowed   | anywhere allowed |
| Network                         | loopback only (5) | full               | full             |
| Process tree cleanup            | whole tree (6)    | process group (7)  | process group (7)|
| Resource limits                 | yes (8)           | yes, but (9)       | timeout only     |
| Non-root                        | yes (10)          | no: runner's user  | no               |
| Total memory of all processes   | not bounded (11)  | not bounded        | not bounded      |

1. Only the allowlisted variables (``ToolSettings.child_env``); bwrap itself is started
   with that environment too, and clears its own (``--clearenv``) before the command.
2. A new PID namespace with its own ``/proc``: no host process is visible.
3. Except read-only ``/usr``, ``/etc``, ``/bin``, ``/sbin``, ``/lib*`` and the runner's
   Python installation. Not ``/root``, ``/home``, ``/work``, outputs or other episodes.
4. The scratch dir, and private ``/tmp`` and ``/dev/shm`` capped at ``tmpfs_size_mb``.
5. A network namespace with only loopback, unless ``allow_network: true``.
6. The command's exit, the timeout or the runner's death ends the PID namespace: the
   kernel kills everything in it, ``setsid`` and double-forked daemons included.
7. The process group is killed; a ``setsid`` or double-forked child survives it.
8. CPU time, address space, file size, open files, process count (counted per sandbox).
9. The process count is not enforced for root, and counts all the user's processes.
10. When the runner is root, commands run as ``run_as_uid`` (nobody) on the host; they
    are never root inside the sandbox.
11. Each process has an address-space limit, but their sum is not bounded (that needs
    cgroups), nor is the memory of the tmpfs mounts beyond their caps.

This is not a tool module: it registers nothing.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from tools.registry import tool_error, tool_result
from tools.sandbox_bwrap import (
    SYSTEM_PATH,
    BwrapOptions,
    BwrapSetupError,
    build_argv,
    hand_over,
    host_uid,
    missing_protections,
)
from tools.settings import SandboxSettings, ToolContext, ToolSettings
from tools.truncate import join_head_tail, marker

logger = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30
# After the main process exits, background children may still hold the output pipe.
DEFAULT_PIPE_GRACE_S = 0.5
# After a SIGKILL of the group the pipe closes at once, unless a process escaped the
# group (setsid); then stop reading after this long rather than hang.
_DRAIN_AFTER_KILL_S = 1.0
_PRLIMIT_SEARCH_PATH = SYSTEM_PATH
# CSI and OSC sequences and two-character escapes, plus one cut off at the end.
_ANSI = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])"
    r"|\x1b\[?[0-?]*[ -/]*\Z"
)


class SandboxError(RuntimeError):
    """Raised when a command cannot be started (unknown backend, missing executable)."""


@dataclass(frozen=True, kw_only=True)
class ResourceLimits:
    """Per-process rlimits of a command (``None`` leaves a limit as inherited).

    ``processes`` is RLIMIT_NPROC, which counts *all* processes of the user, not only
    this command's; the kernel does not enforce it for root (or with CAP_SYS_RESOURCE),
    and a user already running more processes than the limit cannot fork at all.
    Requested values above the runner's own hard limits are lowered to them, since an
    unprivileged process cannot raise a hard limit.
    """

    cpu_s: int | None = 60
    address_space_bytes: int | None = 4 * GIB
    file_size_bytes: int | None = 1 * GIB
    open_files: int | None = 1024
    processes: int | None = 512
    core_bytes: int | None = 0

    # (field, resource id, prlimit option)
    _TABLE: ClassVar[tuple[tuple[str, int, str], ...]] = (
        ("cpu_s", resource.RLIMIT_CPU, "cpu"),
        ("address_space_bytes", resource.RLIMIT_AS, "as"),
        ("file_size_bytes", resource.RLIMIT_FSIZE, "fsize"),
        ("open_files", resource.RLIMIT_NOFILE, "nofile"),
        ("processes", resource.RLIMIT_NPROC, "nproc"),
        ("core_bytes", resource.RLIMIT_CORE, "core"),
    )

    def __post_init__(self) -> None:
        for attr, _, _ in self._TABLE:
            value = getattr(self, attr)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ValueError(f"resource limit {attr} must be None or >= 0, got {value!r}")

    def effective(self) -> list[tuple[int, str, int]]:
        """``(resource id, prlimit option, value)`` for each set limit, clamped to ours."""
        out = []
        for attr, rid, option in self._TABLE:
            value = getattr(self, attr)
            if value is None:
                continue
            hard = resource.getrlimit(rid)[1]
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            out.append((rid, option, value))
        return out


@dataclass(frozen=True, kw_only=True)
class ProcessResult:
    """What a command did: merged output (head + marker + tail if cut) and how it ended.

    ``exit_code`` is ``None`` when the process was killed by a signal (``signal``).
    ``head_chars`` is the length of the output before the truncation marker (all of it
    when nothing was cut); ``fit`` uses it to cut further without nesting markers.
    """

    output: str
    exit_code: int | None
    timed_out: bool
    omitted_chars: int
    head_chars: int
    duration_s: float
    signal: int | None = None

    @property
    def truncated(self) -> bool:
        return self.omitted_chars > 0

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    def without_ansi(self) -> ProcessResult:
        """This result with ANSI escape sequences (colours, cursor moves) removed."""
        head = _ANSI.sub("", self.output[: self.head_chars])
        rest = _ANSI.sub("", self.output[self.head_chars :])
        return replace(self, output=head + rest, head_chars=len(head))

    def fit(self, limit: int) -> ProcessResult:
        """This result with its output cut to at most ``limit`` characters (one marker)."""
        if len(self.output) <= limit:
            return self
        if self.omitted_chars:
            head = self.output[: self.head_chars]
            tail = self.output[self.head_chars + len(marker(self.omitted_chars)) :]
        else:
            middle = len(self.output) // 2
            head, tail = self.output[:middle], self.output[middle:]
        total = len(head) + len(tail) + self.omitted_chars
        output, omitted, head_chars = _render(head, tail, total, limit)
        return replace(self, output=output, omitted_chars=omitted, head_chars=head_chars)


def _render(head: str, tail: str, total: int, limit: int) -> tuple[str, int, int]:
    """``head`` + marker + ``tail`` sized exactly as ``truncate_text`` sizes its cut:
    the text, the omitted count and the kept head's length. ``total`` counts the head,
    the tail and everything already dropped between them."""
    if total <= limit:
        return head + tail, 0, len(head) + len(tail)
    budget = max(limit - len(marker(total)), 0)
    head_len = min(budget // 2, len(head))
    tail_len = min(budget - head_len, len(tail))
    omitted = total - head_len - tail_len
    kept_tail = tail[len(tail) - tail_len :] if tail_len else ""
    return join_head_tail(head[:head_len], kept_tail, omitted), omitted, head_len


# -- backends ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """How a backend wants the command started (what ``run_command`` passes to exec)."""

    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str]
    preexec_fn: Callable[[], None] | None = None
    # bwrap exits 128 + N when the command dies of signal N.
    exit_status_encodes_signals: bool = False


class SandboxBackend(Protocol):
    """Turns a command into a ``LaunchSpec`` (wrapping argv, adding isolation)."""

    @property
    def name(self) -> str: ...

    def prepare(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], limits: ResourceLimits
    ) -> LaunchSpec: ...


@functools.cache
def find_prlimit() -> str | None:
    """Absolute path of util-linux ``prlimit``, or ``None`` when it is not installed."""
    return shutil.which("prlimit", path=_PRLIMIT_SEARCH_PATH)


def _set_rlimits(pairs: tuple[tuple[int, int], ...]) -> None:
    # Runs in the forked child before exec: keep it trivial.
    for rid, value in pairs:
        resource.setrlimit(rid, (value, value))


@dataclass(frozen=True)
class ProcessBackend:
    """A plain child process with rlimits: set by ``prlimit`` wrapping the command, or
    by ``setrlimit`` in a preexec hook when prlimit is missing (or ``use_prlimit`` is
    false). No filesystem or network isolation: that is the bubblewrap backend's job."""

    use_prlimit: bool = True
    name: ClassVar[str] = "process"

    def prepare(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], limits: ResourceLimits
    ) -> LaunchSpec:
        if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            raise SandboxError(f"command not found: {argv[0]!r} (PATH={env.get('PATH', '')!r})")
        limit_list = limits.effective()
        prlimit = find_prlimit() if self.use_prlimit else None
        if prlimit is None:
            pairs = tuple((rid, value) for rid, _, value in limit_list)
            hook = functools.partial(_set_rlimits, pairs)
            return LaunchSpec(argv=tuple(argv), cwd=cwd, env=env, preexec_fn=hook)
        options = [f"--{option}={value}" for _, option, value in limit_list]
        return LaunchSpec(argv=(prlimit, *options, "--", *argv), cwd=cwd, env=env)


@dataclass(frozen=True)
class NoneBackend:
    """The command as it is: no rlimits (``sandbox.backend: none``, an explicit opt-in).
    It still gets only the allowlisted environment and the timeout."""

    name: ClassVar[str] = "none"

    def prepare(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], limits: ResourceLimits
    ) -> LaunchSpec:
        if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            raise SandboxError(f"command not found: {argv[0]!r} (PATH={env.get('PATH', '')!r})")
        return LaunchSpec(argv=tuple(argv), cwd=cwd, env=env)


@dataclass(frozen=True)
class BwrapBackend:
    """The command in a bubblewrap sandbox (``tools.sandbox_bwrap``), in which ``cwd`` is
    the only writable host directory. Rlimits are applied inside the sandbox."""

    options: BwrapOptions = field(default_factory=BwrapOptions)
    name: ClassVar[str] = "bwrap"

    def prepare(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], limits: ResourceLimits
    ) -> LaunchSpec:
        if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            raise SandboxError(f"command not found: {argv[0]!r} (PATH={env.get('PATH', '')!r})")
        rlimits = [f"--{option}={value}" for _, option, value in limits.effective()]
        try:
            if os.geteuid() == 0:  # only root can (and needs to) give files away
                hand_over(cwd, host_uid(self.options))
            full = build_argv(
                argv, scratch=cwd, env=env, rlimit_options=rlimits, options=self.options
            )
        except (BwrapSetupError, OSError) as exc:
            raise SandboxError(f"cannot set up the bubblewrap sandbox: {exc}") from exc
        return LaunchSpec(argv=tuple(full), cwd=cwd, env=env, exit_status_encodes_signals=True)


# Backends that need no options; bwrap is built from SandboxSettings by make_backend.
_BACKENDS: Mapping[str, Callable[[], SandboxBackend]] = {
    "process": ProcessBackend,
    "none": NoneBackend,
}


def get_backend(name: str) -> SandboxBackend:
    """The option-less backend called ``name`` (``process`` or ``none``)."""
    factory = _BACKENDS.get(name)
    if factory is None:
        hint = "; build it with make_backend('bwrap', settings)" if name == "bwrap" else ""
        raise SandboxError(
            f"unknown sandbox backend {name!r}; available by name: "
            f"{', '.join(sorted(_BACKENDS))}{hint}"
        )
    return factory()


def make_backend(name: str, sandbox: SandboxSettings) -> SandboxBackend:
    """The backend ``name`` (``bwrap``, ``process`` or ``none``) configured by ``sandbox``."""
    if name == "bwrap":
        options = BwrapOptions(
            allow_network=sandbox.allow_network,
            tmpfs_size_mb=sandbox.tmpfs_size_mb,
            run_as_uid=sandbox.run_as_uid,
        )
        return BwrapBackend(options)
    return get_backend(name)


def limits_for(sandbox: SandboxSettings) -> ResourceLimits:
    def mib(value: int | None) -> int | None:
        return None if value is None else value * MIB

    return ResourceLimits(
        cpu_s=sandbox.cpu_s,
        address_space_bytes=mib(sandbox.address_space_mb),
        file_size_bytes=mib(sandbox.file_size_mb),
        open_files=sandbox.open_files,
        processes=sandbox.processes,
    )


# -- bounded capture -----------------------------------------------------------------


class OutputCapture:
    """Keeps the first and last characters of a byte stream, in O(limit) memory.

    Bytes are decoded incrementally as UTF-8 with replacement, so invalid data never
    raises and a character split across reads still decodes. ``finish`` returns the text
    (head + marker + tail when cut: no longer than ``limit`` unless ``limit`` is smaller
    than the marker itself) and the omitted count, exactly as ``truncate_text`` would.
    """

    def __init__(self, limit: int) -> None:
        self._limit = max(limit, 0)
        self._head_cap = self._limit // 2
        self._tail_cap = self._limit - self._head_cap
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head: list[str] = []
        self._head_len = 0
        self._tail: deque[str] = deque()
        self._tail_len = 0
        self.total_chars = 0

    def feed(self, data: bytes) -> None:
        self._add(self._decoder.decode(data))

    def _add(self, text: str) -> None:
        if not text:
            return
        self.total_chars += len(text)
        room = self._head_cap - self._head_len
        if room > 0:
            self._head.append(text[:room])
            self._head_len += min(room, len(text))
            text = text[room:]
            if not text:
                return
        self._tail.append(text)
        self._tail_len += len(text)
        # Drop whole chunks only while the rest still covers the tail budget.
        while self._tail and self._tail_len - len(self._tail[0]) >= self._tail_cap:
            self._tail_len -= len(self._tail.popleft())

    def finish(self) -> tuple[str, int, int]:
        """The text, the omitted count and the kept head's length (see ``_render``)."""
        self._add(self._decoder.decode(b"", final=True))
        # Under the limit nothing was dropped (see _add), so head + tail is everything.
        return _render("".join(self._head), "".join(self._tail), self.total_chars, self._limit)


# -- running -------------------------------------------------------------------------


class _CaptureProtocol(asyncio.SubprocessProtocol):
    """Feeds output straight into the capture and reports exit and EOF separately:
    asyncio's own ``Process.wait()`` only returns once every pipe is closed, which a
    background child holding stdout would delay forever."""

    def __init__(self, capture: OutputCapture, loop: asyncio.AbstractEventLoop) -> None:
        self.capture = capture
        self.exited: asyncio.Future[None] = loop.create_future()
        self.output_closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.capture.feed(data.encode() if isinstance(data, str) else data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1 and not self.output_closed.done():
            self.output_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def _wait_for(future: asyncio.Future[None], timeout_s: float) -> bool:
    """Whether ``future`` completes within ``timeout_s`` (it is never cancelled)."""
    done, _ = await asyncio.wait({future}, timeout=max(timeout_s, 0.0))
    return bool(done)


def _kill_group(pgid: int) -> None:
    # The group id stays reserved while any member lives, so this cannot hit an
    # unrelated process group; ESRCH just means everyone is already gone.
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    except PermissionError:
        logger.warning("cannot kill process group %d: permission denied", pgid)


async def _supervise(
    pid: int, protocol: _CaptureProtocol, deadline: float, pipe_grace_s: float
) -> bool:
    """Wait for the command to finish or the deadline; returns whether it timed out."""
    if not await _wait_for(protocol.exited, deadline - time.monotonic()):
        logger.debug("command pid %d timed out; killing its process group", pid)
        _kill_group(pid)
        await _wait_for(protocol.output_closed, _DRAIN_AFTER_KILL_S)
        return True
    grace = min(pipe_grace_s, deadline - time.monotonic())
    if not await _wait_for(protocol.output_closed, grace):
        logger.debug("pid %d exited but its output pipe is still open; killing group", pid)
        _kill_group(pid)
        await _wait_for(protocol.output_closed, _DRAIN_AFTER_KILL_S)
    return False


def _feed_stdin(transport: asyncio.SubprocessTransport, data: bytes | None) -> None:
    pipe = transport.get_pipe_transport(0)
    if data is None or pipe is None:
        return
    if isinstance(pipe, asyncio.WriteTransport):
        pipe.write(data)
        pipe.write_eof()


def _resolve(backend: str | SandboxBackend) -> SandboxBackend:
    return get_backend(backend) if isinstance(backend, str) else backend


async def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    max_output_chars: int,
    stdin_data: bytes | None = None,
    limits: ResourceLimits = ResourceLimits(),
    backend: str | SandboxBackend = "process",
    pipe_grace_s: float = DEFAULT_PIPE_GRACE_S,
) -> ProcessResult:
    """Run ``argv`` and return its merged stdout+stderr and exit status.

    The command gets exactly ``env`` (never ``os.environ``), stdin from ``stdin_data`` or
    /dev/null, and its own session. When it returns, times out or the caller is
    cancelled, its whole process group is killed: background children do not survive.
    Raises ``SandboxError`` when the command cannot be started.
    """
    if not argv:
        raise SandboxError("empty command")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    spec = _resolve(backend).prepare(argv, cwd=cwd, env=env, limits=limits)
    loop = asyncio.get_running_loop()
    capture = OutputCapture(max_output_chars)
    started = time.monotonic()
    try:
        transport, protocol = await loop.subprocess_exec(
            lambda: _CaptureProtocol(capture, loop),
            *spec.argv,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=spec.cwd,
            env=dict(spec.env),
            start_new_session=True,
            preexec_fn=spec.preexec_fn,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]!r}: {exc}") from exc
    pid = transport.get_pid()
    try:
        _feed_stdin(transport, stdin_data)
        timed_out = await _supervise(pid, protocol, started + timeout_s, pipe_grace_s)
        await _wait_for(protocol.exited, _DRAIN_AFTER_KILL_S)
    finally:
        _kill_group(pid)
        transport.close()
    returncode = transport.get_returncode()
    return _result(returncode, capture, timed_out, started, spec.exit_status_encodes_signals)


def _result(
    returncode: int | None,
    capture: OutputCapture,
    timed_out: bool,
    started: float,
    encodes_signals: bool = False,
) -> ProcessResult:
    output, omitted, head_chars = capture.finish()
    signum = -returncode if returncode is not None and returncode < 0 else None
    exit_code = returncode if signum is None else None
    if encodes_signals and exit_code is not None and 128 < exit_code <= 128 + 64:
        signum = exit_code - 128  # most likely; a plain `exit 137` looks the same
    return ProcessResult(
        output=output,
        exit_code=exit_code,
        timed_out=timed_out,
        omitted_chars=omitted,
        head_chars=head_chars,
        duration_s=round(time.monotonic() - started, 3),
        signal=signum,
    )


# -- choosing a backend --------------------------------------------------------------

_TRIAL_SCRIPT = "echo ok > trial && cat trial"
_TRIAL_TIMEOUT_S = 30.0


@dataclass(frozen=True, kw_only=True)
class SandboxCheck:
    """The outcome of the start-up trial. ``backend`` is what commands will use; ``ok``
    whether it works; ``reason`` why the requested backend is not used or fails;
    ``warnings`` what to tell the user at job start (a fallback, missing protections)."""

    backend: str
    ok: bool
    reason: str = ""
    warnings: tuple[str, ...] = ()


def _trial(backend: SandboxBackend, limits: ResourceLimits) -> str | None:
    """Run one small command that writes to its scratch dir; ``None`` when it worked,
    else why not. Blocking on purpose: it runs once per process, at start-up."""
    scratch = Path(tempfile.mkdtemp(prefix="hermes-sandbox-trial-"))
    env = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
    try:
        argv = ["/bin/sh", "-c", _TRIAL_SCRIPT]
        spec = backend.prepare(argv, cwd=scratch, env=env, limits=limits)
        done = subprocess.run(
            spec.argv,
            cwd=spec.cwd,
            env=dict(spec.env),
            preexec_fn=spec.preexec_fn,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TRIAL_TIMEOUT_S,
            start_new_session=True,
        )
        wrote = (scratch / "trial").is_file()
    except (SandboxError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        shutil.rmtree(scratch, onerror=_log_cleanup_error)
    if done.returncode == 0 and done.stdout.strip() == b"ok" and wrote:
        return None
    said = (done.stdout + done.stderr).decode("utf-8", errors="replace").strip()
    return f"a trial command exited with status {done.returncode}: {said[:500] or '(no output)'}"


def _log_cleanup_error(_func: Any, path: str, exc_info: Any) -> None:
    logger.warning("could not remove sandbox trial file %s: %s", path, exc_info[1])


def _missing(name: str, sandbox: SandboxSettings) -> tuple[str, ...]:
    """What the backend ``name`` does not protect, as job-start warnings."""
    if name == "bwrap":
        options = BwrapOptions(allow_network=sandbox.allow_network, run_as_uid=sandbox.run_as_uid)
        return tuple(f"sandbox backend bwrap: {m}" for m in missing_protections(options))
    who = "root" if os.geteuid() == 0 else "the runner's own user"
    unprotected = (
        f"commands run as {who} with no filesystem isolation (they can read and write every "
        "file that user can, outside the scratch directory too), no private /proc (they can "
        "read the runner's /proc/<pid>/environ, API keys included), full network access and "
        "no PID namespace (a setsid or double-forked child outlives its command)"
    )
    if name == "process":
        root = "; the process-count limit is not enforced for root" if who == "root" else ""
        fix = "The bwrap backend gives those (Debian: apt-get install bubblewrap)."
        return (f"sandbox backend process: {unprotected}{root}. {fix}",)
    return (
        f"sandbox backend none (allow_unsafe_none): {unprotected}, and no resource limits "
        "at all (CPU, memory, file size, process count): only the timeout applies.",
    )


def check_sandbox(settings: ToolSettings) -> SandboxCheck:
    """Try the configured backend with one trial command (``auto``: bwrap, else process).

    An explicit backend that fails gives ``ok=False`` (the job should not start); ``auto``
    falls back to ``process`` with a warning saying why and what is then unprotected.
    """
    sandbox = settings.sandbox
    limits = limits_for(sandbox)
    wanted = "bwrap" if sandbox.backend == "auto" else sandbox.backend
    failure = _trial(make_backend(wanted, sandbox), limits)
    if failure is None:
        return SandboxCheck(backend=wanted, ok=True, warnings=_missing(wanted, sandbox))
    if sandbox.backend != "auto":
        reason = f"sandbox backend {wanted} does not work on this machine: {failure}"
        return SandboxCheck(backend=wanted, ok=False, reason=reason)
    reason = f"bubblewrap does not work on this machine ({failure}); using the process backend"
    fallback = _trial(ProcessBackend(), limits)
    if fallback is not None:
        reason += f", which does not work either: {fallback}"
        return SandboxCheck(backend="process", ok=False, reason=reason)
    return SandboxCheck(
        backend="process", ok=True, reason=reason, warnings=(reason, *_missing("process", sandbox))
    )


@functools.lru_cache(maxsize=16)
def _auto_backend(sandbox: SandboxSettings) -> str:
    check = check_sandbox(ToolSettings(env={}, sandbox=sandbox))
    if check.reason:
        logger.warning("%s", check.reason)
    return check.backend


def backend_for(sandbox: SandboxSettings) -> SandboxBackend:
    """The backend commands use under ``sandbox`` (``auto`` is tried once per process)."""
    name = _auto_backend(sandbox) if sandbox.backend == "auto" else sandbox.backend
    return make_backend(name, sandbox)


# -- helpers shared by the process tools ---------------------------------------------

# Rounds of shrinking the output until the JSON result fits its budget.
_FIT_ROUNDS = 6


def episode_env(ctx: ToolContext) -> dict[str, str]:
    """The allowlisted environment for an episode's command, homed in its scratch dir."""
    scratch = str(ctx.scratch_dir)
    return ctx.settings.child_env({"HOME": scratch, "TMPDIR": scratch})


def parse_timeout(value: Any, cap_s: float) -> float:
    """The model's ``timeout`` argument in seconds, capped at ``cap_s`` (the default).

    Raises ``ValueError`` with a message for the model when it is not a positive number.
    """
    if value is None:
        return cap_s
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"timeout must be a positive number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"timeout must be a positive number of seconds, got {value!r}") from None
    if not seconds > 0:  # also rejects NaN
        raise ValueError(f"timeout must be a positive number of seconds, got {value!r}")
    return min(seconds, cap_s)


def result_json(result: ProcessResult, *, timeout_s: float, max_chars: int) -> str:
    """The tool result JSON of ``result``, its output cut so the whole fits ``max_chars``.

    JSON escaping (newlines, control characters) makes the encoded output longer than
    the captured one, so shrink by the observed ratio and re-encode.
    """
    text = _encode(result, timeout_s)
    for _ in range(_FIT_ROUNDS):
        overflow = len(text) - max_chars
        if overflow <= 0 or not result.output:
            break
        encoded = len(json.dumps(result.output, ensure_ascii=False)) - 2
        cut = math.ceil(overflow * len(result.output) / max(encoded, 1))
        result = result.fit(max(len(result.output) - cut - 8, 0))
        text = _encode(result, timeout_s)
    return text  # if still too long, the dispatcher's truncate_result cuts the rest


def _encode(result: ProcessResult, timeout_s: float) -> str:
    """A non-zero exit is a normal result; a timeout is an ``error`` that still carries
    the partial output."""
    payload: dict[str, Any] = {"output": result.output, "exit_code": result.exit_code}
    if result.truncated:
        payload["truncated"] = True
        payload["omitted_chars"] = result.omitted_chars
    if result.timed_out:
        message = (
            f"command timed out after {timeout_s:g} s and was killed together with its "
            "child processes; the output it produced before that is included"
        )
        return tool_error(message, **payload, timed_out=True)
    if result.signal is not None:
        payload["signal"] = result.signal_name
        killed = f"the process was killed by {result.signal_name}"
        if result.exit_code is not None:
            killed = f"exit code {result.exit_code} usually means {killed}"
        payload["note"] = (
            f"{killed}; a resource limit (CPU time, memory, file size) may have been reached"
        )
    return tool_result(payload)


async def run_in_scratch(
    argv: Sequence[str], ctx: ToolContext, *, timeout_s: float, limits: ResourceLimits | None = None
) -> str:
    """Run ``argv`` in the episode's scratch dir and return the tool result JSON."""
    ctx.scratch_dir.mkdir(parents=True, exist_ok=True)
    sandbox = ctx.settings.sandbox
    try:
        result = await run_command(
            argv,
            cwd=ctx.scratch_dir,
            env=episode_env(ctx),
            timeout_s=timeout_s,
            max_output_chars=ctx.max_result_chars,
            limits=limits or limits_for(sandbox),
            backend=backend_for(sandbox),
        )
    except SandboxError as exc:
        return tool_error(str(exc))
    if sandbox.strip_ansi:
        result = result.without_ansi()
    logger.debug(
        "task %s: %s exited %s in %.3f s", ctx.task_id, argv[0], result.exit_code, result.duration_s
    )
    return result_json(result, timeout_s=timeout_s, max_chars=ctx.max_result_chars)
