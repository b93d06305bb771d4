"""Time a decoder's GEMMs alone over a fine grid of token counts, with the name of the kernel the BLAS library picked.

The GPU cost model (lssim.cost.operators) prices a GEMM with a smooth curve in the token count, padded to 64-row
tiles. Vidur's held-out Llama-2-7B shows why that curve misses at powers of two: the measured time is a staircase,
a kernel-selection step of 14-28% right after 512, 1024 and 2048 tokens (lssim.cost.operator_fit.vidur_steps), and
the powers of two sit at the bottom of the steps. This script is the measurement that settles whether the project's
own stack (torch's cuBLAS on the H100 the shipped profile was measured on) has the same steps, where, and which
kernels (tile shapes) cuBLAS switches between: the data a tile/wave model of the steps would be fitted to. The
project's profiles (lssim/profiles) time only powers of two, so the shipped profile is fitted at step bottoms.

    PYTHONPATH=. python3 -m lssim.cost.gpu_gemm_sweep --model qwen2.5-7b --out lssim/profiles   # GPU, a few minutes
    python3 -m lssim.cost.gpu_gemm_sweep --model qwen2.5-1.5b --tokens 1,8 --device cpu --out /tmp   # CPU smoke run

Writes ``{hardware}_{model}_gemm_sweep.csv``: op, k, n (one tensor-parallel rank's ``rows x k @ k x n`` bf16 product,
as lssim.cost.operators.decoder_kernels lists a layer's GEMMs), tokens, seconds (median of ``--iters`` calls timed
with CUDA events after warm-up; perf_counter on CPU), tflops, kernel (the longest device kernel of one call, e.g.
cuBLAS's ``sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_...``), and prints where each GEMM's kernel
changes. The default grid is Vidur's (vidur/profiling/utils/__init__.py, get_num_tokens_to_profile, at
microsoft/vidur 7d47513): 1, 2, 4, then every 8 tokens to 1024, every 16 to 2048, every 32 to 4096.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lssim.cost.operators import decoder_kernels

SWEEP_TOKENS = (1, 2, 4) + tuple(range(8, 1024, 8)) + tuple(range(1024, 2048, 16)) + tuple(range(2048, 4097, 32))
COLUMNS = ["source", "tp", "op", "k", "n", "tokens", "seconds", "seconds_warm", "tflops", "kernel"]


@dataclass(frozen=True)
class GemmShape:
    """One GEMM to time: ``tokens x k @ k x n`` at each token count; source and tp say whose layer it is."""

    source: str
    tp: int
    op: str
    k: int
    n: int
    tokens: tuple[int, ...]


def model_shapes(model: str, tp: int = 1, tokens=SWEEP_TOKENS) -> list[GemmShape]:
    """The GEMMs of a layer of lssim.cost.MODELS[model] on one of ``tp`` ranks."""
    tokens = tuple(sorted({int(t) for t in tokens}))
    if not tokens or tokens[0] < 1:
        raise ValueError(f"tokens must be positive integers, got {tokens!r}")
    return [GemmShape(model, tp, op, k, n, tokens) for op, k, n in decoder_kernels(model, tp=tp).gemms]


def vidur_shapes(data_dir=None) -> list[GemmShape]:
    """Every GEMM Microsoft Vidur profiled on the H100 (lssim/cost/data/vidur_h100_*.csv), at its own token
    counts: our measurement of the same kernels, for the cost model to be checked on Vidur's."""
    from lssim.cost.operator_fit import DATA_DIR, load_vidur

    long = load_vidur(DATA_DIR if data_dir is None else data_dir)
    gemms = long[long["k"] > 0]
    return [GemmShape(model, int(tp), op, int(g["k"].iloc[0]), int(g["n"].iloc[0]), tuple(sorted(g["tokens"].astype(int))))
            for (model, tp, op), g in gemms.groupby(["model", "tp", "op"], sort=False)]


RANGE_PREFIX = "lssim_gemm_"
COLD_BYTES = 256e6  # weight copies cycled through per timing, five times the H100's 50 MB L2


