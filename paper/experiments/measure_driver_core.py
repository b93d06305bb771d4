"""Which instance finishes a two-instance step last, with the driver process free to move or held on one core.

    python -m paper.experiments.measure_driver_core              # placed_history baseline, 3 rounds; ~3 minutes

The driver is this process: the controller, the policy, the token streams of both instances and the trainer (0.22-0.49
of a core, paper.experiments.measure_cpu_share). Each round records the world's baseline three times on one engine: with
the driver free (the OS places it), with all its threads held on CPU 0, and on CPU 1 (os.sched_setaffinity, after
the run's inputs are checked and before it starts; released after). Printed per setting: the steps, how often
instance 0 finished last, and the median and spread of instance 0's last finish minus instance 1's.

Why: in the two-instance worlds of the fourth full validation the real steps end with one instance running on alone
longer than the twin predicts (lssim.analysis.fidelity.compare_phases, real_backend/README.md "Two instances on one host"). Measured 2026-11-27 on this 2-core VM, twice (`--rounds 3`, 24 steps per
setting; a scratch version of the same runs first, then this script): held on CPU 0, instance 0 finished last in 24
of 24 steps both times (+0.23 s and +0.50 s median, on ~1 s steps); held on CPU 1, instance 0 in 9 and 11 of 24;
free, in 14 and 19 of 24 (+0.05 s, +0.13 s); the difference spreads 0.17-0.30 s (std) in every setting. The
instance that shares its core with the driver runs slower and the OS moves the driver, so part of each step's tail
is where the driver sat: not a property of the policy, and not one the twin (instances alike) can know. A GPU
host gives the driver cores of its own.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import pandas as pd

SETTINGS = ("free", "cpu0", "cpu1")


def hold(cpus: set[int]) -> None:
    """Every thread of this process onto `cpus` (threads started later inherit the calling thread's set)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def instance_ends(trace: pd.DataFrame) -> pd.DataFrame:
    """Per step: end0, end1 (each instance's last finish, lssim.analysis.fidelity.instance_last_finish) and diff = end0 - end1."""
    from lssim.analysis.fidelity.compare import instance_last_finish

    ends = instance_last_finish(trace).unstack("instance")
    out = pd.DataFrame({"end0": ends.get(0), "end1": ends.get(1)}).dropna()
    out["diff"] = out["end0"] - out["end1"]
    return out.reset_index()


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per setting: steps, the share where instance 0 finished last, the median and std of diff (seconds)."""
    g = rows.groupby("setting", sort=False)["diff"]
    return pd.DataFrame({"steps": g.size(), "instance0_last": g.apply(lambda d: (d > 0).mean()),
                         "diff_median_s": g.median(), "diff_std_s": g.std()}).round(3)


def measure(world, rounds: int) -> pd.DataFrame:
    """Per step of every run: instance_ends, with its setting and round (`world`: a World of two instances)."""
    from real_backend.world import prepare, run_real, world_engine

    every = os.sched_getaffinity(0)
    rows = []
    with world_engine(world) as (setup, config, _, engine), tempfile.TemporaryDirectory() as scratch:
        prompts, policy = prepare(setup, "baseline", config)  # a throwaway run: first batches of a shape cost more
        run_real(setup, policy, config, f"{scratch}/warm", engine=engine, prompts=prompts)
        for k in range(rounds):
            for setting in SETTINGS:
                prompts, policy = prepare(setup, "baseline", config)  # checks the CPUs: before the driver is held
                hold(every if setting == "free" else {int(setting[-1])})
                try:
                    run_real(setup, policy, config, f"{scratch}/{setting}{k}", engine=engine, prompts=prompts)
                finally:
                    hold(every)
                ends = instance_ends(pd.read_parquet(f"{scratch}/{setting}{k}/trace.parquet"))
                rows.append(ends.assign(setting=setting, round=k))
    return pd.concat(rows, ignore_index=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_driver_core", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="placed_history", help="a world of two instances (default placed_history)")
    p.add_argument("--rounds", type=int, default=3, help="runs per setting (default 3)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        return 2
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        print("error: needs Linux and CPUs 0 and 1 available to this process", file=sys.stderr)
        return 2
    from real_backend.validation_workloads import world_arg

    world = world_arg(args.world, 2)
    if world is None:
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    print(summary(measure(world, args.rounds)).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
