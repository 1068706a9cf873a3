"""Registry throughput: discovery time of the built-in tools and dispatch overhead per call.

Run: ``python bench/bench_registry.py [--rounds 7] [--calls 20000] [--json out.json]``.
Each figure is the median over ``--rounds`` rounds; discovery is measured in a fresh
interpreter each round (imports are cached per process), dispatch in this process.
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
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.dispatch import ToolDispatcher  # noqa: E402
from tools.registry import ToolRegistry  # noqa: E402
from tools.settings import ToolContext, ToolSettings  # noqa: E402

DISCOVERY_PROBE = """
import json, sys, time
if "--warm" in sys.argv:
    import openai, aiohttp  # what a batch worker has imported before discovery runs
t0 = time.perf_counter()
from tools.discovery import discover_tools
t1 = time.perf_counter()
report = discover_tools()
t2 = time.perf_counter()
from tools.registry import registry
from tools.settings import ToolSettings
t3 = time.perf_counter()
snap = registry.snapshot(ToolSettings())
t4 = time.perf_counter()
print(json.dumps({"import_core_s": t1 - t0, "discover_s": t2 - t1, "snapshot_s": t4 - t3,
                  "tools": len(registry.tool_names()), "failed": len(report.failed)}))
"""


def _probe(rounds: int, *flags: str) -> list[dict[str, Any]]:
    samples = []
    for _ in range(rounds):
        out = subprocess.run(
            [sys.executable, "-c", DISCOVERY_PROBE, *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        samples.append(json.loads(out.stdout))
    return samples


def measure_discovery(rounds: int) -> dict[str, Any]:
    cold = _probe(rounds)
    warm = _probe(rounds, "--warm")
    return {
        "tools": cold[0]["tools"],
        "failed_imports": cold[0]["failed"],
        "discover_ms": 1000 * statistics.median(s["discover_s"] for s in cold),
        "discover_openai_preloaded_ms": 1000 * statistics.median(s["discover_s"] for s in warm),
        "snapshot_ms": 1000 * statistics.median(s["snapshot_s"] for s in cold),
        "import_core_ms": 1000 * statistics.median(s["import_core_s"] for s in cold),
    }


def _trivial(args: dict[str, Any], **kwargs: Any) -> str:
    return '{"ok": true}'


async def _trivial_async(args: dict[str, Any], **kwargs: Any) -> str:
    return '{"ok": true}'


def _registry() -> ToolRegistry:
    reg = ToolRegistry()
    params = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for name, handler in (("sync_tool", _trivial), ("async_tool", _trivial_async)):
        reg.register(
            name=name,
            toolset="bench",
            handler=handler,
            schema={"name": name, "description": "no-op", "parameters": params},
        )
    return reg


def measure_dispatch(rounds: int, calls: int) -> dict[str, float]:
    reg = _registry()
    dispatcher = ToolDispatcher(reg.snapshot(ToolSettings(env={})))
    with tempfile.TemporaryDirectory() as tmp:
        ctx = ToolContext(task_id="bench", scratch_dir=Path(tmp))
        raw = '{"n": "5"}'

        def per_call_us(fn: Any) -> float:
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                fn()
                times.append((time.perf_counter() - started) / calls * 1e6)
            return statistics.median(times)

        def registry_dispatch() -> None:
            for _ in range(calls):
                reg.dispatch("sync_tool", {"n": 5})

        def direct_call() -> None:
            for _ in range(calls):
                _trivial({"n": 5})

        def pipeline(name: str) -> Any:
            async def run() -> None:
                for _ in range(calls):
                    await dispatcher.call(name, raw, ctx)

            return lambda: asyncio.run(run())

        results = {
            "direct_handler_call_us": per_call_us(direct_call),
            "registry_dispatch_us": per_call_us(registry_dispatch),
            "pipeline_async_handler_us": per_call_us(pipeline("async_tool")),
            "pipeline_sync_handler_us": per_call_us(pipeline("sync_tool")),
        }
    dispatcher.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args()
    result = {
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "date": time.strftime("%Y-%m-%d"),
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "discovery": measure_discovery(args.rounds),
        "dispatch": measure_dispatch(args.rounds, args.calls),
    }
    print(f"registry benchmark ({result['machine']}, medians of {args.rounds} rounds)")
    d = result["discovery"]
    print(
        f"  discovery of {d['tools']} built-in tools: {d['discover_ms']:.1f} ms "
        f"(+ {d['import_core_ms']:.1f} ms core import, snapshot {d['snapshot_ms']:.2f} ms, "
        f"{d['failed_imports']} failed imports)"
    )
    print(
        "  discovery with openai and aiohttp already imported (as in a worker): "
        f"{d['discover_openai_preloaded_ms']:.1f} ms"
    )
    for key, value in result["dispatch"].items():
        print(f"  {key:<28} {value:8.2f} us/call")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
