"""A fresh trainer's first updates against its later ones: what a run's first step pays for torch's start-up.

    python -m paper.experiments.measure_first_update                 # trainers with a worker process (--trainer-process)
    python -m paper.experiments.measure_first_update --thread        # the passes in this process

Each trainer (a GRPOTrainer of the reference model, no engine) runs `--updates` updates of the trainer probe's fixed
batch (real_backend.trainer_probe: 20 long-tailed sequences), one after another; `--trainers` of them are made in
turn, so the first is made in a fresh interpreter and the later ones in a warm one (as `lssim validate` makes one
per run after its warm-up run).

Measured 2026-11-28 on this 2-core VM, four trainers with a worker process each. Before the passes warmed up
(commit 0750c95): the first update 0.12-0.15 s over the later ones' median (0.56-0.58 s against 0.43-0.44). With a
throwaway forward and backward of 20 x 512 tokens (the first version): +0.03-0.06 s. With a throwaway `accumulate`,
the loss's operations included (real_backend.train_compute.WARM_UP_SHAPE, the product's): +0.058 s for the first
trainer of a fresh interpreter (the driver's own first calls), -0.004 to +0.035 for the later ones.
In the kept modes recordings made with `--trainer-process`
(modes44p-48p, 15 collocated runs) every run's first update took 0.07-0.20 s more than the twin priced it (median
0.095), the later steps 0.01 at the median; with the trainer on the driver's warm thread (modes42) the first took
0.003-0.014 more. The twin's trainer profile discards its own warm-up, so step 0 was short by that in every mode.
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_first_update", description=__doc__.split("\n\n")[0])
    p.add_argument("--thread", action="store_true", help="the passes in this process (default: a worker process)")
    p.add_argument("--trainers", type=int, default=3, help="trainers made in turn (default 3)")
    p.add_argument("--updates", type=int, default=5, help="updates each (default 5)")
    args = p.parse_args(argv)
    import numpy as np

    from real_backend.profile_trainer import _Prompts, synthetic_batch
    from real_backend.trainer import GRPOTrainer
    from real_backend.trainer_probe import probe_lengths
    from real_backend.world import RealSetup

    setup = RealSetup()
    kind = "this process" if args.thread else "a worker process"
    print(f"the probe's update ({len(probe_lengths())} sequences), seconds, passes in {kind}:")
    for k in range(args.trainers):
        t0 = time.monotonic()
        trainer = GRPOTrainer(setup.model_dir, None, _Prompts(), lr=1e-6, threads=setup.trainer_threads, seed=0,
                              process=not args.thread)
        made = time.monotonic() - t0
        rng, seconds = np.random.default_rng(7), []
        for _ in range(args.updates):
            trainer.prompts.tokens.clear()
            batch = synthetic_batch(rng, probe_lengths(), trainer.prompts, int(trainer.model.config.vocab_size))
            t = time.monotonic()
            trainer.update(batch, 0)
            seconds.append(time.monotonic() - t)
        trainer.close()
        later = float(np.median(seconds[2:])) if len(seconds) > 2 else float("nan")
        print(f"trainer {k} (made in {made:.1f} s): " + " ".join(f"{s:.3f}" for s in seconds)
              + f"; first over the later ones' median: {seconds[0] - later:+.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
