"""The actor's forward and backward on a GPU, timed, against the MFU the analytic training model assumes.

``lssim.sim.training.AnalyticTrainCost`` prices training on a GPU cluster at ``mfu`` (0.35 by default) of the dense
peak, FLOPs counted as verl counts them (6 x dense params x tokens + 6 x sum(seq_len^2) x head_dim x heads x layers
for forward and backward; a recompute from gradient checkpointing is inside the MFU). This measures what one GPU
attains on a decoder with the model's shapes: transformers' Qwen2 with random bf16 weights, PyTorch SDPA
attention, gradient checkpointing on (verl's examples enable it), a micro-batch of ``--tokens`` tokens as
``tokens / seq_len`` sequences of ``seq_len`` each, the loss a token-mean cross-entropy over the logits (what the
policy loss costs, its log-probs included). Per cell: ``fwd_bwd`` (what ``update_actor`` runs per micro-batch, the
optimizer step apart: AdamW is memory-bound and priced by bytes) and ``fwd`` (``compute_log_prob``, no grad; its FLOPs
a third of the forward-backward's). Times are CUDA-event medians of ``--iters`` after a warm-up (roofline_gpu's
``time_cuda``).

    PYTHONPATH=. python3 -m lssim.benchmarks.train_gpu --model qwen2.5-1.5b --model qwen2.5-7b --out DIR   # GPU
    python3 -m lssim.benchmarks.train_gpu --model tiny-ref --device cpu --dtype float32 --tokens 64 --seq-lens 16,32 --out /tmp

Writes ``{hardware}_train_mfu.csv``: model, phase, seq_len, n_seqs, tokens, seconds, flops (verl's count), mfu (of
``--peak-tflops``, the H100 SXM's 989 dense bf16 by default), and prints each cell. What it leaves out: FSDP's
collectives and offload (priced by bytes in the model), sequence packing with unequal lengths, fp32 master weights.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd

from lssim.cost import MODELS, SHAPES

COLUMNS = ["model", "phase", "seq_len", "n_seqs", "tokens", "seconds", "flops", "mfu"]


def verl_flops(model: str, seq_len: int, n_seqs: int, backward: bool = True) -> float:
    """FLOPs of forward (x3 with backward) over n_seqs sequences of seq_len tokens, as verl's flops_counter counts
    them: 2 x dense params x tokens + 2 x sum(seq_len^2) x head_dim x heads x layers per forward pass."""
    m = MODELS[model]
    forward = 2.0 * m.params * seq_len * n_seqs + 2.0 * n_seqs * seq_len**2 * m.head_dim * m.n_heads * m.n_layers
    return forward * (3.0 if backward else 1.0)


def build(model: str, device, dtype):
    """transformers' Qwen2 with the shapes of lssim.cost.MODELS[model] (random weights)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    m, shape = MODELS[model], SHAPES[model]
    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=m.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads,
                      head_dim=m.head_dim, tie_word_embeddings=shape.tied_embeddings, max_position_embeddings=32768,
                      attn_implementation="sdpa")
    with torch.device(device):
        net = Qwen2ForCausalLM(cfg).to(dtype)
    net.gradient_checkpointing_enable()
    net.config.use_cache = False
    return net


def _time(fn, device, warmup: int, iters: int) -> float:
    """Median seconds of ``fn()``: the benchmarks' CUDA-event timer on a GPU, perf_counter on a CPU."""
    if device.type == "cuda":
        from lssim.benchmarks.roofline_gpu import time_cuda

        return time_cuda(fn, warmup, iters)["seconds"]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(model: str, tokens: int, seq_lens, device: str = "cuda", dtype: str = "bfloat16", warmup: int = 1,
            iters: int = 3, peak_flops: float = 989e12, log=print) -> pd.DataFrame:
    import torch

    dev, dt = torch.device(device), getattr(torch, dtype)
    net = build(model, dev, dt)
    vocab = SHAPES[model].vocab
    rows = []
    for s in seq_lens:
        if tokens % s:
            raise ValueError(f"--tokens {tokens} is not a multiple of seq_len {s}")
        n = tokens // s
        ids = torch.randint(0, vocab, (n, s), device=dev)

        def fwd_bwd():
            net.train()
            out = net(input_ids=ids, labels=ids)
            out.loss.backward()
            net.zero_grad(set_to_none=True)

        def fwd():
            net.eval()
            with torch.no_grad():
                logits = net(input_ids=ids).logits
                torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[..., None])

        for phase, fn, backward in (("fwd_bwd", fwd_bwd, True), ("fwd", fwd, False)):
            seconds = _time(fn, dev, warmup, iters)
            flops = verl_flops(model, s, n, backward)
            rows.append({"model": model, "phase": phase, "seq_len": s, "n_seqs": n, "tokens": tokens, "seconds": seconds,
                         "flops": flops, "mfu": flops / seconds / peak_flops})
            log(f"{model} {phase:>7} {n:>3} x {s:>5} tokens: {seconds * 1e3:8.1f} ms, {flops / seconds / 1e12:6.0f} TFLOP/s, "
                f"MFU {flops / seconds / peak_flops:.3f}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    del net
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="a key of lssim.cost.MODELS with a DecoderShape")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch")
    ap.add_argument("--seq-lens", default="512,2048,8192")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the dense bf16 peak MFU is taken of")
    ap.add_argument("--hardware", default="H100")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    seq_lens = [int(x) for x in args.seq_lens.split(",") if x.strip()]
    table = pd.concat([measure(m, args.tokens, seq_lens, args.device, args.dtype, iters=args.iters,
                               peak_flops=args.peak_tflops * 1e12) for m in args.model], ignore_index=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.hardware.lower()}_train_mfu.csv"
    table.to_csv(path, index=False, float_format="%.6g")
    print(f"wrote {path} ({len(table)} rows)")


if __name__ == "__main__":
    main()
