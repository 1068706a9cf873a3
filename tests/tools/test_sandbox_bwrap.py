"""The bubblewrap backend, backend selection and the start-up trial, with real bwrap runs.

Attacks (escapes, secrets, fork bombs, resource exhaustion) are in test_attacks.py; this
file checks the sandbox's shape and plumbing: the command line, identity, the scratch
directory hand-over, output decoding, configuration and the job-start trial.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import tools.file_tools  # registers read_file and write_file
import tools.terminal_tool  # noqa: F401  (registers terminal)
from hermes.config import build_config
from hermes.errors import ConfigError
from hermes.runner import plan_job
from hermes.worker import tool_settings
from tests.runner.helpers import job_dict, write_prompts
from tools import sandbox_bwrap
from tools.registry import registry
from tools.sandbox import (
    BwrapBackend,
    ProcessResult,
    SandboxError,
    check_sandbox,
    limits_for,
    make_backend,
    run_command,
)
from tools.sandbox_bwrap import BwrapOptions, build_argv, hand_over
from tools.settings import SandboxSettings, ToolContext, ToolSettings

pytestmark = pytest.mark.timeout(60)

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def bwrap_works() -> None:
    check = check_sandbox(ToolSettings(env={}, sandbox=SandboxSettings(backend="bwrap")))
    if not check.ok:
        pytest.skip(f"bubblewrap does not work here: {check.reason}")


def make_ctx(tmp_path: Path, **sandbox: Any) -> ToolContext:
    settings = ToolSettings(
        env=dict(ENV),
        command_timeout_s=10,
        sandbox=SandboxSettings(**{"backend": "bwrap", **sandbox}),
    )
    return ToolContext(task_id="t1", scratch_dir=tmp_path / "scratch", settings=settings)


def call(ctx: ToolContext, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = json.loads(registry.dispatch(tool, args, task_id=ctx.task_id, ctx=ctx))
    assert isinstance(result, dict)
    return result


def sh(ctx: ToolContext, command: str) -> dict[str, Any]:
    return call(ctx, "terminal", {"command": command})


def argv_for(tmp_path: Path, **options: Any) -> list[str]:
    return build_argv(
        ["echo", "hi"],
        scratch=tmp_path,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        rlimit_options=["--nofile=64"],
        options=BwrapOptions(**options),
    )


def pairs(argv: list[str], option: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == option]


# -- the command line -----------------------------------------------------------------


def test_argv_clears_the_environment_and_sets_only_the_given_one(tmp_path: Path) -> None:
    argv = argv_for(tmp_path)
    assert "--clearenv" in argv
    assert pairs(argv, "--setenv") == [("LANG", "C.UTF-8"), ("PATH", "/usr/bin:/bin")]
    assert argv.index("--clearenv") < argv.index("--setenv")
    # Everything before the command's own argv is bwrap's and the identity steps'.
    assert argv[-3:] == ["--", "echo", "hi"]
    assert "--nofile=64" in argv[argv.index("--clearenv") :]


def test_argv_unshares_namespaces_and_the_network_unless_allowed(tmp_path: Path) -> None:
    argv = argv_for(tmp_path)
    for option in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"):
        assert option in argv
    assert "--die-with-parent" in argv and "--new-session" in argv
    assert "--as-pid-1" not in argv
    assert "--unshare-net" not in argv_for(tmp_path, allow_network=True)


def test_argv_binds_system_dirs_python_and_the_scratch_dir_only(tmp_path: Path) -> None:
    argv = argv_for(tmp_path)
    read_only = [dest for _, dest in pairs(argv, "--ro-bind")]
    assert "/usr" in read_only and "/etc" in read_only
    python = set(sandbox_bwrap._python_dirs())
    for dest in read_only:
        # Nothing of the runner's home or workspace, except the Python installation.
        if dest.startswith(("/root", "/home", "/work", "/opt")):
            assert dest in python
    assert pairs(argv, "--bind") == [(str(tmp_path.resolve()), str(tmp_path))]
    assert argv[argv.index("--chdir") + 1] == str(tmp_path)
    assert argv[argv.index("--remount-ro") + 1] == "/"


def test_missing_parent_dirs_are_made_world_readable_before_binds(tmp_path: Path) -> None:
    argv = argv_for(tmp_path)
    made = [argv[i + 3] for i, a in enumerate(argv) if a == "--perms" and argv[i + 2] == "--dir"]
    assert all(argv[argv.index(d) - 2] == "0755" for d in made)
    bind_at = argv.index("--bind")
    for parent in list(tmp_path.parents)[:-2]:  # below /tmp, which is a tmpfs
        assert str(parent) in made
        assert argv.index(str(parent)) < bind_at


def test_tmpfs_mounts_are_private_and_size_capped(tmp_path: Path) -> None:
    argv = argv_for(tmp_path, tmpfs_size_mb=7)
    for mount in ("/tmp", "/dev/shm"):
        at = argv.index(mount)
        assert argv[at - 1] == "--tmpfs"
        if "--size" in sandbox_bwrap.bwrap_features(sandbox_bwrap.find_program("bwrap") or ""):
            assert argv[at - 3 : at - 1] == ["--size", str(7 << 20)]


def test_missing_bubblewrap_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox_bwrap, "SYSTEM_PATH", str(tmp_path / "empty"))
    with pytest.raises(sandbox_bwrap.BwrapSetupError, match="apt-get install bubblewrap"):
        argv_for(tmp_path)


# -- running commands -------------------------------------------------------------------


def test_home_tmpdir_and_cwd_are_the_scratch_path(tmp_path: Path, bwrap_works: None) -> None:
    ctx = make_ctx(tmp_path)
    result = sh(ctx, 'echo "$HOME|$TMPDIR|$(pwd)"; touch made-here; ls /')
    scratch = str(ctx.scratch_dir)
    assert result["output"].splitlines()[0] == f"{scratch}|{scratch}|{scratch}"
    assert (ctx.scratch_dir / "made-here").is_file()
    system = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin"}
    python_tops = {d.split("/")[1] for d in sandbox_bwrap._python_dirs()}
    top_level = set(result["output"].splitlines()[1:])
    assert top_level <= system | {"tmp", "usr", "var"} | python_tops
    assert "work" not in top_level or "work" in python_tops


def test_commands_are_not_root_and_the_runner_can_remove_their_files(
    tmp_path: Path, bwrap_works: None
) -> None:
    ctx = make_ctx(tmp_path)
    result = sh(ctx, "id -u; id -g; mkdir -p a/b && echo x > a/b/f && chmod 0500 a/b")
    assert result["output"].splitlines() == ["65534", "65534"]
    assert (ctx.scratch_dir / "a/b/f").read_text() == "x\n"
    os.chmod(ctx.scratch_dir / "a/b", 0o700)  # as the episode's cleanup does
    shutil.rmtree(ctx.scratch_dir)
    assert not ctx.scratch_dir.exists()


def test_files_written_by_the_file_tools_can_be_changed_by_commands(
    tmp_path: Path, bwrap_works: None
) -> None:
    ctx = make_ctx(tmp_path)
    assert "error" not in call(ctx, "write_file", {"path": "notes/a.txt", "content": "one\n"})
    result = sh(ctx, "echo two >> notes/a.txt && cat notes/a.txt && touch notes/b")
    assert result == {"output": "one\ntwo\n", "exit_code": 0}
    assert call(ctx, "read_file", {"path": "notes/a.txt"})["content"].count("two") == 1


@pytest.mark.skipif(not IS_ROOT, reason="handing files over needs a root runner")
def test_hand_over_changes_owners_without_following_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("mine")
    scratch = tmp_path / "scratch"
    (scratch / "d").mkdir(parents=True)
    (scratch / "d" / "f").write_text("x")
    (scratch / "link").symlink_to(outside)
    (scratch / "dirlink").symlink_to(tmp_path)
    assert hand_over(scratch, 65534) == 5  # scratch, d, f, link, dirlink
    assert (scratch / "d" / "f").stat().st_uid == 65534
    assert os.lstat(scratch / "link").st_uid == 65534
    assert outside.stat().st_uid == 0 and tmp_path.stat().st_uid == 0
    assert hand_over(scratch, 65534) == 0


@pytest.mark.skipif(not IS_ROOT, reason="the user-namespace-only mode differs only for root")
def test_run_as_uid_null_keeps_root_on_the_host_and_warns(
    tmp_path: Path, bwrap_works: None
) -> None:
    ctx = make_ctx(tmp_path, run_as_uid=None)
    assert sh(ctx, "id -u; touch f")["output"] == "65534\n"
    assert (ctx.scratch_dir / "f").stat().st_uid == 0
    check = check_sandbox(ctx.settings)
    assert check.ok and check.backend == "bwrap"
    assert any("process-count limit is not enforced" in w for w in check.warnings)


def test_binary_output_is_decoded_with_replacement(tmp_path: Path, bwrap_works: None) -> None:
    result = sh(make_ctx(tmp_path), r"printf '\377\376abc\000def\303'")
    assert result["output"] == "\ufffd\ufffdabc\x00def\ufffd"


def test_ansi_escapes_are_kept_by_default_and_stripped_when_set(
    tmp_path: Path, bwrap_works: None
) -> None:
    command = r"printf '\033[1;31mred\033[0m \033]0;title\007plain\n'"
    assert sh(make_ctx(tmp_path), command)["output"] == (
        "\x1b[1;31mred\x1b[0m \x1b]0;title\x07plain\n"
    )
    assert sh(make_ctx(tmp_path, strip_ansi=True), command)["output"] == "red plain\n"


def test_stripping_ansi_keeps_the_truncation_marker_and_head() -> None:
    head, tail = "\x1b[31mab\x1b[0m", "yz\x1b[0m"
    marker = "\n\n[... 100 characters omitted ...]\n\n"
    result = ProcessResult(
        output=head + marker + tail,
        exit_code=0,
        timed_out=False,
        omitted_chars=100,
        head_chars=len(head),
        duration_s=0.0,
    ).without_ansi()
    assert result.output == "ab" + marker + "yz"
    assert result.head_chars == 2


def test_a_command_killed_by_a_signal_is_reported(tmp_path: Path, bwrap_works: None) -> None:
    result = sh(make_ctx(tmp_path), "echo before; kill -9 $$")
    assert result["output"] == "before\n"
    assert result["exit_code"] == 137
    assert result["signal"] == "SIGKILL"
    assert "usually means the process was killed by SIGKILL" in result["note"]


def test_limits_apply_inside_the_sandbox(tmp_path: Path, bwrap_works: None) -> None:
    ctx = make_ctx(tmp_path, cpu_s=7, file_size_mb=3, open_files=99, processes=77)
    result = sh(ctx, "ulimit -t; ulimit -f; ulimit -n; ulimit -u; ulimit -v")
    assert result["output"].split() == ["7", str(3 * 1024), "99", "77", str(4096 * 1024)]


def test_run_command_reports_setup_failures(tmp_path: Path, bwrap_works: None) -> None:
    backend = make_backend("bwrap", SandboxSettings(backend="bwrap"))
    assert isinstance(backend, BwrapBackend)
    with pytest.raises(SandboxError, match="command not found"):
        asyncio.run(
            run_command(
                ["no-such-command-xyz"],
                cwd=tmp_path,
                env=ENV,
                timeout_s=5,
                max_output_chars=100,
                limits=limits_for(SandboxSettings()),
                backend=backend,
            )
        )


# -- backends, the trial and configuration --------------------------------------------


def test_none_backend_needs_an_explicit_opt_in(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allow_unsafe_none"):
        SandboxSettings(backend="none")
    ctx = make_ctx(tmp_path, backend="none", allow_unsafe_none=True)
    assert sh(ctx, "ulimit -f; ulimit -t")["output"].split() == ["unlimited", "unlimited"]
    check = check_sandbox(ctx.settings)
    assert check.ok and "no resource limits at all" in check.warnings[0]


def test_trial_of_bwrap_passes_without_warnings(bwrap_works: None) -> None:
    check = check_sandbox(ToolSettings(env={}, sandbox=SandboxSettings()))
    assert (check.backend, check.ok, check.reason) == ("bwrap", True, "")
    if IS_ROOT:
        assert check.warnings == ()


def test_without_bubblewrap_auto_falls_back_and_explicit_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox_bwrap, "SYSTEM_PATH", str(tmp_path / "empty"))
    auto = check_sandbox(ToolSettings(env={}, sandbox=SandboxSettings(backend="auto")))
    assert (auto.backend, auto.ok) == ("process", True)
    assert "bwrap not found" in auto.reason
    assert len(auto.warnings) == 2 and "no filesystem isolation" in auto.warnings[1]
    explicit = check_sandbox(ToolSettings(env={}, sandbox=SandboxSettings(backend="bwrap")))
    assert (explicit.backend, explicit.ok) == ("bwrap", False)
    assert "apt-get install bubblewrap" in explicit.reason


def _job(tmp_path: Path, **sandbox: Any) -> dict[str, Any]:
    dataset = write_prompts(tmp_path / "prompts.jsonl", 2)
    return job_dict(dataset, tmp_path / "out", sandbox=sandbox)


def test_config_section_is_validated_mapped_and_hashed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="allow_unsafe_none"):
        build_config(_job(tmp_path, backend="none"))
    with pytest.raises(ConfigError, match=r"sandbox\.limits\.cpu: unknown setting"):
        build_config(_job(tmp_path, limits={"cpu": 5}))
    config = build_config(
        _job(tmp_path, backend="process", allow_network=True, limits={"processes": 99})
    )
    sandbox = tool_settings(config).sandbox
    assert (sandbox.backend, sandbox.allow_network, sandbox.processes) == ("process", True, 99)
    assert sandbox.cpu_s == 60 and sandbox.run_as_uid == 65534 and not sandbox.strip_ansi
    assert config.hash() != build_config(_job(tmp_path)).hash()


def test_plan_job_warns_about_what_the_process_backend_misses(tmp_path: Path) -> None:
    plan = plan_job(build_config(_job(tmp_path, backend="process")))
    [warning] = [w for w in plan.warnings if w.startswith("sandbox backend process")]
    assert "no filesystem isolation" in warning and "/proc/<pid>/environ" in warning


def test_plan_job_refuses_an_explicit_backend_that_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox_bwrap, "SYSTEM_PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="sandbox backend bwrap does not work"):
        plan_job(build_config(_job(tmp_path, backend="bwrap")))
    plan = plan_job(build_config(_job(tmp_path, backend="auto")))
    assert any("using the process backend" in w for w in plan.warnings)
