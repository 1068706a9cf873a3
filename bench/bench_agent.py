"""CPU cost of the agent loop per model turn, and the embedded endpoint's throughput.

Run: ``python bench/bench_agent.py [--episodes 200] [--concurrency 32] [--reps 5] [--json f]``.

The embedded endpoint (SYNTHETIC scripted policy, zero latency) runs in a process of its
own, pinned to one core when the OS allows it, so its CPU is never counted here. Figures:

1. the endpoint's requests/s, JSON and streaming (``bench_endpoint.measure``);
2. the loop's CPU time per model turn with no-op async tools: ``--episodes`` episodes,
   ``--concurrency`` at a time through one shared client and dispatcher (as a worker
   runs them), this process's CPU time (all threads) divided by the model turns; once
   with a JSON client and once with a streaming one;
3. the same with the real ``terminal`` tool, adding the CPU of the shell processes it
   starts (``RUSAGE_CHILDREN``; the endpoint process is a child too, but only reaped
   children count, and it is reaped after the last repetition).

Each figure is the median over ``--reps`` repetitions, after one warm-up repetition.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_endpoint import measure  # noqa: E402

from hermes.agent import EpisodeRecord, EpisodeSettings, run_episode  # noqa: E402
from hermes.model_client import ModelClient, ModelSettings  # noqa: E402
from tools.discovery import discover_tools  # noqa: E402
from tools.dispatch import ToolDispatcher  # noqa: E402
from tools.registry import RegistrySnapshot, ToolRegistry, registry, tool_result  # noqa: E402
from tools.settings import ToolSettings  # noqa: E402

SERVER = """
import json, os, sys
core, config = int(sys.argv[1]), json.loads(sys.argv[2])
if core >= 0 and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {core})
from hermes.endpoint.server import EndpointConfig, serve_forever
ready = lambda url: print(url, flush=True)
serve_forever("127.0.0.1", 0, EndpointConfig(**config), ready=ready)
"""

NOOP_TOOLS: dict[str, dict[str, Any]] = {
    "lookup": {
        "query": {"type": "string", "description": "What to look up."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
    },
    "note": {
        "text": {"type": "string", "description": "The note."},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "flag": {"enabled": {"type": "boolean"}, "reason": {"type": "string"}},
}


async def noop_handler(args: dict[str, Any], **kwargs: Any) -> str:
    return tool_result(ok=True, received=sorted(args))


def noop_snapshot() -> RegistrySnapshot:
    """Three async tools that do nothing: what is left is the loop and dispatch itself."""
    fresh = ToolRegistry()
    for name, properties in NOOP_TOOLS.items():
        required = [next(iter(properties))]
        parameters = {"type": "object", "properties": properties, "required": required}
        schema = {"name": name, "description": f"A no-op {name} tool.", "parameters": parameters}
        fresh.register(name=name, toolset="noop", schema=schema, handler=noop_handler)
    return fresh.snapshot(ToolSettings(env={"PATH": os.environ["PATH"]}))


def terminal_snapshot() -> RegistrySnapshot:
    discover_tools()
    return registry.snapshot(ToolSettings(env={"PATH": os.environ["PATH"]}))


@dataclass(frozen=True)
class Scenario:
    name: str
    snapshot: RegistrySnapshot
    toolsets: tuple[str, ...]
    stream: bool = False


@dataclass(frozen=True)
class Rep:
    """One repetition: totals over its episodes."""

    episodes: int
    turns: int
    tool_calls: int
    wall_s: float
    self_cpu_s: float
    child_cpu_s: float
    finish: dict[str, int]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def run_rep(
    scenario: Scenario, base_url: str, args: argparse.Namespace, rep: int, scratch: Path
) -> tuple[Rep, list[EpisodeRecord]]:
    # Built outside the timed part: a worker creates them once, not per episode.
    settings = ModelSettings(
        model="hermes-synthetic",
        base_url=base_url,
        api_key="bench",
        stream=scenario.stream,
        max_retries=0,
        request_timeout_s=60.0,
    )
    client = ModelClient(settings)
    dispatcher = ToolDispatcher(scenario.snapshot)
    tool_names = scenario.snapshot.tools_for(scenario.toolsets)
    episode_settings = EpisodeSettings(max_turns=20, scratch_root=scratch)
    limit = asyncio.Semaphore(args.concurrency)

    async def one(i: int) -> EpisodeRecord:
        async with limit:
            return await run_episode(
                f"Task {rep}-{i}: look into item {i} and write down what you find.",
                task_id=f"bench-{rep}-{i}",
                tool_names=tool_names,
                dispatcher=dispatcher,
                client=client,
                settings=episode_settings,
            )

    try:
        wall0, cpu0, child0 = time.perf_counter(), time.process_time(), children_cpu()
        records = await asyncio.gather(*(one(i) for i in range(args.episodes)))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        child = children_cpu() - child0
    finally:
        await client.close()
        dispatcher.close()
    rep_result = Rep(
        episodes=len(records),
        turns=sum(r.api_calls for r in records),
        tool_calls=sum(r.num_tool_calls for r in records),
        wall_s=wall,
        self_cpu_s=cpu,
        child_cpu_s=child,
        finish=dict(Counter(r.finish_reason for r in records)),
    )
    return rep_result, records


def measure_loop(
    scenario: Scenario, base_url: str, args: argparse.Namespace
) -> tuple[dict[str, Any], list[EpisodeRecord]]:
    """The loop's figures, and the episodes of the warm-up repetition."""
    reps: list[Rep] = []
    warm_up: list[EpisodeRecord] = []
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as scratch:
        for rep in range(args.reps + 1):
            result, records = asyncio.run(run_rep(scenario, base_url, args, rep, Path(scratch)))
            if rep:  # repetition 0 warms up imports, caches and connections
                reps.append(result)
            else:
                warm_up = records
    per_turn = [1e6 * r.self_cpu_s / r.turns for r in reps]
    child_per_turn = [1e6 * r.child_cpu_s / r.turns for r in reps]
    total_per_turn = [a + b for a, b in zip(per_turn, child_per_turn, strict=True)]
    finish: Counter[str] = Counter()
    for r in reps:
        finish.update(r.finish)
    figures = {
        "scenario": scenario.name,
        "stream": scenario.stream,
        "episodes_per_rep": args.episodes,
        "turns_per_episode": round(reps[0].turns / reps[0].episodes, 2),
        "tool_calls_per_turn": round(reps[0].tool_calls / reps[0].turns, 2),
        "self_cpu_us_per_turn": round(statistics.median(per_turn)),
        "self_cpu_us_per_turn_runs": [round(v) for v in per_turn],
        "child_cpu_us_per_turn": round(statistics.median(child_per_turn)),
        "total_cpu_us_per_turn": round(statistics.median(total_per_turn)),
        "turns_per_s_wall": round(statistics.median(r.turns / r.wall_s for r in reps)),
        "finish_reasons": dict(finish),
    }
    return figures, warm_up


