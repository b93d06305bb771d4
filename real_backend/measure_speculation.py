"""Measure what vLLM's n-gram speculative decoding does on this machine, per batch size: acceptance, drafting
and verification cost, and the speedup (or slow-down) of whole batches, with speculation on and off on ONE
engine (the proposer switched per batch by spec_stats.limit_drafts, so both sides share every other setting).

    flock /tmp/lssim-vllm.lock python -m real_backend.measure_speculation --out real_backend/speculation_cpu.json

A cell is B distinct task prompts submitted at once, greedy (vLLM 0.32's CPU build speculates correctly only at
temperature 0, engine.py), up to `max_tokens` each, ending at EOS as in a rollout (the batch shrinks). Each cell
runs twice, drafting allowed (limit B) and not (limit 0), in a random order; greedy speculation is lossless, so
both generate the same tokens (checked: `same_tokens`) and the makespan ratio is the speedup for that work.
The stat logger keeps one row per engine step (spec_stats.SpecCounts(keep_iterations)): running requests,
tokens generated, drafts, drafted and accepted tokens, and the time the frontend saw the step; the time between
two consecutive steps of a cell is one step's cost.

Writes `--out` (JSON: the per-batch-size figures, the per-running-batch figures, the command) and beside it
<stem>_cells.parquet (one row per cell and mode) and <stem>_iterations.parquet (one row per engine step).
lssim.cost.speculative.fit_speculation fits the simulator's model to them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.loop.core import Request, Speculation

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
TOGGLE_SECONDS = 0.03  # "alt" cells: the proposer switched on and off about every this many seconds (a few steps)


def files(out) -> dict[str, Path]:
    out = Path(out)
    return {"cells": out.with_name(out.stem + "_cells.parquet"), "iterations": out.with_name(out.stem + "_iterations.parquet")}


def run_cell(engine, prompt_ids: list[int], max_tokens: int, limit: int, rid0: int,
             toggle_every: float | None = None) -> tuple[dict, list[dict], list]:
    """One batch with the proposer limited to `limit`: (its row, its engine steps, the responses' tokens).
    toggle_every: switch the proposer between `limit` and 0 every this many seconds (at the next token event), so
    speculating and plain steps alternate within the batch under the same load ("alt" cells)."""
    if engine.speculation is not None:
        engine.set_draft_limit(limit)
    engine.set_progress_interval(1 if toggle_every else None)
    engine.reset_spec_counters()
    requests = [Request(rid=rid0 + i, group_id=rid0 + i, step=0, prompt_id=p, sample_idx=0,
                        prompt_len=len(engine.prompt_tokens(p)), max_tokens=max_tokens, seed=0)
                for i, p in enumerate(prompt_ids)]
    t0 = time.time()
    engine.submit(requests)
    left, flipped, current = len(requests), t0, limit
    while left:
        left -= sum(ev.kind == "finished" for ev in engine.next_events())
        if toggle_every and time.time() - flipped >= toggle_every:
            current, flipped = (0 if current else limit), time.time()
            engine.set_draft_limit(current)
    seconds = time.time() - t0
    engine.set_progress_interval(None)
    counts = engine.spec_counters()
    steps = engine._spec.take_iterations()
    lengths = [len(r.tokens) for r in requests]
    mode = "plain" if engine.speculation is None else "alt" if toggle_every else ("on" if limit else "off")
    row = {"batch": len(requests), "mode": mode, "prompts": list(prompt_ids), "seconds": seconds, "tokens": sum(lengths),
           "lengths": lengths, "engine_steps": counts["steps"], "drafts": counts["drafts"],
           "draft_tokens": counts["draft_tokens"], "accepted_tokens": counts["accepted_tokens"]}
    for prev, s in zip([{"time": t0}] + steps, steps):
        s["seconds"] = s["time"] - prev["time"]  # the first step of a cell includes the prefill
    return row, steps, [list(r.tokens) for r in requests]


def measure(engine, prompt_pool: list[int], batch_sizes, max_tokens: int, repeats: int, seed: int, progress=print):
    """Every (repeat, batch size) cell, on then off or off then on (random): (cells, iterations) frames."""
    rng = np.random.default_rng(seed)
    cells = [(rep, b) for rep in range(repeats) for b in batch_sizes]
    cells = [cells[i] for i in rng.permutation(len(cells))]  # drift must not pass for a trend in B
    cell_rows, step_rows, rid = [], [], 0
    for k, (rep, b) in enumerate(cells):
        prompts = rng.choice(prompt_pool, size=b, replace=False).tolist()
        order = ["on", "off"] if rng.random() < 0.5 else ["off", "on"]
        tokens = {}
        for mode in order + ["alt"]:
            row, steps, tokens[mode] = run_cell(engine, prompts, max_tokens, b if mode != "off" else 0, rid,
                                                toggle_every=TOGGLE_SECONDS if mode == "alt" else None)
            rid += b
            row.update(cell=k, repeat=rep)
            cell_rows.append(row)
            step_rows += [{**s, "cell": k, "batch": b, "mode": mode, "step_index": i} for i, s in enumerate(steps)]
        for row in cell_rows[-3:]:
            row["same_tokens"] = tokens["on"] == tokens["off"] == tokens["alt"]
        on, off = cell_rows[-3:-1] if order[0] == "on" else cell_rows[-2:-4:-1]
        progress(f"cell {k + 1}/{len(cells)}: batch {b}: on {on['seconds']:.2f} s, off {off['seconds']:.2f} s, "
                 f"accepted {on['accepted_tokens']}/{on['draft_tokens']} drafted, same tokens {on['same_tokens']}")
    return pd.DataFrame(cell_rows), pd.DataFrame(step_rows)


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


def summarize(cells: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """Per batch size: makespans on and off, the speedup, acceptance; per running batch: step costs."""
    by_batch = {}
    for b, g in cells[cells["mode"].isin(["on", "off", "alt"])].groupby("batch"):
        on, off = g[g["mode"] == "on"], g[g["mode"] == "off"]
        drafts, accepted = int(on["drafts"].sum()), int(on["accepted_tokens"].sum())
        by_batch[int(b)] = {"seconds_on": float(on["seconds"].sum()), "seconds_off": float(off["seconds"].sum()),
                            "speedup": float(off["seconds"].sum() / on["seconds"].sum()),
                            "tokens": int(on["tokens"].sum()), "steps_on": int(on["engine_steps"].sum()),
                            "steps_off": int(off["engine_steps"].sum()), "drafts": drafts,
                            "draft_tokens": int(on["draft_tokens"].sum()), "accepted_tokens": accepted,
                            "accepted_per_draft": accepted / drafts if drafts else None,
                            "same_tokens": bool(g["same_tokens"].all())}
    return {"by_batch": by_batch, "by_running": running_table(steps).to_dict(orient="index")}


def running_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per running batch n, over decode-only engine steps (no prompt tokens, not a cell's first): mean step seconds
    on and off, tokens per sequence per step, drafts per sequence-step, drafted tokens per draft, accepted per draft."""
    d = steps[(steps["prompt_tokens"] == 0) & (steps["step_index"] > 0) & (steps["running"] > 0)]
    rows = {}
    for n, g in d.groupby("running"):
        on, off = g[g["mode"] == "on"], g[g["mode"] == "off"]
        if len(on) < 3 or len(off) < 3:
            continue
        seqsteps = float(n) * len(on)
        rows[int(n)] = {"steps_on": len(on), "steps_off": len(off), "seconds_on": float(on["seconds"].median()),
                        "seconds_off": float(off["seconds"].median()),
                        "tokens_per_seq_step": float(on["generation_tokens"].sum() / seqsteps),
                        "draft_rate": float(on["drafts"].sum() / seqsteps),
                        "draft_len": float(on["draft_tokens"].sum() / max(1, on["drafts"].sum())),
                        "accepted_per_draft": float(on["accepted_tokens"].sum() / max(1, on["drafts"].sum()))}
    return pd.DataFrame.from_dict(rows, orient="index")


def fit_profile(cells: pd.DataFrame, steps: pd.DataFrame, gamma: int, cost_profile) -> dict:
    """The profile's "fit": SpecFit params fitted to every cell (what the simulator uses), and the held-out check:
    fitted on every repeat but the last, the speedup of each cell of the last repeat predicted and measured."""
    from dataclasses import asdict

    from lssim.cost import ProfiledCostModel
    from lssim.cost.speculative import fit_speculation

    base = ProfiledCostModel.from_json(cost_profile)
    fit, info = fit_speculation(cells, steps, base, gamma)
    out = {"params": asdict(fit), "alpha": info["alpha"], "accepted_per_draft": info["accepted_per_draft"],
           "cost_profile": str(cost_profile), "ratios": info["ratios"], "in_sample": info["cells"],
           "in_sample_error_points": info["speedup_error_points"], "step_ratio_held_out": info["step_ratio_held_out"]}
    last = int(cells["repeat"].max())
    if last > 0:
        train = cells.loc[cells["repeat"] < last, "cell"].unique()
        held_fit, held = fit_speculation(cells, steps, base, gamma, train=train)
        out["held_out"] = {"params": asdict(held_fit), "cells": held["cells"], "error_points": held["speedup_error_points"]}
    return out


def write(out: Path, summary: dict, cells: pd.DataFrame | None = None, steps: pd.DataFrame | None = None) -> None:
    from lssim.results import atomic_write

    for kind, frame in (("cells", cells), ("iterations", steps)):
        if frame is not None:
            atomic_write(files(out)[kind], lambda path, f=frame: f.to_parquet(path, index=False))
    atomic_write(out, lambda path: Path(path).write_text(json.dumps(summary, indent=1, default=float)))


def write_fitted(out: Path, summary: dict, cells: pd.DataFrame, steps: pd.DataFrame, gamma: int, cost_profile) -> None:
    """Write the measurement, then fit it and write `summary` again with its "fit": the measurement first, so a
    fit that fails does not lose it (`--refit` later)."""
    write(out, summary, cells, steps)
    summary["fit"] = fit_profile(cells, steps, gamma, cost_profile)
    write(out, summary)


def refit(out: Path, cost_profile) -> dict:
    """Fit an existing measurement again (no engine): rewrite `out`'s "fit"."""
    summary = json.loads(out.read_text())
    cells, steps = pd.read_parquet(files(out)["cells"]), pd.read_parquet(files(out)["iterations"])
    summary["fit"] = fit_profile(cells, steps, int(summary["gamma"]), cost_profile)
    write(out, summary)
    return summary


def measure_fit(engine, prompt_pool: list[int], out, cost_profile, batch_sizes=DEFAULT_BATCH_SIZES, max_tokens: int = 256,
                repeats: int = 2, seed: int = 0, progress=None) -> Path:
    """The measurement and its fit on an engine already started with n-gram speculation (``lssim validate
    --reprofile`` runs it beside the profile, so the speculation is priced as this engine does it in these minutes),
    written to ``out`` as main() writes it. Batch sizes the engine cannot hold at once are left out."""
    if engine.speculation is None:
        raise ValueError("measure_fit needs an engine started with speculation")
    sizes = [b for b in batch_sizes if b <= min(len(prompt_pool), engine.config.max_num_seqs)]
    keep = engine._spec.keep_iterations
    engine._spec.keep_iterations = True
    try:
        cells, steps = measure(engine, prompt_pool, sizes, max_tokens, repeats, seed, progress=progress or (lambda s: None))
    finally:
        engine._spec.keep_iterations = keep
        engine.set_draft_limit(0)  # as layout.drafting_off leaves it: a run sets its own limit when it starts
    out = Path(out)
    gamma = int(engine.speculation.gamma)
    summary = {"kind": "speculation_profile", "engine": "vllm (VLLMEngine), n-gram proposer", "gamma": gamma,
               "max_tokens": max_tokens, "repeats": repeats, "temperature": 0.0,
               "command": " ".join(sys.argv) + " (real_backend.measure_speculation.measure_fit)",
               "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **summarize(cells, steps)}
    write_fitted(out, summary, cells, steps, gamma, cost_profile)
    return out


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
    p.add_argument("--cost-profile", default=str(Path(__file__).with_name("profile_cpu.json")), metavar="JSON",
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

    from . import task
    from .engine import VLLMEngine
    from .engine_config import VLLMConfig
    from .prompts import TaskPrompts

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
        from dataclasses import replace

        plain_engine = VLLMEngine(replace(config, speculation=None), prompts.prompt_tokens, None)
        try:
            run_cell(plain_engine, pool[:8], args.max_tokens, 0, 10**7)  # warm-up
            plain, engine_off = plain_check(plain_engine, cells, args.max_tokens)
        finally:
            plain_engine.close()
        cells = pd.concat([cells, plain], ignore_index=True)
        print(f"engine started with speculation, drafting off, over a plain engine: {engine_off}", file=sys.stderr)
    out = Path(args.out)
    summary = {"kind": "speculation_profile", "engine": "vllm (VLLMEngine), n-gram proposer",
               "model": str(task.MODEL_DIR.name), "gamma": args.gamma, "ngram_lookup": list(config.ngram_lookup),
               "max_tokens": args.max_tokens, "repeats": args.repeats, "temperature": 0.0,
               "command": "python -m real_backend.measure_speculation " + " ".join(argv if argv is not None else sys.argv[1:]),
               "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **summarize(cells, steps)}
    summary["plain_engine"] = engine_off
    write_fitted(out, summary, cells, steps, args.gamma, args.cost_profile)
    report(summary)
    print(f"written to {out} (+ {files(out)['cells'].name}, {files(out)['iterations'].name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
