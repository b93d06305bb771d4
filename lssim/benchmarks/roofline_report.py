"""The roofline benchmark's comparison (lssim/benchmarks/roofline_gpu.py measures): the decode iterations and prefills
measured on a GPU against ``RooflineCostModel`` (its defaults, refitted, and an extended form), per batch band,
and the ``ProfiledCostModel`` fitted to them; ``report`` prints it and writes the CSV and JSON files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lssim.benchmarks.roofline_arch import ARCH, Arch, weight_bytes_read_per_decode
from lssim.cost import HARDWARE, MODELS, ModelSpec, ProfiledCostModel, RooflineCostModel


BANDS = (("n 1-4", 1, 4), ("n 16-64", 16, 64), ("n 128-256", 128, 256))


def ape(pred, meas):
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return np.abs(pred - meas) / meas * 100.0


def error_table(decode: pd.DataFrame, column: str) -> list[dict]:
    """Median / p90 APE and median signed error (pred / measured - 1) of ``column`` per batch band."""
    out = []
    for label, lo, hi in BANDS + (("all", 1, 10**9),):
        sel = decode[(decode["n_seqs"] >= lo) & (decode["n_seqs"] <= hi)]
        if len(sel) == 0:
            continue
        e = ape(sel[column], sel["seconds"])
        signed = (sel[column] / sel["seconds"] - 1.0) * 100
        out.append({"band": label, "points": len(sel), "median_ape_pct": float(np.median(e)),
                    "p90_ape_pct": float(np.percentile(e, 90)), "median_signed_pct": float(np.median(signed))})
    return out


def calibrate_roofline(decode: pd.DataFrame, spec: ModelSpec, hardware: str) -> dict:
    """The RooflineCostModel knobs (bandwidth_efficiency, mfu, iteration_overhead_s) that minimise the
    squared relative error on these measurements (Nelder-Mead within bounds)."""
    from scipy.optimize import minimize

    n, ctx, y = (decode[c].to_numpy(float) for c in ("n_seqs", "ctx_tokens", "seconds"))

    def predict(x):
        m = RooflineCostModel(spec, hardware, bandwidth_efficiency=x[0], mfu=x[1], iteration_overhead_s=x[2])
        return np.array([m.decode_time(int(a), float(b), 1) for a, b in zip(n, ctx)])

    def loss(x):
        return float(np.sum((predict(x) / y - 1.0) ** 2))

    res = minimize(loss, [0.8, 0.5, 1e-4], method="Nelder-Mead", bounds=[(0.05, 1.0), (0.05, 1.0), (0.0, 0.01)],
                   options={"xatol": 1e-5, "fatol": 1e-8, "maxiter": 4000})
    x = res.x
    e = ape(predict(x), y)
    return {"bandwidth_efficiency": float(x[0]), "mfu": float(x[1]), "iteration_overhead_s": float(x[2]),
            "median_ape_pct": float(np.median(e)), "p90_ape_pct": float(np.percentile(e, 90)),
            "max_ape_pct": float(e.max())}


def extended_fit(decode: pd.DataFrame, spec: ModelSpec, arch: Arch, hardware: str) -> dict:
    """A proposed roofline with the two terms the measurements show it lacks, fitted here:

        t = a + max((W + kv_bytes*ctx) / (bandwidth*e), (2*params*n + attn_flops*ctx) / (peak_flops*m)) + c*n

    with W the weight bytes a decode iteration reads (no untied input embedding), ``a`` a fixed time
    per iteration (kernel latencies: about n_layers x a few tens of microseconds) and ``c`` a time per
    running sequence (sampling over the vocabulary, activations, GEMM tiles that the max() does not
    overlap). Fitted by Nelder-Mead on the squared relative error."""
    from scipy.optimize import minimize

    n, ctx, y = (decode[c].to_numpy(float) for c in ("n_seqs", "ctx_tokens", "seconds"))
    hw = HARDWARE[hardware]
    w = weight_bytes_read_per_decode(spec, arch)
    attn = 4.0 * spec.n_layers * spec.n_heads * spec.head_dim

    def predict(x):
        e, m, a, c = x
        mem = (w + spec.kv_bytes_per_token * ctx) / (hw.bandwidth_bytes_per_s * e)
        cmp_ = (2.0 * spec.params * n + attn * ctx) / (hw.peak_flops * m)
        return a + np.maximum(mem, cmp_) + c * n

    def loss(x):
        return float(np.sum((predict(x) / y - 1.0) ** 2))

    res = minimize(loss, [0.85, 0.5, 1e-3, 5e-6], method="Nelder-Mead",
                   bounds=[(0.05, 1.0), (0.05, 1.0), (0.0, 0.02), (0.0, 1e-3)],
                   options={"xatol": 1e-9, "fatol": 1e-10, "maxiter": 20000, "maxfev": 20000})
    e = ape(predict(res.x), y)
    out = {"bandwidth_efficiency": float(res.x[0]), "mfu": float(res.x[1]), "fixed_s": float(res.x[2]),
           "fixed_per_layer_s": float(res.x[2]) / spec.n_layers, "per_seq_s": float(res.x[3]),
           "weight_bytes_read": w, "median_ape_pct": float(np.median(e)), "p90_ape_pct": float(np.percentile(e, 90)),
           "max_ape_pct": float(e.max())}
    fitted = decode.assign(extended_seconds=predict(res.x))
    out["by_band"] = error_table(fitted, "extended_seconds")
    return out


def memory_bound_fit(decode: pd.DataFrame, spec: ModelSpec, arch: Arch, hardware: str) -> dict:
    """Least squares (relative) of t = a + W/bw_w + kv_bytes*ctx/bw_kv on the points with n <= 16, where
    decode is memory-bound: the fixed time per iteration, and the bandwidth weights and KV reads attain."""
    from scipy.optimize import nnls

    sel = decode[decode["n_seqs"] <= 16]
    y = sel["seconds"].to_numpy(float)
    X = np.column_stack([np.ones_like(y), sel["ctx_tokens"].to_numpy(float)])
    # t = a0 + a1*ctx, then split a0 into weight read at the fitted weight bandwidth + overhead is not
    # identifiable from decode alone; report a0, a1 and the bandwidths they imply.
    coef, _ = nnls(X / y[:, None], np.ones_like(y))
    a0, a1 = (float(c) for c in coef)
    peak = HARDWARE[hardware].bandwidth_bytes_per_s
    w = weight_bytes_read_per_decode(spec, arch)
    kv = spec.kv_bytes_per_token
    return {"points": int(len(sel)), "intercept_s": a0, "per_ctx_token_s": a1,
            "weight_bytes_read": w, "intercept_as_bandwidth": w / a0 if a0 else None,
            "intercept_as_fraction_of_peak": (w / a0) / peak if a0 else None,
            "kv_bandwidth": kv / a1 if a1 else None, "kv_fraction_of_peak": (kv / a1) / peak if a1 else None,
            "median_ape_pct": float(np.median(ape(X @ coef, y)))}


def report(name: str, hardware: str, variants: pd.DataFrame, prefill: pd.DataFrame, out: Path, meta: dict,
           log=print) -> dict:
    """Compare the measured decode iterations (`variants`: every variant, the best graph one per point measured) and
    prefills with the roofline, fit the profiled cost model, print it all and write OUT/<hardware>_<name>_*.csv and
    the profile JSON (with the comparison in its meta). Returns the comparison."""
    spec, arch = MODELS[name], ARCH[name]
    key = f"{hardware.lower()}_{name}"
    decode = decode_table(variants, spec, hardware)
    table, table_gpu = _log_decode(decode, name, hardware, log)
    calib, ext, membound = _roofline_fits(decode, spec, arch, hardware, log)
    pre = prefill.drop(columns=["model"]) if len(prefill) else None
    fit = ProfiledCostModel.fit(decode, pre, name=f"{name} on {hardware} (roofline_gpu.py, CUDA graph)")
    fitq = ProfiledCostModel.fit(decode, pre, quadratic_n=True, name=fit.name)
    for label, f in (("linear", fit), ("with n^2", fitq)):
        e = f.fit_stats
        log(f"ProfiledCostModel fit ({label}): {f!r}\n  fit error median {e['median_ape_pct']:.1f}%, p90 {e['p90_ape_pct']:.1f}%, "
            f"max {e['max_ape_pct']:.1f}% over {e['n_points']} points")
    chosen = fitq if fitq.fit_stats["p90_ape_pct"] < 0.8 * fit.fit_stats["p90_ape_pct"] else fit
    if pre is not None:
        pe = ape([chosen.prefill_time(int(t)) for t in pre["prefill_tokens"]], pre["seconds"])
        log(f"prefill: roofline median APE {np.median(pre['ape_pct']):.1f}% (max {pre['ape_pct'].max():.1f}%); "
            f"profiled p0 {chosen.p0 * 1e3:.3f} ms + p1 {chosen.p1 * 1e6:.3f} us/token, median APE {np.median(pe):.1f}% (max {pe.max():.1f}%)")

    summary = {"roofline_defaults": table, "roofline_without_overhead": table_gpu, "roofline_refit": calib,
               "extended_roofline_fit": ext,
               "memory_bound_fit": membound,
               "prefill_roofline_median_ape_pct": float(np.median(pre["ape_pct"])) if pre is not None else None,
               "profiled_linear_fit_error": fit.fit_stats, "profiled_quadratic_fit_error": fitq.fit_stats,
               "profiled_saved": "quadratic" if chosen is fitq else "linear"}
    out.mkdir(parents=True, exist_ok=True)
    decode.to_csv(out / f"{key}_decode.csv", index=False, float_format="%.6g")
    variants.to_csv(out / f"{key}_decode_variants.csv", index=False, float_format="%.6g")
    if pre is not None:
        pre.to_csv(out / f"{key}_prefill.csv", index=False, float_format="%.6g")
    chosen.to_json(out / f"{key}_profile.json", meta={**meta, "comparison": summary})
    return summary


def decode_table(variants: pd.DataFrame, spec: ModelSpec, hardware: str) -> pd.DataFrame:
    """The best CUDA-graph variant of each decode point, with the unfused and eager times beside it and the
    roofline's prediction (defaults, and without the iteration overhead), its bound and its error."""
    roof = RooflineCostModel(spec, hardware)
    roof0 = RooflineCostModel(spec, hardware, iteration_overhead_s=0.0)
    decode = variants[(variants["mode"] == "cuda_graph") & variants["best"]].copy()
    decode = decode.sort_values(["n_seqs", "ctx_len"]).reset_index(drop=True)

    def per_point(sel):
        table = variants[sel].groupby(["n_seqs", "ctx_len"])["seconds"].min()
        return [table.get((n, L), np.nan) for n, L in zip(decode["n_seqs"], decode["ctx_len"])]

    graph = variants["mode"] == "cuda_graph"
    decode["unfused_seconds"] = per_point(graph & ~variants["fused"].astype(bool))
    decode["eager_seconds"] = per_point(variants["mode"] == "eager")
    decode["roofline_seconds"] = [roof.decode_time(int(n), float(c), 1) for n, c in zip(decode["n_seqs"], decode["ctx_tokens"])]
    decode["roofline_gpu_seconds"] = [roof0.decode_time(int(n), float(c), 1) for n, c in zip(decode["n_seqs"], decode["ctx_tokens"])]
    decode["roofline_bound"] = [roof.iteration_breakdown(int(n), float(c))["bound"] for n, c in zip(decode["n_seqs"], decode["ctx_tokens"])]
    decode["ape_pct"] = ape(decode["roofline_seconds"], decode["seconds"])
    cols = ["n_seqs", "ctx_tokens", "seconds", "ctx_len", "attention", "fused", "seconds_p10", "seconds_p90", "wall_seconds",
            "unfused_seconds", "eager_seconds", "roofline_seconds", "roofline_gpu_seconds", "roofline_bound", "ape_pct"]
    return decode[cols]


