"""What the roofline benchmark (lssim/benchmarks/roofline_gpu.py) needs of each model beyond ``lssim.cost.MODELS``:
its architecture (``ARCH``: vocabulary, MLP width, tied embeddings, QKV bias, RoPE base, from its Hugging Face
config), its parameter count from them, and the weight bytes one decode iteration reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from lssim.cost import ModelSpec


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
