"""Roofline vs a real GPU: time decode iterations and prefills of a Qwen/Llama-shaped decoder, compare
them with ``RooflineCostModel`` and fit a ``ProfiledCostModel`` to them. Results: lssim/profiles/README.md.

    PYTHONPATH=. python3 lssim/benchmarks/roofline_gpu.py --model qwen2.5-7b --out lssim/profiles
    PYTHONPATH=. python3 lssim/benchmarks/roofline_gpu.py --breakdown --model qwen2.5-7b --out lssim/profiles
    python3 lssim/benchmarks/roofline_gpu.py --report-only --model qwen2.5-7b --out lssim/profiles  # no GPU
    python3 lssim/benchmarks/roofline_gpu.py --selftest   # CPU: the decoder computes what transformers' Qwen2 does
    # sizes between cuBLAS's kernel-selection steps (a separate --out: the files are named by model):
    PYTHONPATH=. python3 lssim/benchmarks/roofline_gpu.py --model qwen2.5-7b --batch-sizes 3,24,100,136,200 \\
        --context-lens 512,2048 --prefills 1x520,1x1040,1x1500,1x3000,3x700 --out /tmp/unaligned

What is timed. A decoder with the shapes of ``lssim.cost.MODELS[model]`` (vocabulary, MLP width, tied
embeddings and QKV bias from the model's Hugging Face config, kept in ``ARCH``; the parameter count is
checked against ``MODELS``), random bf16 weights, written the way an inference engine runs it: fused
QKV and gate/up projections, RoPE, a preallocated contiguous KV cache, GQA attention over the cache with
the query heads of one KV head packed together (K and V are read once per KV head, as vLLM's decode
kernels do), then the LM head on the batch's last tokens and vLLM's random sampling (fp32 softmax at
temperature 1, exponential-race sampling, no top-p sort). One decode iteration of ``n`` sequences, each
with ``L`` tokens of context, is captured in a CUDA graph (vLLM replays graphs for decode) and timed
with CUDA events: 3 warm-ups, then the median of 15 replays (the wall clock over 15 back-to-back
replays is kept as a cross-check). Variants at every point: PyTorch SDPA's flash, cuDNN and
memory-efficient attention and plain batched matmuls, each with plain PyTorch ops between the GEMMs;
then the fastest attention with the element-wise work between GEMMs compiled by ``torch.compile``
(``fused``; attention stays outside the compiled pieces, as in vLLM's piecewise compilation). The
fastest variant is the measurement; all are kept in the variants file, with eager execution (no
graph) for what kernel launches from Python cost. Points run in a random order so that clock drift
does not pass for a trend. Prefill of ``b`` prompts of ``p`` tokens is one forward pass (CUDA
graph, plain and fused, the faster kept) with causal attention that writes the KV cache and samples
the last token of each prompt. ``--breakdown`` times the parts of one decode iteration (linear
layers alone, attention calls alone, LM head with sampling) at a few batch sizes.

What is not in it: the engine's CPU work per iteration (scheduling, input preparation, detokenising,
streaming), a paged KV cache (vLLM's block table makes attention slightly slower than this contiguous
cache), vLLM's own kernels, and sequences of unequal length in one batch. So the measurements are
what the GPU needs: about the floor under a real engine's iteration time.

``ctx_tokens`` follows ``CostModel.decode_time``: the sum over the running sequences of their context
(prompt + generated) at the iteration, here ``n * L``; each sequence's new token attends to ``L``
cached tokens (its own included).

Outputs in ``--out`` per model (``h100`` is the ``--hardware`` key in lower case):
``{hw}_{model}_decode.csv`` (the fit's input: n_seqs, ctx_tokens, seconds, with the roofline beside),
``{hw}_{model}_decode_variants.csv`` (every variant), ``{hw}_{model}_prefill.csv`` (prefill_tokens,
seconds, ...), ``{hw}_{model}_profile.json`` (``ProfiledCostModel.to_json``; under "measured_by" how
it was measured and the comparison with the roofline) and, with ``--breakdown``, ``{hw}_{model}_breakdown.csv``.

The decoder is lssim/benchmarks/roofline_decoder.py, the models' shapes roofline_arch.py, the comparison and its
files roofline_report.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.benchmarks.roofline_arch import ARCH, weight_bytes_read_per_decode
from lssim.benchmarks.roofline_decoder import Decoder, attention, first_line, selftest
from lssim.benchmarks.roofline_report import report
from lssim.cost import HARDWARE, MODELS, RooflineCostModel


BATCH_SIZES = (1, 4, 16, 64, 128, 256)
CONTEXT_LENS = (128, 512, 2048, 4096, 8192)  # per sequence
PREFILLS = ((1, 128), (1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192), (4, 512), (8, 1024), (16, 1024), (4, 4096))
ATTENTION = ("flash", "cudnn", "efficient", "bmm")


def time_cuda(fn, warmup: int = 3, iters: int = 15) -> dict:
    """Median, p10 and p90 seconds of ``fn()`` by CUDA events around each call, and the mean of
    ``iters`` back-to-back calls by the wall clock (a cross-check)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in ev:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) / 1e3 for s, e in ev)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / iters
    return {"seconds": statistics.median(times), "seconds_p10": float(np.percentile(times, 10)),
            "seconds_p90": float(np.percentile(times, 90)), "wall_seconds": wall}


