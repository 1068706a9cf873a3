"""Model-written attacks on the runner, through the terminal and execute_code tools.

Each attack goes through ``registry.dispatch`` with a real ``ToolContext``, as in a job,
and must end with a tool result (output or error) in bounded time and memory, leaving
nothing outside the scratch directory changed. The bwrap backend must stop them all; the
``*_documented`` tests show what the plain ``process`` backend does NOT stop (the job-start
warning lists the same gaps).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import resource
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tools.code_execution_tool
import tools.file_tools
import tools.terminal_tool  # noqa: F401  (the imports register the tools)
from tools.registry import registry
from tools.sandbox import check_sandbox
from tools.settings import SandboxSettings, ToolContext, ToolSettings

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-attack-" + uuid.uuid4().hex  # a fake API key the runner holds
FILE_SECRET = "runner-private-" + uuid.uuid4().hex  # a file of the runner's, outside scratch
MIB = 1 << 20


@pytest.fixture(scope="module")
def bwrap_works() -> None:
    check = check_sandbox(ToolSettings(env={}, sandbox=SandboxSettings(backend="bwrap")))
    if not check.ok:
        pytest.skip(f"bubblewrap does not work here: {check.reason}")


@dataclass
class World:
    """A scratch dir, and next to it a sentinel dir of the runner's with a secret file."""

    tmp: Path
    scratch: Path
    outside: Path

    @property
    def secret_file(self) -> Path:
        return self.outside / "secret.txt"

    def ctx(self, backend: str = "bwrap", timeout_s: float = 10, **sandbox: Any) -> ToolContext:
        settings = ToolSettings(
            env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "OPENAI_API_KEY": SECRET},
            command_timeout_s=timeout_s,
            sandbox=SandboxSettings(backend=backend, **sandbox),
        )
        return ToolContext(task_id="attack", scratch_dir=self.scratch, settings=settings)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.txt").write_text(FILE_SECRET)
    (outside / "sub" / "data.bin").write_bytes(os.urandom(256))
    (tmp_path / "scratch").mkdir()
    yield World(tmp=tmp_path, scratch=tmp_path / "scratch", outside=outside)


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry below ``root`` (not following symlinks): mode, owner, content digest."""
    seen: dict[str, tuple[int, int, str]] = {}
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        if path.is_symlink():
            digest = "->" + os.readlink(path)
        elif path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            digest = ""
        seen[str(path.relative_to(root))] = (info.st_mode, info.st_uid, digest)
    return seen


def call(ctx: ToolContext, tool: str, args: dict[str, Any], within_s: float = 10) -> dict[str, Any]:
    """Dispatch like a job does; the result must be JSON and arrive within ``within_s``."""
    started = time.monotonic()
    raw = registry.dispatch(tool, args, task_id=ctx.task_id, ctx=ctx)
    elapsed = time.monotonic() - started
    assert elapsed < within_s, f"{tool} took {elapsed:.1f} s"
    result = json.loads(raw)
    assert isinstance(result, dict)
    return result


def sh(ctx: ToolContext, command: str, within_s: float = 10) -> dict[str, Any]:
    return call(ctx, "terminal", {"command": command}, within_s)


def py(ctx: ToolContext, code: str, within_s: float = 10) -> dict[str, Any]:
    return call(ctx, "execute_code", {"code": code}, within_s)


def text_of(result: dict[str, Any]) -> str:
    return json.dumps(result)


def host_pids_with(marker: str) -> list[int]:
    """Live host processes whose command line contains ``marker`` (zombies have none)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def wait_gone(marker: str, wait_s: float = 3.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    while (left := host_pids_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def run_as_runner(world: World, backend: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """Run tool calls in a fresh Python process that holds SECRET in its real environment
    (``/proc/<pid>/environ`` shows a process's initial environment, which
    ``monkeypatch.setenv`` cannot change), like a runner started with an API key."""
    script = (
        "import json, os, sys\n"
        "from pathlib import Path\n"
        "import tools.code_execution_tool, tools.terminal_tool\n"
        "from tools.registry import registry\n"
        "from tools.settings import SandboxSettings, ToolContext, ToolSettings\n"
        "spec = json.loads(sys.argv[1])\n"
        "settings = ToolSettings(env=dict(os.environ), command_timeout_s=10,\n"
        "                        sandbox=SandboxSettings(backend=spec['backend']))\n"
        "ctx = ToolContext(task_id='a', scratch_dir=Path(spec['scratch']), settings=settings)\n"
        "own = Path('/proc/self/environ').read_bytes().decode(errors='replace')\n"
        "out = [registry.dispatch(t, a, task_id='a', ctx=ctx) for t, a in spec['calls']]\n"
        "print(json.dumps({'has_secret': spec['secret'] in own, 'results': out}))\n"
    )
    spec = {"backend": backend, "scratch": str(world.scratch), "calls": calls, "secret": SECRET}
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["has_secret"], "the runner process must hold the secret for this to mean much"
    return [json.loads(r) for r in report["results"]]


ENV_SNOOPING: list[tuple[str, dict[str, Any]]] = [
    ("terminal", {"command": "env"}),
    ("terminal", {"command": "cat /proc/self/environ"}),
    ("terminal", {"command": "cat /proc/1/environ"}),
    ("terminal", {"command": "cat /proc/$PPID/environ"}),
    ("terminal", {"command": "cat /proc/*/environ | tr '\\0' '\\n'"}),
    ("terminal", {"command": "ps -eo pid,args e 2>&1; cat /proc/*/cmdline | tr '\\0' ' '"}),
    (
        "execute_code",
        {
            "code": (
                "import glob, os\n"
                "print(dict(os.environ))\n"
                "for path in glob.glob('/proc/*/environ'):\n"
                "    try:\n"
                "        print(path, open(path, 'rb').read())\n"
                "    except OSError as exc:\n"
                "        print(path, exc)\n"
            )
        },
    ),
]


# -- secrets ------------------------------------------------------------------------------


def test_environment_and_proc_do_not_reveal_the_runners_secret(
    world: World, bwrap_works: None
) -> None:
    results = run_as_runner(world, "bwrap", ENV_SNOOPING)
    assert "PATH=" in results[0]["output"]
    if os.geteuid() == 0:  # PID 1 is bwrap's root-owned init, not the runner
        assert "Permission denied" in results[2]["output"]
    for result in results:
        assert SECRET not in text_of(result)
        assert "OPENAI_API_KEY" not in text_of(result)


def test_process_backend_can_read_proc_environ_documented(world: World) -> None:
    results = run_as_runner(world, "process", ENV_SNOOPING)
    assert SECRET not in results[0]["output"]  # the allowlist keeps it out of `env`...
    assert SECRET in results[3]["output"]  # ...but the runner's /proc/<pid>/environ has it


# -- files outside the scratch directory -----------------------------------------------------


def test_files_outside_the_scratch_dir_are_invisible_and_unchanged(
    world: World, bwrap_works: None
) -> None:
    ctx = world.ctx()
    before, tmp_before = snapshot(world.outside), sorted(p.name for p in world.tmp.iterdir())
    tag = uuid.uuid4().hex
    attempts = [
        "cat ../outside/secret.txt",
        f"cat {world.secret_file}",
        f"ln -s {world.secret_file} link && cat link",
        "cat ~/../outside/secret.txt",
        f"echo pwned > {world.secret_file}",
        f"rm -rf {world.outside}",
        f"touch {world.outside}/new; mkdir ../escape",
        f"touch /work/hermes-attack-{tag} /root/hermes-attack-{tag} /hermes-attack-{tag}",
        f"echo x >> /etc/hostname; touch /usr/hermes-attack-{tag}",
        f"cd / && find / -name secret.txt -not -path '/proc/*' 2>/dev/null; ls {world.tmp}",
    ]
    for command in attempts:
        assert FILE_SECRET not in text_of(sh(ctx, command))
    code = f"print(open({str(world.secret_file)!r}).read())\n"
    assert FILE_SECRET not in text_of(py(ctx, code))
    code = f"open({str(world.outside / 'py-new')!r}, 'w').write('x')\n"
    assert "Error" in py(ctx, code)["output"]
    assert snapshot(world.outside) == before
    assert sorted(p.name for p in world.tmp.iterdir()) == tmp_before
    for top in ("/work", "/root", ""):
        assert not os.path.exists(f"{top}/hermes-attack-{tag}")


def test_tmp_is_a_private_tmpfs(world: World, bwrap_works: None) -> None:
    name = f"/tmp/hermes-attack-{uuid.uuid4().hex}"
    result = sh(world.ctx(), f"echo leak > {name} && cat {name} && echo x > /dev/shm/y")
    assert result == {"output": "leak\n", "exit_code": 0}
    assert not os.path.exists(name)


def test_process_backend_can_read_and_write_outside_scratch_documented(world: World) -> None:
    ctx = world.ctx("process")
    assert FILE_SECRET in sh(ctx, f"cat {world.secret_file}")["output"]
    sh(ctx, f"touch {world.outside}/written-by-the-command")
    assert (world.outside / "written-by-the-command").exists()


def test_links_left_by_a_command_do_not_let_file_tools_escape(
    world: World, bwrap_works: None
) -> None:
    ctx = world.ctx()
    result = sh(
        ctx,
        "ln -s /etc/shadow shadow; ln -s /etc/passwd passwd; "
        f"ln -s {world.secret_file} secret; ln -s {world.outside} outdir; "
        "ln /etc/passwd hard 2>&1 | grep -c 'cross-device'; "
        f"ln {world.secret_file} hard2 2>&1 | grep -c 'No such file'",
    )
    assert result["output"].split() == ["1", "1"]  # hard links across mounts fail
    for path in ("shadow", "passwd", "secret", "outdir/secret.txt"):
        result = call(ctx, "read_file", {"path": path})
        assert "outside the episode's working directory" in result["error"]
        assert FILE_SECRET not in text_of(result)
    result = call(ctx, "write_file", {"path": "outdir/new.txt", "content": "x"})
    assert "error" in result and not (world.outside / "new.txt").exists()


def test_process_backend_hard_link_is_refused_by_read_file_documented(world: World) -> None:
    ctx = world.ctx("process")
    # Without the sandbox the command can hard-link a file of the runner's into scratch;
    # read_file still refuses it (the command could just `cat` it, though).
    assert sh(ctx, f"ln {world.secret_file} hard && echo linked")["output"] == "linked\n"
    result = call(ctx, "read_file", {"path": "hard"})
    assert "hard links" in result["error"] and FILE_SECRET not in text_of(result)


# -- processes --------------------------------------------------------------------------


def test_setsid_and_double_forked_children_die_with_the_command(
    world: World, bwrap_works: None
) -> None:
    marks = [f"{random.randint(10**6, 10**7)}.{random.randint(10**5, 10**6)}" for _ in range(3)]
    result = sh(
        world.ctx(),
        f"setsid sleep {marks[0]} & (sleep {marks[1]} &); "
        f"nohup sleep {marks[2]} >/dev/null 2>&1 & sleep 0.2; ps -eo args",
        within_s=5,
    )
    assert result["exit_code"] == 0
    assert all(f"sleep {m}" in result["output"] for m in marks)  # they did run
    for mark in marks:
        assert wait_gone(f"sleep\0{mark}") == []


def test_process_backend_setsid_child_survives_documented(world: World) -> None:
    mark = f"{random.randint(10**6, 10**7)}.{random.randint(10**5, 10**6)}"
    sh(world.ctx("process"), f"setsid sleep {mark} >/dev/null 2>&1 < /dev/null & sleep 0.2")
    survivors = host_pids_with(f"sleep\0{mark}")
    try:
        assert survivors, "with the process backend a setsid child escapes the group kill"
    finally:
        for pid in survivors:
            os.kill(pid, 9)


@pytest.mark.parametrize("command", [":(){ :|:& };:", "bomb() { bomb | bomb & }; bomb; sleep 100"])
def test_fork_bomb_is_contained(world: World, bwrap_works: None, command: str) -> None:
    marker = f"bomb-{uuid.uuid4().hex}"
    ctx = world.ctx(timeout_s=3, processes=64).with_limit(5_000)
    result = sh(ctx, f": {marker}; {command}", within_s=3 + 4)
    assert len(text_of(result)) <= 5_000
    assert wait_gone(marker) == []


@pytest.mark.slow
def test_a_fork_bomb_does_not_stop_other_sandboxes_from_forking(
    world: World, bwrap_works: None
) -> None:
    from tools.terminal_tool import terminal_handler

    bomb = world.ctx(timeout_s=4, processes=64)
    other = ToolContext(
        task_id="other", scratch_dir=world.tmp / "other", settings=bomb.settings
    ).with_limit(2_000)

    async def scenario() -> list[str]:
        return await asyncio.gather(
            terminal_handler({"command": ":(){ :|:& };:; sleep 100"}, ctx=bomb),
            terminal_handler(
                {"command": "sleep 1; for i in $(seq 40); do sleep 1 & done; wait; echo ok"},
                ctx=other,
            ),
        )

    _, raw = asyncio.run(scenario())
    assert json.loads(raw) == {"output": "ok\n", "exit_code": 0}


def test_python_fork_loop_is_contained(world: World, bwrap_works: None) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    ctx = world.ctx(timeout_s=3, processes=32)
    result = py(ctx, code, within_s=3 + 4)
    assert result["timed_out"] is True
    assert wait_gone(str(world.scratch)) == []


@pytest.mark.parametrize("command", ["while true; do :; done", "sleep 1000", "cat /dev/zero"])
def test_commands_that_never_end_are_killed_at_the_timeout(
    world: World, bwrap_works: None, command: str
) -> None:
    started = time.monotonic()
    result = call(world.ctx(timeout_s=1), "terminal", {"command": command}, within_s=4)
    assert result["timed_out"] is True and "timed out after 1 s" in result["error"]
    assert time.monotonic() - started >= 1


def test_stdin_is_empty(world: World, bwrap_works: None) -> None:
    assert sh(world.ctx(), "cat; read line; echo rc=$?", within_s=3) == {
        "output": "rc=1\n",
        "exit_code": 0,
    }
    assert "EOFError" in py(world.ctx(), "input()", within_s=3)["output"]


# -- resources ------------------------------------------------------------------------------


@pytest.mark.slow
def test_printing_gigabytes_is_truncated_in_bounded_memory(world: World, bwrap_works: None) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ctx = world.ctx(timeout_s=50).with_limit(20_000)
    result = sh(ctx, "yes | head -c 3G", within_s=50)
    rss_growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert result["exit_code"] == 0 and result["truncated"] is True
    assert result["omitted_chars"] > 3 * 10**9 - 20_000
    assert len(text_of(result)) <= 20_000
    assert rss_growth_mib < 64


def test_filling_the_scratch_disk_is_stopped_by_the_file_size_limit(
    world: World, bwrap_works: None
) -> None:
    result = sh(world.ctx(file_size_mb=8), "dd if=/dev/zero of=big bs=1M count=100")
    assert result["signal"] == "SIGXFSZ" and "file size" in result["note"]
    assert (world.scratch / "big").stat().st_size == 8 * MIB


def test_filling_tmp_is_stopped_by_the_tmpfs_size(world: World, bwrap_works: None) -> None:
    ctx = world.ctx(tmpfs_size_mb=16, file_size_mb=64)
    result = sh(
        ctx,
        "dd if=/dev/zero of=/tmp/big bs=1M count=100 2>&1 | grep -c 'No space'; "
        "for i in 1 2 3 4; do head -c 6M /dev/zero 2>/dev/null > /dev/shm/f$i || echo full; "
        "done; df -k --output=used /tmp /dev/shm | tail -n +2",
    )
    lines = result["output"].split()
    assert lines[:3] == ["1", "full", "full"]
    assert all(int(kib) <= 16 * 1024 for kib in lines[3:])


def test_allocating_too_much_memory_fails_and_is_reported(world: World, bwrap_works: None) -> None:
    ctx = world.ctx(address_space_mb=512)
    result = sh(ctx, "python3 -c 'b = bytearray(10 * 1024**3)'; head -c 2G /dev/zero | tail -c 1G")
    assert "MemoryError" in result["output"] and "memory exhausted" in result["output"]
    result = py(ctx, "b = bytearray(10 * 1024**3)")
    assert result["exit_code"] == 1 and "MemoryError" in result["output"]


# -- network ----------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP server on the host's loopback; records every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            accepted.append(peer[0])
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(timeout=2)
    server.close()


def _connect(port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('failed', exc)\n"
    )


def test_network_is_unreachable_unless_allowed(
    world: World, bwrap_works: None, listener: tuple[int, list[str]]
) -> None:
    port, accepted = listener
    assert py(world.ctx(), _connect(port))["output"].startswith("failed")
    assert "failed" in sh(world.ctx(), "curl -sS -m 2 https://1.1.1.1 || echo failed")["output"]
    assert accepted == []
    assert py(world.ctx(allow_network=True), _connect(port))["output"] == "connected\n"
    assert accepted == ["127.0.0.1"]


def test_process_backend_reaches_the_network_documented(
    world: World, listener: tuple[int, list[str]]
) -> None:
    port, accepted = listener
    assert py(world.ctx("process"), _connect(port))["output"] == "connected\n"
    assert accepted == ["127.0.0.1"]