def request_prefixes(records: list[EpisodeRecord]) -> list[list[dict[str, Any]]]:
    """The message lists the loop sent: each conversation up to each assistant turn."""
    out = []
    for record in records:
        sent = [{k: v for k, v in m.items() if k != "reasoning"} for m in record.messages]
        out += [sent[:i] for i, m in enumerate(sent) if m["role"] == "assistant"]
    return out


async def replay_once(
    base_url: str,
    requests: list[list[dict[str, Any]]],
    tools: list[dict[str, Any]],
    concurrency: int,
) -> float:
    """This process's CPU seconds to send ``requests`` through a bare ModelClient."""
    settings = ModelSettings(
        model="hermes-synthetic", base_url=base_url, api_key="bench", max_retries=0
    )
    client = ModelClient(settings)
    limit = asyncio.Semaphore(concurrency)

    async def one(messages: list[dict[str, Any]]) -> None:
        async with limit:
            await client.complete(messages, tools)

    try:
        cpu0 = time.process_time()
        await asyncio.gather(*(one(m) for m in requests))
        return time.process_time() - cpu0
    finally:
        await client.close()


def measure_client(
    scenario: Scenario, base_url: str, args: argparse.Namespace, records: list[EpisodeRecord]
) -> dict[str, Any]:
    """The model client alone on the very requests the loop sent: the loop's share is
    the difference."""
    requests = request_prefixes(records)
    tools = scenario.snapshot.get_definitions(scenario.snapshot.tools_for(scenario.toolsets))
    per_call = []
    for rep in range(args.reps + 1):
        cpu = asyncio.run(replay_once(base_url, requests, tools, args.concurrency))
        if rep:
            per_call.append(1e6 * cpu / len(requests))
    return {
        "requests_per_rep": len(requests),
        "self_cpu_us_per_call": round(statistics.median(per_call)),
        "self_cpu_us_per_call_runs": [round(v) for v in per_call],
    }


