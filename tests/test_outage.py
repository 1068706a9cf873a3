"""The outage gate: a down endpoint pauses requests instead of failing every prompt."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from hermes.endpoint import EmbeddedEndpoint, EndpointConfig
from hermes.model_client import ModelClient, ModelSettings, TransientModelError
from hermes.outage import OutageError, OutageGate, OutagePolicy


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_gate_closes_after_threshold_and_admits_one_probe_at_a_time() -> None:
    async def scenario() -> list[str]:
        gate = OutageGate(OutagePolicy(failure_threshold=3, probe_interval_s=0.2, max_outage_s=5))
        events: list[str] = []
        for _ in range(2):
            gate.failure("connection", probe=False)
        assert not gate.closed
        gate.failure("rate_limit", probe=False)  # 429s are back-pressure, not an outage
        assert not gate.closed
        gate.failure("http_500", probe=False)
        assert gate.closed and gate.outages == 1

        async def request(name: str) -> None:
            probe, _waited = await gate.admit()
            events.append(f"{name}:{'probe' if probe else 'go'}")
            if probe:
                await asyncio.sleep(0.05)
                gate.success()

        await asyncio.gather(*(request(f"r{i}") for i in range(5)))
        return events

    events = asyncio.run(scenario())
    assert sum(e.endswith(":probe") for e in events) == 1
    assert sum(e.endswith(":go") for e in events) == 4


def test_gate_gives_up_after_max_outage() -> None:
    async def scenario() -> None:
        gate = OutageGate(
            OutagePolicy(failure_threshold=1, probe_interval_s=0.05, max_outage_s=0.3)
        )
        gate.failure("connection", probe=False)
        while True:
            probe, _ = await gate.admit()
            assert probe
            gate.failure("connection", probe=True)

    started = time.monotonic()
    with pytest.raises(OutageError, match=r"endpoint unavailable for \d+ s"):
        asyncio.run(scenario())
    assert time.monotonic() - started < 1.5


def test_requests_wait_out_an_outage_without_spending_retries() -> None:
    """20 concurrent turns with 1 retry each survive a 1.5 s outage, and the worker sends
    only a handful of requests while the endpoint is down."""
    port = _free_port()
    endpoint = EmbeddedEndpoint(EndpointConfig(seed=1), port=port)
    starter = threading.Timer(1.5, endpoint.start)
    settings = ModelSettings(
        model="hermes-embedded",
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="x",
        max_retries=1,
        backoff_base_s=0.01,
        backoff_max_s=0.02,
        request_timeout_s=2,
        outage=OutagePolicy(failure_threshold=4, probe_interval_s=0.2, max_outage_s=30),
    )

    async def scenario() -> tuple[list[object], ModelClient]:
        client = ModelClient(settings)
        messages = [{"role": "user", "content": "hello"}]
        results = await asyncio.gather(
            *(client.complete(messages, [], deadline=time.monotonic() + 1.0) for _ in range(20)),
            return_exceptions=True,
        )
        await client.close()
        return results, client

    starter.start()
    try:
        results, client = asyncio.run(scenario())
    finally:
        starter.cancel()
        endpoint.stop()
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == []
    # The deadline (1 s) is shorter than the outage (1.5 s): waiting did not count.
    assert max(float(getattr(r, "paused_s", 0.0)) for r in results) >= 0.5
    assert client.gate.outages == 1 and not client.gate.closed
    served = endpoint.stats()["requests"]
    assert served == 20


def test_an_outage_longer_than_the_limit_fails_as_transient() -> None:
    settings = ModelSettings(
        model="m",
        base_url=f"http://127.0.0.1:{_free_port()}/v1",
        api_key="x",
        max_retries=5,
        backoff_base_s=0.01,
        backoff_max_s=0.02,
        outage=OutagePolicy(failure_threshold=2, probe_interval_s=0.1, max_outage_s=0.5),
    )

    async def scenario() -> None:
        client = ModelClient(settings)
        try:
            await client.complete([{"role": "user", "content": "x"}], [])
        finally:
            await client.close()

    with pytest.raises(TransientModelError) as info:
        asyncio.run(scenario())
    assert info.value.kind == "outage"
    assert "endpoint unavailable" in str(info.value) and "connection" in str(info.value)
