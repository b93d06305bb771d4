"""Measure what vLLM's n-gram speculative decoding does on this machine, per batch size: acceptance, drafting
and verification cost, and the speedup (or slow-down) of whole batches, with speculation on and off on ONE
engine (the proposer switched per batch by spec_stats.limit_drafts, so both sides share every other setting).

    flock /tmp/lssim-vllm.lock python -m paper.experiments.measure_speculation --out real_backend/data/speculation_cpu.json

A cell is B distinct task prompts submitted at once, greedy (vLLM 0.32's CPU build speculates correctly only at
temperature 0, engine.py), up to `max_tokens` each, ending at EOS as in a rollout (the batch shrinks). Each cell
runs twice, drafting allowed (limit B) and not (limit 0), in a random order; greedy speculation is lossless, so
both generate the same tokens (checked: `same_tokens`) and the makespan ratio is the speedup for that work.
The stat logger keeps one row per engine step (spec_stats.SpecCounts(keep_iterations)): running requests,
tokens generated, drafts, drafted and accepted tokens, and the time the frontend saw the step; the time between
two consecutive steps of a cell is one step's cost.

Writes `--out` (JSON: the per-batch-size figures, the per-running-batch figures, the command, the fit) and beside it
<stem>_cells.parquet (one row per cell and mode) and <stem>_iterations.parquet (one row per engine step). The
measurement and the fit are product code (real_backend.speculation_fit, which `lssim validate --reprofile` runs on its
speculating engine); this script starts the engine, adds the plain-engine check and prints the report.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from lssim.loop.core import Speculation
from real_backend.speculation_fit import DEFAULT_BATCH_SIZES, files, measure, refit, run_cell, summarize, write_fitted


def plain_check(engine, cells: pd.DataFrame, max_tokens: int) -> tuple[pd.DataFrame, dict]:
    """The first repeat's cells again on an engine started WITHOUT speculation: what an engine started with it costs
    even with drafting off (vLLM turns async scheduling off for n-gram speculation, among others)."""
    rows = []
    first = cells[(cells["mode"] == "off") & (cells["repeat"] == 0)]
    for _, off in first.iterrows():
        row, _, _ = run_cell(engine, list(off["prompts"]), max_tokens, 0, 10**6 + len(rows) * 1000)
        rows.append({**row, "cell": off["cell"], "repeat": 0, "same_tokens": None})
    plain = pd.DataFrame(rows)
    figures = {"seconds_plain": float(plain["seconds"].sum()), "seconds_spec_engine_off": float(first["seconds"].sum()),
               "cells": int(len(plain))}
    figures["spec_engine_off_over_plain"] = figures["seconds_spec_engine_off"] / figures["seconds_plain"]
    return plain, figures


def with_plain_check(config, prompts, cells: pd.DataFrame, max_tokens: int) -> tuple[pd.DataFrame, dict]:
    """plain_check on a plain engine started for it (and closed after): the cells with its rows added, its figures."""
    from dataclasses import replace

    from real_backend.engine import VLLMEngine

    plain_engine = VLLMEngine(replace(config, speculation=None), prompts.prompt_tokens, None)
    try:
        run_cell(plain_engine, prompts.pool.prompt_id.tolist()[:8], max_tokens, 0, 10**7)  # warm-up
        plain, engine_off = plain_check(plain_engine, cells, max_tokens)
    finally:
        plain_engine.close()
    print(f"engine started with speculation, drafting off, over a plain engine: {engine_off}", file=sys.stderr)
    return pd.concat([cells, plain], ignore_index=True), engine_off


def report(summary: dict) -> None:
    for b, r in summary["by_batch"].items():
        print(f"batch {int(b):3d}: on {r['seconds_on']:.2f} s, off {r['seconds_off']:.2f} s, speedup {r['speedup']:.3f}, "
              f"accepted/draft {r['accepted_per_draft']:.3f}, same tokens {r['same_tokens']}")
    fit = summary.get("fit", {})
    print(f"fit: {fit.get('params')} alpha {fit.get('alpha', float('nan')):.3f}")
    if "held_out" in fit:
        for c in fit["held_out"]["cells"]:
            print(f"  held-out cell {c['cell']} batch {c['batch']}: measured {c['measured']:.3f}, predicted {c['predicted']:.3f}")
        print(f"  held-out speedup error (points): {fit['held_out']['error_points']}")
    loo = fit.get("step_ratio_held_out")
    if loo:
        for r in loo["points"]:
            print(f"  step cost at n={r['n']:2d} (left out): measured {r['measured']:.3f}x, predicted {r['predicted']:.3f}x "
                  f"({r['error_pct']:+.1f}%, {r['weight']} steps)")
        print(f"  left-out batch sizes: median |error| {loo['median_abs_pct']:.1f}%, p90 {loo['p90_abs_pct']:.1f}%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="JSON")
    p.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)), metavar="N,N,...")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--gamma", type=int, default=4, help="drafted tokens per step (vLLM num_speculative_tokens)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cost-profile", default="real_backend/data/profile_cpu.json", metavar="JSON",
                   help="the plain engine's cost model the speculation factors are relative to (lssim profile)")
    p.add_argument("--plain-check", action="store_true",
                   help="then the first repeat's cells on an engine started without speculation (one more engine start)")
    p.add_argument("--refit", action="store_true", help="no engine: fit the measurement already in --out again")
    args = p.parse_args(argv)
    if args.refit:
        report(refit(Path(args.out), args.cost_profile))
        return 0
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    if min(batch_sizes) < 1 or args.max_tokens < 2 or args.repeats < 1:
        p.error("batch sizes >= 1, --max-tokens >= 2 and --repeats >= 1")

    import real_backend.engine  # noqa: F401  (vLLM's logging set up before vLLM is imported)

    from real_backend import task
    from real_backend.engine import VLLMEngine
    from real_backend.engine_config import VLLMConfig
    from real_backend.prompts import TaskPrompts

    prompts = TaskPrompts.from_files(task.PROMPTS_PATH, task.MODEL_DIR)
    max_num_seqs = max(64, 2 * max(batch_sizes))
    spec = Speculation(method="ngram", gamma=args.gamma, max_batch=max(batch_sizes))
    config = VLLMConfig(model=str(task.MODEL_DIR), max_num_seqs=max_num_seqs, speculation=spec,
                        sampling_kwargs={"temperature": 0.0})
    t0 = time.monotonic()
    engine = VLLMEngine(config, prompts.prompt_tokens, None)
    print(f"engine up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    engine._spec.keep_iterations = True
    try:
        pool = prompts.pool.prompt_id.tolist()
        measure(engine, pool, [max(batch_sizes)], args.max_tokens, 1, args.seed + 1, progress=lambda s: None)  # warm-up
        cells, steps = measure(engine, pool, batch_sizes, args.max_tokens, args.repeats, args.seed,
                               progress=lambda s: print(s, file=sys.stderr, flush=True))
    finally:
        engine.close()
    engine_off = None
    if args.plain_check:
        cells, engine_off = with_plain_check(config, prompts, cells, args.max_tokens)
    out = Path(args.out)
    summary = {"kind": "speculation_profile", "engine": "vllm (VLLMEngine), n-gram proposer",
               "model": str(task.MODEL_DIR.name), "gamma": args.gamma, "ngram_lookup": list(config.ngram_lookup),
               "max_tokens": args.max_tokens, "repeats": args.repeats, "temperature": 0.0,
               "command": "python -m paper.experiments.measure_speculation " + " ".join(argv if argv is not None else sys.argv[1:]),
               "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **summarize(cells, steps)}
    summary["plain_engine"] = engine_off
    write_fitted(out, summary, cells, steps, args.gamma, args.cost_profile)
    report(summary)
    print(f"written to {out} (+ {files(out)['cells'].name}, {files(out)['iterations'].name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
