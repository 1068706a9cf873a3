"""hermes-batch: turn a dataset of prompts into a dataset of tool-using agent trajectories."""

from __future__ import annotations

__version__ = "0.1.0"