def _ranges_and_kernels(prof, on_gpu: bool):
    """The labelled CPU ranges of a profiler session, and its device kernels (on a CPU: its matmul operators)."""
    events = list(prof.events())
    ranges = {e.name[len(RANGE_PREFIX):]: e.time_range for e in events
              if e.name.startswith(RANGE_PREFIX) and getattr(e.device_type, "name", "") == "CPU"}
    kernels = [e for e in events if not e.name.startswith(RANGE_PREFIX)
               and (getattr(e.device_type, "name", "") == "CUDA") == on_gpu
               and (on_gpu or "mm" in e.name) and not e.name.startswith(("Memcpy", "Memset"))]
    return ranges, kernels


def time_kernels(calls: dict, device, warmup: int = 3, iters: int = 15) -> dict:
    """{key: (seconds, kernel)} for each of ``calls[key] = [fn, ...]``: the device time of one call, the median over
    ``iters`` calls (cycling through the list) of the summed durations of the kernels it ran, read from the profiler
    (CUPTI: no launch gaps, as in a CUDA graph, and as Vidur times kernels), and the name of its longest kernel. On
    a CPU the matmul operators' durations. A key whose kernels are not found gets (nan, '')."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    on_gpu = device.type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for key, fns in calls.items():
            for i in range(warmup):
                fns[i % len(fns)]()
            sync()
            with record_function(f"{RANGE_PREFIX}{key}"):
                for i in range(iters):
                    fns[i % len(fns)]()
                sync()
    ranges, kernels = _ranges_and_kernels(prof, on_gpu)
    out = {}
    for key in calls:
        r = ranges.get(str(key))
        inside = [] if r is None else sorted((e for e in kernels if r.start <= e.time_range.start <= r.end),
                                             key=lambda e: e.time_range.start)
        if not inside:
            out[key] = (float("nan"), "")
            continue
        us = [e.time_range.elapsed_us() for e in inside]
        per_call = len(us) // iters
        if per_call and len(us) == per_call * iters:  # one call's kernels each: the median call
            seconds = statistics.median(sum(us[i:i + per_call]) for i in range(0, len(us), per_call)) * 1e-6
        else:
            seconds = sum(us) / iters * 1e-6
        out[key] = (seconds, max(inside, key=lambda e: e.time_range.elapsed_us()).name)
    return out


def sweep_shapes(shapes, device: str = "cuda", dtype: str = "bfloat16", warmup: int = 3, iters: int = 15,
                 seed: int = 0, log=print, on_rows=None, cold_bytes: float = COLD_BYTES) -> pd.DataFrame:
    """One row per shape and token count: the device time of one GEMM with its weight cold (``seconds``: the call
    cycles through enough copies of the weight to overflow the L2 cache, as a forward pass through many layers
    does), with the same weight every call (``seconds_warm``: what a profiler repeating one kernel sees), and the
    kernel. A ``k x n`` product is timed once at the union of the token counts its shapes ask for (Vidur's models
    share some), then reported for each shape. ``on_rows(table so far)`` is called after every ``k x n``."""
    import torch
    import torch.nn.functional as F

    dev, dt = torch.device(device), getattr(torch, dtype)
    gen = torch.Generator(device=dev).manual_seed(seed)
    by_product: dict[tuple[int, int], list[GemmShape]] = {}
    for s in shapes:
        if not s.tokens or min(s.tokens) < 1:
            raise ValueError(f"tokens must be positive integers, got {s.tokens!r} for {s.source} {s.op}")
        by_product.setdefault((s.k, s.n), []).append(s)
    rows = []
    for i, ((k, n), group) in enumerate(by_product.items()):
        counts = sorted({t for s in group for t in s.tokens})
        copies = max(1, int(-(-cold_bytes // (2 * k * n))))
        weights = [torch.randn(n, k, device=dev, dtype=dt, generator=gen).mul_(0.02) for _ in range(copies)]
        inputs = torch.randn(counts[-1], k, device=dev, dtype=dt, generator=gen)
        cold = time_kernels({m: [lambda x=inputs[:m], w=w: F.linear(x, w) for w in weights] for m in counts}, dev, warmup, iters)
        warm = time_kernels({m: [lambda x=inputs[:m]: F.linear(x, weights[0])] for m in counts}, dev, warmup, iters)
        for s in group:
            rows += [{"source": s.source, "tp": s.tp, "op": s.op, "k": k, "n": n, "tokens": m, "seconds": cold[m][0],
                      "seconds_warm": warm[m][0], "tflops": 2.0 * m * k * n / cold[m][0] / 1e12, "kernel": cold[m][1]}
                     for m in s.tokens]
        top = counts[-1]
        log(f"[{i + 1}/{len(by_product)}] {k} x {n} ({', '.join(sorted({f'{s.source} tp{s.tp} {s.op}' for s in group}))}): "
            f"{len(counts)} token counts; at {counts[0]}: {cold[counts[0]][0] * 1e6:.1f} us cold, {warm[counts[0]][0] * 1e6:.1f} warm; "
            f"at {top}: {2.0 * top * k * n / cold[top][0] / 1e12:.0f} TFLOP/s")
        del weights, inputs
        if on_rows is not None:
            on_rows(pd.DataFrame(rows, columns=COLUMNS))
    return pd.DataFrame(rows, columns=COLUMNS)


def sweep(model: str, tokens=SWEEP_TOKENS, device: str = "cuda", dtype: str = "bfloat16", tp: int = 1,
          warmup: int = 3, iters: int = 15, seed: int = 0, log=print) -> pd.DataFrame:
    """One row per GEMM of a layer of ``model`` (one of ``tp`` ranks) and token count: time and kernel."""
    return sweep_shapes(model_shapes(model, tp, tokens), device, dtype, warmup, iters, seed, log)


def kernel_switches(table: pd.DataFrame) -> pd.DataFrame:
    """Where each GEMM's kernel changes from one token count to the next: op, tokens (the first count on the new
    kernel), previous_tokens, time_ratio (its time over the previous count's), kernel, previous_kernel."""
    out = []
    keys = [c for c in ("source", "tp", "op") if c in table.columns]
    for key, g in table.sort_values("tokens").groupby(keys, sort=False):
        op = key[-1] if isinstance(key, tuple) else key
        prev = None
        for r in g.itertuples():
            if prev is not None and r.kernel != prev.kernel:
                out.append({"op": op, "tokens": r.tokens, "previous_tokens": prev.tokens,
                            "time_ratio": r.seconds / prev.seconds, "kernel": r.kernel, "previous_kernel": prev.kernel})
            prev = r
    return pd.DataFrame(out, columns=["op", "tokens", "previous_tokens", "time_ratio", "kernel", "previous_kernel"])


def _write(table: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    table.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], help="a key of lssim.cost.MODELS with a DecoderShape (repeatable)")
    ap.add_argument("--vidur", action="store_true", help="also every GEMM Vidur profiled on the H100, at its token counts")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", default=None, help="comma-separated token counts for --model (default: Vidur's grid to 4096)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--hardware", default="H100", help="the file name's prefix (lower-cased)")
    ap.add_argument("--out", default="lssim/profiles", help="a folder, or a .csv file")
    args = ap.parse_args(argv)
    if not args.model and not args.vidur:
        ap.error("name --model and/or --vidur")
    tokens = SWEEP_TOKENS if args.tokens is None else tuple(int(x) for x in args.tokens.split(",") if x.strip())
    shapes = [s for m in args.model for s in model_shapes(m, args.tp, tokens)] + (vidur_shapes() if args.vidur else [])
    out = Path(args.out)
    if out.suffix == ".csv":
        path = out
    else:
        label = args.model[0] if len(args.model) == 1 and not args.vidur else "vidur" if not args.model else "models"
        path = out / f"{args.hardware.lower()}_{label}{'' if args.tp == 1 else f'_tp{args.tp}'}_gemm_sweep.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.stem + ".partial.csv")  # what a stopped sweep leaves, named as such
    table = sweep_shapes(shapes, args.device, args.dtype, iters=args.iters, on_rows=lambda t: _write(t, partial))
    _write(table, path)
    partial.unlink(missing_ok=True)
    print(f"wrote {path} ({len(table)} rows)")
    for r in kernel_switches(table).itertuples():
        print(f"  {r.op}: {r.previous_tokens} -> {r.tokens} tokens x{r.time_ratio:.2f}: {r.previous_kernel} -> {r.kernel}")


if __name__ == "__main__":
    main()