def graphed(fn):
    """``fn`` captured in a CUDA graph; returns (replay, graph)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay, graph


def microbench(device) -> dict:
    """What this GPU attains: device-to-device copy (bytes read + written), a batch-1 GEMV over a 1 GiB
    bf16 matrix (bytes read), and an 8192^3 bf16 GEMM."""
    import torch
    import torch.nn.functional as F

    out = {}
    a = torch.empty(2 * 2**30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    t = time_cuda(lambda: b.copy_(a), 2, 10)["seconds"]
    out["copy_bytes_per_s"] = 2 * a.numel() / t
    del a, b
    w = torch.randn(32768, 16384, device=device, dtype=torch.bfloat16)
    x = torch.randn(1, 16384, device=device, dtype=torch.bfloat16)
    t = time_cuda(lambda: F.linear(x, w), 3, 20)["seconds"]
    out["gemv_bytes_per_s"] = w.numel() * 2 / t
    del w, x
    m = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    t = time_cuda(lambda: m @ m, 3, 10)["seconds"]
    out["gemm_flops_per_s"] = 2 * 8192**3 / t
    del m
    torch.cuda.empty_cache()
    return out


def measure_model(name: str, hardware: str, batch_sizes, context_lens, prefills, headroom_gib: float,
                  fuse: bool = True, seed: int = 0, log=print) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Decode rows (every variant: mode cuda_graph/eager, attention, fused) and prefill rows (the best
    graph variant, with the others as columns) of ``MODELS[name]`` on this GPU."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    spec, arch = MODELS[name], ARCH[name]
    device = torch.device("cuda")
    model, caches, t_max = _build(name, device, fuse, headroom_gib, max(context_lens), seed, log)
    rng = np.random.default_rng(seed)
    roof = RooflineCostModel(spec, hardware)
    points = [(n, L) for n in batch_sizes for L in context_lens if n * L <= t_max]
    skipped = [(n, L) for n in batch_sizes for L in context_lens if n * L > t_max]
    if skipped:
        log(f"  skipped (KV cache does not fit): {skipped}")
    rows, broken = [], set()
    for idx in rng.permutation(len(points)):
        n, L = points[idx]
        ks, vs = caches(n, L)
        tokens = torch.as_tensor(rng.integers(0, arch.vocab, n), device=device)
        cos, sin = model.rope_tables(torch.full((n,), L - 1, device=device))

        def step(kind, fused):
            attend = attention(kind)
            return lambda: model.sample(model.logits(model.decode_hidden(tokens, cos, sin, L - 1, ks, vs, attend, fused)))

        rows += _decode_rows(step, {"model": name, "n_seqs": n, "ctx_len": L, "ctx_tokens": n * L}, roof, fuse, broken, log)
    variants = pd.DataFrame(rows)
    prefill = pd.DataFrame([row for b, plen in prefills if b * plen <= t_max
                            for row in _prefill_row(name, model, caches, device, b, plen, rng, roof, fuse, broken, log)])
    info = {"kv_cache_tokens": t_max, "skipped_points": skipped, "failed": sorted(broken)}
    return variants, prefill, info


def _build(name: str, device, fuse: bool, headroom_gib: float, longest_context: int, seed: int, log):
    """``MODELS[name]``'s decoder on the GPU (fused unless not `fuse`) and one KV cache buffer in the memory left but
    `headroom_gib`: (decoder, caches(b, length) -> per-layer K and V views of b sequences, the buffer's tokens)."""
    import torch

    spec, arch = MODELS[name], ARCH[name]
    dtype = torch.bfloat16
    t0 = time.perf_counter()
    model = Decoder(spec, arch, device, dtype, seed)
    if model.n_params() != spec.params:
        raise RuntimeError(f"{name}: built {model.n_params():,} parameters, MODELS says {spec.params:,}")
    if fuse:
        model.fuse()
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    slot = spec.n_kv_heads * spec.head_dim  # elements per token per layer, for K or for V
    t_max = int((free - headroom_gib * 2**30) // (2 * spec.n_layers * slot * 2))
    if t_max < longest_context:
        raise RuntimeError(f"{name}: room for {t_max} KV tokens only ({free / 2**30:.1f} GiB free)")
    buf = torch.empty(2 * spec.n_layers * t_max * slot, device=device, dtype=dtype).normal_(0, 1)
    log(f"{name}: {spec.params / 1e9:.2f}B parameters built in {time.perf_counter() - t0:.1f} s; "
        f"KV cache for {t_max:,} tokens ({buf.numel() * 2 / 2**30:.1f} GiB)")

    def caches(b: int, length: int):
        size = b * length * slot
        shape = (b, spec.n_kv_heads, length, spec.head_dim)
        ks = [buf[(2 * i) * t_max * slot:][:size].view(shape) for i in range(spec.n_layers)]
        vs = [buf[(2 * i + 1) * t_max * slot:][:size].view(shape) for i in range(spec.n_layers)]
        return ks, vs

    return model, caches, t_max


def _time_graph(fn) -> dict:
    """time_cuda of `fn` captured in a CUDA graph; `fn` is called once outside the capture first (an unsupported
    shape is refused there, and torch.compile compiles there)."""
    import torch

    fn()
    torch.cuda.synchronize()
    replay, graph = graphed(fn)
    r = time_cuda(replay)
    del replay, graph
    return r


def _decode_rows(step, base: dict, roof, fuse: bool, broken: set, log) -> list[dict]:
    """One decode point's rows: every attention not yet `broken` (a backend that refuses a shape is skipped from
    then on, and said so), the fastest fused with torch.compile (with `fuse`), and the fastest again eager.
    `step(kind, fused)` makes the point's iteration."""
    import torch

    n, L = base["n_seqs"], base["ctx_len"]
    results = {}
    for kind in ATTENTION:
        if kind in broken:
            continue
        try:
            results[(kind, False)] = _time_graph(step(kind, False))
        except Exception as exc:  # noqa: BLE001 - a backend that refuses a shape is skipped, and said so
            log(f"  {kind} attention failed at n={n} L={L}: {first_line(exc)}")
            if kind != "bmm":
                broken.add(kind)
            torch.cuda.synchronize()
    best_kind = min(results, key=lambda k: results[k]["seconds"])[0]
    if fuse and "fused" not in broken:
        t1 = time.perf_counter()
        try:
            results[(best_kind, True)] = _time_graph(step(best_kind, True))
        except Exception as exc:  # noqa: BLE001
            log(f"  fused (torch.compile) failed at n={n} L={L}: {first_line(exc)}")
            broken.add("fused")
            torch.cuda.synchronize()
        if time.perf_counter() - t1 > 5:
            log(f"  (torch.compile took {time.perf_counter() - t1:.0f} s)")
    best = min(results, key=lambda k: results[k]["seconds"])
    rows = [{**base, "mode": "cuda_graph", "attention": kind, "fused": fused, "best": (kind, fused) == best, **r}
            for (kind, fused), r in results.items()]
    eager = time_cuda(step(best_kind, False), 1, 5)
    rows.append({**base, "mode": "eager", "attention": best_kind, "fused": False, "best": False, **eager})
    torch.cuda.empty_cache()
    m = results[best]["seconds"]
    r = roof.decode_time(n, n * L, 1)
    log(f"  n={n:>3} L={L:>5} ctx={n * L:>9,}: {m * 1e3:7.3f} ms ({best[0]}{', fused' if best[1] else ''}), "
        f"roofline {r * 1e3:7.3f} ms, APE {abs(r - m) / m * 100:5.1f}% | eager {eager['seconds'] * 1e3:6.2f} | "
        + " ".join(f"{k}{'+fused' if f else ''}={v['seconds'] * 1e3:.3f}" for (k, f), v in results.items()))
    return rows


def _graph_seconds(fn) -> float:
    """Median seconds of `fn` replayed from a CUDA graph (no call outside the capture first: breakdown's parts)."""
    replay, graph = graphed(fn)
    r = time_cuda(replay)["seconds"]
    del replay, graph
    return r


def _prefill_row(name: str, model, caches, device, b: int, plen: int, rng, roof, fuse: bool, broken: set,
                 log) -> list[dict]:
    """The prefill of `b` prompts of `plen` tokens: one row (the faster of plain and fused graphs, both as columns,
    and eager), or none when every variant failed."""
    import torch

    ks, vs = caches(b, plen)
    tokens = torch.as_tensor(rng.integers(0, ARCH[name].vocab, (b, plen)), device=device)
    cos, sin = model.rope_tables(torch.arange(plen, device=device).repeat(b))

    def run(fused):
        return lambda: model.sample(model.logits(model.prefill_hidden(tokens, cos, sin, ks, vs, fused)))

    res = {}
    for label, fn in (("graph", run(False)), ("graph_fused", run(True) if fuse and "fused" not in broken else None)):
        if fn is None:
            continue
        try:
            res[label] = _time_graph(fn)
        except Exception as exc:  # noqa: BLE001
            log(f"  prefill {b}x{plen} {label} failed: {first_line(exc)}")
            torch.cuda.synchronize()
    if not res:
        return []
    eager = time_cuda(run(False), 1, 5)["seconds"]
    best = min(res, key=lambda k: res[k]["seconds"])
    tok = b * plen
    rp = roof.prefill_time(tok)
    m = res[best]["seconds"]
    row = {"model": name, "prefill_tokens": tok, **res[best], "n_prompts": b, "prompt_len": plen, "variant": best,
           **{f"{k}_seconds": v["seconds"] for k, v in res.items()}, "eager_seconds": eager,
           "roofline_seconds": rp, "ape_pct": abs(rp - m) / m * 100}
    log(f"  prefill {b:>2} x {plen:>5} = {tok:>6} tokens: {m * 1e3:8.2f} ms ({best}), roofline {rp * 1e3:8.2f} ms, "
        f"APE {row['ape_pct']:5.1f}% | eager {eager * 1e3:.2f} ms")
    torch.cuda.empty_cache()
    return [row]


def breakdown(name: str, points=((1, 512), (16, 512), (64, 512), (256, 512)), seed: int = 0, log=print,
              device: str = "cuda") -> pd.DataFrame:
    """Where a decode iteration's time goes: CUDA-graph time of the whole (fused) iteration, of its
    linear layers alone (every projection and the LM head, same shapes), of its attention calls alone,
    and of the LM head with sampling, at a few batch sizes."""
    import gc

    import torch
    import torch.nn.functional as F

    gc.collect()
    torch.cuda.empty_cache()
    spec, arch = MODELS[name], ARCH[name]
    device, dtype = torch.device(device), torch.bfloat16
    model = Decoder(spec, arch, device, dtype, seed)
    model.fuse()
    d, hq, hkv = spec.head_dim, spec.n_heads, spec.n_kv_heads
    rng = np.random.default_rng(seed)
    rows = []
    for n, L in points:
        shape = (n, hkv, L, d)
        ks = [torch.randn(shape, device=device, dtype=dtype) for _ in range(spec.n_layers)]
        vs = [torch.randn(shape, device=device, dtype=dtype) for _ in range(spec.n_layers)]
        tokens = torch.as_tensor(rng.integers(0, arch.vocab, n), device=device)
        cos, sin = model.rope_tables(torch.full((n,), L - 1, device=device))
        x = torch.randn(n, spec.hidden, device=device, dtype=dtype)
        o = torch.randn(n, hq * d, device=device, dtype=dtype)
        act = torch.randn(n, arch.intermediate, device=device, dtype=dtype)
        q = torch.randn(n, hkv, hq // hkv, d, device=device, dtype=dtype)

        def linears():
            for p in model.layers:
                F.linear(x, p["wqkv"], p["bqkv"])
                F.linear(o, p["wo"])
                F.linear(x, p["wgu"])
                F.linear(act, p["wd"])
            return F.linear(x, model.lm_head)

        full = {kind: _graph_seconds(lambda a=attention(kind): model.sample(model.logits(
            model.decode_hidden(tokens, cos, sin, L - 1, ks, vs, a, True)))) for kind in ("flash", "cudnn")}
        kind = min(full, key=full.get)
        attend = attention(kind)
        row = {"model": name, "n_seqs": n, "ctx_len": L, "attention": kind, "iteration_s": full[kind],
               "linears_s": _graph_seconds(linears),
               "attention_s": _graph_seconds(lambda: [attend(q, ks[i], vs[i]) for i in range(spec.n_layers)][-1]),
               "lm_head_sample_s": _graph_seconds(lambda: model.sample(model.logits(x))),
               "weights_at_gemv_bw_s": weight_bytes_read_per_decode(spec, arch) / _GEMV_BW.get("bw", float("nan"))}
        row["rest_s"] = row["iteration_s"] - row["linears_s"] - row["attention_s"]
        rows.append(row)
        log(f"  {name} n={n:>3} L={L}: iteration {row['iteration_s'] * 1e3:.3f} ms = linears {row['linears_s'] * 1e3:.3f} "
            f"+ attention {row['attention_s'] * 1e3:.3f} + rest {row['rest_s'] * 1e3:.3f}; LM head+sampling "
            f"{row['lm_head_sample_s'] * 1e3:.3f}; weights at GEMV bandwidth {row['weights_at_gemv_bw_s'] * 1e3:.3f} ms")
        del ks, vs
        torch.cuda.empty_cache()
    return pd.DataFrame(rows)


_GEMV_BW: dict = {}  # filled by main() from the microbenchmark


def machine_meta(hardware: str) -> dict:
    import torch

    meta = {"script": "lssim/benchmarks/roofline_gpu.py", "command": " ".join(["python3", *sys.argv]),
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "hardware_spec": hardware,
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "host": platform.node()}
    try:
        meta["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return meta


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _prefills(text: str) -> tuple[tuple[int, int], ...]:
    """``"1x520,4x700"`` -> ((1, 520), (4, 700)): prompts x tokens per prompt."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        b, _, plen = item.partition("x")
        if not (b.isdigit() and plen.isdigit()) or int(b) < 1 or int(plen) < 1:
            raise argparse.ArgumentTypeError(f"--prefills item {item!r} is not PROMPTSxTOKENS (e.g. 1x520)")
        out.append((int(b), int(plen)))
    return tuple(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", choices=sorted(ARCH), help="repeatable (default: qwen2.5-1.5b)")
    ap.add_argument("--hardware", default="H100", choices=sorted(HARDWARE), help="the roofline's spec (default: H100)")
    ap.add_argument("--out", default="lssim/profiles", help="folder for the CSV and JSON files")
    ap.add_argument("--batch-sizes", type=_ints, default=BATCH_SIZES)
    ap.add_argument("--context-lens", type=_ints, default=CONTEXT_LENS, help="per sequence")
    ap.add_argument("--prefills", type=_prefills, default=PREFILLS,
                    help="PROMPTSxTOKENS,... (default: powers of two; e.g. 1x520,1x1040,3x700 for sizes between "
                         "cuBLAS's kernel-selection steps)")
    ap.add_argument("--headroom-gib", type=float, default=4.0, help="GPU memory left outside the KV cache")
    ap.add_argument("--no-fuse", action="store_true", help="skip the torch.compile'd (fused) variant")
    ap.add_argument("--breakdown", action="store_true", help="only time the parts of a decode iteration (linears, attention, rest)")
    ap.add_argument("--report-only", action="store_true",
                    help="recompute the comparison and the profile JSON from the CSV files already in --out (no GPU)")
    ap.add_argument("--selftest", action="store_true", help="check the decoder against transformers on CPU and exit")
    args = ap.parse_args(argv)
    if args.selftest:
        selftest()
        return
    out = Path(args.out)
    if args.report_only:
        for name in args.model or ["qwen2.5-1.5b"]:
            key = f"{args.hardware.lower()}_{name}"
            variants = pd.read_csv(out / f"{key}_decode_variants.csv")
            prefill = pd.read_csv(out / f"{key}_prefill.csv").assign(model=name)
            meta = json.loads((out / f"{key}_profile.json").read_text())["measured_by"]
            meta.pop("comparison", None)
            report(name, args.hardware, variants, prefill, out, meta)
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("roofline_gpu.py needs a CUDA GPU (use --selftest on CPU)")
    meta = machine_meta(args.hardware)
    print(json.dumps(meta, indent=1))
    mb = microbench(torch.device("cuda"))
    meta["microbench"] = mb
    peak = HARDWARE[args.hardware]
    print(f"attained: copy {mb['copy_bytes_per_s'] / 1e12:.2f} TB/s, GEMV {mb['gemv_bytes_per_s'] / 1e12:.2f} TB/s "
          f"({mb['gemv_bytes_per_s'] / peak.bandwidth_bytes_per_s * 100:.0f}% of the {peak.bandwidth_bytes_per_s / 1e12:.2f} TB/s spec), "
          f"GEMM {mb['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s ({mb['gemm_flops_per_s'] / peak.peak_flops * 100:.0f}% of spec)")
    _GEMV_BW["bw"] = mb["gemv_bytes_per_s"]
    if args.breakdown:
        out.mkdir(parents=True, exist_ok=True)
        for name in args.model or ["qwen2.5-1.5b"]:
            breakdown(name).to_csv(out / f"{args.hardware.lower()}_{name}_breakdown.csv", index=False, float_format="%.6g")
        return
    summaries = {}
    for name in args.model or ["qwen2.5-1.5b"]:
        variants, prefill, info = measure_model(name, args.hardware, args.batch_sizes, args.context_lens, args.prefills,
                                                args.headroom_gib, fuse=not args.no_fuse)
        summaries[name] = report(name, args.hardware, variants, prefill, out, {**meta, "model": name, **info})
    print(json.dumps(summaries, indent=1, default=float))


if __name__ == "__main__":
    main()
