"""An OpenAI-compatible model endpoint as the model-backed tools see it (moa, vision,
image generation). Keys are read from the variable an endpoint names (``api_key_env``)
at call time, so they never sit in a job file, a result or a log line. Not a tool module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

from tools.registry import ToolUnavailable
from tools.settings import ToolContext, ToolSettings

logger = logging.getLogger(__name__)

# Servers such as vLLM accept any key, but the openai client insists on one.
_PLACEHOLDER_KEY = "no-key-configured"
_ERROR_EXCERPT_CHARS = 300


@dataclass(frozen=True, slots=True)
class ModelEndpoint:
    """One model behind an OpenAI-compatible base URL; the key lives in ``api_key_env``."""

    model: str
    base_url: str
    api_key_env: str | None = None

    def api_key(self, settings: ToolSettings) -> str:
        if not self.api_key_env:
            return _PLACEHOLDER_KEY
        key = settings.env.get(self.api_key_env)
        if not key:
            raise ToolUnavailable(
                f"the API key variable {self.api_key_env} (named by api_key_env for model "
                f"{self.model!r}) is not set in the environment"
            )
        return key

    def client(self, settings: ToolSettings, toolset: str) -> openai.AsyncOpenAI:
        """A fresh client; callers close it (``async with``) so no loop outlives a call."""
        timeout_s = float(settings.option(toolset, "timeout_s", default=120.0))
        max_retries = int(settings.option(toolset, "max_retries", default=1))
        return openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key(settings),
            timeout=min(timeout_s, settings.call_timeout_s),
            max_retries=max_retries,
        )

    def describe_error(self, exc: BaseException, settings: ToolSettings) -> str:
        """A short, key-free description of a failed call to this endpoint."""
        if isinstance(exc, openai.APIStatusError):
            text = f"HTTP {exc.status_code}: {exc.message}"
        elif isinstance(exc, openai.APITimeoutError):
            text = "request timed out"
        elif isinstance(exc, openai.APIConnectionError):
            text = f"cannot connect to {self.base_url}: {exc.__cause__ or exc}"
        elif isinstance(exc, json.JSONDecodeError):
            text = "the endpoint returned a body that is not JSON"
        else:
            text = f"{type(exc).__name__}: {exc}"
        key = settings.env.get(self.api_key_env or "")
        if key:
            text = text.replace(key, "***")
        return text[:_ERROR_EXCERPT_CHARS]


# Failures of a model call that become messages instead of exceptions. The openai client
# raises a bare JSONDecodeError (a ValueError) for a non-JSON body.
API_ERRORS: tuple[type[BaseException], ...] = (openai.OpenAIError, ValueError)


def endpoint_from_options(settings: ToolSettings, toolset: str, env_prefix: str) -> ModelEndpoint:
    """Read ``<toolset>.model/base_url/api_key_env`` (or ``<env_prefix>_MODEL`` ...)."""
    model = settings.option(toolset, "model", env=f"{env_prefix}_MODEL")
    base_url = settings.option(toolset, "base_url", env=f"{env_prefix}_BASE_URL")
    missing = [
        f"{toolset}.{key} (or the environment variable {env_prefix}_{key.upper()})"
        for key, value in (("model", model), ("base_url", base_url))
        if not value
    ]
    if missing:
        raise ToolUnavailable(
            f"the {toolset} tools need a model endpoint: set {' and '.join(missing)} in the "
            "job's tools: section; optionally "
            f"{toolset}.api_key_env (or {env_prefix}_API_KEY_ENV) naming the variable that "
            "holds the API key"
        )
    key_env = settings.option(toolset, "api_key_env", env=f"{env_prefix}_API_KEY_ENV")
    endpoint = ModelEndpoint(str(model), str(base_url), str(key_env) if key_env else None)
    endpoint.api_key(settings)  # raises ToolUnavailable when the named variable is unset
    return endpoint


def episode_context(kwargs: Mapping[str, Any]) -> ToolContext | None:
    ctx = kwargs.get("ctx")
    return ctx if isinstance(ctx, ToolContext) else None


# -- mixture of agents configuration ----------------------------------------------------


# -- calls ------------------------------------------------------------------------------


async def complete(
    endpoint: ModelEndpoint,
    settings: ToolSettings,
    toolset: str,
    messages: list[ChatCompletionMessageParam],
    **params: Any,
) -> str:
    """One chat completion; returns the text or raises one of ``API_ERRORS``."""
    extra = {k: v for k, v in params.items() if v is not None}
    async with endpoint.client(settings, toolset) as client:
        response = await client.chat.completions.create(
            model=endpoint.model, messages=messages, **extra
        )
    # A server may answer 200 with no choices; that is no answer, not an empty one.
    if not response.choices or not response.choices[0].message.content:
        raise ValueError("the endpoint returned no message content")
    return response.choices[0].message.content
