"""Measure what training-side token pruning saves on the real GRPO trainer (real_backend/token_pruning.py).

    python -m paper.experiments.measure_pruning --out lssim/sim/data/pruning_cpu.json

1. Rollouts: a few steps of the task on vLLM under the baseline policy, by the reference model (a trainer that
   only records what it is given: the weights stay fixed, so every step's batch is the same model's).
2. Training: each captured step trained by the plain GRPOTrainer and by each pruning variant (G2TP and
   micro-entropy pruning, masking only or compacting), with the log-prob recompute on as verl runs it; every
   (variant, step) repeated, all in one random order; the trainer's CPU time per phase (the machine is shared).
3. Factors: per variant, the median over steps of its time over the baseline's, for the log-prob phase and the
   update, beside the share of loss tokens pruned, the share of tokens the forward passes still run over, and
   what lssim's ProfiledTrainCost predicts for the compacted batches (does "fewer, shorter sequences" explain it?).

Writes the JSON (lssim.sim.training.ScaledTrainCost.from_measurement reads it) and `<stem>_runs.parquet` beside it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.sim.train_profiled import ProfiledTrainCost

from real_backend import task

VARIANTS = {
    "baseline": None,
    "g2tp-mask": {"method": "g2tp", "fraction": 0.4, "compact": False},
    "g2tp-compact": {"method": "g2tp", "fraction": 0.4, "compact": True},
    "entropy-mask": {"method": "entropy", "window": 16, "threshold": 0.05, "compact": False},
    "entropy-compact": {"method": "entropy", "window": 16, "threshold": 0.05, "compact": True},
}


class _Capture:
    """A trainer that keeps the groups it is given and trains nothing."""

    def __init__(self):
        self.steps: list = []

    def train(self, groups, step):
        self.steps.append(groups)
        return {}


def rollouts(steps: int, groups_per_step: int, group_size: int, max_tokens: int, seed: int):
    from lssim.loop.controller import RunConfig

    from real_backend.world import RealSetup, prepare, run_real, start_engine

    setup = RealSetup()
    config = RunConfig(steps=steps, groups_per_step=groups_per_step, group_size=group_size, max_tokens=max_tokens, seed=seed)
    prompts, policy = prepare(setup, "baseline", config)
    engine = start_engine(setup, prompts, seed=seed)
    capture = _Capture()
    try:
        with tempfile.TemporaryDirectory() as out:
            run_real(setup, policy, config, out, engine=engine, prompts=prompts, trainer=capture)
    finally:
        engine.close()
    return capture.steps, prompts


def make_trainers(prompts, threads: int, seed: int) -> dict:
    from real_backend.token_pruning import PruningGRPOTrainer
    from real_backend.trainer import GRPOTrainer

    common = dict(engine=None, prompts=prompts, lr=1e-6, recompute_logprobs=True, threads=threads, seed=seed)
    return {name: (GRPOTrainer(str(task.MODEL_DIR), **common) if cfg is None else
                   PruningGRPOTrainer(str(task.MODEL_DIR), **common, **cfg)) for name, cfg in VARIANTS.items()}


def measure(trainers: dict, steps: list, repeats: int, rng) -> pd.DataFrame:
    cells = [(v, s, r) for r in range(repeats) for v in trainers for s in range(len(steps))]
    rows = []
    for i in rng.permutation(len(cells)):
        variant, s, rep = cells[i]
        m = trainers[variant].train(steps[s], s)
        samples = trainers[variant]._samples(steps[s], s)  # the batch it trained: its lengths, for the prediction
        rows.append({"variant": variant, "step": s, "repeat": rep, "lengths": [x.length for x in samples],
                     **{k: m.get(k, np.nan) for k in ("logprob_cpu_seconds", "update_cpu_seconds", "logprob_seconds",
                                                       "update_seconds", "pruned_loss_fraction", "computed_token_fraction",
                                                       "loss_tokens_before", "forward_tokens_before")}})
    return pd.DataFrame(rows)


def factors(df: pd.DataFrame, profile: ProfiledTrainCost) -> dict:
    """Per variant: median over steps of (its median time / the baseline's), measured and predicted."""
    med = df.groupby(["variant", "step"]).agg(lp=("logprob_cpu_seconds", "median"), up=("update_cpu_seconds", "median"),
                                              lengths=("lengths", "first"), pruned=("pruned_loss_fraction", "median"),
                                              computed=("computed_token_fraction", "median"))
    pred = med["lengths"].map(lambda lens: profile.step_seconds(np.asarray(lens, dtype=np.int64)))
    med["plp"], med["pup"] = pred.map(lambda p: p[0]), pred.map(lambda p: p[1])
    base = med.loc["baseline"]
    out = {}
    for variant in VARIANTS:
        if variant == "baseline":
            continue
        v = med.loc[variant]
        out[variant] = {
            "settings": VARIANTS[variant],
            "logprob_factor": float(np.median(v["lp"] / base["lp"])),
            "update_factor": float(np.median(v["up"] / base["up"])),
            "predicted_logprob_factor": float(np.median(v["plp"] / base["plp"])),
            "predicted_update_factor": float(np.median(v["pup"] / base["pup"])),
            "pruned_loss_fraction": float(v["pruned"].median()),
            "computed_token_fraction": float(v["computed"].median()),
            "update_factor_by_step": (v["up"] / base["up"]).round(4).tolist(),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paper.experiments.measure_pruning", description=__doc__.split("\n\n")[0],
                                 allow_abbrev=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="real_backend/data/profile_trainer_cpu.json")
    args = ap.parse_args(argv)
    out = Path(args.out)
    profile = ProfiledTrainCost.from_json(args.profile, recompute_logprobs=True)
    steps, prompts = rollouts(args.steps, args.groups_per_step, args.group_size, args.max_tokens, args.seed)
    trainers = make_trainers(prompts, args.threads, args.seed)
    for name, tr in trainers.items():  # warm-up: a process's first steps are slower
        tr.train(steps[0], 0)
    df = measure(trainers, steps, args.repeats, np.random.default_rng(args.seed))
    result = {"kind": "PruningMeasurement", "version": 1,
              "command": "python -m paper.experiments.measure_pruning " + " ".join(argv if argv is not None else sys.argv[1:]),
              "clock": "trainer CPU time (1 thread; a shared machine)", "recompute_logprobs": True,
              "batches": {"steps": args.steps, "groups_per_step": args.groups_per_step, "group_size": args.group_size,
                          "max_tokens": args.max_tokens, "sequences_trained_per_step": df[df.variant == "baseline"]
                          .groupby("step")["lengths"].first().map(len).tolist()},
              "measurements": out.stem + "_runs.parquet", "variants": factors(df, profile)}
    runs = out.with_name(out.stem + "_runs.parquet")
    df.to_parquet(runs.with_name(runs.name + ".tmp"), index=False)
    runs.with_name(runs.name + ".tmp").replace(runs)
    import json

    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)
    for name, f in result["variants"].items():
        print(f"{name:16s} pruned {f['pruned_loss_fraction']:5.1%} of loss tokens, forward over {f['computed_token_fraction']:5.1%}"
              f" of tokens: logprob x{f['logprob_factor']:.3f} (predicted x{f['predicted_logprob_factor']:.3f}), "
              f"update x{f['update_factor']:.3f} (predicted x{f['predicted_update_factor']:.3f})")
    print(f"wrote {out} and {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
