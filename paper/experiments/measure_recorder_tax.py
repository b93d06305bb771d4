"""Does the recorder's background write slow a run that trains beside its rollout? Runs in pairs on one engine, the
recorder's per-step files written (as always) or skipped, in alternating order.

    python -m paper.experiments.measure_recorder_tax                 # 8 pairs of async K=1 runs, ~4 minutes
    python -m paper.experiments.measure_recorder_tax --pairs 4 --mode disaggregated

Outside collocated a run writes its files (steps, responses, trace, unfinished rows, meta) on a thread beside the
next rollout (real_backend.recorder.Recorder.write_in_background), which the twin does not price. Each write here
took ~30 ms of CPU (the runs' 5 steps x 8 groups x 4 samples), so it could have been part of async's missing ~0.07 s
a step (docs/fidelity.md, "What is left (issue 37)").

Measured 2026-11-28 on this 2-core VM, alone (`--pairs 8`, async K=1, the trainer in its own process): each write
30.3 ms of CPU at the median; the runs' total step time written / skipped, paired: 1.003 at the median (0.79-1.28,
sd 0.15); the rollouts' 1.011. Not measurable at this noise: a write's 30 ms is at most 3% of a step, and the pairs
do not show it. Ruled out as a cause of async's shortfall.

Per update (2026-11-28, later; disaggregated, 6 rounds of three runs each: written, skipped, and a variant that wrote
in a spawned process of its own, a scratch change not kept): the updates beside a rollout took 0.028 s longer at the
median with the files written on their thread, 0.021 s with them written by another process; the step totals of the
three within 0.3%. Part of the ~0.05 s a run's update pays beyond the twin's price (`python -m
paper.experiments.update_price`), and the same in a process (the cores' share, not the interpreter's lock), so the
writer stays a thread. `update_s` below: the updates' seconds per run.

Hybrid (`--pairs 4 --mode hybrid`, 2026-11-28 23:30 UTC): steps 1.008 at the median (0.95-1.04), rollouts 0.993,
updates 1.005; a write 27.5 ms of CPU. Not what leaves hybrid's twin ~5% fast beyond collocated's level.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_recorder_tax", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=8, help="pairs of runs (default 8)")
    p.add_argument("--mode", default="async", choices=("disaggregated", "async", "hybrid"))
    args = p.parse_args(argv)
    if args.pairs < 1:
        print("error: --pairs must be >= 1", file=sys.stderr)
        return 2
    import numpy as np

    from paper.experiments.paired_runs import TOTALS, paired_ratios, paired_runs, run_totals
    from real_backend import recorder

    written = recorder.Recorder._write_files
    cpu: list[float] = []

    def timed(self, *files):
        t0 = time.thread_time()
        written(self, *files)
        cpu.append(time.thread_time() - t0)

    @contextlib.contextmanager
    def files(write):
        recorder.Recorder._write_files = write
        try:
            yield
        finally:
            recorder.Recorder._write_files = written

    variants = {"written": lambda: files(timed), "skipped": lambda: files(lambda self, *_: None)}
    rows = [run_totals(run) for run in paired_runs(variants, args.pairs, (args.mode,))]
    ratios = paired_ratios(rows, TOTALS, "written", "skipped")
    for what, ratio in ratios.items():
        print(f"{what.split('_')[0]}s, written over skipped, paired: median {ratio.median():.3f} "
              f"(min {ratio.min():.3f}, max {ratio.max():.3f}, sd {ratio.std():.3f}, {len(ratio)} pairs)")
    print(f"a write's CPU: median {np.median(cpu) * 1e3:.1f} ms over {len(cpu)} writes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
