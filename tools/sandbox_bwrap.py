"""The bubblewrap launch spec: the argv that runs one command in a throwaway sandbox.

Not a tool module: ``tools.sandbox.BwrapBackend`` calls ``build_argv`` for each command.

What the command sees (every path at its host path, so the file tools, which run outside
the sandbox, and the command agree on every name):

- read-only: ``/usr``, ``/etc``, ``/bin``, ``/sbin``, ``/lib*`` (symlinks recreated as
  symlinks) and the runner's Python installation (so ``execute_code`` finds its
  interpreter and installed packages). Nothing else of the host: not ``/root``, ``/home``,
  ``/work``, the output directory, other episodes' scratch directories, ``/sys``.
- read-write: the episode's scratch directory only; ``/tmp`` and ``/dev/shm`` are private
  tmpfs mounts capped at ``tmpfs_size_mb`` each; everything else is read-only.
- a new ``/proc`` for a new PID namespace (the runner's ``/proc/<pid>/environ`` does not
  exist there), a minimal ``/dev``, private IPC, UTS and cgroup namespaces, and a network
  namespace with only a loopback interface unless ``allow_network``.
- the environment is cleared (``--clearenv``) and rebuilt from the allowlist; bwrap
  itself is also started with only the allowlist, since a process can read its parent's
  ``/proc/<pid>/environ``.

Identity. When the runner is root and ``run_as_uid`` is set (the default, 65534 =
nobody), bwrap runs privileged (mounts need no user namespace) and the command is
started through ``setpriv`` (real uid/gid ``run_as_uid``, no supplementary groups,
``no_new_privs`` so setuid binaries do not elevate) and then ``unshare --user`` (a user
namespace mapping only that uid). Running as a real non-root uid is what makes the kernel
enforce RLIMIT_NPROC at all (it never applies to uid 0); the user namespace makes the
count per sandbox (Linux >= 5.14 counts processes per user namespace), so a fork bomb in
one episode does not stop the others from forking. Since commands are not root, the
scratch directory is handed over to ``run_as_uid`` before each command
(``hand_over``); the runner, being root, can still read and remove everything in it.
Otherwise (non-root runner, or ``run_as_uid: null``) bwrap makes an unprivileged user
namespace in which the command is uid 65534 while it stays the runner's uid on the host.

Resource limits are applied by ``prlimit`` as the last step inside the sandbox, after
the user namespace exists: set before it, RLIMIT_NPROC would count every sandbox of the
same uid together.

Not ``--as-pid-1``: bwrap's own init as PID 1 reaps orphans and reports the command's
exit status, while a command as PID 1 would ignore signals it has no handler for and
collect zombies. When the command exits, or bwrap is killed (timeout), or the runner
dies (``--die-with-parent``), PID 1 exits and the kernel kills every process left in the
namespace, ``setsid`` and double-forked daemons included.

Not contained: the total size of the scratch directory (only each file's size is capped;
it is on the host disk and removed with the episode); the total memory of all processes
of a sandbox (each has an address-space limit; a sum needs cgroups); commands creating
nested user namespaces in the privileged mode (``--disable-userns`` needs bwrap's own
user namespace; a nested one gives no access beyond what the sandbox already has). An old
bubblewrap without ``--size`` (< 0.7) leaves the tmpfs mounts uncapped, with a warning.

Measured start cost (2 cores, Linux 6.18, bwrap 0.8.0, root runner): ``true`` through
``run_command`` takes a median of 12.7 ms over 50 runs on a quiet machine (up to 20 ms
under load), of which bubblewrap is about 8 ms and ``setpriv`` + ``unshare`` + ``prlimit``
the rest; 9.3 ms with ``run_as_uid: null`` (no setpriv/unshare); 1.7 ms with the process
backend. ``hand_over`` adds about 4 us per scratch entry (37 ms for 10,000 files).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tools.settings import NOBODY_UID

logger = logging.getLogger(__name__)

MIB = 1 << 20
SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"
# Directories of the host filesystem every program expects (bound read-only if present).
_SYSTEM_DIRS = ("/usr", "/etc")
# Often symlinks into /usr (merged /usr); recreated as symlinks, else bound read-only.
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class BwrapSetupError(RuntimeError):
    """Raised when the sandbox cannot be built here (bubblewrap or a helper missing)."""


@dataclass(frozen=True, kw_only=True)
class BwrapOptions:
    """The sandbox settings that shape the bwrap command line."""

    allow_network: bool = False
    tmpfs_size_mb: int = 64
    run_as_uid: int | None = NOBODY_UID
    executable: str = "bwrap"


@dataclass(frozen=True, kw_only=True)
class HostLayout:
    """The read-only part of the host the sandbox shows: ``(source, dest)`` bind pairs
    and ``(target, dest)`` symlinks."""

    binds: tuple[tuple[str, str], ...]
    symlinks: tuple[tuple[str, str], ...]


def find_program(name: str) -> str | None:
    """Absolute path of a system program (never looked up in the job's PATH)."""
    if os.path.isabs(name):
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name, path=SYSTEM_PATH)


