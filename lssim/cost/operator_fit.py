"""Fitting a KernelProfile (lssim.cost.operators) to measurements, and its error on the points it was not fitted on.

Two sources of measured GPU time, both shipped as small CSV files:

* the project's own H100 profiles (``lssim/profiles/h100_<model>_{decode,prefill,breakdown}.csv``, measured by
  lssim/benchmarks/roofline_gpu.py): whole decode iterations of qwen2.5-7b and qwen2.5-1.5b on a grid of batch
  size x context, whole prefills, and a breakdown of four iterations per model (linear layers, attention, LM
  head with sampling). Every coefficient of the profile is fitted to these, jointly for the two models, on
  all points but the held-out ones: every decode point at batch sizes 4 and 128 (every third batch size) and
  every third prefill by size. The breakdown rows only train.
* Microsoft Vidur's public H100 per-operation profiles (``lssim/cost/data/vidur_h100_*.csv``, derived from
  data/profiling/compute/h100/*/mlp.csv at microsoft/vidur 7d47513; its attention.csv files are not in the
  stored copy, so attention is not checked against Vidur): the time of each linear and element-wise kernel
  of a layer, per model, tensor-parallel degree and token count. The GEMM and element-wise curves are
  fitted to four models and checked on the fifth, Llama-2-7B, which none of the fit saw. These are another
  stack's kernels (sarathi/vLLM, timed one by one), so that fit is a check of the per-kernel form, not a
  profile the simulator uses.

Fits minimise the squared log ratio of predicted to measured time (relative error) over log coefficients.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.cost.catalog import DecoderShape, ModelSpec
from lssim.cost.operators import (DATA_DIR, GemmTable, KernelProfile, OperatorCostModel, decoder_kernels, elementwise_seconds,
                        fitted_fields, gemm_seconds)
from lssim.cost.roofline import RooflineCostModel

PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
LSSIM_MODELS = ("qwen2.5-7b", "qwen2.5-1.5b")
GEMM_SWEEP = PROFILES_DIR / "h100_gemm_sweep.csv"  # lssim.cost.gpu_gemm_sweep on the H100 (real_backend/gpu/measure_h100.sh)
HELD_OUT_BATCH_SIZES = (4, 128)
VIDUR_HELD_OUT = "Llama-2-7b-hf"
VIDUR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
VIDUR_TABLE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
LAYER_FIELDS = ("gemm_launch_s", "gemm_bandwidth", "gemm_flops", "gemm_ramp_rows",
                "elementwise_launch_s", "elementwise_bandwidth")

# Where the fits start: datasheet-like H100 numbers (the fit moves every one of them).
START = KernelProfile(
    name="start", gemm_launch_s=5e-6, gemm_bandwidth=3e12, gemm_flops=7e14, gemm_ramp_rows=100.0,
    elementwise_launch_s=3e-6, elementwise_bandwidth=2e12, attention_launch_s=5e-6, attention_bandwidth=2.5e12,
    attention_flops=3e14, sampling_launch_s=2e-5, sampling_bandwidth=2e12, forward_s=1e-4)


def _fit(residuals, start: KernelProfile, names: tuple[str, ...]) -> KernelProfile:
    """Least squares over the log of the named coefficients of ``start``; residuals(profile) -> array."""
    from scipy.optimize import least_squares

    def profile_at(x):
        return replace(start, **{k: float(v) for k, v in zip(names, np.exp(x))})

    x0 = np.log([getattr(start, k) for k in names])
    result = least_squares(lambda x: residuals(profile_at(x)), x0)
    return profile_at(result.x)


# ----------------------------------------------------------------------------------------------
# The project's H100 profiles: whole iterations
# ----------------------------------------------------------------------------------------------


def lssim_points(profiles_dir=PROFILES_DIR, models=LSSIM_MODELS, hardware: str = "h100") -> pd.DataFrame:
    """Every measured point of the project's GPU profiles, one row each: model, kind (decode, prefill, or a
    breakdown part: linears, attention, lm_head_sample), n_seqs, ctx_len (per sequence), n_prompts,
    prompt_len, seconds, held_out."""
    rows = []
    for model in models:
        base = Path(profiles_dir) / f"{hardware}_{model}"
        for r in pd.read_csv(f"{base}_decode.csv").itertuples():
            rows.append({"model": model, "kind": "decode", "n_seqs": r.n_seqs, "ctx_len": r.ctx_len, "seconds": r.seconds,
                         "held_out": r.n_seqs in HELD_OUT_BATCH_SIZES})
        prefill = pd.read_csv(f"{base}_prefill.csv").sort_values(["prefill_tokens", "n_prompts"]).reset_index(drop=True)
        for i, r in enumerate(prefill.itertuples()):
            rows.append({"model": model, "kind": "prefill", "n_prompts": r.n_prompts, "prompt_len": r.prompt_len,
                         "seconds": r.seconds, "held_out": i % 3 == 1})
        for r in pd.read_csv(f"{base}_breakdown.csv").itertuples():
            for kind in ("linears", "attention", "lm_head_sample"):
                rows.append({"model": model, "kind": kind, "n_seqs": r.n_seqs, "ctx_len": r.ctx_len,
                             "seconds": getattr(r, f"{kind}_s"), "held_out": False})
    df = pd.DataFrame(rows)
    for col in ("n_seqs", "ctx_len", "n_prompts", "prompt_len"):
        df[col] = df[col].fillna(0).astype(int)
    return df


def predict_points(profile: KernelProfile, points: pd.DataFrame, gemms: GemmTable | None = None) -> np.ndarray:
    """Seconds the operator model with ``profile`` (and measured GEMMs ``gemms``) gives for each row of
    :func:`lssim_points`."""
    models = {m: OperatorCostModel(m, profile, gemms=gemms) for m in points["model"].unique()}
    out = []
    for r in points.itertuples():
        model = models[r.model]
        if r.kind == "decode":
            out.append(model.decode_time(r.n_seqs, r.n_seqs * r.ctx_len, 1))
        elif r.kind == "prefill":
            out.append(model.prompt_prefill_time([r.prompt_len] * r.n_prompts))
        else:
            parts = model.iteration_breakdown(r.n_seqs, r.n_seqs * r.ctx_len)
            out.append({"linears": parts["gemm_s"] + parts["lm_head_s"], "attention": parts["attention_s"],
                        "lm_head_sample": parts["lm_head_s"] + parts["sampling_s"]}[r.kind])
    return np.array(out)


GEMM_FIELDS = ("gemm_launch_s", "gemm_bandwidth", "gemm_flops", "gemm_ramp_rows")


def fit_gemm_curve(gemms: GemmTable, start: KernelProfile = START) -> KernelProfile:
    """The GEMM curve's coefficients fitted to every measured GEMM of the table (each product at each token count):
    what prices a product the table does not hold (the LM head, another model's shapes)."""
    rows = gemms.frame
    measured = rows["seconds"].to_numpy(float)
    args = [rows[c].to_numpy(float) for c in ("tokens", "k", "n")]
    return _fit(lambda p: np.log(gemm_seconds(p, *args) / measured), start, GEMM_FIELDS)


def fit_profile(points: pd.DataFrame, name: str = "H100-torch",
                start: KernelProfile = START, gemms: GemmTable | None = None) -> KernelProfile:
    """Every coefficient fitted to the rows of ``points`` that are not held out. With ``gemms``, the GEMMs it
    measured are priced from it, the GEMM curve (for the products it does not hold) is fitted to its rows, and
    the other kernels' coefficients to the points."""
    train = points[~points["held_out"]]
    measured = train["seconds"].to_numpy(float)
    names = fitted_fields()
    if gemms is not None:
        start = fit_gemm_curve(gemms, start)
        names = tuple(f for f in names if f not in GEMM_FIELDS)
    profile = _fit(lambda p: np.log(predict_points(p, train, gemms) / measured), start, names)
    source = (f"fitted by lssim.cost.operator_fit.fit_profile to {len(train)} points of lssim/profiles "
              f"({', '.join(sorted(train['model'].unique()))}; H100 80GB HBM3, torch 2.11, CUDA graphs), "
              f"{int(points['held_out'].sum())} held out" + ("" if gemms is None else f"; GEMMs from {gemms.source}"))
    return replace(profile, name=name, source=source)


def lssim_table(profile: KernelProfile, points: pd.DataFrame, with_gemms: KernelProfile | None = None,
                gemms: GemmTable | None = None) -> pd.DataFrame:
    """Held-out decode and prefill points: measured, predicted, with the measured GEMMs (``with_gemms``, the profile
    fitted around ``gemms``) and the roofline beside."""
    held = points[points["held_out"] & points["kind"].isin(["decode", "prefill"])].copy()
    held["predicted_s"] = predict_points(profile, held)
    held["gemm_table_s"] = predict_points(with_gemms, held, gemms) if with_gemms is not None else np.nan
    roof = {m: RooflineCostModel(m, "H100") for m in held["model"].unique()}
    held["roofline_s"] = [roof[r.model].decode_time(r.n_seqs, r.n_seqs * r.ctx_len, 1) if r.kind == "decode"
                          else roof[r.model].prefill_time(r.n_prompts * r.prompt_len) for r in held.itertuples()]
    held["tokens"] = np.where(held["kind"] == "decode", held["n_seqs"], held["n_prompts"] * held["prompt_len"])
    held.insert(0, "source", "lssim H100 torch")
    return held.rename(columns={"seconds": "measured_s"}).drop(columns="held_out")


# ----------------------------------------------------------------------------------------------
# Vidur's per-operation profiles: one layer's kernels
# ----------------------------------------------------------------------------------------------


def load_vidur(data_dir=DATA_DIR, hardware: str = "h100") -> pd.DataFrame:
    """Vidur's per-kernel times as long rows: model, tp, tokens, op, seconds, with the kernel's shape from
    decoder_kernels (gemm: k, n; element-wise: bytes per token)."""
    models = pd.read_csv(Path(data_dir) / f"vidur_{hardware}_models.csv").set_index("model")
    ops = pd.read_csv(Path(data_dir) / f"vidur_{hardware}_ops.csv")
    long = ops.melt(id_vars=["model", "tp", "tokens"], value_vars=list(VIDUR_OPS), var_name="op", value_name="ms")
    long = long.dropna(subset=["ms"])
    shape_cols = {"k": [], "n": [], "bytes_per_token": []}
    cache = {}
    for r in long.itertuples():
        key = (r.model, r.tp)
        if key not in cache:
            cache[key] = _vidur_kernels(models.loc[r.model], r.model, r.tp)
        k, n, b = cache[key].get(r.op, (0, 0, 0))
        shape_cols["k"].append(k)
        shape_cols["n"].append(n)
        shape_cols["bytes_per_token"].append(b)
    long = long.assign(seconds=long["ms"] * 1e-3, **shape_cols).drop(columns="ms")
    return long.reset_index(drop=True)


def _vidur_kernels(m, name: str, tp: int) -> dict[str, tuple[int, int, int]]:
    """op -> (k, n, bytes per token) for one Vidur model at tensor-parallel degree tp."""
    head_dim = int(m["hidden"]) // int(m["n_heads"])
    sketch = ModelSpec(1, int(m["n_layers"]), int(m["hidden"]), int(m["n_heads"]), int(m["n_kv_heads"]), head_dim, 2, name)
    shape = DecoderShape(int(m["vocab"]), int(m["intermediate"]), False, False)
    spec = replace(sketch, params=shape.params(sketch))
    kern = decoder_kernels(spec, shape, int(tp))
    out = {op: (k, n, 0) for op, k, n in kern.gemms}
    out.update({op: (0, 0, b) for op, b in kern.elementwise})
    return out


def predict_ops(profile: KernelProfile, long: pd.DataFrame) -> np.ndarray:
    tokens = long["tokens"].to_numpy(float)
    is_gemm = (long["k"] > 0).to_numpy()
    gemm = gemm_seconds(profile, tokens, long["k"].to_numpy(float), long["n"].to_numpy(float))
    elem = elementwise_seconds(profile, tokens, long["bytes_per_token"].to_numpy(float))
    return np.where(is_gemm, gemm, elem)


def fit_layer_kernels(long: pd.DataFrame, start: KernelProfile = START) -> KernelProfile:
    """The GEMM and element-wise coefficients fitted to every per-kernel row of ``long``."""
    measured = long["seconds"].to_numpy(float)
    fitted = _fit(lambda p: np.log(predict_ops(p, long) / measured), start, LAYER_FIELDS)
    return replace(fitted, name="vidur H100 layer kernels", source="lssim.cost.operator_fit.fit_layer_kernels")


def vidur_layer_sums(profile: KernelProfile, long: pd.DataFrame, models: pd.DataFrame) -> pd.DataFrame:
    """Per model, tp and token count: one layer's measured and predicted kernel time, times the layers."""
    per_op = long.assign(predicted_s=predict_ops(profile, long))
    sums = per_op.groupby(["model", "tp", "tokens"], as_index=False)[["seconds", "predicted_s"]].sum()
    layers = sums["model"].map(models.set_index("model")["n_layers"])
    return sums.assign(measured_s=sums["seconds"] * layers, predicted_s=sums["predicted_s"] * layers).drop(columns="seconds")


def vidur_check(data_dir=DATA_DIR) -> tuple[KernelProfile, pd.DataFrame]:
    """Fit the layer kernels on every Vidur model but VIDUR_HELD_OUT; its layer sums at every tp and token count."""
    long = load_vidur(data_dir)
    models = pd.read_csv(Path(data_dir) / "vidur_h100_models.csv")
    fitted = fit_layer_kernels(long[long["model"] != VIDUR_HELD_OUT])
    sums = vidur_layer_sums(fitted, long[long["model"] == VIDUR_HELD_OUT], models)
    return fitted, sums


def vidur_table(sums: pd.DataFrame) -> pd.DataFrame:
    """The held-out model's rows at tp 1 and the batch/prefill sizes of VIDUR_TABLE_TOKENS."""
    rows = sums[(sums["tp"] == 1) & sums["tokens"].isin(VIDUR_TABLE_TOKENS)].copy()
    rows["kind"] = np.where(rows["tokens"] <= 256, "decode layers", "prefill layers")
    rows["n_seqs"] = np.where(rows["tokens"] <= 256, rows["tokens"], 0)
    rows["n_prompts"] = np.where(rows["tokens"] > 256, 1, 0)
    rows["prompt_len"] = np.where(rows["tokens"] > 256, rows["tokens"], 0)
    rows["ctx_len"] = 0
    rows["roofline_s"] = np.nan
    rows["gemm_table_s"] = np.nan
    rows.insert(0, "source", "vidur H100 (layer kernels)")
    return rows.drop(columns="tp")


# ----------------------------------------------------------------------------------------------
# The held-out table
# ----------------------------------------------------------------------------------------------

TABLE_COLUMNS = ["source", "model", "kind", "n_seqs", "ctx_len", "n_prompts", "prompt_len", "tokens",
                 "measured_s", "predicted_s", "ape_pct", "gemm_table_s", "gemm_table_ape_pct", "roofline_s", "roofline_ape_pct"]
STEPS_SOURCE = "lssim H100 torch, between steps"


def fit_with_gemms(points: pd.DataFrame, gemm_sweep=GEMM_SWEEP) -> tuple[KernelProfile, GemmTable]:
    """(the profile fitted around the sweep's GEMMs, the sweep as a GemmTable): what ``OperatorCostModel(model,
    "H100", gemms="H100")`` prices with (``lssim/cost/data/h100_kernels_gemms.json``)."""
    gemms = GemmTable(gemm_sweep, source=f"lssim/profiles/{Path(gemm_sweep).name}")
    return replace(fit_profile(points, gemms=gemms), name="H100-torch+gemm table"), gemms


def heldout_table(profiles_dir=PROFILES_DIR, data_dir=DATA_DIR, gemm_sweep=GEMM_SWEEP,
                  step_logs=None, unseen_logs=None) -> tuple[pd.DataFrame, KernelProfile, pd.DataFrame]:
    """(table of every held-out point reported, the fitted H100 profile, Vidur's held-out layer sums at every
    tp and token count). Deterministic: the test reproduces the shipped table from the shipped data.

    ``predicted_s`` is the shipped model (every GEMM on the fitted curve: ``SimSetup(cost="operators")``);
    ``gemm_table_s`` the model with the GEMMs measured by the sweep (``gemm_sweep``) and the other kernels fitted
    around them (``OperatorCostModel(..., gemms="H100")``). The lssim rows are the
    profiles' held-out points, the points measured after the fit on both sides of cuBLAS's steps
    (:func:`step_points`) and whole iterations of two models no fit saw (:func:`unseen_points`); the Vidur rows are the other stack's layers, priced by the curve fitted to Vidur's
    other models (the per-kernel form's check; see :func:`cross_stack`)."""
    points = lssim_points(profiles_dir)
    profile = fit_profile(points)
    with_gemms, gemms = fit_with_gemms(points, gemm_sweep)
    held = points[points["held_out"]]
    steps = step_points(step_logs)
    lssim_rows = pd.concat([lssim_table(profile, held, with_gemms, gemms),
                            lssim_table(profile, steps, with_gemms, gemms).assign(source=STEPS_SOURCE),
                            lssim_table(profile, unseen_points(unseen_logs), with_gemms, gemms).assign(source=UNSEEN_SOURCE)],
                           ignore_index=True)
    _, sums = vidur_check(data_dir)
    table = pd.concat([lssim_rows, vidur_table(sums)], ignore_index=True)
    for col in ("", "gemm_table_", "roofline_"):
        pred = table["predicted_s" if not col else f"{col}s"]
        table[f"{col}ape_pct"] = (pred / table["measured_s"] - 1).abs() * 100
    return table[TABLE_COLUMNS].reset_index(drop=True), profile, sums


def cross_stack(gemm_sweep=GEMM_SWEEP, data_dir=DATA_DIR) -> pd.DataFrame:
    """The same GEMMs on the same GPU model, timed the same way (kernel device time), by two software stacks: the
    project's sweep (torch 2.11, cuBLAS 13) against Vidur's profiles (sarathi on an older cuBLAS). One row per
    Vidur model, tp and token count: vidur_s (a layer's nine measured kernels), ours_s (the same layer with
    our four GEMMs in place of Vidur's, its element-wise kernels kept), ratio. Where the two disagree, no model
    of one stack can meet the other's points: the kernel library's choice of kernel per shape differs."""
    sweep = pd.read_csv(gemm_sweep)
    long = load_vidur(data_dir)
    ours = sweep.groupby(["k", "n", "tokens"])["seconds"].median()
    gemm = long["k"] > 0
    keys = list(zip(long["k"], long["n"], long["tokens"]))
    swapped = np.where(gemm, [ours.get(key, np.nan) for key in keys], long["seconds"])
    layer = long.assign(ours_s=swapped).groupby(["model", "tp", "tokens"], as_index=False)[["seconds", "ours_s"]].sum(min_count=9)
    layer = layer.rename(columns={"seconds": "vidur_s"}).dropna()
    return layer.assign(ratio=layer["ours_s"] / layer["vidur_s"])


# ----------------------------------------------------------------------------------------------
# Why the held-out Vidur prefill points resist a fitted curve (diagnostics; nothing above uses them)
# ----------------------------------------------------------------------------------------------

NEIGHBOURHOOD = 0.15  # token counts within +-15% of a point are its neighbours


def vidur_measured_layers(data_dir=DATA_DIR, model: str = VIDUR_HELD_OUT, tp: int = 1) -> pd.Series:
    """Measured seconds of ``model``'s layers (the nine kernels of a layer summed, times the layers) at every
    token count Vidur profiled at tensor-parallel degree ``tp``, indexed by the token count."""
    long = load_vidur(data_dir)
    layers = pd.read_csv(Path(data_dir) / "vidur_h100_models.csv").set_index("model").loc[model, "n_layers"]
    rows = long[(long["model"] == model) & (long["tp"] == tp)]
    if rows.empty:
        raise ValueError(f"{data_dir}: no Vidur rows for model {model!r} at tp {tp}")
    return rows.groupby("tokens")["seconds"].sum() * layers


def vidur_steps(data_dir=DATA_DIR, tokens=VIDUR_TABLE_TOKENS) -> pd.DataFrame:
    """At each table token count t of the held-out model (tp 1): how its measured time compares with the token
    counts profiled next to it. cuBLAS picks a GEMM kernel per shape, so the time is a staircase in the token
    count, and powers of two sit at the low end of a step (the last count before a jump).

    Columns: tokens; measured_s; next_tokens, next_measured_s (the next profiled count); jump_pct (its time over
    t's, in %); floor_pct: the least max(APE at t, APE at next) that any model whose time grows no faster than
    the token count between the two (p(next)/p(t) <= next/t: any curve without a step there) can reach,
    (q - r) / (q + r) with q the measured and r the token ratio; below_neighbours_pct: how far t's time per
    token is below the median time per token of the counts within NEIGHBOURHOOD of t (t excluded)."""
    measured = vidur_measured_layers(data_dir)
    counts = measured.index.to_numpy()
    out = []
    for t in tokens:
        if t not in measured.index:
            raise ValueError(f"{data_dir}: held-out model has no tp-1 row at {t} tokens")
        later = counts[counts > t]
        near = counts[(np.abs(counts / t - 1) <= NEIGHBOURHOOD) & (counts != t)]
        row = {"tokens": int(t), "measured_s": measured[t], "next_tokens": np.nan, "next_measured_s": np.nan,
               "jump_pct": np.nan, "floor_pct": np.nan, "below_neighbours_pct": np.nan}
        if len(later):
            nxt = int(later.min())
            q, r = measured[nxt] / measured[t], nxt / t
            row.update(next_tokens=nxt, next_measured_s=measured[nxt], jump_pct=(q - 1) * 100,
                       floor_pct=max(q - r, 0.0) / (q + r) * 100)
        if len(near):
            per_token = np.median(measured[near].to_numpy() / near)
            row["below_neighbours_pct"] = (1 - measured[t] / t / per_token) * 100
        out.append(row)
    return pd.DataFrame(out)


def vidur_form_floor(data_dir=DATA_DIR, tokens=VIDUR_TABLE_TOKENS, start: KernelProfile = START) -> pd.DataFrame:
    """The per-kernel form fitted to the held-out model's OWN tp-1 layer times at ``tokens`` (the very points
    of the table): the APE it reaches there is a lower bound on what the form can reach when it does not see
    them. Never used for a prediction. Columns: tokens, measured_s, predicted_s, ape_pct."""
    long = load_vidur(data_dir)
    held = long[(long["model"] == VIDUR_HELD_OUT) & (long["tp"] == 1) & long["tokens"].isin(tokens)].reset_index(drop=True)
    group = held.groupby("tokens").ngroup().to_numpy()
    measured = np.bincount(group, held["seconds"].to_numpy(float))
    fitted = _fit(lambda p: np.log(np.bincount(group, predict_ops(p, held)) / measured), start, LAYER_FIELDS)
    layers = pd.read_csv(Path(data_dir) / "vidur_h100_models.csv").set_index("model").loc[VIDUR_HELD_OUT, "n_layers"]
    predicted = np.bincount(group, predict_ops(fitted, held))
    return pd.DataFrame({"tokens": np.sort(held["tokens"].unique()), "measured_s": measured * layers,
                         "predicted_s": predicted * layers, "ape_pct": np.abs(predicted / measured - 1) * 100})


def vidur_neighbourhood_errors(sums: pd.DataFrame, tokens=VIDUR_TABLE_TOKENS) -> pd.DataFrame:
    """The model's signed error (%, predicted over measured) over each table point's neighbourhood: every token
    count the held-out model was profiled at (tp 1) within NEIGHBOURHOOD of t, t included. A batch in a
    simulation has any size, so this, not the error at the power of two alone, is what the step structure leaves
    a smooth model. ``sums`` is vidur_check's. Columns: tokens, points, median_signed_pct, max_ape_pct, within_10."""
    tp1 = sums[sums["tp"] == 1]
    signed = (tp1["predicted_s"] / tp1["measured_s"] - 1).to_numpy() * 100
    counts = tp1["tokens"].to_numpy()
    out = []
    for t in tokens:
        near = np.abs(counts / t - 1) <= NEIGHBOURHOOD
        out.append({"tokens": int(t), "points": int(near.sum()), "median_signed_pct": float(np.median(signed[near])),
                    "max_ape_pct": float(np.abs(signed[near]).max()), "within_10": int((np.abs(signed[near]) <= 10).sum())})
    return pd.DataFrame(out)


INTERPOLATION_TILE = 128  # rows a GEMM tile spans on the H100 (the staircase's steps sit at its multiples)


def vidur_interpolation_errors(data_dir=DATA_DIR, tile: int = INTERPOLATION_TILE) -> pd.DataFrame:
    """What a model made of the measurements themselves reaches (Vidur's own approach: a table of the profiled
    points): every profiled token count of every Vidur model and tp, left out in turn and predicted from the
    others, each kernel interpolated linearly between its nearest measured counts, taken from t's own tile step
    (ceil(t / tile)) when a count there was measured, so that no interpolation crosses a step it need not. The
    first and last counts are skipped (extrapolation). Columns: model, tp, tokens, measured_s, predicted_s (a
    layer's nine kernels), ape_pct."""
    long = load_vidur(data_dir)
    rows = []
    for (model, tp), g in long.groupby(["model", "tp"]):
        table = g.pivot_table(index="tokens", columns="op", values="seconds").sort_index()
        counts = table.index.to_numpy(float)
        for i in range(1, len(counts) - 1):
            others = np.delete(np.arange(len(counts)), i)
            xs, t = counts[others], counts[i]
            same_step = np.ceil(xs / tile) == np.ceil(t / tile)
            use = others[same_step] if same_step.any() else others
            predicted = sum(np.interp(t, counts[use], table[op].to_numpy()[use]) for op in table.columns)
            measured = table.iloc[i].sum()
            rows.append({"model": model, "tp": int(tp), "tokens": int(t), "measured_s": measured, "predicted_s": predicted,
                         "ape_pct": abs(predicted / measured - 1) * 100})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# Whole iterations on both sides of the kernel library's steps (measured after the fit, never fitted)
# ----------------------------------------------------------------------------------------------

STEP_LOGS = {model: PROFILES_DIR / f"h100_{model}_steps.log" for model in LSSIM_MODELS}
_DECODE_LINE = re.compile(r"^\s+n=\s*(\d+) L=\s*(\d+) ctx=\s*[\d,]+:\s+([\d.]+) ms")
_PREFILL_LINE = re.compile(r"^\s+prefill\s+(\d+) x\s+(\d+) =\s+\d+ tokens:\s+([\d.]+) ms")


def points_from_log(path, model: str) -> pd.DataFrame:
    """The decode and prefill points that lssim/benchmarks/roofline_gpu.py printed to a log (its best variant per
    point), as rows of :func:`lssim_points` (all held out)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if (m := _DECODE_LINE.match(line)):
            n, ctx, ms = int(m[1]), int(m[2]), float(m[3])
            rows.append({"model": model, "kind": "decode", "n_seqs": n, "ctx_len": ctx, "n_prompts": 0, "prompt_len": 0,
                         "seconds": ms * 1e-3, "held_out": True})
        elif (m := _PREFILL_LINE.match(line)):
            b, plen, ms = int(m[1]), int(m[2]), float(m[3])
            rows.append({"model": model, "kind": "prefill", "n_seqs": 0, "ctx_len": 0, "n_prompts": b, "prompt_len": plen,
                         "seconds": ms * 1e-3, "held_out": True})
    if not rows:
        raise ValueError(f"{path}: no decode or prefill point lines from roofline_gpu.py")
    return pd.DataFrame(rows)


UNSEEN_LOGS = {model: PROFILES_DIR / f"h100_{model}_heldout.log" for model in ("llama2-7b", "llama3-8b")}
UNSEEN_SOURCE = "lssim H100 torch, models never fitted"


def unseen_points(logs=None) -> pd.DataFrame:
    """Whole iterations of two models no fit saw (another family: Llama-2-7B's 32 KV heads, Llama-3-8B's GQA and
    128k vocabulary), measured on 2026-11-26 with the same script (decode at 1, 16, 128 sequences of 512 and 2048
    tokens where the KV fits, prefills of 512, 1024, 2048 and 4 x 512 tokens)."""
    return points_from_logs(UNSEEN_LOGS if logs is None else logs)


def step_points(logs=None) -> pd.DataFrame:
    """The points measured on 2026-11-26 (real_backend/gpu/measure_h100.sh, FUSE=' '): decode at 16, 24, 128 and 136
    sequences of 512 tokens, prefills of 512/520, 1024/1040, 2048/2080, 1500 and 3000 tokens, each model."""
    return points_from_logs(STEP_LOGS if logs is None else logs)


def points_from_logs(logs: dict) -> pd.DataFrame:
    """:func:`points_from_log` of every {model: log path}, in one frame."""
    return pd.concat([points_from_log(path, model) for model, path in logs.items()], ignore_index=True)
