"""Whole-job benchmark: driver and worker memory vs dataset size, throughput vs the ideal.

Run: ``python bench/bench_runner.py [--sizes 10000,100000] [--repeats 3] [--json f]``
(``--only memory`` or ``--only throughput`` runs one part). Every measurement runs the
real CLI (``batch_runner.py --job``) in a subprocess against the embedded endpoint (a
SYNTHETIC scripted policy, in a thread of the driver) with the cheap ``todo`` toolset:

- memory: trivial prompts, zero endpoint latency, at most one tool turn per episode. A
  sampler thread reads VmRSS and VmHWM of the driver (the CLI process) and of every Ray
  process running an EpisodeWorker actor (plus that worker's children) every
  ``--interval`` s; a process's peak is the larger of its sampled VmRSS and its last
  VmHWM. Memory should be flat in the dataset size (``ratio`` near 1.0).
- throughput: ``--latency-ms`` per model call and 1-3 tool turns per episode. Achieved
  model calls/s (the rows' ``api_calls``, summed) over the window the episodes were in
  flight (first ``started_at`` to last ``finished_at``) is compared with the ideal
  ``num_workers * concurrency / latency``; the process wall time (with start-up) is
  reported too.

Each figure is the median of ``--repeats`` runs. Generated prompts and outputs live in
``--workdir`` (a temporary folder by default), never in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKER_TITLE = b"ray::EpisodeWorker"
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
TICKS = os.sysconf("SC_CLK_TCK")
MB = 1024.0
ROLES = ("driver", "worker", "other")


# -- sampling /proc -----------------------------------------------------------------------


@dataclass
class Peak:
    """Peak memory (KB) and last-seen CPU seconds of one process."""

    role: str
    rss_kb: int = 0
    hwm_kb: int = 0
    tree_kb: int = 0  # the process plus its descendants, summed per sample
    cpu_s: float = 0.0
    rss_at: float = 0.0  # epoch time of the highest sampled RSS

    @property
    def peak_kb(self) -> int:
        return max(self.rss_kb, self.hwm_kb)


def _stat(pid: str) -> tuple[int, float] | None:
    """(ppid, CPU seconds) from /proc/PID/stat; None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _memory_kb(pid: int) -> tuple[int, int, int]:
    """(VmRSS, VmHWM, RssAnon) in KB; zeros once the process is a zombie or gone.

    RssAnon leaves out file-backed pages (shared libraries, memory-mapped Arrow files),
    which the kernel can drop: growth there is not a leak."""
    found = {"VmRSS": 0, "VmHWM": 0, "RssAnon": 0}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0, 0, 0
    for line in lines:
        key = line.split(":", 1)[0]
        if key in found:
            found[key] = int(line.split()[1])
    return found["VmRSS"], found["VmHWM"], found["RssAnon"]


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICKS


