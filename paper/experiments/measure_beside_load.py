"""Does the trainer slow down more beside a full engine? The profile's shared-host factors measured beside its
long-tailed cells and beside cells whose requests all run to half the budget (every request decoding until the cell
ends),
in alternating rounds on one engine.

    python -m paper.experiments.measure_beside_load                  # 3 rounds of each, ~4 minutes
    python -m paper.experiments.measure_beside_load --rounds 2

Why: in the modes recordings the runs' own trainer factor (a disaggregated update over a collocated one on the same
tokens, `python -m paper.experiments.trainer_beside`) is 1.37-1.57, the profile's 1.11-1.31. A run's update overlaps
the dense start of the next rollout; the profile's updates overlap its cells at any phase, their sparse tails
included. If the factor is higher beside a full engine, the profile under-measures what a run's update meets.
The trainer runs in a process of its own (`--trainer-process`), as in those recordings.

Measured 2026-11-28 on this 2-core VM, alone (`--rounds 4`, cells of 32 requests, full ones of 128 tokens each): the
trainer 1.40x slower beside full cells (1.27-1.45 over four rounds) against 1.22x beside the long-tailed ones
(1.10-1.55); the engine 1.25x beside an update in full cells against 2.14x in long-tailed ones. So the product's
shared-host probe now takes the trainer's factor beside full cells (real_backend.host_sharing `FULL`) and the
engine's beside the long-tailed ones as before: replayed with the engine's factor from full cells as well, async's
speedup error over the seven process recordings rose to +21.4 points on the mean, with the trainer's alone (x1.15) it
fell from +14.0 to +9.2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_beside_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of each kind of cell (default 3)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import pandas as pd

    from real_backend import host_sharing
    from real_backend.profile_trainer import _Prompts
    from real_backend.trainer import GRPOTrainer
    from real_backend.validation_workloads import world_arg
    from real_backend.world import world_engine

    longtail = host_sharing.longtail_lengths
    full = lambda rng, n, length: [int(length) // 2] * n  # noqa: E731  every request to half the budget
    fits = []
    with world_engine(world_arg("default")) as (setup, _, _, engine):
        setup = dataclasses.replace(setup, trainer_process=True)
        trainer = GRPOTrainer(setup.model_dir, None, _Prompts(), lr=1e-6, threads=setup.trainer_threads, seed=0,
                              process=True)
        try:
            for k in range(args.rounds):
                for cells in ("long-tailed", "full") if k % 2 == 0 else ("full", "long-tailed"):
                    host_sharing.longtail_lengths = longtail if cells == "long-tailed" else full
                    rows = host_sharing.measure_sharing(engine, trainer, int(trainer.model.config.vocab_size), rounds=1,
                                                        updates=5, group_size=None, seed=k)
                    fit = host_sharing.fit_sharing(rows)
                    seconds = fit["median_seconds"]
                    fits.append({"round": k, "cells": cells, "engine x": fit["by_round"]["engine_slowdown"][0],
                                 "trainer x": fit["by_round"]["trainer_slowdown"][0],
                                 "cell alone s": seconds.get("engine_alone"), "update alone s": seconds.get("trainer_alone")})
                    print(fits[-1], file=sys.stderr)
        finally:
            host_sharing.longtail_lengths = longtail
            trainer.close()
    table = pd.DataFrame(fits)
    print(table.round(3).to_string(index=False))
    print(table.groupby("cells")[["engine x", "trainer x"]].median().round(3).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