def _log_decode(decode: pd.DataFrame, name: str, hardware: str, log) -> tuple[list[dict], list[dict]]:
    """Print the decode table and the roofline's errors per batch band; returns those errors (with the defaults,
    and without the iteration overhead)."""
    log(f"\n{name} on {hardware}: decode iteration, measured (CUDA graph) vs RooflineCostModel defaults")
    log(f"{'n':>4} {'L':>5} {'ctx_tokens':>10} {'measured ms':>11} {'roofline ms':>11} {'APE %':>6} {'unfused ms':>10} "
        f"{'eager ms':>9}  bound")
    for r in decode.itertuples():
        log(f"{r.n_seqs:>4} {r.ctx_len:>5} {r.ctx_tokens:>10,} {r.seconds * 1e3:>11.3f} {r.roofline_seconds * 1e3:>11.3f} "
            f"{r.ape_pct:>6.1f} {r.unfused_seconds * 1e3:>10.3f} {r.eager_seconds * 1e3:>9.3f}  {r.roofline_bound}")
    table = error_table(decode, "roofline_seconds")
    table_gpu = error_table(decode, "roofline_gpu_seconds")
    for label, t in (("roofline (defaults, 0.5 ms overhead)", table), ("roofline without the overhead", table_gpu)):
        log(f"APE of {label}:")
        for row in t:
            log(f"  {row['band']:>10}: median {row['median_ape_pct']:5.1f}%, p90 {row['p90_ape_pct']:5.1f}%, "
                f"median signed {row['median_signed_pct']:+6.1f}% ({row['points']} points)")
    return table, table_gpu


