"""The GPU cost model built from measured kernels (lssim.cost.operators) against every held-out measured point.

    python -m lssim.benchmarks.gpu_cost_model            # fit, print the held-out table (no GPU, ~10 s)
    python -m lssim.benchmarks.gpu_cost_model --write    # ... and rewrite lssim/cost/data/h100_kernels.json,
                                                         #     h100_kernels_gemms.json and gpu_cost_heldout.csv
    python -m lssim.benchmarks.gpu_cost_model --from-vidur VIDUR_CHECKOUT   # rebuild vidur_h100_*.csv

What is held out and what the fits see: lssim.cost.operator_fit. The shipped H100 profile is the one fitted
without the held-out points, so the table is the error of the model the simulator uses
(``SimSetup(cost="operators")``); the "measured GEMMs" column is the model with the GEMMs measured by
lssim.cost.gpu_gemm_sweep (lssim/profiles/h100_gemm_sweep.csv; ``OperatorCostModel(..., gemms="H100")``).

``--from-vidur`` reads data/profiling/compute/h100/<org>/<model>/mlp.csv from a checkout of
https://github.com/microsoft/vidur (read at commit 7d47513) and writes, per model, tensor-parallel degree and
token count, the median time in ms of each of a layer's nine measured kernels (duplicate rows averaged):
every token count for the held-out Llama-2-7B at tp 1, powers of two and multiples of 128 elsewhere (to keep
the file small). phi-2 is left out: its MLP is not gated and its attention runs beside the MLP.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.cost.operator_fit import (GEMM_SWEEP, VIDUR_HELD_OUT, VIDUR_OPS, VIDUR_TABLE_TOKENS, cross_stack,
                                     fit_gemm_curve, fit_with_gemms, heldout_table, lssim_points, vidur_form_floor,
                                     vidur_interpolation_errors, vidur_neighbourhood_errors, vidur_steps)
from lssim.cost.operators import DATA_DIR, GEMM_TABLE_PROFILES, KERNEL_PROFILES, GemmTable, gemm_seconds

TABLE_CSV = DATA_DIR / "gpu_cost_heldout.csv"
# Layers of each Vidur model (its config.json: num_hidden_layers), which mlp.csv does not record.
VIDUR_LAYERS = {"Llama-2-7b-hf": 32, "Llama-2-70b-hf": 80, "CodeLlama-34b-Instruct-hf": 48, "internlm-20b": 60,
                "Qwen-72B": 80}


def derive_vidur(root: Path, out: Path = DATA_DIR, hardware: str = "h100") -> None:
    models, ops = [], []
    for path in sorted((root / "data" / "profiling" / "compute" / hardware).glob("*/*/mlp.csv")):
        name = path.parent.name
        if name not in VIDUR_LAYERS:
            print(f"skipped {path} (no layer count; not a gated-MLP decoder)")
            continue
        df = pd.read_csv(path)
        first = df.iloc[0]
        models.append({"model": name, "n_layers": VIDUR_LAYERS[name], "hidden": int(first["n_embd"]),
                       "n_heads": int(first["n_head"]), "n_kv_heads": int(first["n_kv_head"]),
                       "intermediate": int(first["n_expanded_embd"]), "vocab": int(first["vocab_size"])})
        cols = {f"time_stats.{op}.median": op for op in VIDUR_OPS}
        t = df.rename(columns={**cols, "num_tensor_parallel_workers": "tp", "num_tokens": "tokens"})
        t = t.groupby(["tp", "tokens"], as_index=False)[list(VIDUR_OPS)].mean()
        tokens = t["tokens"].to_numpy()
        keep = (tokens & (tokens - 1) == 0) | (tokens % 128 == 0) | ((name == VIDUR_HELD_OUT) & (t["tp"] == 1)).to_numpy()
        ops.append(t[keep].assign(model=name))
    pd.DataFrame(models).to_csv(out / f"vidur_{hardware}_models.csv", index=False)
    table = pd.concat(ops)[["model", "tp", "tokens", *VIDUR_OPS]]
    table.to_csv(out / f"vidur_{hardware}_ops.csv", index=False, float_format="%.5g")
    print(f"wrote {out / f'vidur_{hardware}_models.csv'} ({len(models)} models) and "
          f"{out / f'vidur_{hardware}_ops.csv'} ({len(table)} rows)")


def format_table(table: pd.DataFrame) -> str:
    lines = ["| source | model | point | measured ms | predicted ms | APE | measured GEMMs ms (APE) | roofline ms (APE) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        if r.kind == "decode":
            point = f"decode n={r.n_seqs} L={r.ctx_len}"
        elif r.kind == "prefill":
            point = f"prefill {r.n_prompts}x{r.prompt_len}"
        else:
            point = f"{r.kind}, {r.tokens} tokens"
        roof = "" if np.isnan(r.roofline_s) else f"{r.roofline_s * 1e3:.2f} ({r.roofline_ape_pct:.1f}%)"
        curve = "" if np.isnan(r.gemm_table_s) else f"{r.gemm_table_s * 1e3:.2f} ({r.gemm_table_ape_pct:.1f}%)"
        lines.append(f"| {r.source} | {r.model} | {point} | {r.measured_s * 1e3:.2f} | {r.predicted_s * 1e3:.2f} "
                     f"| {r.ape_pct:.1f}% | {curve} | {roof} |")
    return "\n".join(lines)


def summary(table: pd.DataFrame, sums: pd.DataFrame) -> str:
    lines = []
    for (source, kind), g in table.groupby(["source", "kind"], sort=False):
        roof = "" if g["roofline_ape_pct"].isna().all() else \
            (f"; with the measured GEMMs median {g['gemm_table_ape_pct'].median():.1f}%, max {g['gemm_table_ape_pct'].max():.1f}%"
             f"; roofline median {g['roofline_ape_pct'].median():.1f}%, max {g['roofline_ape_pct'].max():.1f}%")
        lines.append(f"{source} {kind}: {len(g)} held-out points, APE median {g['ape_pct'].median():.1f}%, "
                     f"max {g['ape_pct'].max():.1f}%, {int((g['ape_pct'] <= 10).sum())}/{len(g)} within 10%{roof}")
    ape = (sums["predicted_s"] / sums["measured_s"] - 1).abs() * 100
    for tp, a in ape.groupby(sums["tp"]):
        lines.append(f"vidur {VIDUR_HELD_OUT} tp={tp}, every shipped token count ({len(a)}): APE median "
                     f"{a.median():.1f}%, p90 {np.percentile(a, 90):.1f}%, max {a.max():.1f}%, "
                     f"{int((a <= 10).sum())}/{len(a)} within 10%")
    return "\n".join(lines + gemm_summary() + steps_summary(sums))


def gemm_summary() -> list[str]:
    """The measured GEMMs themselves: how the curve for unmeasured products fits them, and the other stack."""
    gemms = GemmTable(GEMM_SWEEP)
    curve = fit_gemm_curve(gemms)
    f = gemms.frame
    ape = np.abs(gemm_seconds(curve, *(f[c].to_numpy(float) for c in ("tokens", "k", "n"))) / f["seconds"] - 1) * 100
    lines = [f"the GEMM sweep ({len(f)} kernels: {len(gemms.products())} products, 1-4096 tokens; lssim/profiles/"
             f"{GEMM_SWEEP.name}): the curve fitted to all of them (what prices a product not measured) is off by "
             f"median {np.median(ape):.1f}%, p90 {np.percentile(ape, 90):.1f}%, max {ape.max():.1f}%"]
    cs = cross_stack()
    lines.append("two stacks, the same H100 kernels timed the same way (a Vidur layer with our four GEMMs in place of "
                 f"its own, over its own): ratio median {cs['ratio'].median():.3f}, range {cs['ratio'].min():.2f}-"
                 f"{cs['ratio'].max():.2f}; within 10% of Vidur's layer at {int(((cs['ratio'] - 1).abs() <= 0.1).sum())}"
                 f"/{len(cs)} points")
    llama = cs[(cs["model"] == VIDUR_HELD_OUT) & (cs["tp"] == 1)].set_index("tokens")["ratio"]
    lines.append(f"  {VIDUR_HELD_OUT} tp=1 at the table's counts: "
                 + ", ".join(f"{t}: {llama[t]:.2f}" for t in VIDUR_TABLE_TOKENS if t in llama.index))
    return lines


def steps_summary(sums: pd.DataFrame) -> list[str]:
    """Why the Vidur prefill points resist a fitted curve (lssim.cost.operator_fit.vidur_steps, vidur_form_floor)."""
    lines = [f"vidur {VIDUR_HELD_OUT} tp=1, measured time at each table point from 64 tokens vs the next profiled count:"]
    steps = vidur_steps()
    for r in steps[steps["tokens"] >= 64].dropna(subset=["next_tokens"]).itertuples():
        lines.append(f"  {r.tokens:>5} -> {int(r.next_tokens):>5} tokens: {r.jump_pct:+5.1f}% (a model without a step there "
                     f"misses one of the two by >= {r.floor_pct:4.1f}%); time per token {r.below_neighbours_pct:+5.1f}% "
                     f"below its +-15% neighbours")
    near = vidur_neighbourhood_errors(sums)
    near = near[near["tokens"] >= 64]
    lines.append("the model over each point's +-15% neighbourhood (every count profiled there): "
                 + ", ".join(f"{r.tokens}: median {r.median_signed_pct:+.1f}% ({r.within_10}/{r.points} within 10%)"
                             for r in near.itertuples()))
    floor = vidur_form_floor()
    lines.append(f"the per-kernel form fitted to the held-out model's own {len(floor)} table points (a bound, never "
                 f"shipped): APE max {floor['ape_pct'].max():.1f}%, median {floor['ape_pct'].median():.1f}%")
    table = vidur_interpolation_errors()
    lines.append("the measurements as their own model (each profiled count left out and interpolated from the others "
                 "within its 128-row tile step: Vidur's approach), per model and tp: APE median / max, within 10%:")
    for (model, tp), g in table.groupby(["model", "tp"]):
        worst = g.loc[g["ape_pct"].idxmax()]
        lines.append(f"  {model:<26} tp={tp}: {g['ape_pct'].median():4.1f}% / {g['ape_pct'].max():5.1f}% (at "
                     f"{int(worst.tokens)} tokens), {int((g['ape_pct'] <= 10).sum())}/{len(g)}")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the shipped profile and held-out table")
    ap.add_argument("--from-vidur", type=Path, default=None, help="a Vidur checkout: rebuild vidur_h100_*.csv first")
    args = ap.parse_args(argv)
    if args.from_vidur:
        derive_vidur(args.from_vidur)
    table, profile, sums = heldout_table()
    print(format_table(table))
    print()
    print(summary(table, sums))
    if args.write:
        profile.to_json(KERNEL_PROFILES["H100"])
        fit_with_gemms(lssim_points())[0].to_json(GEMM_TABLE_PROFILES["H100"])
        table.to_csv(TABLE_CSV, index=False, float_format="%.6g")
        print(f"\nwrote {KERNEL_PROFILES['H100']}, {GEMM_TABLE_PROFILES['H100']} and {TABLE_CSV}")


if __name__ == "__main__":
    main()
