"""What the analytic models know about a model and a GPU: architecture specs, datasheet numbers, KV capacity."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

__all__ = ["ModelSpec", "Hardware", "DecoderShape", "MODELS", "HARDWARE", "SHAPES", "kv_capacity_tokens"]

_INF = float("inf")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of a decoder-only transformer that matter for cost.

    ``params`` is the total parameter count (embeddings and LM head included: all are read once
    per forward pass). ``head_dim * n_heads`` need not equal ``hidden``.
    """

    params: int
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    name: str = ""

    def __post_init__(self) -> None:
        for field in ("params", "n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "dtype_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"ModelSpec.{field} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelSpec.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V cache per token over all layers: 2 x layers x kv_heads x head_dim x dtype."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights (all read once per forward pass)."""
        return self.params * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tp: int = 1) -> int:
        """KV bytes per token held by one of ``tp`` GPUs. KV heads are split across tensor-parallel
        ranks; when ``tp > n_kv_heads`` they are replicated (as vLLM does), one head per rank."""
        heads = -(-self.n_kv_heads // tp)  # ceil
        return 2 * self.n_layers * heads * self.head_dim * self.dtype_bytes


# Published configs (Hugging Face config.json of each model). Parameter counts were recomputed from
# those configs (embeddings + per-layer attention incl. Qwen's QKV bias + gated MLP + norms; tied
# embeddings for qwen2.5-1.5b) and match the model cards: 7.61B, 1.54B, 32.8B (card: "32.5B"
# non-embedding-rounded), 8.03B. All in bf16.
MODELS: dict[str, ModelSpec] = {
    # Qwen/Qwen2.5-7B: 28 layers, hidden 3584, 28 heads, 4 KV heads, head_dim 128, vocab 152064.
    "qwen2.5-7b": ModelSpec(7_615_616_512, 28, 3584, 28, 4, 128, 2, "qwen2.5-7b"),
    # Qwen/Qwen2.5-1.5B: 28 layers, hidden 1536, 12 heads, 2 KV heads, head_dim 128, tied embeddings.
    "qwen2.5-1.5b": ModelSpec(1_543_714_304, 28, 1536, 12, 2, 128, 2, "qwen2.5-1.5b"),
    # Qwen/Qwen2.5-32B: 64 layers, hidden 5120, 40 heads, 8 KV heads, head_dim 128, vocab 152064.
    "qwen2.5-32b": ModelSpec(32_763_876_352, 64, 5120, 40, 8, 128, 2, "qwen2.5-32b"),
    # meta-llama/Meta-Llama-3-8B: 32 layers, hidden 4096, 32 heads, 8 KV heads, head_dim 128, vocab 128256.
    "llama3-8b": ModelSpec(8_030_261_248, 32, 4096, 32, 8, 128, 2, "llama3-8b"),
    # The project's CPU reference model: 2 layers, hidden 128, 4 heads (MHA, head_dim 32), vocab 64.
    # Parameter count assumes a 4x gated MLP (intermediate 512) and tied embeddings; fp32 on CPU.
    "tiny-ref": ModelSpec(533_120, 2, 128, 4, 4, 32, 4, "tiny-ref"),
    # meta-llama/Llama-2-7b-hf: 32 layers, hidden 4096, 32 heads (MHA), head_dim 128, vocab 32000, MLP 11008.
    # The model of Vidur's public H100 per-operation profiles (lssim.cost.data, lssim.benchmarks.gpu_cost_model).
    "llama2-7b": ModelSpec(6_738_415_616, 32, 4096, 32, 32, 128, 2, "llama2-7b"),
}


@dataclass(frozen=True)
class DecoderShape:
    """What ``ModelSpec`` leaves out and a per-kernel cost model needs: the vocabulary (LM head and sampling),
    the MLP width (gated: gate and up projections fused, then down), whether the input embedding is the
    LM head (tied), and whether the QKV projection has a bias (Qwen2)."""

    vocab: int
    intermediate: int
    tied_embeddings: bool
    qkv_bias: bool

    def __post_init__(self) -> None:
        for field in ("vocab", "intermediate"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"DecoderShape.{field} must be a positive int, got {value!r}")
        for field in ("tied_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"DecoderShape.{field} must be a bool, got {getattr(self, field)!r}")

    def params(self, spec: ModelSpec) -> int:
        """The parameter count these shapes give with ``spec`` (embeddings, attention with its bias, gated
        MLP, two norms a layer and the final norm): equals ``spec.params`` for every entry of SHAPES."""
        h, q, kv = spec.hidden, spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
        attn = h * (q + 2 * kv) + (q + 2 * kv if self.qkv_bias else 0) + q * h
        layer = attn + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tied_embeddings else 2) + spec.n_layers * layer + h


# From the same config.json files as MODELS (vocab_size, intermediate_size, tie_word_embeddings, QKV bias).
SHAPES: dict[str, DecoderShape] = {
    "qwen2.5-7b": DecoderShape(152_064, 18_944, False, True),
    "qwen2.5-1.5b": DecoderShape(151_936, 8_960, True, True),
    "qwen2.5-32b": DecoderShape(152_064, 27_648, False, True),
    "llama3-8b": DecoderShape(128_256, 14_336, False, False),
    "tiny-ref": DecoderShape(64, 512, True, False),
    "llama2-7b": DecoderShape(32_000, 11_008, False, False),
}


@dataclass(frozen=True)
class Hardware:
    """One accelerator: memory capacity, peak memory bandwidth and dense bf16 peak FLOP/s."""

    name: str
    memory_bytes: float
    bandwidth_bytes_per_s: float
    peak_flops: float

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "bandwidth_bytes_per_s", "peak_flops"):
            value = getattr(self, field)
            if isinstance(value, bool) or not (isinstance(value, numbers.Real) and 0 < value < _INF):
                raise ValueError(f"Hardware.{field} must be a positive finite number, got {value!r}")


_GiB = 2**30
HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS
    # "with sparsity" -> 989 TFLOPS dense. ("80GB" parts report 81,559 MiB in nvidia-smi ~ 80 GiB.)
    "H100": Hardware("H100", 80 * _GiB, 3.35e12, 989e12),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 TFLOPS
    # with sparsity -> 989 TFLOPS dense (same compute die as H100).
    "H200": Hardware("H200", 141 * _GiB, 4.8e12, 989e12),
    # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: 80 GB HBM2e, 2,039 GB/s, BF16 312 TFLOPS
    # dense (624 with sparsity).
    "A100": Hardware("A100", 80 * _GiB, 2.039e12, 312e12),
}


def lookup_spec(value, table: dict, what: str):
    if isinstance(value, str):
        try:
            return table[value]
        except KeyError:
            raise ValueError(f"unknown {what} {value!r}; known: {sorted(table)}") from None
    return value


def kv_capacity_tokens(
    model: ModelSpec | str,
    hardware: Hardware | str,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    reserved_bytes_per_gpu: float = 2 * _GiB,
) -> int:
    """Tokens of KV cache that fit on one engine instance of ``tp`` GPUs, the way vLLM sizes it:
    per GPU, ``gpu_memory_utilization x memory - weights/tp - reserved``, divided by that GPU's
    KV bytes per token. ``reserved_bytes_per_gpu`` (default 2 GiB) stands in for what vLLM's
    profiling run finds for activations, CUDA graphs and non-torch allocations. Returns 0 if the
    weights do not fit."""
    model = lookup_spec(model, MODELS, "model")
    hardware = lookup_spec(hardware, HARDWARE, "hardware")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    free = hardware.memory_bytes * gpu_memory_utilization - model.weight_bytes / tp - reserved_bytes_per_gpu
    return max(0, int(free // model.kv_bytes_per_token_per_gpu(tp)))
