"""mixture_of_agents against a fake OpenAI chat-completions server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tools.moa_tool import mixture_of_agents, moa_plan
from tools.registry import registry
from tools.settings import ToolContext, ToolSettings

KEY = "sk-moa-secret"


@dataclass
class FakeChat:
    """Answers ``answer from <model>``; ``bad-*`` models get HTTP 400, ``broken-*`` junk.

    With ``gather`` set, reference calls wait until that many have arrived, so a sequential
    fan-out would time out instead of passing.
    """

    gather: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    arrived: int = 0
    all_arrived: asyncio.Event | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.auth.append(request.headers.get("Authorization"))
        model = body["model"]
        if model.startswith("bad"):
            error = {"error": {"message": f"model {model} does not exist", "type": "invalid"}}
            return web.json_response(error, status=400)
        if model.startswith("broken"):
            return web.Response(text="<html>oops</html>", content_type="application/json")
        if self.gather and body["messages"][0]["role"] == "user":
            await self._wait_for_siblings()
        content = f"answer from {model}"
        if body["messages"][0]["role"] == "system":
            content = f"final from {model}"
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def _wait_for_siblings(self) -> None:
        if self.all_arrived is None:
            self.all_arrived = asyncio.Event()
        self.arrived += 1
        if self.arrived >= self.gather:
            self.all_arrived.set()
        await asyncio.wait_for(self.all_arrived.wait(), timeout=3)


@contextlib.asynccontextmanager
async def fake_openai(fake: FakeChat) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


def run_moa(
    tmp_path: Path, fake: FakeChat, models: list[str], aggregator: str | None = None
) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        async with fake_openai(fake) as base:
            options: dict[str, Any] = {
                "reference_models": [
                    {"model": m, "base_url": base, "api_key_env": "MOA_KEY"} for m in models
                ],
                "max_retries": 0,
                "timeout_s": 10,
            }
            if aggregator:
                options["aggregator"] = {"model": aggregator, "base_url": base}
                options["api_key_env"] = "MOA_KEY"
            settings = ToolSettings(options={"moa": options}, env={"MOA_KEY": KEY})
            ctx = ToolContext(task_id="t", scratch_dir=tmp_path, settings=settings)
            args = {"user_prompt": "What is 2+2?"}
            return json.loads(await mixture_of_agents(args, ctx=ctx, task_id="t"))

    return asyncio.run(scenario())


def test_fans_out_concurrently_and_aggregates(tmp_path: Path) -> None:
    fake = FakeChat(gather=2)
    result = run_moa(tmp_path, fake, ["ref-a", "ref-b", "bad-c"], aggregator="agg")
    assert result["response"] == "final from agg"
    assert result["models_used"] == ["ref-a", "ref-b"]
    assert result["failed_models"] == ["bad-c"]
    assert result["errors"]["bad-c"].startswith("HTTP 400")
    assert result["aggregator"] == "agg"
    # The aggregator saw both reference answers and the user's question.
    final = fake.requests[-1]
    assert final["model"] == "agg"
    system, user = final["messages"]
    assert "answer from ref-a" in system["content"]
    assert "answer from ref-b" in system["content"]
    assert "bad-c" not in system["content"]
    assert user == {"role": "user", "content": "What is 2+2?"}
    assert final["temperature"] == 0.4
    assert {r["temperature"] for r in fake.requests[:-1]} == {0.6}
    assert fake.auth == [f"Bearer {KEY}"] * 4
    assert KEY not in json.dumps(result)


def test_first_reference_aggregates_by_default(tmp_path: Path) -> None:
    fake = FakeChat()
    result = run_moa(tmp_path, fake, ["ref-a", "broken-b"])
    assert result["response"] == "final from ref-a"
    assert result["failed_models"] == ["broken-b"]
    assert "not JSON" in result["errors"]["broken-b"]


def test_all_references_failing_is_an_error(tmp_path: Path) -> None:
    fake = FakeChat()
    result = run_moa(tmp_path, fake, ["bad-a", "bad-b"])
    assert result["error"] == "every reference model failed"
    assert result["failed_models"] == ["bad-a", "bad-b"]
    assert len(fake.requests) == 2  # no aggregator call


def test_failing_aggregator_is_an_error(tmp_path: Path) -> None:
    result = run_moa(tmp_path, FakeChat(), ["ref-a"], aggregator="bad-agg")
    assert "aggregator model 'bad-agg' failed: HTTP 400" in result["error"]
    assert result["models_used"] == ["ref-a"]


def test_environment_configuration() -> None:
    env = {
        "HERMES_MOA_MODELS": "m1, m2,",
        "HERMES_MOA_BASE_URL": "http://127.0.0.1:9/v1",
        "HERMES_MOA_API_KEY_ENV": "MY_KEY",
        "MY_KEY": "k",
    }
    plan = moa_plan(ToolSettings(env=env))
    assert [e.model for e in plan.references] == ["m1", "m2"]
    assert {e.base_url for e in plan.references} == {"http://127.0.0.1:9/v1"}
    assert plan.aggregator == plan.references[0]
    assert registry.check_availability("mixture_of_agents", ToolSettings(env=env)).available


def test_hidden_with_a_reason_when_unconfigured(tmp_path: Path) -> None:
    reason = registry.check_availability("mixture_of_agents", ToolSettings(env={})).reason
    for needle in ("moa.reference_models", "HERMES_MOA_MODELS", "HERMES_MOA_BASE_URL"):
        assert needle in reason
    no_url = ToolSettings(env={"HERMES_MOA_MODELS": "m1"})
    assert "base_url" in registry.check_availability("mixture_of_agents", no_url).reason
    no_key = ToolSettings(
        options={"moa": {"reference_models": [{"model": "m", "base_url": "http://x/v1",
                                               "api_key_env": "ABSENT_KEY"}]}},
        env={},
    )  # fmt: skip
    assert "ABSENT_KEY" in registry.check_availability("mixture_of_agents", no_key).reason
    numbers = ToolSettings(options={"moa": {"reference_models": [1, 2]}}, env={})
    assert (
        "must be a model name" in registry.check_availability("mixture_of_agents", numbers).reason
    )
    ctx = ToolContext(task_id="t", scratch_dir=tmp_path, settings=ToolSettings(env={}))
    result = json.loads(asyncio.run(mixture_of_agents({"user_prompt": "q"}, ctx=ctx)))
    assert "not configured" in result["error"]
    assert (
        "episode context"
        in json.loads(asyncio.run(mixture_of_agents({"user_prompt": "q"})))["error"]
    )
    assert "non-empty" in json.loads(asyncio.run(mixture_of_agents({}, ctx=ctx)))["error"]
