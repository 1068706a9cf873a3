"""The embedded OpenAI-compatible HTTP server, answering with a SYNTHETIC scripted policy.

For smoke runs, the test suite and benchmarks only: no model is behind it. It speaks
``POST /v1/chat/completions`` (JSON and SSE streaming), ``GET /v1/models``, ``GET /health``
and ``GET /stats`` (request and injected-fault counters), on a bare ``aiohttp.web.Server``
without router, middlewares or access log, so it sustains thousands of requests per
second on one core. Use ``EmbeddedEndpoint`` in-process (own thread and event loop) or
``serve_forever`` in a process of its own. ``temperature``, ``top_p`` and other sampling
options are accepted and ignored: the policy is deterministic.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import Any

from aiohttp import web

from hermes.endpoint.faults import (
    FAULT_KINDS,
    NO_FAULT,
    AttemptCounter,
    FaultRates,
    apply_content_fault,
    draw_faults,
)
from hermes.endpoint.policy import (
    Decision,
    PolicyConfig,
    RequestError,
    completion_tokens,
    decide,
    offered_tools,
    prompt_tokens,
    read_conversation,
)
from hermes.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "hermes-synthetic"
MAX_BODY_BYTES = 256 * 1024 * 1024
_JSON = "application/json"
_HTML_BODY = (
    "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>"
    "<h1>Bad Gateway</h1><p>hermes embedded endpoint: injected html_200 fault</p>"
    "</body></html>"
)


@dataclass(frozen=True, kw_only=True)
class EndpointConfig:
    """Settings of the embedded endpoint and its SYNTHETIC scripted policy.

    ``seed`` applies when a request carries none. ``reasoning``: ``auto`` (only when the
    request asks), ``always`` or ``never``; ``reasoning_style``: ``field``
    (``reasoning_content``) or ``think_tags`` (``<think>...</think>`` at the start of the
    content). Every request waits ``latency_ms`` plus up to ``jitter_ms``.
    """

    model: str = DEFAULT_MODEL
    aliases: tuple[str, ...] = ()
    seed: int = 0
    min_tool_turns: int = 1
    max_tool_turns: int = 3
    max_calls_per_turn: int = 2
    reasoning: str = "auto"
    reasoning_style: str = "field"
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    stream_chunk_chars: int = 24
    faults: FaultRates = field(default_factory=FaultRates)

    def __post_init__(self) -> None:
        self.policy_config()  # validates the policy fields
        if not self.model:
            raise ConfigError("the endpoint's model name must not be empty")
        if self.latency_ms < 0 or self.jitter_ms < 0:
            raise ConfigError("latency_ms and jitter_ms must be >= 0")
        if self.stream_chunk_chars < 1:
            raise ConfigError("stream_chunk_chars must be >= 1")

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            seed=self.seed,
            min_tool_turns=self.min_tool_turns,
            max_tool_turns=self.max_tool_turns,
            max_calls_per_turn=self.max_calls_per_turn,
            reasoning=self.reasoning,
            reasoning_style=self.reasoning_style,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EndpointConfig:
        """Build from a job file's mapping; unknown keys are a ConfigError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown endpoint option(s) {unknown}; known: {sorted(known)}")
        values = dict(data)
        if isinstance(values.get("faults"), Mapping):
            values["faults"] = FaultRates.from_dict(values["faults"])
        if isinstance(values.get("aliases"), list):
            values["aliases"] = tuple(values["aliases"])
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"invalid endpoint option: {exc}") from exc


# -- rendering ---------------------------------------------------------------------------


def _usage(body: Mapping[str, Any], decision: Decision) -> dict[str, int]:
    prompt = prompt_tokens(body["messages"], offered_tools(body))
    completion = completion_tokens(decision)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _message(decision: Decision) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": decision.content}
    if decision.reasoning is not None:
        message["reasoning_content"] = decision.reasoning
    if decision.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in decision.tool_calls
        ]
    return message