@functools.cache
def bwrap_features(executable: str) -> frozenset[str]:
    """The long options this bubblewrap accepts (``--size`` needs 0.7+, ``--disable-userns``
    0.8+), read from its ``--help``; empty when it cannot run."""
    try:
        done = subprocess.run(
            [executable, "--help"], capture_output=True, text=True, timeout=10, env={}
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.debug("cannot run %s --help: %s", executable, exc)
        return frozenset()
    return frozenset(re.findall(r"^\s+(--[a-z0-9-]+)", done.stdout + done.stderr, re.M))


def _python_dirs() -> list[str]:
    """The runner's Python installation: prefixes and the interpreter's directory."""
    dirs = [sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)]
    out: list[str] = []
    for path in dirs:
        for variant in (os.path.abspath(path), os.path.realpath(path)):
            if variant != "/" and variant not in out:
                out.append(variant)
    return out


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


@functools.cache
def host_layout() -> HostLayout:
    """What of this host the sandbox binds read-only (computed once per process)."""
    binds: list[tuple[str, str]] = []
    symlinks: list[tuple[str, str]] = []
    for path in _SYSTEM_DIRS:
        if os.path.isdir(path):
            binds.append((path, path))
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            symlinks.append((os.readlink(path), path))
        elif os.path.isdir(path):
            binds.append((path, path))
    for path in _python_dirs():
        covered = [dest for _, dest in binds]
        if os.path.isdir(path) and not _under(path, covered):
            binds.append((os.path.realpath(path), path))
    return HostLayout(binds=tuple(binds), symlinks=tuple(symlinks))


def runs_privileged(options: BwrapOptions) -> bool:
    """Whether bwrap runs as root and drops the command to ``run_as_uid`` itself."""
    return os.geteuid() == 0 and options.run_as_uid is not None


def sandbox_uid(options: BwrapOptions) -> int:
    """The uid (and gid) of commands inside the sandbox."""
    return options.run_as_uid if options.run_as_uid is not None else NOBODY_UID


def host_uid(options: BwrapOptions) -> int:
    """The uid commands have on the host (what must own the scratch directory)."""
    return sandbox_uid(options) if runs_privileged(options) else os.geteuid()


def _need(name: str) -> str:
    path = find_program(name)
    if path is None:
        raise BwrapSetupError(
            f"{name} not found in {SYSTEM_PATH}; install it (Debian: apt-get install "
            f"{'bubblewrap' if name == 'bwrap' else 'util-linux'})"
        )
    return path


