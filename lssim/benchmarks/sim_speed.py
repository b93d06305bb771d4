"""Simulator speed: responses simulated per wall-clock second on a run of at least a million responses.

    python -m lssim.benchmarks.sim_speed [--responses 1000000] [--policy baseline --policy hadb]

The trace is synthesized from the math7b preset with as many steps as it takes; its synthesis and the
Workload's index are timed apart from the simulation. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import math
import time

from lssim.replay import SimSetup, simulate
from lssim.synth import get_preset, synthesize
from lssim.workload import Workload


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--responses", type=int, default=1_000_000)
    ap.add_argument("--policy", action="append", default=None)
    args = ap.parse_args(argv)
    preset = get_preset("math7b")
    per_step = preset.prompts_per_step * preset.group_size
    cfg = preset.replace(steps=math.ceil(args.responses / per_step))
    t = time.perf_counter()
    trace = synthesize(cfg)
    t_synth = time.perf_counter() - t
    t = time.perf_counter()
    workload = Workload(trace)
    t_index = time.perf_counter() - t
    print(f"trace: {len(trace):,} responses, {cfg.steps} steps (synthesized in {t_synth:.2f} s, indexed in {t_index:.2f} s)")
    for policy in args.policy or ["baseline", "hadb"]:
        t = time.perf_counter()
        result = simulate(workload, policy, SimSetup())
        wall = time.perf_counter() - t
        n = len(result.responses)
        print(f"{policy:10s} {n:,} responses in {wall:.2f} s: {n / wall:,.0f} responses/s "
              f"(simulated rollout time {result.steps['rollout_seconds'].sum():,.0f} s)")


if __name__ == "__main__":
    main()