def _is_worker(pid: int) -> bool:
    try:
        return WORKER_TITLE in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _descendants(root: int, parents: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


class Sampler(threading.Thread):
    """Samples the process tree under ``root`` (the CLI) until ``stop()``.

    Only descendants of the CLI count, so Ray workers of other jobs running on the same
    machine (tests, other benchmarks) are ignored.
    """

    def __init__(self, root: int, interval: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.root, self.interval = root, interval
        self.started_at = time.time()
        self.peaks: dict[int, Peak] = {}
        self.tree_peak_kb = 0
        self.samples = 0
        # (epoch time, cumulative CPU seconds by role), to tell who used the cores when.
        self.timeline: list[tuple[float, dict[str, float]]] = []
        self.driver_rss: list[tuple[float, int, int]] = []  # (epoch time, RSS, anon KB)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def sample(self) -> None:
        parents, cpu = {}, {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (got := _stat(entry)) is not None:
                parents[int(entry)], cpu[int(entry)] = got
        tree = _descendants(self.root, parents) | {self.root}
        rss = {pid: _memory_kb(pid) for pid in tree}
        self.tree_peak_kb = max(self.tree_peak_kb, sum(r[0] for r in rss.values()))
        for pid in tree:
            peak = self.peaks.get(pid)
            if peak is None:
                peak = self.peaks[pid] = Peak(role="driver" if pid == self.root else "other")
            parent = self.peaks.get(parents.get(pid, 0))
            forked = parent is not None and parent.role == "worker"
            if peak.role == "other" and not forked and _is_worker(pid):
                # A Ray worker process takes the actor's title once the actor is created;
                # what it used before (as an idle worker) still counts as the worker's.
                # A worker's own children keep its title until they exec: not workers.
                peak.role = "worker"
            now_rss, now_hwm, _ = rss[pid]
            if now_rss > peak.rss_kb:
                peak.rss_kb, peak.rss_at = now_rss, time.time()
            peak.hwm_kb = max(peak.hwm_kb, now_hwm)
            peak.cpu_s = max(peak.cpu_s, cpu.get(pid, 0.0))
            if peak.role == "worker":
                below = _descendants(pid, parents) & tree
                peak.tree_kb = max(peak.tree_kb, now_rss + sum(rss[c][0] for c in below))
        self.samples += 1
        by_role = dict.fromkeys(ROLES, 0.0)
        for peak in self.peaks.values():
            by_role[peak.role] += peak.cpu_s
        by_role["machine"] = _machine_busy_s()
        now = time.time()
        self.timeline.append((now, by_role))
        self.driver_rss.append((now, rss[self.root][0], rss[self.root][2]))

    def driver_rss_at(self, when: float) -> tuple[float, float]:
        """The driver's (RSS, RssAnon) in MB at the first sample from ``when`` on."""
        return next(
            ((kb / MB, anon / MB) for t, kb, anon in self.driver_rss if t >= when),
            (float("nan"), float("nan")),
        )

    def driver_anon_peak_mb(self) -> float:
        return max((anon for _, _, anon in self.driver_rss), default=0) / MB

    def cores_used(self, start: float, end: float) -> dict[str, float]:
        """Mean cores busy per role between two epoch times (the nearest samples
        outside them), plus ``foreign``: the rest of the machine (other jobs, tests),
        which makes the figures noisy when well above 0. NaN when the sampler saw too
        little of that span."""
        before = [s for s in self.timeline if s[0] <= start]
        after = [s for s in self.timeline if s[0] >= end]
        if not before or not after or after[0][0] <= before[-1][0]:
            return dict.fromkeys((*ROLES, "foreign"), float("nan"))
        (t0, cpu0), (t1, cpu1) = before[-1], after[0]
        used = {role: (cpu1[role] - cpu0[role]) / (t1 - t0) for role in cpu0}
        machine = used.pop("machine")
        used["foreign"] = max(0.0, machine - sum(used.values()))
        return used


# -- jobs ----------------------------------------------------------------------------------


def write_prompts(path: Path, count: int) -> Path:
    """``count`` trivial JSONL prompts (written once per size and reused)."""
    if path.exists():
        return path
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for i in range(count):
            f.write(json.dumps({"id": f"p{i:07d}", "prompt": f"Task {i}: plan it"}) + "\n")
    tmp.replace(path)
    return path


def job_config(
    dataset: Path,
    out: Path,
    *,
    workers: int,
    concurrency: int,
    batch: int,
    endpoint: dict[str, Any],
) -> dict[str, Any]:
    return {
        "run_name": "bench",
        "output_dir": str(out),
        "seed": 1,
        "dataset": {"path": str(dataset)},
        "model": {"name": "hermes-embedded", "base_url": "embedded"},
        "episode": {"max_turns": 6},
        "distribution": "todo_only",
        "distributions": {
            "todo_only": {"description": "the cheapest tool", "toolsets": {"todo": 100}}
        },
        "runner": {
            "num_workers": workers,
            "concurrency": concurrency,
            "batch_size": batch,
            "progress": False,
        },
        "endpoint": {"seed": 1, **endpoint},
    }


@dataclass
class Outcome:
    """What one run of the CLI produced, measured from outside."""

    wall_s: float
    launched_at: float  # epoch seconds, to compare with the rows' timestamps
    sampler: Sampler
    run_dir: Path
    warnings: list[str] = field(default_factory=list)


def run_cli(job: dict[str, Any], workdir: Path, *, interval: float, timeout: float) -> Outcome:
    """Run one job in a subprocess under the sampler; raises if it does not exit 0."""
    out = Path(job["output_dir"])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    job_file = workdir / "job.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    log = workdir / "cli.log"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    launched_at, started = time.time(), time.perf_counter()
    with log.open("wb") as handle:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "batch_runner.py"), "--job", str(job_file)],
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sampler = Sampler(proc.pid, interval)
        sampler.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_cli(proc)
            raise RuntimeError(f"the job took more than {timeout} s; log: {log}") from None
        except BaseException:
            _stop_cli(proc)  # Ctrl-C or SIGTERM: the CLI has its own session, so tell it
            raise
        finally:
            sampler.stop()
    wall = time.perf_counter() - started
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the job exited with {code}; end of {log}:\n{tail}")
    return Outcome(
        wall_s=wall,
        launched_at=launched_at,
        sampler=sampler,
        run_dir=out / job["run_name"],
        warnings=_warnings(log),
    )


def _warnings(log: Path) -> list[str]:
    """The CLI's warning and error lines (a worker restart, say), kept with the figures
    because the log goes with the workdir."""
    keep = ("WARNING", "ERROR", "died", "Traceback")
    lines = log.read_text(errors="replace").splitlines()
    return [line[:300] for line in lines if any(word in line for word in keep)][:50]


def _stop_cli(proc: subprocess.Popen[bytes]) -> None:
    """Stop the CLI's process group: SIGTERM (the driver shuts Ray down), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def _shard_files(run_dir: Path) -> list[Path]:
    return sorted([*run_dir.glob("trajectories/*.parquet"), *run_dir.glob("rejected/*.parquet")])


def episode_span(files: list[Path]) -> tuple[int, int, float, float]:
    """(rows, summed api_calls, first started_at, last finished_at) as epoch seconds."""
    rows = calls = 0
    first, last = float("inf"), float("-inf")
    for path in files:
        table = pq.read_table(path, columns=["api_calls", "started_at", "finished_at"])
        if table.num_rows == 0:
            continue
        rows += table.num_rows
        calls += int(pc.sum(table["api_calls"]).as_py() or 0)
        first = min(first, pc.min(table["started_at"]).as_py().timestamp())
        last = max(last, pc.max(table["finished_at"]).as_py().timestamp())
    return rows, calls, first, last


def output_figures(outcome: Outcome) -> dict[str, Any]:
    """Rows, model calls, the in-flight window and the cores busy during it, read back
    from the Parquet output and statistics.json."""
    files = _shard_files(outcome.run_dir)
    rows, calls, first, last = episode_span(files)
    stats = json.loads((outcome.run_dir / "statistics.json").read_text(encoding="utf-8"))
    dist = stats["distributions"]
    sizes = [p.stat().st_size for p in files]
    cores = outcome.sampler.cores_used(first, last)
    # Steady state, against the peak: a peak well above these comes from start-up or
    # from the end of the run (statistics, markers), not from the episodes.
    nan = (float("nan"), float("nan"))
    mid_window = outcome.sampler.driver_rss_at((first + last) / 2) if rows else nan
    end_window = outcome.sampler.driver_rss_at(last) if rows else nan
    return {
        "rows": rows,
        "api_calls": calls,
        "driver_rss_mid_window_mb": mid_window[0],
        "driver_rss_last_episode_mb": end_window[0],
        "driver_anon_mid_window_mb": mid_window[1],
        "driver_anon_last_episode_mb": end_window[1],
        "driver_anon_peak_mb": outcome.sampler.driver_anon_peak_mb(),
        "episodes_window_s": last - first if rows else 0.0,
        # From launching the CLI to the first episode, and from the last one to exit.
        "startup_s": first - outcome.launched_at if rows else 0.0,
        "shutdown_s": outcome.launched_at + outcome.wall_s - last if rows else 0.0,
        "driver_reported_wall_s": stats.get("wall_time_s"),
        "mean_model_time_per_episode_s": dist["model_time_s"]["mean"],
        "mean_tool_time_per_episode_s": dist["tool_time_s"]["mean"],
        "mean_api_calls_per_episode": dist["turns"]["mean"],
        "shard_files": len(files),
        "shard_mean_kb": statistics.mean(sizes) / 1024 if sizes else 0.0,
        **{f"{role}_cores_in_window": used for role, used in cores.items()},
    }


def process_figures(sampler: Sampler) -> dict[str, Any]:
    """Peak memory (MB) and CPU seconds of the driver, the workers and the rest of Ray."""
    driver = sampler.peaks[sampler.root]
    workers = [p for p in sampler.peaks.values() if p.role == "worker"]
    others = [p for p in sampler.peaks.values() if p.role == "other"]
    return {
        "driver_peak_mb": driver.peak_kb / MB,
        "driver_sampled_rss_mb": driver.rss_kb / MB,
        # When the driver's sampled RSS peaked, from launch: compare with start-up plus
        # the in-flight window to tell start-up, steady state and the end of the run.
        "driver_peak_at_s": driver.rss_at - sampler.started_at,
        "worker_peak_mb": max((w.peak_kb for w in workers), default=0) / MB,
        "worker_peaks_mb": sorted(round(w.peak_kb / MB, 1) for w in workers),
        "worker_tree_peak_mb": max((w.tree_kb for w in workers), default=0) / MB,
        "worker_processes": len(workers),
        "all_processes_peak_mb": sampler.tree_peak_kb / MB,
        "driver_cpu_s": driver.cpu_s,
        "workers_cpu_s": sum(w.cpu_s for w in workers),
        "other_ray_cpu_s": sum(p.cpu_s for p in others),
        "samples": sampler.samples,
    }


# -- measurements --------------------------------------------------------------------------


def median_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric figure over the runs (lists and text are left out)."""
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return {k: statistics.median(run[k] for run in runs) for k in keys}


def one_run(args: argparse.Namespace, dataset: Path, size: int, **knobs: Any) -> dict[str, Any]:
    """Run the CLI once and gather every figure; raises if rows went missing."""
    job = job_config(dataset, args.workdir / "out", workers=args.workers, **knobs)
    outcome = run_cli(job, args.workdir, interval=args.interval, timeout=args.timeout)
    figures = {
        "wall_s": outcome.wall_s,
        **process_figures(outcome.sampler),
        **output_figures(outcome),
        "cli_warning_lines": len(outcome.warnings),
        "cli_warnings": outcome.warnings,
    }
    if figures["rows"] != size:
        raise RuntimeError(f"{size} prompts gave {figures['rows']} rows in {outcome.run_dir}")
    window = figures["episodes_window_s"] or float("nan")
    figures["episodes_per_s_wall"] = size / outcome.wall_s
    figures["episodes_per_s_in_flight"] = size / window
    if not args.keep:
        shutil.rmtree(args.workdir / "out", ignore_errors=True)
    return figures


def measure_memory(args: argparse.Namespace, size: int) -> dict[str, Any]:
    dataset = write_prompts(args.workdir / f"prompts_{size}.jsonl", size)
    repeats = args.large_repeats if size >= 100_000 else args.repeats
    runs = []
    for i in range(repeats):
        figures = one_run(
            args,
            dataset,
            size,
            concurrency=args.memory_concurrency,
            batch=args.batch_size,
            endpoint={"latency_ms": 0, "min_tool_turns": 0, "max_tool_turns": 1},
        )
        runs.append(figures)
        _note(
            f"memory {size}: run {i + 1}/{repeats} wall {figures['wall_s']:.1f} s, driver "
            f"{figures['driver_peak_mb']:.0f} MB, worker {figures['worker_peak_mb']:.0f} MB"
            f"{_anomalies(args, figures)}"
        )
    return {"prompts": size, "repeats": repeats, "runs": runs, "median": median_figures(runs)}


def measure_throughput(args: argparse.Namespace) -> dict[str, Any]:
    size = args.throughput_prompts
    dataset = write_prompts(args.workdir / f"prompts_{size}.jsonl", size)
    latency_s = args.latency_ms / 1000
    in_flight = args.workers * args.concurrency
    ideal = in_flight / latency_s
    runs = []
    for i in range(args.repeats):
        figures = one_run(
            args,
            dataset,
            size,
            concurrency=args.concurrency,
            batch=args.throughput_batch_size,
            endpoint={"latency_ms": args.latency_ms, "min_tool_turns": 1, "max_tool_turns": 3},
        )
        window = figures["episodes_window_s"] or float("nan")
        figures["calls_per_s_in_flight"] = figures["api_calls"] / window
        figures["calls_per_s_wall"] = figures["api_calls"] / figures["wall_s"]
        figures["ratio_to_ideal"] = figures["calls_per_s_in_flight"] / ideal
        # Time a model call took as the worker saw it: the endpoint's latency plus HTTP,
        # JSON and event-loop delays on both sides. Well above latency_ms means queueing.
        figures["model_time_per_call_s"] = (
            figures["mean_model_time_per_episode_s"] / figures["mean_api_calls_per_episode"]
        )
        runs.append(figures)
        _note(
            f"throughput: run {i + 1}/{args.repeats} {figures['calls_per_s_in_flight']:.0f} "
            f"calls/s in flight ({figures['ratio_to_ideal']:.0%} of {ideal:.0f})"
            f"{_anomalies(args, figures)}"
        )
    return {
        "prompts": size,
        "latency_ms": args.latency_ms,
        "num_workers": args.workers,
        "concurrency_per_worker": args.concurrency,
        "ideal_calls_per_s": ideal,
        "repeats": args.repeats,
        "runs": runs,
        "median": median_figures(runs),
    }


def _anomalies(args: argparse.Namespace, figures: dict[str, Any]) -> str:
    """What makes a run's figures suspect: worker restarts, warnings, a busy machine."""
    notes = []
    if figures["worker_processes"] != args.workers:
        notes.append(f"{figures['worker_processes']} worker processes for {args.workers}")
    if figures["cli_warning_lines"]:
        notes.append(f"{figures['cli_warning_lines']} warning lines: {figures['cli_warnings'][0]}")
    if figures["foreign_cores_in_window"] > 0.25:
        notes.append(f"other programs used {figures['foreign_cores_in_window']:.2f} cores")
    return f" [{'; '.join(notes)}]" if notes else ""


def _note(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# -- report ----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    try:
        ray_version = version("ray")
    except PackageNotFoundError:
        ray_version = "not installed"
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu": model,
        "ram_gb": round(int(meminfo[1]) / 1024 / 1024, 1),
        "python": platform.python_version(),
        "ray": ray_version,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": _git_revision(),
    }


def _git_revision() -> str:
    """HEAD of the repository, with ``+dirty`` when hermes/ or tools/ have local edits."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "hermes", "tools"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}+dirty" if dirty else head or "unknown"


def memory_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "memory (medians)  prompts  repeats  driver MB  worker MB  all procs MB  wall s"
        "  window s  ep/s wall  ep/s in flight  start-up s  shutdown s",
    ]
    for r in results:
        m = r["median"]
        lines.append(
            f"{'':17}{r['prompts']:>8} {r['repeats']:>8} {m['driver_peak_mb']:>10.0f} "
            f"{m['worker_peak_mb']:>10.0f} {m['all_processes_peak_mb']:>13.0f} "
            f"{m['wall_s']:>7.1f} {m['episodes_window_s']:>9.1f} {m['episodes_per_s_wall']:>10.0f} "
            f"{m['episodes_per_s_in_flight']:>15.0f} {m['startup_s']:>11.1f} "
            f"{m['shutdown_s']:>11.1f}"
        )
    for r in results:
        m = r["median"]
        lines.append(
            f"  {r['prompts']}: driver RSS {m['driver_rss_mid_window_mb']:.0f} MB mid-run, "
            f"{m['driver_rss_last_episode_mb']:.0f} MB at the last episode, peak "
            f"{m['driver_peak_mb']:.0f} MB at {m['driver_peak_at_s']:.1f} s (episodes ended at "
            f"{m['startup_s'] + m['episodes_window_s']:.1f} s); anonymous memory (no "
            f"mapped files) {m['driver_anon_mid_window_mb']:.0f} / "
            f"{m['driver_anon_last_episode_mb']:.0f} / {m['driver_anon_peak_mb']:.0f} MB"
        )
        lines.append(f"  {r['prompts']}: cores busy while episodes ran: {_cores(m)}")
    return lines


def memory_ratios(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Peak memory of each size over the smallest size's (flat memory: near 1.0)."""
    base = min(results, key=lambda r: r["prompts"])
    ratios = {}
    for r in results:
        if r is base:
            continue
        key = f"{r['prompts']}/{base['prompts']}"
        ratios[key] = {
            role: r["median"][f"{role}_peak_mb"] / base["median"][f"{role}_peak_mb"]
            for role in ("driver", "worker")
        }
    return ratios


def throughput_lines(t: dict[str, Any]) -> list[str]:
    m = t["median"]
    return [
        f"throughput (medians of {t['repeats']}): {t['prompts']} prompts, latency "
        f"{t['latency_ms']:g} ms, {t['num_workers']} workers x {t['concurrency_per_worker']} "
        "in flight",
        f"  model calls {m['api_calls']:.0f} ({m['mean_api_calls_per_episode']:.2f}/episode)",
        f"  in flight   {m['calls_per_s_in_flight']:.0f} calls/s over {m['episodes_window_s']:.1f}"
        f" s = {m['ratio_to_ideal']:.0%} of ideal {t['ideal_calls_per_s']:.0f} calls/s",
        f"  wall        {m['calls_per_s_wall']:.0f} calls/s over {m['wall_s']:.1f} s "
        f"(start-up {m['startup_s']:.1f} s, shutdown {m['shutdown_s']:.1f} s)",
        f"  model time per call as workers saw it {1000 * m['model_time_per_call_s']:.0f} ms; "
        f"tool time per episode {1000 * m['mean_tool_time_per_episode_s']:.0f} ms",
        f"  CPU s: driver+endpoint {m['driver_cpu_s']:.1f}, workers {m['workers_cpu_s']:.1f}, "
        f"other Ray {m['other_ray_cpu_s']:.1f}",
        f"  cores busy while episodes ran: {_cores(m)}",
    ]


def _cores(m: dict[str, Any]) -> str:
    used = [m[f"{role}_cores_in_window"] for role in ROLES]
    parts = ", ".join(f"{name} {value:.2f}" for name, value in zip(ROLES, used, strict=True))
    return (
        f"{parts} (total {sum(used):.2f} of {len(os.sched_getaffinity(0))}); "
        f"other programs on the machine {m['foreign_cores_in_window']:.2f}"
    )


# -- command line ------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--only", choices=("memory", "throughput"), default=None)
    add("--sizes", default="10000,100000", help="prompt counts of the memory part")
    add("--repeats", type=int, default=3)
    add("--large-repeats", type=int, default=None, help="repeats for 100k+ (default --repeats)")
    add("--workers", type=int, default=2)
    add("--memory-concurrency", type=int, default=64, help="memory part, per worker")
    add("--batch-size", type=int, default=200, help="memory part: prompts per shard")
    add("--throughput-prompts", type=int, default=2000)
    add("--throughput-batch-size", type=int, default=200)
    add("--latency-ms", type=float, default=100.0)
    add("--concurrency", type=int, default=32, help="throughput part, per worker")
    add("--interval", type=float, default=0.2, help="memory sampling period, s")
    add("--timeout", type=float, default=3600.0, help="per run, s")
    add("--workdir", type=Path, default=None, help="prompts and outputs (default: a tmp dir)")
    add("--keep", action="store_true", help="keep the outputs and prompt files")
    add("--json", type=Path, default=ROOT / "bench" / "results" / "runner.json")
    args = parser.parse_args()
    args.sizes = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    if args.large_repeats is None:
        args.large_repeats = args.repeats
    return args


def main() -> int:
    args = parse_args()
    # SystemExit on SIGTERM, so the finally clauses stop the CLI and remove the workdir.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    own_workdir = args.workdir is None
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hermes-bench-runner-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine(), "settings": _settings(args)}
    lines = [f"runner benchmark: {json.dumps(result['machine'])}"]
    try:
        if args.only in (None, "memory"):
            memory = [measure_memory(args, size) for size in args.sizes]
            result["memory"] = memory
            result["memory_ratios"] = memory_ratios(memory)
            lines += ["", *memory_table(memory)]
            lines += [
                f"  peak memory ratio {k}: driver {v['driver']:.2f}, worker {v['worker']:.2f}"
                for k, v in result["memory_ratios"].items()
            ]
        if args.only in (None, "throughput"):
            result["throughput"] = measure_throughput(args)
            lines += ["", *throughput_lines(result["throughput"])]
    finally:
        if own_workdir and not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    sys.stdout.write("\n".join(lines) + "\n")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


if __name__ == "__main__":
    sys.exit(main())
