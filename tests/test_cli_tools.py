"""``hermes-batch tools`` / ``python batch_runner.py --list_tools`` in real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SEARXNG", "TAVILY", "BRAVE"))}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_tools_json_lists_availability_and_reasons() -> None:
    result = _run("-m", "hermes.cli", "tools", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    rows = {(r["toolset"], r["tool"]): r for r in data["tools"]}
    for offline in ("terminal", "read_file", "write_file", "patch", "search_files"):
        toolset = "terminal" if offline == "terminal" else "file"
        assert rows[(toolset, offline)]["available"], rows[(toolset, offline)]
    assert rows[("code_execution", "execute_code")]["available"]
    assert rows[("todo", "todo")]["available"]
    search = rows[("web", "web_search")]
    assert not search["available"] and "SEARXNG_URL" in search["reason"]
    assert not rows[("moa", "mixture_of_agents")]["available"]
    assert rows[("moa", "mixture_of_agents")]["reason"]
    assert data["failed_imports"] == {}
    assert len(data["fingerprint"]) == 16
    assert any(line.startswith("coding = terminal + file") for line in data["composite_toolsets"])


def test_configuring_a_backend_makes_a_tool_available() -> None:
    result = _run("-m", "hermes.cli", "tools", "--json", env={"SEARXNG_URL": "http://127.0.0.1:9"})
    rows = {(r["toolset"], r["tool"]): r for r in json.loads(result.stdout)["tools"]}
    assert rows[("web", "web_search")]["available"]


def test_batch_runner_list_tools_prints_the_table() -> None:
    result = _run("batch_runner.py", "--list_tools")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TOOLSET", "TOOL", "AVAILABLE", "WHY", "NOT"]
    terminal = next(line for line in lines if line.split()[:2] == ["terminal", "terminal"])
    assert terminal.split()[2] == "yes"
    search = next(line for line in lines if line.split()[:2] == ["web", "web_search"])
    assert search.split()[2] == "no" and "SEARXNG_URL" in search
    assert "tools available; registry fingerprint" in result.stdout
