"""Shared fixtures: an isolated registry, an episode context, a private Ray/HOME setup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.registry import ToolRegistry
from tools.settings import ToolContext, ToolSettings

# Ray writes an auth token under HOME and attaches to any cluster named in RAY_ADDRESS;
# tests must never depend on either.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.pop("RAY_ADDRESS", None)


@pytest.fixture
def fresh_registry() -> ToolRegistry:
    """A registry of its own, so a test's tools never leak into another test."""
    return ToolRegistry()


@pytest.fixture
def settings() -> ToolSettings:
    return ToolSettings(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


@pytest.fixture
def ctx(tmp_path: Path, settings: ToolSettings) -> ToolContext:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return ToolContext(task_id="task-1", scratch_dir=scratch, settings=settings)
