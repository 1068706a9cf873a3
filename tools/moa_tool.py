"""Mixture of agents: ask several models the same question, then let one synthesize."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openai.types.chat import ChatCompletionMessageParam

from tools.model_endpoint import (
    API_ERRORS,
    ModelEndpoint,
    complete,
    episode_context,
)
from tools.registry import ToolUnavailable, registry, tool_error, tool_result
from tools.settings import ToolSettings

logger = logging.getLogger(__name__)

_MOA_HELP = (
    "set moa.reference_models in the job's tools: section (a list of "
    '{"model", "base_url", "api_key_env"}) or the environment variables HERMES_MOA_MODELS '
    "(comma-separated model names), HERMES_MOA_BASE_URL and optionally "
    "HERMES_MOA_API_KEY_ENV (the name of the variable holding the key)"
)


@dataclass(frozen=True, slots=True)
class MoaPlan:
    references: tuple[ModelEndpoint, ...]
    aggregator: ModelEndpoint
    reference_temperature: float
    aggregator_temperature: float
    max_tokens: int | None


def _endpoint_from_item(item: Any, base_url: Any, key_env: Any, what: str) -> ModelEndpoint:
    if not isinstance(item, str | Mapping):
        raise ToolUnavailable(f"{what} {item!r} must be a model name or a mapping; {_MOA_HELP}")
    spec: dict[str, Any] = {"model": item} if isinstance(item, str) else dict(item)
    model = spec.get("model")
    url = spec.get("base_url") or base_url
    if not model or not url:
        raise ToolUnavailable(
            f"{what} {spec!r} needs a model and a base_url (or moa.base_url / "
            f"HERMES_MOA_BASE_URL); {_MOA_HELP}"
        )
    env_name = spec.get("api_key_env") or key_env
    return ModelEndpoint(str(model), str(url), str(env_name) if env_name else None)


def moa_plan(settings: ToolSettings) -> MoaPlan:
    """The configured reference models and aggregator; ToolUnavailable says what is missing."""
    raw = settings.option("moa", "reference_models", env="HERMES_MOA_MODELS")
    base_url = settings.option("moa", "base_url", env="HERMES_MOA_BASE_URL")
    key_env = settings.option("moa", "api_key_env", env="HERMES_MOA_API_KEY_ENV")
    items = [s.strip() for s in raw.split(",") if s.strip()] if isinstance(raw, str) else raw
    if not items or isinstance(items, Mapping):
        raise ToolUnavailable(f"mixture_of_agents has no reference models: {_MOA_HELP}")
    refs = tuple(_endpoint_from_item(i, base_url, key_env, "reference model") for i in items)
    agg_raw = settings.option("moa", "aggregator", env="HERMES_MOA_AGGREGATOR")
    aggregator = (
        _endpoint_from_item(agg_raw, base_url or refs[0].base_url, key_env, "aggregator")
        if agg_raw
        else refs[0]
    )
    for endpoint in (*refs, aggregator):
        endpoint.api_key(settings)
    max_tokens = settings.option("moa", "max_tokens")
    return MoaPlan(
        references=refs,
        aggregator=aggregator,
        reference_temperature=float(settings.option("moa", "reference_temperature", default=0.6)),
        aggregator_temperature=float(settings.option("moa", "aggregator_temperature", default=0.4)),
        max_tokens=int(max_tokens) if max_tokens else None,
    )


def check_moa(settings: ToolSettings) -> bool:
    moa_plan(settings)
    return True


def _aggregator_prompt(answers: list[tuple[str, str]]) -> str:
    numbered = "\n\n".join(
        f"[Response {i} from {model}]\n{text}" for i, (model, text) in enumerate(answers, 1)
    )
    return (
        "Several assistants answered the user's request below. Write a single answer that "
        "is better than each of them: keep what is correct, resolve disagreements, drop "
        "errors and repetition. Do not mention the assistants or their responses.\n\n"
        f"{numbered}"
    )


async def _ask_reference(
    endpoint: ModelEndpoint, plan: MoaPlan, settings: ToolSettings, prompt: str
) -> tuple[str, str | None, str | None]:
    try:
        text = await complete(
            endpoint,
            settings,
            "moa",
            [{"role": "user", "content": prompt}],
            temperature=plan.reference_temperature,
            max_tokens=plan.max_tokens,
        )
    except API_ERRORS as exc:
        logger.info("moa reference model %s failed: %s", endpoint.model, type(exc).__name__)
        return endpoint.model, None, endpoint.describe_error(exc, settings)
    return endpoint.model, text, None


async def mixture_of_agents(args: dict[str, Any], **kwargs: Any) -> str:
    ctx = episode_context(kwargs)
    if ctx is None:
        return tool_error("mixture_of_agents needs an episode context (ctx) to run")
    prompt = args.get("user_prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return tool_error("user_prompt must be a non-empty string")
    try:
        plan = moa_plan(ctx.settings)
    except ToolUnavailable as exc:
        return tool_error(f"mixture_of_agents is not configured: {exc}")
    outcomes = await asyncio.gather(
        *(_ask_reference(ep, plan, ctx.settings, prompt) for ep in plan.references)
    )
    answers = [(model, text) for model, text, _ in outcomes if text is not None]
    errors = {model: err for model, _, err in outcomes if err is not None}
    if not answers:
        return tool_error("every reference model failed", failed_models=list(errors), errors=errors)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": _aggregator_prompt(answers)},
        {"role": "user", "content": prompt},
    ]
    try:
        response = await complete(
            plan.aggregator,
            ctx.settings,
            "moa",
            messages,
            temperature=plan.aggregator_temperature,
            max_tokens=plan.max_tokens,
        )
    except API_ERRORS as exc:
        reason = plan.aggregator.describe_error(exc, ctx.settings)
        return tool_error(
            f"aggregator model {plan.aggregator.model!r} failed: {reason}",
            models_used=[m for m, _ in answers],
            failed_models=list(errors),
        )
    return tool_result(
        response=response,
        models_used=[m for m, _ in answers],
        failed_models=list(errors),
        errors=errors,
        aggregator=plan.aggregator.model,
    )


MOA_SCHEMA = {
    "name": "mixture_of_agents",
    "description": (
        "Ask several strong language models the same question in parallel and get one "
        "synthesized answer. Use it for hard reasoning, math or coding questions where a "
        "second opinion helps; it is slow and costly, so not for simple lookups."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "user_prompt": {
                "type": "string",
                "description": "The complete, self-contained question or task to answer.",
            }
        },
        "required": ["user_prompt"],
    },
}

registry.register(
    name="mixture_of_agents",
    toolset="moa",
    schema=MOA_SCHEMA,
    handler=mixture_of_agents,
    check_fn=check_moa,
    is_async=True,
    emoji="🧠",
)
