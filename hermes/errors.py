"""The engine's exception tree. Each message says what the user should fix."""

from __future__ import annotations


class HermesError(Exception):
    """Base of every error the engine raises on purpose."""


class ConfigError(HermesError):
    """A job file, CLI flag or override is invalid; raised before anything is written."""


class DatasetError(HermesError):
    """The prompt dataset cannot be read at all (single bad rows are counted, not raised)."""


class ModelAPIError(HermesError):
    """The model endpoint failed permanently for a request (after retries when transient)."""


class ToolSetupError(HermesError):
    """The tool registry cannot be built as the job asks (failed discovery, strict toolsets)."""
