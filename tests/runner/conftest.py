"""Fixtures for the runner tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runner.helpers import write_prompts


@pytest.fixture
def prompts(tmp_path: Path) -> Callable[[int], Path]:
    return lambda n: write_prompts(tmp_path / f"prompts_{n}.jsonl", n)
