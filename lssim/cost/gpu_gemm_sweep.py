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
import time
from pathlib import Path

import pandas as pd

from .operators import decoder_kernels

SWEEP_TOKENS = (1, 2, 4) + tuple(range(8, 1024, 8)) + tuple(range(1024, 2048, 16)) + tuple(range(2048, 4097, 32))
COLUMNS = ["op", "k", "n", "tokens", "seconds", "tflops", "kernel"]


def _timed(fn, device, warmup: int, iters: int) -> float:
    """Median seconds of ``fn()``: CUDA events around each call on a GPU (the benchmarks' `time_cuda`), perf_counter
    on a CPU."""
    if device.type == "cuda":
        from lssim.benchmarks.roofline_gpu import time_cuda  # imported here: that module imports lssim.cost

        return time_cuda(fn, warmup, iters)["seconds"]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kernel_name(fn, device) -> str:
    """The longest kernel one call of ``fn`` runs on ``device`` (on a CPU, the longest matmul operator)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        fn()
        if on_gpu:
            torch.cuda.synchronize()
    events = [e for e in prof.events() if (getattr(e.device_type, "name", "") == "CUDA") == on_gpu]
    if not on_gpu:
        events = [e for e in events if "mm" in e.name]
    return max(events, key=lambda e: e.time_range.elapsed_us()).name if events else ""


def sweep(model: str, tokens=SWEEP_TOKENS, device: str = "cuda", dtype: str = "bfloat16", tp: int = 1,
          warmup: int = 3, iters: int = 15, seed: int = 0, log=print) -> pd.DataFrame:
    """One row per GEMM of a layer of ``model`` (one of ``tp`` ranks) and token count: time and kernel."""
    import torch
    import torch.nn.functional as F

    tokens = sorted({int(t) for t in tokens})
    if not tokens or tokens[0] < 1:
        raise ValueError(f"tokens must be positive integers, got {tokens!r}")
    dev, dt = torch.device(device), getattr(torch, dtype)
    gen = torch.Generator(device=dev).manual_seed(seed)
    rows = []
    for op, k, n in decoder_kernels(model, tp=tp).gemms:
        weight = torch.randn(n, k, device=dev, dtype=dt, generator=gen).mul_(0.02)
        inputs = torch.randn(tokens[-1], k, device=dev, dtype=dt, generator=gen)
        for m in tokens:
            x = inputs[:m]
            call = lambda: F.linear(x, weight)  # noqa: E731 - x is rebound per token count, used at once
            seconds = _timed(call, dev, warmup, iters)
            rows.append({"op": op, "k": k, "n": n, "tokens": m, "seconds": seconds,
                         "tflops": 2.0 * m * k * n / seconds / 1e12, "kernel": kernel_name(call, dev)})
        log(f"{op} ({k} x {n}): {len(tokens)} token counts, {rows[-1]['tflops']:.0f} TFLOP/s at {tokens[-1]}")
        del weight, inputs
    return pd.DataFrame(rows, columns=COLUMNS)


def kernel_switches(table: pd.DataFrame) -> pd.DataFrame:
    """Where each GEMM's kernel changes from one token count to the next: op, tokens (the first count on the new
    kernel), previous_tokens, time_ratio (its time over the previous count's), kernel, previous_kernel."""
    out = []
    for op, g in table.sort_values("tokens").groupby("op", sort=False):
        prev = None
        for r in g.itertuples():
            if prev is not None and r.kernel != prev.kernel:
                out.append({"op": op, "tokens": r.tokens, "previous_tokens": prev.tokens,
                            "time_ratio": r.seconds / prev.seconds, "kernel": r.kernel, "previous_kernel": prev.kernel})
            prev = r
    return pd.DataFrame(out, columns=["op", "tokens", "previous_tokens", "time_ratio", "kernel", "previous_kernel"])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a key of lssim.cost.MODELS with a DecoderShape")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", default=None, help="comma-separated token counts (default: Vidur's grid to 4096)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--hardware", default="H100", help="the file name's prefix (lower-cased)")
    ap.add_argument("--out", default="lssim/profiles")
    args = ap.parse_args(argv)
    tokens = SWEEP_TOKENS if args.tokens is None else tuple(int(x) for x in args.tokens.split(",") if x.strip())
    table = sweep(args.model, tokens, args.device, args.dtype, args.tp, iters=args.iters)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.hardware.lower()}_{args.model}{'' if args.tp == 1 else f'_tp{args.tp}'}_gemm_sweep.csv"
    tmp = path.with_suffix(".csv.tmp")
    table.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(path)  # nothing half-written if the sweep fails
    print(f"wrote {path} ({len(table)} rows)")
    switches = kernel_switches(table)
    for r in switches.itertuples():
        print(f"  {r.op}: {r.previous_tokens} -> {r.tokens} tokens x{r.time_ratio:.2f}: {r.previous_kernel} -> {r.kernel}")


if __name__ == "__main__":
    main()