def _roofline_fits(decode: pd.DataFrame, spec: ModelSpec, arch: Arch, hardware: str, log) -> tuple[dict, dict, dict]:
    """The roofline refitted, the extended roofline and the memory-bound fit of the decode table, each printed."""
    calib = calibrate_roofline(decode, spec, hardware)
    log(f"roofline refit (bandwidth_efficiency {calib['bandwidth_efficiency']:.3f}, mfu {calib['mfu']:.3f}, "
        f"iteration_overhead_s {calib['iteration_overhead_s'] * 1e6:.0f} us): median APE {calib['median_ape_pct']:.1f}%, "
        f"p90 {calib['p90_ape_pct']:.1f}%, max {calib['max_ape_pct']:.1f}%")
    ext = extended_fit(decode, spec, arch, hardware)
    log(f"extended roofline (proposal) t = a + max(mem, compute) + c*n, weights without the untied input embedding "
        f"({ext['weight_bytes_read'] / 1e9:.2f} GB): bandwidth_efficiency {ext['bandwidth_efficiency']:.3f}, mfu {ext['mfu']:.3f}, "
        f"a {ext['fixed_s'] * 1e3:.3f} ms ({ext['fixed_per_layer_s'] * 1e6:.1f} us/layer), c {ext['per_seq_s'] * 1e6:.2f} us/seq: "
        f"median APE {ext['median_ape_pct']:.1f}%, p90 {ext['p90_ape_pct']:.1f}%, max {ext['max_ape_pct']:.1f}%")
    membound = memory_bound_fit(decode, spec, arch, hardware)
    log(f"memory-bound points (n <= 16): t = {membound['intercept_s'] * 1e3:.3f} ms + {membound['per_ctx_token_s'] * 1e9:.3f} ns x ctx; "
        f"weights ({membound['weight_bytes_read'] / 1e9:.2f} GB) at {(membound['intercept_as_bandwidth'] or 0) / 1e12:.2f} TB/s "
        f"({(membound['intercept_as_fraction_of_peak'] or 0) * 100:.0f}% of peak) if the intercept were all weight read; "
        f"KV at {(membound['kv_bandwidth'] or 0) / 1e12:.2f} TB/s ({(membound['kv_fraction_of_peak'] or 0) * 100:.0f}% of peak)")
    return calib, ext, membound
