"""Fixtures for the fault suites: a standalone `hermes-batch serve` process, prompt files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runner.helpers import ROOT, write_prompts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class EndpointProcess:
    """The embedded endpoint in a process of its own (`python -m hermes.cli serve`), so a
    test can read its /stats, kill it with SIGKILL and bring it back on the same port."""

    def __init__(self, log_dir: Path, *args: str) -> None:
        self.port = free_port()
        self.args = args
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> EndpointProcess:
        self.starts += 1
        log = (self.log_dir / f"endpoint-{self.port}-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hermes.cli", "serve", "--port", str(self.port), *self.args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the endpoint exited with {self.proc.returncode}; see {log}")
            try:
                self.get("/health")
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the endpoint did not answer on port {self.port} in {timeout} s")

    def get(self, path: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            data: dict[str, Any] = json.loads(response.read())
        return data

    def stats(self) -> dict[str, Any]:
        return self.get("/stats")

    def kill(self) -> None:
        """SIGKILL: the endpoint vanishes mid-request, as a crashed server does."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


@pytest.fixture
def endpoint_process(tmp_path: Path) -> Iterator[Callable[..., EndpointProcess]]:
    """``endpoint_process("--latency-ms", "20", "--fault", "http_500=0.05")`` starts one;
    every process started is stopped at teardown."""
    started: list[EndpointProcess] = []

    def start(*args: str) -> EndpointProcess:
        endpoint = EndpointProcess(tmp_path, *args).start()
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        endpoint.stop()


@pytest.fixture
def prompts(tmp_path: Path) -> Callable[[int], Path]:
    return lambda n: write_prompts(tmp_path / f"prompts_{n}.jsonl", n)


__all__ = ["EndpointProcess", "free_port"]
