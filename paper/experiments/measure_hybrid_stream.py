"""What streaming buys the real hybrid mode: runs of `--mode hybrid` on one engine, in turn with groups streamed into
the update as they finish (GRPOTrainer.feed, the default) and with the update run whole after the rollout (feed
switched off: hybrid as it was before streaming).

    python -m paper.experiments.measure_hybrid_stream --rounds 2        # the default world; a few minutes

Printed per variant, medians over the rounds of each run's median step: the step seconds (from the previous
step's weights being ready to this one's), the rollout seconds, and how long the update ran after the rollout
ended (train_end - rollout_end: what the next rollout waits for), with the streamed groups per step. The first
step of each run is left out (it starts from the engine's idle state). On a 2-core host the streamed update's
forward and backward share the cores with vLLM's engine core, so part of what streaming hides on a cluster (the
train devices are others) is lost here: the rollout itself gets slower.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_hybrid_stream", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of the two runs (default 2)")
    p.add_argument("--steps", type=int, default=6, help="steps per run (default 6)")
    p.add_argument("--world", default="default", help="the validation world (real_backend/validation_workloads.toml)")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import pandas as pd

    from lssim.loop.modes import ModeConfig
    from real_backend.trainer import GRPOTrainer
    from real_backend.validation_workloads import world_arg
    from real_backend.world import prepare, run_real, world_engine

    world = world_arg(args.world)
    if world is None:
        return 2
    streamed_feed = GRPOTrainer.feed
    mode = ModeConfig(mode="hybrid", rollout_devices=1, train_devices=1)
    rows = []
    with world_engine(world) as (setup, config, _, engine), tempfile.TemporaryDirectory() as scratch:
        config = dataclasses.replace(config, steps=args.steps, total_groups=None)
        prompts, policy = prepare(setup, "baseline", config)
        run_real(setup, policy, dataclasses.replace(config, steps=2, total_groups=None), f"{scratch}/warm", engine=engine,
                 prompts=prompts, mode=mode)  # the first steps in a process are slower
        for k in range(args.rounds):
            for streamed in (True, False):
                GRPOTrainer.feed = streamed_feed if streamed else (lambda self, group, step: None)
                prompts, policy = prepare(setup, "baseline", config)
                out = f"{scratch}/{'streamed' if streamed else 'whole'}-{k}"
                run_real(setup, policy, config, out, engine=engine, prompts=prompts, mode=mode, checkpoint=False)
                s = pd.read_parquet(f"{out}/steps.parquet").iloc[1:]
                rows.append({"round": k, "streamed": streamed, "step_s": s["step_seconds"].median(),
                             "rollout_s": s["rollout_seconds"].median(),
                             "after_rollout_s": (s["train_end"] - s["rollout_end"]).median(),
                             "streamed_groups": s["trainer_streamed_groups"].median()})
                print(rows[-1], flush=True)
    GRPOTrainer.feed = streamed_feed
    table = pd.DataFrame(rows).groupby("streamed")[["step_s", "rollout_s", "after_rollout_s", "streamed_groups"]].median()
    print(table.round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
