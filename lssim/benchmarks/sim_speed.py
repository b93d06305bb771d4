"""Simulator speed, as ratios against issue 15's goals: responses per second per policy on one core, sweep runs per
second with 1 and 2 workers, and the wall time of `lssim replay` on a large trace with and without its references.

    python -m lssim.benchmarks.sim_speed                       # every section, defaults below
    python -m lssim.benchmarks.sim_speed --only sim --responses 1000000 --policy baseline --policy hadb
    python -m lssim.benchmarks.sim_speed --only sweep --sweep-runs 24
    python -m lssim.benchmarks.sim_speed --only cli --cli-responses 1024000

Every figure is the median of `--repeats` runs (the machine this was written on is shared and noisy: read
the spread it prints too). `sim`: the trace is synthesized from the math7b preset with as many steps as it
takes, its synthesis and the Workload's index timed apart; the simulation runs pinned to one CPU. `sweep`:
`lssim.parallel.run_jobs` over a small trace (policies x instance counts), on 1 and on 2 processes, pool start
included. `cli`: `python -m lssim.cli replay` in a fresh process on a synthesized trace (process start,
reading and validating the trace included), with baseline and oracle, then with --no-reference.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lssim.replay import SimSetup, simulate
from lssim.synth import get_preset, synthesize
from lssim.workload import Workload

GOAL_RESPONSES_PER_SECOND = 1_000_000  # issue 15: on one core, baseline, oracle and hadb
GOAL_CLI_SECONDS = 5.0  # issue 15: `lssim replay` of 1,024,000 responses under hadb with its references


def _trace(responses: int, **overrides):
    preset = get_preset("math7b")
    per_step = preset.prompts_per_step * preset.group_size
    return synthesize(preset.replace(steps=max(1, math.ceil(responses / per_step)), **overrides))


def _median(times: list[float]) -> str:
    return f"median of {len(times)}, {min(times):.2f}-{max(times):.2f} s" if len(times) > 1 else "1 run"


def bench_sim(responses: int, policies: list[str], repeats: int) -> None:
    t = time.perf_counter()
    trace = _trace(responses)
    t_synth = time.perf_counter() - t
    t = time.perf_counter()
    workload = Workload(trace)
    t_index = time.perf_counter() - t
    print(f"sim: {len(trace):,} responses (synthesized in {t_synth:.2f} s, indexed in {t_index:.2f} s); one core; "
          f"goal {GOAL_RESPONSES_PER_SECOND:,} responses/s")
    pinned = _pin_one_cpu()
    try:
        for policy in policies:
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                result = simulate(workload, policy, SimSetup())
                times.append(time.perf_counter() - t)
            n, wall = len(result.responses), statistics.median(times)
            print(f"  {policy:16s} {n / wall:>10,.0f} responses/s  {n / wall / GOAL_RESPONSES_PER_SECOND:6.3f}x goal  "
                  f"({n:,} in {wall:.2f} s, {_median(times)})")
    finally:
        _unpin(pinned)


def _pin_one_cpu():
    if not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    return before


def _unpin(before) -> None:
    if before is not None:
        os.sched_setaffinity(0, before)


def bench_sweep(n_runs: int, repeats: int) -> None:
    from lssim.parallel import SimJob, run_jobs

    trace = synthesize(get_preset("math7b").replace(steps=4, prompts_per_step=64, n_prompts=128))
    specs, sizes = ["baseline", "hadb", "april", "seer", "lpt", "breaker"], [2, 4, 8, 16]
    jobs = [SimJob(trace, specs[i % len(specs)], SimSetup(n_instances=sizes[(i // len(specs)) % len(sizes)]), seed=i)
            for i in range(n_runs)]
    print(f"sweep: {n_runs} runs of {len(trace):,} responses each (lssim.parallel.run_jobs; pool start included)")
    rates = {}
    for workers in (1, 2):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            run_jobs(jobs, workers=workers)
            times.append(time.perf_counter() - t)
        rates[workers] = n_runs / statistics.median(times)
        print(f"  {workers} worker{'s' if workers > 1 else ' '}  {rates[workers]:7.2f} runs/s  ({_median(times)})")
    print(f"  2 workers over 1: {rates[2] / rates[1]:.2f}x (ideal 2x on 2 idle cores)")


def bench_cli(responses: int, policy: str, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="lssim-bench-") as tmp:
        path = Path(tmp) / "trace.parquet"
        from lssim.trace import write_trace

        write_trace(_trace(responses), path)
        print(f"cli: python -m lssim.cli replay {responses:,}-response trace --policy {policy} (fresh process each; "
              f"goal {GOAL_CLI_SECONDS:.0f} s for 1,024,000 with references)")
        walls = {}
        for label, extra in (("with baseline and oracle", []), ("--no-reference", ["--no-reference"])):
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "lssim.cli", "replay", str(path), "--policy", policy, "--json", *extra],
                               check=True, stdout=subprocess.DEVNULL)
                times.append(time.perf_counter() - t)
            walls[label] = statistics.median(times)
            print(f"  {label:26s} {walls[label]:7.2f} s  {responses / walls[label]:>9,.0f} responses/s of trace  ({_median(times)})")
        ratio = walls["with baseline and oracle"] / walls["--no-reference"]
        print(f"  references cost {ratio:.2f}x the policy's run alone")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["sim", "sweep", "cli"], action="append", help="sections to run (default: all)")
    ap.add_argument("--responses", type=int, default=300_000, help="sim: responses in the trace (default 300,000)")
    ap.add_argument("--policy", action="append", default=None, help="sim: policies (default baseline, oracle, hadb, april)")
    ap.add_argument("--sweep-runs", type=int, default=24, help="sweep: runs (default 24)")
    ap.add_argument("--cli-responses", type=int, default=256_000, help="cli: responses in the trace (default 256,000)")
    ap.add_argument("--cli-policy", default="hadb")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is printed (default 3)")
    args = ap.parse_args(argv)
    sections = args.only or ["sim", "sweep", "cli"]
    if "sim" in sections:
        bench_sim(args.responses, args.policy or ["baseline", "oracle", "hadb", "april"], args.repeats)
    if "sweep" in sections:
        bench_sweep(args.sweep_runs, args.repeats)
    if "cli" in sections:
        bench_cli(args.cli_responses, args.cli_policy, args.repeats)


if __name__ == "__main__":
    main()