def _identity(options: BwrapOptions) -> tuple[list[str], list[str]]:
    """bwrap options and the command prefix that make the command a non-root uid."""
    uid = sandbox_uid(options)
    if runs_privileged(options):
        bwrap_args = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        prefix = [
            *(_need("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups"),
            *("--no-new-privs", "--inh-caps=-all", "--"),
            *(_need("unshare"), "--user", f"--map-user={uid}", f"--map-group={uid}", "--"),
        ]
        return bwrap_args, prefix
    bwrap_args = ["--unshare-user", "--uid", str(uid), "--gid", str(uid)]
    if "--disable-userns" in bwrap_features(_need(options.executable)):
        bwrap_args.append("--disable-userns")
    return bwrap_args, []


class _Mounts:
    """Accumulates mount arguments in order, first creating missing parent directories
    world-readable: bwrap would copy the host's modes, and a 0700 ``/root`` would hide
    the Python installation below it from a non-root command."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._populated: list[str] = []  # host directories bound: all below them exists
        self._made: set[str] = set()  # directories that exist but start empty

    def parents(self, dest: str) -> None:
        for parent in reversed(PurePosixPath(dest).parents[:-1]):
            name = str(parent)
            if name not in self._made and not _under(name, self._populated):
                self.args += ["--perms", "0755", "--dir", name]
                self._made.add(name)

    def mount(self, *args: str, populated: bool) -> None:
        """Add one mount option whose last argument is its destination."""
        dest = args[-1]
        self.parents(dest)
        self.args += args
        if populated:
            self._populated.append(dest)
        else:
            self._made.add(dest)


def _filesystem(scratch: str, options: BwrapOptions, layout: HostLayout) -> list[str]:
    features = bwrap_features(_need(options.executable))
    size = ["--size", str(options.tmpfs_size_mb * MIB)] if "--size" in features else []
    mounts = _Mounts()
    mounts.mount("--proc", "/proc", populated=False)
    mounts.mount("--dev", "/dev", populated=False)
    for tmpfs in ("/tmp", "/dev/shm"):
        mounts.mount("--perms", "1777", *size, "--tmpfs", tmpfs, populated=False)
    # After the tmpfs mounts, so a Python installed below /tmp is not hidden by them.
    for source, dest in layout.binds:
        mounts.mount("--ro-bind", source, dest, populated=True)
    for target, dest in [*layout.symlinks, ("/tmp", "/var/tmp")]:
        mounts.parents(dest)
        mounts.args += ["--symlink", target, dest]
    mounts.mount("--bind", os.path.realpath(scratch), scratch, populated=True)
    return [*mounts.args, "--remount-ro", "/", "--chdir", scratch]


def build_argv(
    command: Sequence[str],
    *,
    scratch: Path,
    env: Mapping[str, str],
    rlimit_options: Sequence[str],
    options: BwrapOptions,
    layout: HostLayout | None = None,
) -> list[str]:
    """The full argv: bwrap, its options, the identity and rlimit steps, ``command``.

    ``scratch`` is the only writable host directory and the working directory; ``env``
    is set inside with ``--setenv`` after ``--clearenv``. Raises ``BwrapSetupError``
    when bubblewrap or a helper program is missing.
    """
    bwrap = _need(options.executable)
    scratch_path = os.path.abspath(scratch)
    identity_args, prefix = _identity(options)
    argv = [bwrap, *identity_args]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not options.allow_network:
        argv.append("--unshare-net")
    argv += ["--hostname", "sandbox", "--die-with-parent", "--new-session"]
    argv += _filesystem(scratch_path, options, layout or host_layout())
    argv.append("--clearenv")
    for name, value in sorted(env.items()):
        argv += ["--setenv", name, value]
    argv += ["--", *prefix, _need("prlimit"), *rlimit_options, "--", *command]
    return argv


def missing_protections(options: BwrapOptions) -> list[str]:
    """What this configuration of the bwrap backend does not protect on this host."""
    missing = []
    features = bwrap_features(options.executable) if find_program(options.executable) else None
    if os.geteuid() == 0 and options.run_as_uid is None:
        missing.append(
            "sandbox.run_as_uid is null and the runner is root: commands are host root "
            "inside a user namespace, so the process-count limit is not enforced (a fork "
            "bomb runs until the timeout) and root-owned files bound read-only (such as "
            "/etc/shadow) are readable"
        )
    if features is not None and "--size" not in features:
        missing.append("this bubblewrap has no --size: /tmp and /dev/shm are not size-capped")
    if options.allow_network:
        missing.append("sandbox.allow_network is true: commands can reach the network")
    return missing


def hand_over(scratch: Path, uid: int) -> int:
    """Give ``uid`` (and gid ``uid``) every entry of ``scratch`` it does not own yet;
    returns how many changed. For a root runner whose commands run as ``run_as_uid``.

    ``os.fwalk`` without following symlinks and ``chown`` relative to a verified
    directory descriptor without following the last component: a command running in the
    same scratch directory cannot turn this into a chown of a file outside it.
    """
    changed = 0
    top = os.path.realpath(scratch)
    if os.lstat(top).st_uid != uid:
        os.chown(top, uid, uid, follow_symlinks=False)
        changed += 1
    for _dirpath, dirnames, filenames, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in (*dirnames, *filenames):
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if info.st_uid != uid:
                    os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
                    changed += 1
            except FileNotFoundError:
                continue  # removed meanwhile by a command of the same episode
    return changed
