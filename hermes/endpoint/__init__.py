"""The embedded OpenAI-compatible endpoint, driven by a SYNTHETIC scripted policy.

No model is behind it: it exists for smoke runs (the quickstart job), the test suite and
benchmarks. It speaks the Chat Completions protocol over real HTTP (JSON and streaming),
calls the tools it is offered with schema-valid arguments in a deterministic plan, and can
inject faults (errors, rate limits, bad bodies, hangs, malformed or unknown tool calls,
huge outputs, truncated streams). Real trajectories come from pointing the runner's
``base_url`` at vLLM, SGLang, OpenAI, OpenRouter or any compatible server.
"""

from __future__ import annotations

from hermes.endpoint.faults import FAULT_KINDS, FaultRates
from hermes.endpoint.policy import Decision, PolicyConfig, ToolCall, decide
from hermes.endpoint.server import (
    DEFAULT_MODEL,
    SERVE_HELP,
    EmbeddedEndpoint,
    EndpointConfig,
    EndpointServer,
    add_serve_arguments,
    config_from_args,
    serve_forever,
)

__all__ = [
    "DEFAULT_MODEL",
    "FAULT_KINDS",
    "SERVE_HELP",
    "Decision",
    "EmbeddedEndpoint",
    "EndpointConfig",
    "EndpointServer",
    "FaultRates",
    "PolicyConfig",
    "ToolCall",
    "add_serve_arguments",
    "config_from_args",
    "decide",
    "serve_forever",
]
