"""Profile the real GRPO trainer on this machine and fit lssim's ProfiledTrainCost (the trainer stage of `lssim profile`).

    python -m real_backend.profile_trainer --out real_backend/data/profile_trainer_cpu.json

What is timed, all through the code a real run uses: `GRPOTrainer.train` on synthetic GRPO batches (its own
`logprob_seconds` and `update_seconds` metrics; the trainer recomputes old log-probs for this, as verl does), and
`VLLMEngine.update_weights` into a running engine (its `sync_seconds`). Batches are groups of two responses with
rewards 0 and 1 (every group has signal, so every sequence trains) over the reference model's vocabulary.

Cells: a grid of batch sizes x sequence lengths (all sequences of a cell equally long; some cells with 2 or 4
mini-batches, which tells the per-optimizer-step cost from the per-step one) for the fit, and long-tailed batches
like the task's rollouts for a held-out check of what the simulator predicts: whole steps of mixed lengths. Every
cell is repeated, and all of them (sync pushes included) run in one random order: the shared VM's speed drifts, and
drift must not pass for a trend in batch size or length.

Writes the JSON (coefficients, forms, fit error by split, how it was measured) and, beside it,
`<stem>_steps.parquet` with every measurement. docs/training.md reports the figures.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.loop.core import Group, Request
from lssim.sim.train_profiled import ProfiledTrainCost

from . import task

BATCH_SIZES = (2, 4, 8, 16, 32, 64, 128)
SEQ_LENS = (16, 48, 128, 256, 384, 520)  # the task's prompts are ~7 tokens, its responses at most 512
PROMPT_LEN = 8
MIXED_BATCH_SIZES = (12, 24, 48, 96, 128)
MINI_BATCH_CELLS = ((2, 16, 128), (4, 32, 256), (2, 64, 384), (4, 128, 48))  # (mini_batches, B, T)


class _Prompts:
    """prompt_tokens for synthetic prompts: what GRPOTrainer asks of a prompt source."""

    def __init__(self):
        self.tokens: dict[int, list[int]] = {}

    def prompt_tokens(self, prompt_id: int) -> list[int]:
        return self.tokens[prompt_id]


def synthetic_batch(rng, lengths, prompts: _Prompts, vocab: int) -> list[Group]:
    """Groups of two responses (rewards 0 and 1) of the given total lengths (prompt PROMPT_LEN + response)."""
    groups, lengths = [], list(lengths)
    if len(lengths) % 2:
        raise ValueError(f"batch of {len(lengths)} sequences: groups of two need an even count")
    for g in range(0, len(lengths), 2):
        pid = len(prompts.tokens)
        prompts.tokens[pid] = [task.BOS_ID] + rng.integers(4, vocab, size=PROMPT_LEN - 1).tolist()
        members = []
        for k, total in enumerate(lengths[g:g + 2]):
            n = int(total) - PROMPT_LEN
            r = Request(rid=g + k, group_id=pid, step=0, prompt_id=pid, sample_idx=k, prompt_len=PROMPT_LEN, max_tokens=n)
            r.tokens = rng.integers(4, vocab, size=n).tolist()
            r.generated, r.reward = n, float(k)
            r.signals["logprobs"] = (-np.log(vocab) + 0.01 * rng.standard_normal(n)).tolist()
            members.append(r)
        groups.append(Group(prompt_id=pid, step=0, requests=members))
    return groups


def longtail_lengths(rng, n: int) -> list[int]:
    """n total lengths like the task's rollouts: lognormal responses, median ~90 tokens, capped at 512."""
    response = np.clip(np.round(rng.lognormal(np.log(90), 0.85, size=n)), 1, 512).astype(int)
    return (response + PROMPT_LEN).tolist()


def plan_cells(rng, repeats: int, sync_repeats: int, quick: bool = False) -> list[dict]:
    """Every cell x repeat, in one random order."""
    sizes, lens = (BATCH_SIZES[:4], SEQ_LENS[:4]) if quick else (BATCH_SIZES, SEQ_LENS)
    cells = [{"kind": "step", "split": "fit", "cell": f"B{B}xT{T}", "lengths": [T] * B, "mini_batches": 1}
             for B in sizes for T in lens]
    cells += [{"kind": "step", "split": "fit", "cell": f"B{B}xT{T}m{m}", "lengths": [T] * B, "mini_batches": m}
              for m, B, T in (MINI_BATCH_CELLS[:2] if quick else MINI_BATCH_CELLS)]
    for B in (MIXED_BATCH_SIZES[:2] if quick else MIXED_BATCH_SIZES):
        for k in range(2):  # two different draws per size
            cells.append({"kind": "step", "split": "held_out", "cell": f"mixedB{B}#{k}", "lengths": longtail_lengths(rng, B),
                          "mini_batches": 1})
    planned = [dict(c, repeat=r) for r in range(repeats) for c in cells]
    planned += [{"kind": "sync", "split": "fit", "cell": "sync", "lengths": [], "mini_batches": 1, "repeat": r}
                for r in range(sync_repeats)]
    return [planned[i] for i in rng.permutation(len(planned))]


