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
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.cost import HARDWARE, MODELS, ModelSpec, ProfiledCostModel, RooflineCostModel


@dataclass(frozen=True)
class Arch:
    """What ``ModelSpec`` leaves out and the forward pass needs (from each model's config.json)."""

    vocab: int
    intermediate: int
    tied: bool
    qkv_bias: bool
    rope_theta: float


ARCH: dict[str, Arch] = {
    "qwen2.5-1.5b": Arch(151_936, 8_960, True, True, 1e6),
    "qwen2.5-7b": Arch(152_064, 18_944, False, True, 1e6),
    "qwen2.5-32b": Arch(152_064, 27_648, False, True, 1e6),
    "llama3-8b": Arch(128_256, 14_336, False, False, 5e5),
    "llama2-7b": Arch(32_000, 11_008, False, False, 1e4),
}

BATCH_SIZES = (1, 4, 16, 64, 128, 256)
CONTEXT_LENS = (128, 512, 2048, 4096, 8192)  # per sequence
PREFILLS = ((1, 128), (1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192), (4, 512), (8, 1024), (16, 1024), (4, 4096))
ATTENTION = ("flash", "cudnn", "efficient", "bmm")
BANDS = (("n 1-4", 1, 4), ("n 16-64", 16, 64), ("n 128-256", 128, 256))


def param_count(spec: ModelSpec, arch: Arch) -> int:
    h, d = spec.hidden, spec.head_dim
    q, kv = spec.n_heads * d, spec.n_kv_heads * d
    attn = h * (q + 2 * kv) + (q + 2 * kv if arch.qkv_bias else 0) + q * h
    layer = attn + 3 * h * arch.intermediate + 2 * h
    return arch.vocab * h * (1 if arch.tied else 2) + spec.n_layers * layer + h


def weight_bytes_read_per_decode(spec: ModelSpec, arch: Arch) -> int:
    """Bytes of weights one decode iteration reads: all but the input embedding table, of which it
    gathers only ``n`` rows (with tied embeddings the table is the LM head and is read in full)."""
    unread = 0 if arch.tied else arch.vocab * spec.hidden
    return (spec.params - unread) * spec.dtype_bytes


# ----------------------------------------------------------------------------------------------
# The decoder
# ----------------------------------------------------------------------------------------------