def completion_body(
    decision: Decision, *, cid: str, model: str, usage: dict[str, int]
) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    choice = {
        "index": 0,
        "message": _message(decision),
        "logprobs": None,
        "finish_reason": decision.finish_reason,
    }
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def _pieces(text: str, size: int) -> list[str]:
    # Huge texts get bigger pieces: a 5 MB answer in 24-char chunks would take seconds.
    size = max(size, len(text) // 512)
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_events(
    decision: Decision, *, cid: str, model: str, usage: dict[str, int] | None, piece: int
) -> list[bytes]:
    """The SSE ``data:`` events of a streamed answer, ``[DONE]`` included."""
    head = f'{{"id":"{cid}","object":"chat.completion.chunk","created":{int(time.time())},'
    head += f'"model":{json.dumps(model)},"choices":'

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return f"data: {head}[{json.dumps(choice)}]}}\n\n".encode()

    events = [event({"role": "assistant", "content": ""})]
    events += [event({"reasoning_content": p}) for p in _pieces(decision.reasoning or "", piece)]
    events += [event({"content": p}) for p in _pieces(decision.content or "", piece)]
    for index, call in enumerate(decision.tool_calls):
        function = {"name": call.name, "arguments": ""}
        first = {"index": index, "id": call.id, "type": "function", "function": function}
        events.append(event({"tool_calls": [first]}))
        events += [
            event({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in _pieces(call.arguments, piece)
        ]
    events.append(event({}, decision.finish_reason))
    if usage is not None:
        events.append(f'data: {head}[],"usage":{json.dumps(usage)}}}\n\n'.encode())
    events.append(b"data: [DONE]\n\n")
    return events


def error_response(
    status: int, message: str, kind: str, *, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An OpenAI-style error body: ``{"error": {"message", "type", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type=_JSON, headers=headers
    )


def _json_response(data: Any) -> web.Response:
    return web.Response(body=json.dumps(data).encode(), content_type=_JSON)


# -- the server --------------------------------------------------------------------------


class EndpointServer:
    """The endpoint on the current event loop: ``await start(host, port)``, ``await close()``.

    Counters (``stats()``) and the per-body attempt table live here, one set per server.
    """

    def __init__(self, config: EndpointConfig | None = None) -> None:
        self.config = config or EndpointConfig()
        self._policy = self.config.policy_config()
        self._attempts = AttemptCounter()
        # Jitter only shifts timing, never content, so a per-server RNG is enough.
        self._jitter_rng = random.Random(self.config.seed)
        self._counts = {"requests": 0, "bad_requests": 0, "streamed": 0, "completions": 0}
        self._faults = dict.fromkeys(FAULT_KINDS, 0)
        self._serial = 0
        self._runner: web.ServerRunner | None = None
        self._routes: dict[str, tuple[str, Callable[[web.BaseRequest], Any]]] = {
            "/v1/chat/completions": ("POST", self._completions),
            "/chat/completions": ("POST", self._completions),
            "/v1/models": ("GET", self._models),
            "/models": ("GET", self._models),
            "/health": ("GET", self._health),
            "/stats": ("GET", self._stats),
        }

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0: a free port) and return the bound port."""
        # handler_cancellation: a client giving up on a hung request frees its handler.
        server = web.Server(self._dispatch, access_log=None, handler_cancellation=True)
        self._runner = web.ServerRunner(server, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        bound: int = self._runner.addresses[0][1]
        return bound

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def stats(self) -> dict[str, Any]:
        """Requests seen and faults injected, by kind."""
        return {
            **self._counts,
            "faults": dict(self._faults),
            "faults_total": sum(self._faults.values()),
        }

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        route = self._routes.get(request.path)
        if route is None:
            return error_response(404, f"no route {request.path}", "invalid_request_error")
        method, handler = route
        if request.method != method:
            return error_response(
                405, f"{request.path} accepts {method} only", "invalid_request_error"
            )
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            return error_response(exc.status, exc.reason, "invalid_request_error")
        except Exception as exc:
            # A policy bug must still answer in the protocol's error format, and loudly.
            logger.exception("the embedded endpoint failed on %s", request.path)
            return error_response(500, f"embedded endpoint error: {exc!r}", "server_error")
        return response

    async def _models(self, request: web.BaseRequest) -> web.Response:
        names = (self.config.model, *self.config.aliases)
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "hermes"} for n in names]
        return _json_response({"object": "list", "data": data})

    async def _health(self, request: web.BaseRequest) -> web.Response:
        return _json_response({"status": "ok", "policy": "synthetic"})

    async def _stats(self, request: web.BaseRequest) -> web.Response:
        return _json_response(self.stats())

    async def _completions(self, request: web.BaseRequest) -> web.StreamResponse:
        self._counts["requests"] += 1
        if (request.content_length or 0) > MAX_BODY_BYTES:
            self._counts["bad_requests"] += 1
            message = f"request body over {MAX_BODY_BYTES} bytes"
            return error_response(413, message, "invalid_request_error")
        # Not request.read(): its 1 MiB cap is far below a long agent conversation.
        raw = await request.content.read()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            decision = decide(body, self._policy)
        except ValueError as exc:  # JSONDecodeError and RequestError are ValueErrors
            self._counts["bad_requests"] += 1
            return error_response(400, f"invalid request: {exc}", "invalid_request_error")
        stream = body.get("stream") is True
        tools = offered_tools(body)
        faults = self.config.faults
        draw = NO_FAULT
        if faults.enabled:
            attempt = self._attempts.next(raw)
            draw = draw_faults(faults, raw, attempt, stream=stream, has_tools=bool(tools))
        await self._latency()
        if draw.transport is not None:
            self._faults[draw.transport] += 1
            if draw.transport != "truncated_stream":
                return await self._transport_fault(draw.transport, stream, body)
        if draw.content is not None:
            self._faults[draw.content] += 1
            prompt = read_conversation(body["messages"]).prompt
            call_id = "call_" + hashlib.sha256(raw).hexdigest()[:16]
            decision = apply_content_fault(
                draw.content, decision, tools, faults, prompt, call_id=call_id
            )
        return await self._answer(request, body, decision, stream, draw.transport is not None)

    async def _answer(
        self,
        request: web.BaseRequest,
        body: Mapping[str, Any],
        decision: Decision,
        stream: bool,
        truncate: bool,
    ) -> web.StreamResponse:
        self._serial += 1
        cid = f"chatcmpl-{self._serial:012x}"
        model = self._model_name(body)
        usage = _usage(body, decision)
        self._counts["completions"] += 1
        if not stream:
            return _json_response(completion_body(decision, cid=cid, model=model, usage=usage))
        self._counts["streamed"] += 1
        options = body.get("stream_options")
        wants_usage = isinstance(options, Mapping) and options.get("include_usage") is True
        events = stream_events(
            decision,
            cid=cid,
            model=model,
            usage=usage if wants_usage else None,
            piece=self.config.stream_chunk_chars,
        )
        return await _send_stream(request, b"".join(events), truncate=truncate)

    def _model_name(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) and model else self.config.model

    async def _latency(self) -> None:
        cfg = self.config
        if cfg.latency_ms or cfg.jitter_ms:
            delay = cfg.latency_ms + self._jitter_rng.uniform(0, cfg.jitter_ms)
            await asyncio.sleep(delay / 1000)

    async def _transport_fault(
        self, kind: str, stream: bool, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        faults = self.config.faults
        if kind == "hang":
            await asyncio.sleep(faults.hang_s)
            return error_response(504, "injected hang fault elapsed", "server_error")
        if kind == "http_500":
            message = "The server had an error processing your request (injected http_500)"
            return error_response(500, message, "server_error")
        if kind == "http_429":
            headers = {"Retry-After": f"{faults.retry_after_s:g}"}
            message = "Rate limit reached (injected http_429)"
            return error_response(429, message, "rate_limit_error", headers=headers)
        if kind == "html_200":
            return web.Response(status=200, text=_HTML_BODY, content_type="text/html")
        return self._empty_choices(stream, body)

    def _empty_choices(self, stream: bool, body: Mapping[str, Any]) -> web.Response:
        self._serial += 1
        model = self._model_name(body)
        data: dict[str, Any] = {
            "id": f"chatcmpl-{self._serial:012x}",
            "object": "chat.completion.chunk" if stream else "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [],
        }
        if not stream:
            data["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            return _json_response(data)
        payload = f"data: {json.dumps(data)}\n\ndata: [DONE]\n\n"
        return web.Response(body=payload.encode(), content_type="text/event-stream")


async def _send_stream(
    request: web.BaseRequest, payload: bytes, *, truncate: bool
) -> web.StreamResponse:
    """Send SSE events; with ``truncate``, send half of them and drop the connection."""
    if not truncate:
        headers = {"Cache-Control": "no-cache"}
        return web.Response(body=payload, content_type="text/event-stream", headers=headers)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    # Half the bytes lands mid-event, and always before the final "[DONE]" event.
    await response.write(payload[: len(payload) // 2])
    if request.transport is not None:
        request.transport.close()
    return response


# -- running it --------------------------------------------------------------------------


class EmbeddedEndpoint:
    """The endpoint in a background thread with its own event loop, for in-process use.

    ``with EmbeddedEndpoint(config) as ep: client(base_url=ep.base_url)``; or call
    ``start()``/``stop()``. Port 0 (the default) picks a free port.
    """

    def __init__(
        self, config: EndpointConfig | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.server = EndpointServer(config)
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, the ``base_url`` an OpenAI client needs."""
        return f"http://{self.host}:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        return self.server.stats()

    def start(self, timeout_s: float = 30.0) -> EmbeddedEndpoint:
        """Start listening; returns once the port is bound (raises OSError if it cannot)."""
        if self._thread is not None:
            raise RuntimeError("this EmbeddedEndpoint is already started")
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="hermes-endpoint", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError(f"the embedded endpoint did not start within {timeout_s} s")
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise self._error
        return self

    def stop(self) -> None:
        """Stop listening, end pending requests (hung ones included) and join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        self._thread = self._loop = None

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            self.port = loop.run_until_complete(self.server.start(self.host, self.port))
        except OSError as exc:
            self._error = exc
            loop.close()
            ready.set()
            return
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self.server.close())
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def __enter__(self) -> EmbeddedEndpoint:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve_forever(
    host: str,
    port: int,
    config: EndpointConfig,
    *,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM. ``ready(base_url)`` is called once listening."""
    asyncio.run(_serve(host, port, config, ready))


async def _serve(
    host: str, port: int, config: EndpointConfig, ready: Callable[[str], None] | None
) -> None:
    server = EndpointServer(config)
    bound = await server.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    url = f"http://{host}:{bound}/v1"
    logger.info("embedded endpoint (SYNTHETIC scripted policy) listening on %s", url)
    if ready is not None:
        ready(url)
    try:
        await stop.wait()
    finally:
        await server.close()


SERVE_HELP = (
    "Run the embedded OpenAI-compatible endpoint. Its answers come from a SYNTHETIC "
    "scripted policy (deterministic tool calls with schema-valid arguments, optional "
    "injected faults) meant for smoke runs, tests and benchmarks, not for real data: "
    "point --base_url at vLLM, SGLang, OpenAI or another real server for that."
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a ``serve`` subcommand; turn them into a config with config_from_args."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name to report")
    parser.add_argument("--seed", type=int, default=0, help="policy seed for seedless requests")
    parser.add_argument("--min-tool-turns", type=int, default=1)
    parser.add_argument("--max-tool-turns", type=int, default=3)
    parser.add_argument("--reasoning", choices=["auto", "always", "never"], default="auto")
    parser.add_argument("--reasoning-style", choices=["field", "think_tags"], default="field")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND=P",
        help=f"inject a fault with probability P; KIND is one of {', '.join(FAULT_KINDS)}, "
        "or a fault option (seed, retry_after_s, hang_s, huge_output_bytes)",
    )


def config_from_args(args: argparse.Namespace) -> EndpointConfig:
    """An EndpointConfig from add_serve_arguments options (ConfigError when invalid)."""
    faults: dict[str, float] = {}
    for item in args.fault:
        kind, sep, value = item.partition("=")
        try:
            faults[kind.strip()] = float(value) if sep else 1.0
        except ValueError as exc:
            raise ConfigError(f"--fault {item!r}: expected KIND=NUMBER") from exc
    if "huge_output_bytes" in faults or "seed" in faults:
        faults = {k: int(v) if k in ("huge_output_bytes", "seed") else v for k, v in faults.items()}
    return EndpointConfig(
        model=args.model,
        seed=args.seed,
        min_tool_turns=args.min_tool_turns,
        max_tool_turns=args.max_tool_turns,
        reasoning=args.reasoning,
        reasoning_style=args.reasoning_style,
        latency_ms=args.latency_ms,
        jitter_ms=args.jitter_ms,
        faults=FaultRates.from_dict(faults),
    )