def measure(trainer, engine, cells: list[dict], rng, vocab: int, progress=None) -> pd.DataFrame:
    """Run the cells; a row per cell with the trainer's own phase times (sync rows: the engine's)."""
    rows, prompts = [], trainer.prompts
    for step, cell in enumerate(progress(cells) if progress else cells):
        row = dict(cell, micro_batch_tokens=trainer.micro_batch_tokens, logprob_seconds=math.nan, update_seconds=math.nan,
                   logprob_cpu_seconds=math.nan, update_cpu_seconds=math.nan, sync_seconds=math.nan, started=time.time())
        if cell["kind"] == "sync":
            row["sync_seconds"] = engine.update_weights(trainer.model.state_dict(), version=step + 1)
        else:
            trainer.mini_batches = cell["mini_batches"]
            prompts.tokens.clear()
            metrics = trainer.train(synthetic_batch(rng, cell["lengths"], prompts, vocab), step)
            if metrics["samples"] != len(cell["lengths"]):
                raise RuntimeError(f"cell {cell['cell']}: trained {metrics['samples']} of {len(cell['lengths'])} sequences")
            row.update({k: metrics[k] for k in ("logprob_seconds", "update_seconds", "logprob_cpu_seconds", "update_cpu_seconds")})
        rows.append(row)
    df = pd.DataFrame(rows)
    df["n_seqs"] = df["lengths"].map(len)
    df["tokens"] = df["lengths"].map(sum)
    return df


def _machine(threads: int) -> dict:
    import torch

    return {"machine": platform.machine(), "processor": platform.processor() or "unknown", "cpus": os.cpu_count(),
            "torch_threads": threads, "torch": torch.__version__, "python": platform.python_version(),
            "note": "a shared VM: other processes ran beside the profile"}


def _start_engine(model_dir: str, dtype: str = "float32"):
    from lssim.loop.controller import RunConfig

    from .world import RealSetup, prepare, start_engine

    setup = RealSetup(model_dir=model_dir, dtype=dtype)
    prompts, _ = prepare(setup, "baseline", RunConfig(steps=1, groups_per_step=1, group_size=2, max_tokens=16))
    return start_engine(setup, prompts)


def _report(model: ProfiledTrainCost) -> str:
    lines = ["fitted (seconds):"]
    lines += [f"  {k} = {getattr(model, k):.4g}" for k in ("l0", "lB", "l1", "l2", "u0", "uB", "u1", "u2", "o0", "k0", "s0")]
    stats = model.fit_stats
    rows = [(f"{clock} {split}", phase, s) for clock in ("cpu", "wall") for split, phases in stats[clock].items()
            for phase, s in phases.items()] + [("wall", "sync push", stats["sync"])]
    lines.append(f"error (fitted on {stats['fitted_on']} time):")
    for where, phase, s in rows:
        lines.append(f"  {where:14s} {phase:20s} median {s['median_ape_pct']:5.1f}%  p90 {s['p90_ape_pct']:5.1f}%  "
                     f"max {s['max_ape_pct']:5.1f}%  ({s['n_points']} points)")
    return "\n".join(lines)


def _measure_all(args) -> pd.DataFrame:
    from .trainer import GRPOTrainer

    rng = np.random.default_rng(args.seed)
    engine = _start_engine(args.model_dir, args.dtype)
    try:
        trainer = GRPOTrainer(args.model_dir, engine=None, prompts=_Prompts(), lr=1e-6, recompute_logprobs=True,
                              threads=args.threads, seed=args.seed, device=args.device, dtype=args.dtype)
        vocab = int(trainer.model.config.vocab_size)
        measure(trainer, engine, plan_cells(rng, 1, 2, quick=True)[:6], rng, vocab)  # warm-up, discarded
        cells = plan_cells(rng, args.repeats, args.sync_repeats, quick=args.quick)
        print(f"{len(cells)} measurements, in random order", file=sys.stderr)
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        return measure(trainer, engine, cells, rng, vocab, progress=tqdm)
    finally:
        engine.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m real_backend.profile_trainer", description=__doc__.split("\n\n")[0],
                                 allow_abbrev=False)
    ap.add_argument("--out", required=True, help="profile JSON to write (the measurements go beside it as <stem>_steps.parquet)")
    ap.add_argument("--model-dir", default=str(task.MODEL_DIR))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sync-repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the trainer (the real world pins one core)")
    ap.add_argument("--device", default="cpu", help="the trainer's torch device (cuda on a GPU machine)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"), help="fit on the trainer's CPU time (a shared "
                    "CPU machine) or wall time (a GPU, whose work the CPU clock does not see)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a small grid (for tests and a first look)")
    ap.add_argument("--from-measurements", metavar="PARQUET", help="refit from measurements already taken (no engine, "
                    "no trainer): e.g. after a change to the fit")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.sync_repeats < 2:
        ap.error("--repeats must be >= 1 and --sync-repeats >= 2")
    out = Path(args.out)
    if not out.parent.is_dir():
        ap.error(f"--out: folder {out.parent} does not exist")
    steps_path = out.with_name(out.stem + "_steps.parquet")
    command = "python -m real_backend.profile_trainer " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.from_measurements:
        df = pd.read_parquet(args.from_measurements)
        previous = Path(args.from_measurements).with_name(Path(args.from_measurements).name.replace("_steps.parquet", ".json"))
        meta = (ProfiledTrainCost.from_json(previous).meta or {}) if previous.is_file() else {}
        meta = {**meta, "refit_command": command}
    else:
        df = _measure_all(args)
        meta = {"command": command, "trainer": "real_backend.trainer.GRPOTrainer (recompute_logprobs=True while profiling)",
                "model_dir": str(args.model_dir), "device": args.device, "dtype": args.dtype, **_machine(args.threads)}
    meta["measurements"] = steps_path.name
    mbt = int(df["micro_batch_tokens"].iloc[0])
    model = ProfiledTrainCost.fit(df, micro_batch_tokens=mbt, mini_batches=1, meta=meta, source=str(steps_path),
                                  clock=args.clock)
    if Path(args.from_measurements or "").resolve() != steps_path.resolve():
        tmp = steps_path.with_name(steps_path.name + ".tmp")
        df.to_parquet(tmp, index=False)
        tmp.replace(steps_path)
    model.to_json(out)
    print(_report(model))
    print(f"wrote {out} and {steps_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