class Decoder:
    """A Qwen2/Llama decoder as an engine runs it (fused projections, preallocated KV cache).

    Each layer is two pieces around the attention call, as in vLLM's piecewise compilation:
    ``_pre_attn`` (RMSNorm, QKV projection, RoPE) and ``_post_attn`` (output projection, residual,
    RMSNorm, gated MLP, residual). ``fuse()`` compiles both with ``torch.compile`` (Inductor fuses the
    element-wise work into a few kernels, as vLLM's compilation does); the calls take ``fused=True``
    to use them.
    """

    def __init__(self, spec: ModelSpec, arch: Arch, device, dtype, seed: int = 0) -> None:
        import torch

        self.spec, self.arch = spec, arch
        gen = torch.Generator(device=device).manual_seed(seed)
        h, d, hq, hkv, inter = spec.hidden, spec.head_dim, spec.n_heads, spec.n_kv_heads, arch.intermediate

        def w(*shape):
            return torch.randn(*shape, device=device, dtype=dtype, generator=gen).mul_(0.02)

        def ones(k):
            return torch.ones(k, device=device, dtype=dtype)

        self.embed = w(arch.vocab, h)
        self.lm_head = self.embed if arch.tied else w(arch.vocab, h)
        qkv = (hq + 2 * hkv) * d
        self.layers = [
            {"ln1": ones(h), "wqkv": w(qkv, h), "bqkv": w(qkv) if arch.qkv_bias else None, "wo": w(h, hq * d),
             "ln2": ones(h), "wgu": w(2 * inter, h), "wd": w(h, inter)}
            for _ in range(spec.n_layers)
        ]
        self.norm = ones(h)
        self.inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        self.eps = 1e-6
        self._pieces = {False: (_pre_attn, _post_attn)}

    def fuse(self) -> None:
        import torch

        self._pieces[True] = (torch.compile(_pre_attn, dynamic=True, fullgraph=True),
                              torch.compile(_post_attn, dynamic=True, fullgraph=True))

    def n_params(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.arch.tied else [self.lm_head])
        tensors += [t for layer in self.layers for t in layer.values() if t is not None]
        return sum(t.numel() for t in tensors)

    def rope_tables(self, positions):
        """cos, sin of shape positions.shape + (head_dim,), in the weights' dtype."""
        import torch

        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)
        return emb.cos().to(self.embed.dtype), emb.sin().to(self.embed.dtype)

    def decode_hidden(self, tokens, cos, sin, pos: int, kcache, vcache, attend, fused: bool = False):
        """One decode iteration: ``tokens`` [n] at position ``pos`` (cos, sin: [n, D]); caches are
        per-layer [n, Hkv, L, D] views with ``pos < L``; ``attend(q [n, Hkv, G, D], K, V)`` attends over
        all L cached tokens. Returns the final normed hidden states [n, hidden]."""
        import torch.nn.functional as F

        s = self.spec
        pre, post = self._pieces[fused]
        n, hq, hkv = tokens.shape[0], s.n_heads, s.n_kv_heads
        x = self.embed[tokens]
        for i, p in enumerate(self.layers):
            q, k, v = pre(x, p["ln1"], p["wqkv"], p["bqkv"], cos, sin, hq, hkv, self.eps)
            kcache[i][:, :, pos] = k
            vcache[i][:, :, pos] = v
            o = attend(q.view(n, hkv, hq // hkv, s.head_dim), kcache[i], vcache[i])
            x = post(x, o.reshape(n, hq * s.head_dim), p["wo"], p["ln2"], p["wgu"], p["wd"], self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)

    def prefill_hidden(self, tokens, cos, sin, kcache, vcache, fused: bool = False):
        """Prefill ``tokens`` [b, p] at positions 0..p-1 (cos, sin: [b*p, D]), writing caches
        [b, Hkv, >= p, D]; causal attention. Returns the final normed hidden state of each prompt's
        last token [b, hidden]."""
        import torch.nn.functional as F

        s = self.spec
        pre, post = self._pieces[fused]
        b, plen = tokens.shape
        d, hq, hkv = s.head_dim, s.n_heads, s.n_kv_heads
        x = self.embed[tokens.reshape(-1)]
        for i, p in enumerate(self.layers):
            q, k, v = pre(x, p["ln1"], p["wqkv"], p["bqkv"], cos, sin, hq, hkv, self.eps)
            q = q.view(b, plen, hq, d).transpose(1, 2)
            k = k.view(b, plen, hkv, d).transpose(1, 2)
            v = v.view(b, plen, hkv, d).transpose(1, 2)
            kcache[i][:, :, :plen] = k
            vcache[i][:, :, :plen] = v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
            x = post(x, o.transpose(1, 2).reshape(b * plen, hq * d), p["wo"], p["ln2"], p["wgu"], p["wd"], self.eps)
        last = x.view(b, plen, -1)[:, -1]
        return F.rms_norm(last, (last.shape[-1],), self.norm, self.eps)

    def logits(self, hidden):
        import torch.nn.functional as F

        return F.linear(hidden, self.lm_head)

    @staticmethod
    def sample(logits):
        """vLLM's random sampling at temperature 1: fp32 softmax, then argmax of p / Exp(1) noise."""
        import torch

        probs = torch.softmax(logits.float(), -1)
        return probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)


def _rope(x, cos, sin):
    import torch

    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def _pre_attn(x, ln1, wqkv, bqkv, cos, sin, hq: int, hkv: int, eps: float):
    """x [T, hidden] -> q [T, Hq, D], k, v [T, Hkv, D] (q and k rotated); cos, sin [T, D]."""
    import torch.nn.functional as F

    t = x.shape[0]
    d = cos.shape[-1]
    qkv = F.linear(F.rms_norm(x, (x.shape[-1],), ln1, eps), wqkv, bqkv)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
    c, s = cos[:, None], sin[:, None]
    return _rope(q.reshape(t, hq, d), c, s), _rope(k.reshape(t, hkv, d), c, s), v.reshape(t, hkv, d)


def _post_attn(x, o, wo, ln2, wgu, wd, eps: float):
    """Residual after attention, then the gated MLP with its residual."""
    import torch.nn.functional as F

    x = x + F.linear(o, wo)
    g, u = F.linear(F.rms_norm(x, (x.shape[-1],), ln2, eps), wgu).chunk(2, -1)
    return x + F.linear(F.silu(g) * u, wd)


def attention(kind: str):
    """``attend(q, K, V)`` for decode: q [n, Hkv, G, D] (the G query heads of a KV head as G rows),
    K, V [n, Hkv, L, D]; no mask (the new token sees its whole context)."""
    import torch
    import torch.nn.functional as F

    if kind == "bmm":
        def attend(q, k, v):
            scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
            return torch.matmul(torch.softmax(scores, -1).to(q.dtype), v)
        return attend
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[kind]

    def attend(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v)
    return attend


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Measuring one model
# ----------------------------------------------------------------------------------------------


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def measure_model(name: str, hardware: str, batch_sizes, context_lens, prefills, headroom_gib: float,
                  fuse: bool = True, seed: int = 0, log=print) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Decode rows (every variant: mode cuda_graph/eager, attention, fused) and prefill rows (the best
    graph variant, with the others as columns) of ``MODELS[name]`` on this GPU."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    spec, arch = MODELS[name], ARCH[name]
    device, dtype = torch.device("cuda"), torch.bfloat16
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
    if t_max < max(context_lens):
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

    def time_graph(fn) -> dict:
        fn()  # refuses an unsupported shape (and compiles) outside a capture
        torch.cuda.synchronize()
        replay, graph = graphed(fn)
        r = time_cuda(replay)
        del replay, graph
        return r

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

        base = {"model": name, "n_seqs": n, "ctx_len": L, "ctx_tokens": n * L}
        results = {}
        for kind in ATTENTION:
            if kind in broken:
                continue
            try:
                results[(kind, False)] = time_graph(step(kind, False))
            except Exception as exc:  # noqa: BLE001 - a backend that refuses a shape is skipped, and said so
                log(f"  {kind} attention failed at n={n} L={L}: {_first_line(exc)}")
                if kind != "bmm":
                    broken.add(kind)
                torch.cuda.synchronize()
        best_kind = min(results, key=lambda k: results[k]["seconds"])[0]
        if fuse and "fused" not in broken:
            t1 = time.perf_counter()
            try:
                results[(best_kind, True)] = time_graph(step(best_kind, True))
            except Exception as exc:  # noqa: BLE001
                log(f"  fused (torch.compile) failed at n={n} L={L}: {_first_line(exc)}")
                broken.add("fused")
                torch.cuda.synchronize()
            if time.perf_counter() - t1 > 5:
                log(f"  (torch.compile took {time.perf_counter() - t1:.0f} s)")
        best = min(results, key=lambda k: results[k]["seconds"])
        for (kind, fused), r in results.items():
            rows.append({**base, "mode": "cuda_graph", "attention": kind, "fused": fused, "best": (kind, fused) == best, **r})
        eager = time_cuda(step(best_kind, False), 1, 5)
        rows.append({**base, "mode": "eager", "attention": best_kind, "fused": False, "best": False, **eager})
        torch.cuda.empty_cache()
        m = results[best]["seconds"]
        r = roof.decode_time(n, n * L, 1)
        log(f"  n={n:>3} L={L:>5} ctx={n * L:>9,}: {m * 1e3:7.3f} ms ({best[0]}{', fused' if best[1] else ''}), "
            f"roofline {r * 1e3:7.3f} ms, APE {abs(r - m) / m * 100:5.1f}% | eager {eager['seconds'] * 1e3:6.2f} | "
            + " ".join(f"{k}{'+fused' if f else ''}={v['seconds'] * 1e3:.3f}" for (k, f), v in results.items()))
    variants = pd.DataFrame(rows)

    prows = []
    for b, plen in prefills:
        if b * plen > t_max:
            continue
        ks, vs = caches(b, plen)
        tokens = torch.as_tensor(rng.integers(0, arch.vocab, (b, plen)), device=device)
        cos, sin = model.rope_tables(torch.arange(plen, device=device).repeat(b))

        def run(fused):
            return lambda: model.sample(model.logits(model.prefill_hidden(tokens, cos, sin, ks, vs, fused)))

        res = {}
        for label, fn in (("graph", run(False)), ("graph_fused", run(True) if fuse and "fused" not in broken else None)):
            if fn is None:
                continue
            try:
                res[label] = time_graph(fn)
            except Exception as exc:  # noqa: BLE001
                log(f"  prefill {b}x{plen} {label} failed: {_first_line(exc)}")
                torch.cuda.synchronize()
        if not res:
            continue
        eager = time_cuda(run(False), 1, 5)["seconds"]
        best = min(res, key=lambda k: res[k]["seconds"])
        tok = b * plen
        rp = roof.prefill_time(tok)
        m = res[best]["seconds"]
        prows.append({"model": name, "prefill_tokens": tok, **res[best], "n_prompts": b, "prompt_len": plen, "variant": best,
                      **{f"{k}_seconds": v["seconds"] for k, v in res.items()}, "eager_seconds": eager,
                      "roofline_seconds": rp, "ape_pct": abs(rp - m) / m * 100})
        log(f"  prefill {b:>2} x {plen:>5} = {tok:>6} tokens: {m * 1e3:8.2f} ms ({best}), roofline {rp * 1e3:8.2f} ms, "
            f"APE {prows[-1]['ape_pct']:5.1f}% | eager {eager * 1e3:.2f} ms")
        torch.cuda.empty_cache()
    prefill = pd.DataFrame(prows)
    info = {"kv_cache_tokens": t_max, "skipped_points": skipped, "failed": sorted(broken)}
    return variants, prefill, info


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

        def times(fn):
            replay, graph = graphed(fn)
            r = time_cuda(replay)["seconds"]
            del replay, graph
            return r

        full = {kind: times(lambda a=attention(kind): model.sample(model.logits(
            model.decode_hidden(tokens, cos, sin, L - 1, ks, vs, a, True)))) for kind in ("flash", "cudnn")}
        kind = min(full, key=full.get)
        attend = attention(kind)
        row = {"model": name, "n_seqs": n, "ctx_len": L, "attention": kind, "iteration_s": full[kind],
               "linears_s": times(linears),
               "attention_s": times(lambda: [attend(q, ks[i], vs[i]) for i in range(spec.n_layers)][-1]),
               "lm_head_sample_s": times(lambda: model.sample(model.logits(x))),
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


# ----------------------------------------------------------------------------------------------
# Comparing with the cost models
# ----------------------------------------------------------------------------------------------


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
    spec, arch = MODELS[name], ARCH[name]
    key = f"{hardware.lower()}_{name}"
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
    decode = decode[cols]

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


# ----------------------------------------------------------------------------------------------
# Self-test against transformers (CPU, tiny shapes)
# ----------------------------------------------------------------------------------------------


def selftest() -> None:
    """The decoder's prefill and one cached decode step give transformers' Qwen2 logits (fp32, CPU),
    with every decode attention implementation that runs on CPU."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    arch = Arch(vocab=97, intermediate=96, tied=True, qkv_bias=True, rope_theta=1e6)
    cfg = Qwen2Config(vocab_size=arch.vocab, hidden_size=64, intermediate_size=arch.intermediate, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=arch.rope_theta,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=64)
    hf = Qwen2ForCausalLM(cfg).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.2)
    shape = (2, 64, 4, 2, 16, 4)  # layers, hidden, heads, KV heads, head_dim, fp32
    spec = ModelSpec(param_count(ModelSpec(1, *shape), arch), *shape, "selftest")
    if sum(p.numel() for p in hf.parameters()) != spec.params:
        raise AssertionError("param_count disagrees with transformers")
    dec = Decoder(spec, arch, torch.device("cpu"), torch.float32)
    sd = hf.state_dict()
    dec.embed = dec.lm_head = sd["model.embed_tokens.weight"]
    dec.norm = sd["model.norm.weight"]
    for i, layer in enumerate(dec.layers):
        g = lambda k: sd[f"model.layers.{i}.{k}"]  # noqa: E731
        layer.update(ln1=g("input_layernorm.weight"), ln2=g("post_attention_layernorm.weight"), wo=g("self_attn.o_proj.weight"),
                     wqkv=torch.cat([g(f"self_attn.{x}_proj.weight") for x in "qkv"]),
                     bqkv=torch.cat([g(f"self_attn.{x}_proj.bias") for x in "qkv"]),
                     wgu=torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")]), wd=g("mlp.down_proj.weight"))
    b, plen = 3, 9
    ids = torch.randint(0, arch.vocab, (b, plen + 1))
    with torch.no_grad():
        ref = hf(ids).logits  # [b, plen+1, V]
        ks = [torch.zeros(b, 2, plen + 1, 16) for _ in range(2)]
        vs = [torch.zeros(b, 2, plen + 1, 16) for _ in range(2)]
        cos, sin = dec.rope_tables(torch.arange(plen).repeat(b))
        got = dec.logits(dec.prefill_hidden(ids[:, :plen], cos, sin, ks, vs))
        err = (got - ref[:, plen - 1]).abs().max().item()
        print(f"prefill logits vs transformers: max abs diff {err:.2e}")
        assert err < 1e-4, err
        cos, sin = dec.rope_tables(torch.full((b,), plen))
        for kind in ("bmm", "math"):
            got = dec.logits(dec.decode_hidden(ids[:, plen], cos, sin, plen, ks, vs, attention(kind)))
            err = (got - ref[:, plen]).abs().max().item()
            print(f"decode ({kind}) logits vs transformers: max abs diff {err:.2e}")
            assert err < 1e-4, err
        try:
            dec.fuse()
            got = dec.logits(dec.decode_hidden(ids[:, plen], cos, sin, plen, ks, vs, attention("bmm"), fused=True))
        except Exception as exc:  # noqa: BLE001 - torch.compile needs a C compiler on CPU
            print(f"fused (torch.compile) decode not checked: {_first_line(exc)}")
        else:
            err = (got - ref[:, plen]).abs().max().item()
            print(f"decode (bmm, fused) logits vs transformers: max abs diff {err:.2e}")
            assert err < 1e-4, err
    for name, arch_ in ARCH.items():
        assert param_count(MODELS[name], arch_) == MODELS[name].params, name
    print("selftest passed; ARCH parameter counts match MODELS")


# ----------------------------------------------------------------------------------------------


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
