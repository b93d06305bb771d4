"""Issue 37: does a short interpreter switch interval while a run trains beside its rollout help or hurt the run?
Runs in pairs on one engine, the interval at 0.1 ms or Python's 5 ms, in alternating order, per execution mode.

    python -m paper.experiments.measure_switch_interval --rounds 4 --modes disaggregated,async,hybrid   # ~6 minutes

Why: each call the trainer's lane makes into torch gives up the interpreter's lock and waits to get it back; beside a
thread running Python without pause an update and its snapshot lost 0.25 s at 5 ms and 0.04 s at 0.1 ms (`python -m
paper.experiments.measure_update_gil --switch-interval S`), so real_backend.train_job set 0.1 ms while a lane lived
(modes53p and modes54p were recorded so). A run's driver is not such a thread: it shares the lock with vLLM's output
thread (VLLMEngine's asyncio loop) all rollout long, which at 0.1 ms may hand it over far more often (the likely
cause of what is measured below; the hand-overs were not counted).

Measured 2026-11-28 ~22:35-22:50 UTC on this 2-core VM, alone, the trainer in its own process, 5 steps x 8 groups x 4
samples (`--rounds 4` with all three modes, then `--rounds 4 --modes async,hybrid`): 0.1 ms over 5 ms, paired, the
runs' total step time: async 1.031 at the median (0.92-1.12, 6 of 8 pairs slower), hybrid 1.027 (0.97-1.10, 7 of
8), disaggregated 1.003 (4 pairs); the rollouts 1.038 / 1.039 / 1.004; the updates 0.870 / 1.020 / 0.964. The
updates' gain does not pay for the rollouts' loss: the interval went back to Python's (real_backend/train_job.py).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

SHORT, PYTHON = 1e-4, 5e-3  # seconds


@contextlib.contextmanager
def switch_interval(seconds: float):
    saved = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(saved)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_switch_interval", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="pairs per mode (default 4)")
    p.add_argument("--modes", default="disaggregated,async,hybrid", help="modes that train beside the rollout, comma-separated")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if args.rounds < 1 or not set(modes) <= {"disaggregated", "async", "hybrid"}:
        print("error: --rounds must be >= 1 and --modes some of disaggregated, async, hybrid", file=sys.stderr)
        return 2
    from paper.experiments.paired_runs import TOTALS, paired_ratios, paired_runs, run_totals

    variants = {"0.1 ms": lambda: switch_interval(SHORT), "5 ms": lambda: switch_interval(PYTHON)}
    rows = [run_totals(run) for run in paired_runs(variants, args.rounds, tuple(modes))]
    ratios = paired_ratios(rows, TOTALS, "0.1 ms", "5 ms")
    for what, ratio in ratios.items():
        for name, r in ratio.groupby(level="mode"):
            print(f"{what.split('_')[0]}s {name}: 0.1 ms over 5 ms, paired: median {r.median():.3f} "
                  f"(min {r.min():.3f}, max {r.max():.3f}, {(r > 1).sum()} of {len(r)} slower)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
