"""Throughput of the embedded endpoint (SYNTHETIC scripted policy), JSON and streaming.

Run: ``python bench/bench_endpoint.py [--seconds 3] [--runs 5] [--concurrency 64] [--json f]``.
The server runs in its own process (``serve_forever``) pinned to one core when the OS
allows it; this process drives it with an aiohttp client at the given concurrency, pinned
to the other cores. Each figure is the median requests/s over ``--runs`` runs, with the
server's CPU use over the run: near 100 % means the server was the bottleneck, well under
means the client (sharing a small machine) was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent

SERVER = """
import os, sys
core = int(sys.argv[1])
if core >= 0 and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {core})
from hermes.endpoint.server import EndpointConfig, serve_forever
serve_forever("127.0.0.1", 0, EndpointConfig(), ready=lambda url: print(url, flush=True))
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
]


def request_bodies(count: int, *, stream: bool) -> list[bytes]:
    """Small conversations: a system and a user message, some with a tool turn done."""
    bodies = []
    for i in range(count):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": f"Request {i}: list the files and write a summary."},
        ]
        if i % 2:
            function = {"name": "terminal", "arguments": '{"command": "ls -la"}'}
            call = {"id": "call_1", "type": "function", "function": function}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": "call_1", "content": "total 0\n"})
        body: dict[str, Any] = {"model": "hermes-synthetic", "messages": messages, "tools": TOOLS}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        bodies.append(json.dumps(body).encode())
    return bodies


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc (0.0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(url: str, bodies: list[bytes], seconds: float, concurrency: int) -> int:
    """Requests completed with status 200 in ``seconds``, ``concurrency`` at a time."""
    done = 0
    deadline = time.perf_counter() + seconds
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(offset: int) -> None:
            nonlocal done
            i = offset
            while time.perf_counter() < deadline:
                body = bodies[i % len(bodies)]
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"HTTP {response.status}")
                done += 1
                i += concurrency

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return done


def start_server(core: int) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(core)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    base_url = proc.stdout.readline().strip()
    if not base_url:
        proc.kill()
        raise RuntimeError("the endpoint process exited before listening")
    return proc, base_url


def measure(args: argparse.Namespace, pid: int, url: str, stream: bool) -> dict[str, Any]:
    bodies = request_bodies(256, stream=stream)
    asyncio.run(drive(url, bodies, 0.5, args.concurrency))  # warm-up
    rates, cpu = [], []
    for _ in range(args.runs):
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        count = asyncio.run(drive(url, bodies, args.seconds, args.concurrency))
        elapsed = time.perf_counter() - t0
        rates.append(count / elapsed)
        cpu.append(100 * (cpu_seconds(pid) - cpu0) / elapsed)
    return {
        "median_rps": round(statistics.median(rates)),
        "runs_rps": [round(r) for r in rates],
        "server_cpu_percent": round(statistics.median(cpu)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    server_core = cores[0] if len(cores) > 1 else -1
    if server_core >= 0:
        os.sched_setaffinity(0, set(cores[1:]))  # the client stays off the server's core
    proc, base_url = start_server(server_core)
    try:
        url = base_url + "/chat/completions"
        results = {
            "python": platform.python_version(),
            "cores": len(cores),
            "server_pinned_to_core": server_core,
            "concurrency": args.concurrency,
            "seconds_per_run": args.seconds,
            "non_streaming": measure(args, proc.pid, url, stream=False),
            "streaming": measure(args, proc.pid, url, stream=True),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    text = json.dumps(results, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