def start_server(core: int, config: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(core), json.dumps(config)],
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


def table(results: dict[str, Any]) -> str:
    ep = results["endpoint"]
    lines = [
        f"python {results['python']}, {results['cores']} cores, endpoint pinned to core "
        f"{results['server_pinned_to_core']}, {results['episodes_per_rep']} episodes x "
        f"{results['reps']} reps, concurrency {results['concurrency']}",
        "",
        "embedded endpoint              req/s   server CPU",
        f"  JSON                      {ep['non_streaming']['median_rps']:>8}   "
        f"{ep['non_streaming']['server_cpu_percent']:>4} %",
        f"  streaming                 {ep['streaming']['median_rps']:>8}   "
        f"{ep['streaming']['server_cpu_percent']:>4} %",
        "",
        "agent loop, CPU per model turn (us)   loop  children  total  turns/s  calls/turn",
    ]
    for row in results["loop"]:
        lines.append(
            f"  {row['scenario']:<34}{row['self_cpu_us_per_turn']:>6}"
            f"{row['child_cpu_us_per_turn']:>10}{row['total_cpu_us_per_turn']:>7}"
            f"{row['turns_per_s_wall']:>9}{row['tool_calls_per_turn']:>12}"
        )
    client = results["client_only"]
    lines += [
        "",
        f"model client alone, same {client['requests_per_rep']} requests as the first row: "
        f"{client['self_cpu_us_per_call']} us per call",
        f"  so the loop's own share (dispatch, messages, records) is about "
        f"{client['loop_own_cpu_us_per_turn']} us per turn",
    ]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per repetition")
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    parser.add_argument("--reps", type=int, default=5, help="measured repetitions")
    parser.add_argument("--tool-turns", type=int, default=3, help="tool turns per episode")
    parser.add_argument("--seconds", type=float, default=2.0, help="per endpoint run")
    parser.add_argument("--runs", type=int, default=3, help="endpoint runs")
    parser.add_argument("--http-concurrency", type=int, default=64, help="endpoint bench")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    server_core = cores[0] if len(cores) > 1 else -1
    if server_core >= 0:
        os.sched_setaffinity(0, set(cores[1:]))  # this process stays off the server's core
    config = {"min_tool_turns": args.tool_turns, "max_tool_turns": args.tool_turns}
    proc, base_url = start_server(server_core, config)
    noop, terminal = noop_snapshot(), terminal_snapshot()
    scenarios = [
        Scenario("no-op tools, JSON", noop, ("noop",)),
        Scenario("no-op tools, streaming", noop, ("noop",), stream=True),
        Scenario("terminal tool, JSON", terminal, ("terminal",)),
    ]
    try:
        endpoint_args = argparse.Namespace(
            runs=args.runs, seconds=args.seconds, concurrency=args.http_concurrency
        )
        url = base_url + "/chat/completions"
        results: dict[str, Any] = {
            "python": platform.python_version(),
            "cores": len(cores),
            "server_pinned_to_core": server_core,
            "episodes_per_rep": args.episodes,
            "reps": args.reps,
            "concurrency": args.concurrency,
            "endpoint": {
                "non_streaming": measure(endpoint_args, proc.pid, url, stream=False),
                "streaming": measure(endpoint_args, proc.pid, url, stream=True),
            },
        }
        loop = [measure_loop(s, base_url, args) for s in scenarios]
        results["loop"] = [figures for figures, _ in loop]
        client = measure_client(scenarios[0], base_url, args, loop[0][1])
        client["loop_own_cpu_us_per_turn"] = (
            results["loop"][0]["self_cpu_us_per_turn"] - client["self_cpu_us_per_call"]
        )
        results["client_only"] = client
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    text = json.dumps(results, indent=2)
    sys.stdout.write(table(results) + "\n")
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
