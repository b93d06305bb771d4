"""Execution-time (cost) models for one engine instance.

The simulator fast-forwards an engine between changes of batch composition, so it never asks
"how long is one token" but "how long are the next ``k`` decode iterations of ``n`` running
sequences whose contexts sum to ``ctx`` tokens". During such a span nothing joins or leaves, so
``n`` is constant and the summed context grows by exactly ``n`` per iteration: an arithmetic ramp.
Every model here has a per-iteration time that is piecewise linear in ``ctx`` with at most two
pieces, so the span is summed in closed form and inverted (``iterations_within``) by solving a
quadratic, then nudged by at most a step or two so the inverse is exact for the forward formula.

Conventions shared by all models (the ``CostModel`` protocol):

* ``decode_time(n, ctx, k)``: seconds for ``k`` decode iterations; ``ctx`` is the summed context
  (prompt + generated so far) at the first of them. 0 when ``k == 0`` or ``n == 0``.
* ``iterations_within(n, ctx, s)``: the largest ``k`` with ``decode_time(n, ctx, k) <= s``.
* ``prefill_time(tokens)``: seconds added to the iteration that admits ``tokens`` prompt tokens
  (possibly of several prompts together). Affine in ``tokens`` with a non-negative intercept, so
  it is subadditive: ``prefill_time(a + b) <= prefill_time(a) + prefill_time(b)``. Pricing all
  prompts as one call therefore never overstates their prefill, which keeps lower bounds valid.
* ``departure_time(k)``: seconds added when ``k`` sequences leave a running batch at once (finished or
  aborted): the engine's work to free them and re-pack its batch. 0 for ``k == 0``; non-negative, so it
  only ever adds time and lower bounds priced without it stay valid. 0 in the roofline; a profile
  measures it (on vLLM's CPU build 0.3-0.5 ms per departing sequence,
  a fifth of a small batch's 2 ms iteration).

Hot-path methods use plain float arithmetic only (no numpy, no allocation); constants are
precomputed in ``__init__``.

Implementations: :class:`RooflineCostModel` (analytic, from model and GPU specs) and
:class:`ProfiledCostModel` (least-squares fit to measurements of a real engine, as in Vidur).
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "CostModel",
    "ModelSpec",
    "Hardware",
    "MODELS",
    "HARDWARE",
    "RooflineCostModel",
    "ProfiledCostModel",
    "batch_features",
    "kv_capacity_tokens",
    "solo_decode_time",
    "peak_tokens_per_second",
    "SpeculativeCost",
]

_INF = float("inf")


@runtime_checkable
class CostModel(Protocol):
    """What the simulator needs from an execution-time model (see module docstring)."""

    name: str

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        """Seconds for ``n_iters`` consecutive decode iterations of one engine instance with
        ``n_seqs`` running sequences, where ``ctx_tokens`` is the sum of the sequences' context
        lengths (prompt + generated) at the first of those iterations; the sum grows by ``n_seqs``
        each iteration. Exact for the model's per-iteration formula (closed form), monotone
        non-decreasing in every argument, and 0 for ``n_iters == 0``."""
        ...

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        """The largest ``k >= 0`` with ``decode_time(n_seqs, ctx_tokens, k) <= seconds``."""
        ...

    def prefill_time(self, n_tokens: int) -> float:
        """Seconds to prefill ``n_tokens`` prompt tokens (added to the admitting iteration);
        0 for ``n_tokens <= 0``; affine (hence subadditive) in ``n_tokens`` above 0."""
        ...

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        """A lower bound on the summed decode seconds of any schedule that generates ``tokens`` tokens with at
        most ``max_num_seqs`` sequences per iteration, where ``context_reads`` is the sum over those tokens of
        the context each was decoded at (schedule-independent: a response of ``L`` tokens on a context of
        ``c`` reads ``L*c + L*(L-1)/2``). The lower bound's work term (lssim.bounds)."""
        ...

    def departure_time(self, n_leaving: int) -> float:
        """Seconds added when ``n_leaving`` sequences leave the running batch at one iteration boundary;
        0 for ``n_leaving <= 0``, non-negative otherwise."""
        ...

    def describe(self) -> dict:
        """The model's parameters, for reports."""
        ...


# ----------------------------------------------------------------------------------------------
# Closed-form sums over an arithmetic ramp, shared by the models.
#
# A piece is a per-iteration time f(i) = a + b*i (i = 0, 1, ... counts iterations into the span,
# b >= 0). Its sum over i in [0, k) is k*a + b*k*(k-1)/2.
# ----------------------------------------------------------------------------------------------


def _settle(decode_time, n_seqs: int, ctx_tokens: float, seconds: float, k: int) -> int:
    """Move an estimate k of `iterations_within` to the exact answer against the forward formula:
    the largest k with decode_time(n_seqs, ctx_tokens, k) <= seconds (float rounding moves k by one)."""
    while decode_time(n_seqs, ctx_tokens, k + 1) <= seconds:
        k += 1
    while k > 0 and decode_time(n_seqs, ctx_tokens, k) > seconds:
        k -= 1
    return k


def _ramp_count(a: float, b: float, seconds: float) -> float:
    """Real k >= 0 solving ``k*a + b*k*(k-1)/2 == seconds`` (a > 0, b >= 0, seconds >= 0).

    Written as ``(b/2) k^2 + B k - seconds = 0`` with ``B = a - b/2``; the form
    ``2s / (B + sqrt(B^2 + 2bs))`` avoids cancellation when ``b`` is tiny (and covers b == 0).
    It is an estimate: callers fix the last step against the forward formula.
    """
    B = a - 0.5 * b
    disc = math.sqrt(B * B + 2.0 * b * seconds)
    if B > 0.0:
        return 2.0 * seconds / (B + disc)
    return (disc - B) / b  # B <= 0 implies b >= 2a > 0


# ----------------------------------------------------------------------------------------------
# Model and hardware specs
# ----------------------------------------------------------------------------------------------


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


def _lookup(value, table: dict, what: str):
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
    model = _lookup(model, MODELS, "model")
    hardware = _lookup(hardware, HARDWARE, "hardware")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    free = hardware.memory_bytes * gpu_memory_utilization - model.weight_bytes / tp - reserved_bytes_per_gpu
    return max(0, int(free // model.kv_bytes_per_token_per_gpu(tp)))


# ----------------------------------------------------------------------------------------------
# Roofline model
# ----------------------------------------------------------------------------------------------


class RooflineCostModel:
    """Analytic roofline: per-iteration time = max(compute, memory) + fixed overhead.

    * memory  = (weight_bytes/tp + kv_bytes_per_token_per_gpu x ctx) / (bandwidth x bandwidth_efficiency)
    * compute = (2 x params x n + 4 x layers x n_heads x head_dim x ctx) / (tp x peak_flops x mfu)

    (the attention term counts QK^T and AV: 2 FLOPs per multiply-add, two matmuls, per context
    token per layer). Both sides are affine in ``ctx``, which ramps linearly over a span, so the
    span splits at the one iteration where the larger side switches and each piece is summed in
    closed form. Tensor-parallel communication is not modelled.

    Prefill of ``t`` tokens = ``2 x params x t / (tp x peak_flops x prefill_mfu)`` (+ one weight read,
    see below). The causal-attention FLOPs of prefill (quadratic in each prompt's length) are left
    out: ``prefill_time`` gets the total over possibly many prompts, so it cannot know them, and
    they are small for RL-sized prompts (about 1% of prefill FLOPs for a 7B model at 1k tokens,
    5% at 4k). Leaving them out keeps ``prefill_time`` affine and subadditive.

    Defaults (per GPU, chosen so the model lands where measured vLLM numbers are):

    * ``bandwidth_efficiency=0.85``: fraction of datasheet HBM bandwidth a streaming GEMV reaches
      on H100/A100 class parts (typically 80-90%).
    * ``mfu=0.5``: decode-time model FLOP utilisation when compute-bound (large batches).
    * ``prefill_mfu=0.6``: prefill GEMMs are large and efficient.
    * ``iteration_overhead_s=5e-4``: per-iteration scheduler, sampling and launch overhead
      (vLLM with CUDA graphs: a few hundred microseconds).
    * ``prefill_includes_weight_read=True``: ``prefill_time`` adds one weight read, i.e. prefill is
      priced as its own forward pass (vLLM without chunked prefill). Set False when prefill tokens
      ride on a decode iteration that already pays the weight read.

    With these, qwen2.5-7b on one H100 decodes at batch 1 in about 5.9 ms per token.
    """

    def __init__(
        self,
        model: ModelSpec | str,
        hardware: Hardware | str,
        tp: int = 1,
        *,
        bandwidth_efficiency: float = 0.85,
        mfu: float = 0.5,
        prefill_mfu: float = 0.6,
        iteration_overhead_s: float = 5e-4,
        prefill_includes_weight_read: bool = True,
    ) -> None:
        self.model = model = _lookup(model, MODELS, "model")
        self.hardware = hw = _lookup(hardware, HARDWARE, "hardware")
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be an int >= 1, got {tp!r}")
        for label, value in (("bandwidth_efficiency", bandwidth_efficiency), ("mfu", mfu), ("prefill_mfu", prefill_mfu)):
            if not 0 < value <= 1:
                raise ValueError(f"{label} must be in (0, 1], got {value}")
        if not 0 <= iteration_overhead_s < _INF:
            raise ValueError(f"iteration_overhead_s must be >= 0 and finite, got {iteration_overhead_s}")
        self.tp = tp
        self.bandwidth_efficiency = float(bandwidth_efficiency)
        self.mfu = float(mfu)
        self.prefill_mfu = float(prefill_mfu)
        self.iteration_overhead_s = float(iteration_overhead_s)
        self.prefill_includes_weight_read = bool(prefill_includes_weight_read)
        self.name = f"roofline[{model.name or 'model'}@{hw.name}x{tp}]"

        bw = hw.bandwidth_bytes_per_s * bandwidth_efficiency
        flops = tp * hw.peak_flops * mfu
        attn_flops_per_ctx = 4.0 * model.n_layers * model.n_heads * model.head_dim
        # memory(ctx) = _mem_a + _mem_b*ctx ; compute(n, ctx) = _cmp_a*n + _cmp_b*ctx  (seconds)
        self._mem_a = model.weight_bytes / tp / bw
        self._mem_b = model.kv_bytes_per_token_per_gpu(tp) / bw
        self._cmp_a = 2.0 * model.params / flops
        self._cmp_b = attn_flops_per_ctx / flops
        self._ov = self.iteration_overhead_s
        # prefill(t) = _pf_a*t + _pf_w for t > 0
        self._pf_a = 2.0 * model.params / (tp * hw.peak_flops * prefill_mfu)
        self._pf_w = self._mem_a if prefill_includes_weight_read else 0.0

    # -- hot path ------------------------------------------------------------------------------

    def _sides(self, n_seqs: int, ctx_tokens: float) -> tuple[float, float, float, float]:
        """(v0, s0, v1, s1): the roofline side on top at the span's first iteration (its time and
        per-iteration slope as the context grows), then the other side."""
        mb, cb = self._mem_b, self._cmp_b
        m0 = self._mem_a + mb * ctx_tokens
        c0 = self._cmp_a * n_seqs + cb * ctx_tokens
        if c0 >= m0:
            return c0, cb * n_seqs, m0, mb * n_seqs
        return m0, mb * n_seqs, c0, cb * n_seqs

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        if n_iters <= 0 or n_seqs <= 0:
            return 0.0
        k = n_iters
        v0, s0, v1, s1 = self._sides(n_seqs, ctx_tokens)
        if s1 > s0:
            # The other side overtakes after iteration floor((v0 - v1)/(s1 - s0)).
            j = int((v0 - v1) / (s1 - s0)) + 1
            if j < k:
                return (j * (v0 + s0 * (j - 1) * 0.5)
                        + (k - j) * (v1 + s1 * (j + k - 1) * 0.5)
                        + k * self._ov)
        return k * (v0 + s0 * (k - 1) * 0.5 + self._ov)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        if n_seqs <= 0:
            raise ValueError("iterations_within needs n_seqs >= 1 (an idle engine never advances)")
        if not seconds < _INF:
            raise ValueError(f"seconds must be finite, got {seconds}")
        if seconds <= 0.0:
            return 0  # every iteration takes > 0 s (the weight read)
        v0, s0, v1, s1 = self._sides(n_seqs, ctx_tokens)
        ov = self._ov
        est = _ramp_count(v0 + ov, s0, seconds)
        if s1 > s0:
            j = int((v0 - v1) / (s1 - s0)) + 1
            if est > j:
                rest = seconds - j * (v0 + s0 * (j - 1) * 0.5 + ov)
                est = j + _ramp_count(v1 + s1 * j + ov, s1, max(rest, 0.0))
        return _settle(self.decode_time, n_seqs, ctx_tokens, seconds, int(est))

    def prefill_time(self, n_tokens: int) -> float:
        if n_tokens <= 0:
            return 0.0
        return self._pf_a * n_tokens + self._pf_w

    def departure_time(self, n_leaving: int) -> float:
        return 0.0  # a GPU engine's scheduler work overlaps the previous iteration; its overhead is in `_ov`

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        # Each iteration costs max(memory, compute) + overhead >= either side, so the sum is at least either
        # side summed; both grow with the number of iterations, which is at least tokens / max_num_seqs.
        if tokens <= 0:
            return 0.0
        iters = tokens / max_num_seqs
        memory = iters * (self._mem_a + self._ov) + self._mem_b * context_reads
        compute = self._cmp_a * tokens + self._cmp_b * context_reads + self._ov * iters
        return max(memory, compute)

    # -- helpers -------------------------------------------------------------------------------

    def iteration_breakdown(self, n_seqs: int, ctx_tokens: float) -> dict:
        """Components of one iteration's time (seconds), for reports and sanity checks."""
        weights = self._mem_a
        kv = self._mem_b * ctx_tokens
        compute = self._cmp_a * n_seqs + self._cmp_b * ctx_tokens
        return {
            "weight_read_s": weights,
            "kv_read_s": kv,
            "memory_s": weights + kv,
            "compute_s": compute,
            "overhead_s": self._ov,
            "bound": "compute" if compute >= weights + kv else "memory",
            "total_s": max(weights + kv, compute) + self._ov,
        }

    def describe(self) -> dict:
        return {
            "kind": "roofline",
            "name": self.name,
            "model": asdict(self.model),
            "hardware": asdict(self.hardware),
            "tp": self.tp,
            "bandwidth_efficiency": self.bandwidth_efficiency,
            "mfu": self.mfu,
            "prefill_mfu": self.prefill_mfu,
            "iteration_overhead_s": self.iteration_overhead_s,
            "prefill_includes_weight_read": self.prefill_includes_weight_read,
        }

    def __repr__(self) -> str:
        return f"RooflineCostModel({self.name})"


# ----------------------------------------------------------------------------------------------
# Profiled (fitted) model
# ----------------------------------------------------------------------------------------------

_DECODE_FORM = "t_iter = c0 + c1*n_seqs + c2*ctx_tokens + c3*n_seqs^2"
_PREFILL_FORM = "t_prefill = p0 + p1*prefill_tokens (0 when prefill_tokens == 0)"
_DEPARTURE_FORM = "t_departure = f0 + f1*leaving (0 when leaving == 0): k sequences leave the batch at one iteration"
_COEFFICIENTS = ("c0", "c1", "c2", "c3", "p0", "p1", "f0", "f1")
_BATCH_COLUMNS = ("n_seqs", "prompt_len", "lengths", "seconds")
_DECODE_COLUMNS = ("n_seqs", "ctx_tokens", "seconds")
_PREFILL_COLUMNS = ("prefill_tokens", "seconds")


class ProfiledCostModel:
    """Table-driven model fitted to per-iteration measurements of a real engine (the Vidur approach).

    Per decode iteration ``t = c0 + c1*n + c2*ctx + c3*n^2``; per prefill ``t = p0 + p1*tokens``; when
    ``k`` sequences leave the batch (finish or abort) ``t = f0 + f1*k``.
    ``n`` is constant over a span and ``ctx`` ramps linearly, so a span of ``k`` iterations is
    ``k*a + c2*n*k*(k-1)/2`` with ``a`` the first iteration's time: exact, and exactly invertible.
    Coefficients are non-negative (fitted with NNLS), which makes every method monotone.
    ``c3`` (a superlinear batch term) is fitted only with ``fit(..., quadratic_n=True)``; if it is
    positive, throughput can fall at large batches (see :func:`peak_tokens_per_second`).

    Two ways to fit: :meth:`fit` to per-iteration and prefill measurements, or :meth:`fit_makespans` to the
    makespans of whole batches with known lengths, the quantity the simulator predicts: a batch's makespan
    under this model is linear in all eight coefficients (:func:`batch_features`), so NNLS fits them at once.
    """

    def __init__(
        self,
        c0: float,
        c1: float,
        c2: float,
        c3: float = 0.0,
        p0: float = 0.0,
        p1: float = 0.0,
        f0: float = 0.0,
        f1: float = 0.0,
        *,
        fit_stats: dict | None = None,
        name: str = "profiled",
    ) -> None:
        coeffs = {"c0": c0, "c1": c1, "c2": c2, "c3": c3, "p0": p0, "p1": p1, "f0": f0, "f1": f1}
        for key, value in coeffs.items():
            if isinstance(value, bool) or not (isinstance(value, numbers.Real) and 0 <= value < _INF):
                raise ValueError(f"ProfiledCostModel coefficient {key} must be finite and >= 0, got {value!r}")
        if c0 + c1 + c3 <= 0:
            raise ValueError("ProfiledCostModel: c0 + c1 + c3 must be > 0 (an iteration must take time)")
        self.c0, self.c1, self.c2, self.c3, self.p0, self.p1, self.f0, self.f1 = (float(v) for v in coeffs.values())
        self.fit_stats = dict(fit_stats) if fit_stats else None  # fit_error() at fit time
        self.name = name

    # -- hot path ------------------------------------------------------------------------------

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        if n_iters <= 0 or n_seqs <= 0:
            return 0.0
        a = self.c0 + (self.c1 + self.c3 * n_seqs) * n_seqs + self.c2 * ctx_tokens
        return n_iters * (a + self.c2 * n_seqs * (n_iters - 1) * 0.5)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        if n_seqs <= 0:
            raise ValueError("iterations_within needs n_seqs >= 1 (an idle engine never advances)")
        if not seconds < _INF:
            raise ValueError(f"seconds must be finite, got {seconds}")
        if seconds <= 0.0:
            return 0
        a = self.c0 + (self.c1 + self.c3 * n_seqs) * n_seqs + self.c2 * ctx_tokens
        k = int(_ramp_count(a, self.c2 * n_seqs, seconds))
        return _settle(self.decode_time, n_seqs, ctx_tokens, seconds, k)

    def prefill_time(self, n_tokens: int) -> float:
        if n_tokens <= 0:
            return 0.0
        return self.p0 + self.p1 * n_tokens

    def departure_time(self, n_leaving: int) -> float:
        if n_leaving <= 0:
            return 0.0
        return self.f0 + self.f1 * n_leaving

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        # Summed over I iterations with n_i sequences: c0*I + c1*T + c3*sum(n_i^2) + c2*W, and sum(n_i^2) >= T^2/I
        # (Cauchy-Schwarz); c0*I + c3*T^2/I is least at I = T*sqrt(c3/c0), held within [T/max_num_seqs, T].
        if tokens <= 0:
            return 0.0
        lo, hi = tokens / max_num_seqs, float(tokens)
        best = tokens * math.sqrt(self.c3 / self.c0) if self.c0 > 0 else hi
        iters = min(max(best, lo), hi)
        return self.c0 * iters + self.c3 * tokens * tokens / iters + self.c1 * tokens + self.c2 * context_reads

    @property
    def coefficients(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in _COEFFICIENTS}

    def makespan(self, lengths, prompt_len: int) -> float:
        """Seconds from submission to the last token of a batch of requests admitted at once, one per entry
        of ``lengths`` (tokens each generates), each with a prompt of ``prompt_len``: what the simulator gives."""
        f = batch_features(lengths, prompt_len)
        return sum(getattr(self, k) * v for k, v in f.items())

    # -- fitting -------------------------------------------------------------------------------

    @classmethod
    def fit(cls, decode_df, prefill_df=None, *, quadratic_n: bool = False, name: str = "profiled") -> "ProfiledCostModel":
        """Fit to measurements. ``decode_df``: one row per decode iteration with columns
        ``n_seqs``, ``ctx_tokens``, ``seconds``; ``prefill_df`` (optional; prefill is free without
        it): columns ``prefill_tokens``, ``seconds``. Each may be a DataFrame or a path to a
        .csv/.parquet/.json file. Minimises squared *relative* error (rows weighted by 1/seconds,
        matching the percentage-error report) with non-negative coefficients (scipy NNLS).
        Raises ValueError naming the file and column on missing columns, non-finite or
        non-positive times, or too few distinct points."""
        import numpy as np

        ddf, dsrc = _load_table(decode_df, _DECODE_COLUMNS, "decode measurements")
        n = ddf["n_seqs"].to_numpy(float)
        ctx = ddf["ctx_tokens"].to_numpy(float)
        y = ddf["seconds"].to_numpy(float)
        columns = [np.ones_like(n), n, ctx] + ([n * n] if quadratic_n else [])
        if len(np.unique(n)) < (3 if quadratic_n else 2) or len(np.unique(ctx)) < 2:
            raise ValueError(
                f"{dsrc}: too few distinct points to fit {_DECODE_FORM}: need >= {3 if quadratic_n else 2} "
                "distinct n_seqs and >= 2 distinct ctx_tokens values"
            )
        c = _nnls_relative(np.column_stack(columns), y, dsrc)
        c0, c1, c2 = c[:3]
        c3 = c[3] if quadratic_n else 0.0

        p0 = p1 = 0.0
        if prefill_df is not None:
            pdf, psrc = _load_table(prefill_df, _PREFILL_COLUMNS, "prefill measurements")
            tok = pdf["prefill_tokens"].to_numpy(float)
            if len(np.unique(tok)) < 2:
                raise ValueError(f"{psrc}: too few distinct points: need >= 2 distinct prefill_tokens values")
            if (tok <= 0).any():
                raise ValueError(f"{psrc}: column 'prefill_tokens' must be > 0")
            p0, p1 = _nnls_relative(np.column_stack([np.ones_like(tok), tok]), pdf["seconds"].to_numpy(float), psrc)

        if c0 + c1 + c3 <= 0:
            raise ValueError(f"{dsrc}: fit gave zero time for an iteration; check the 'seconds' column units")
        model = cls(float(c0), float(c1), float(c2), float(c3), float(p0), float(p1), name=name)
        model.fit_stats = model.fit_error(ddf)
        return model

    @classmethod
    def fit_makespans(cls, batches, *, quadratic_n: bool = True, name: str = "profiled") -> "ProfiledCostModel":
        """Fit every coefficient to measured batch makespans. ``batches``: rows with ``n_seqs``, ``prompt_len``,
        ``lengths`` (the list of tokens each request generated) and ``seconds`` (submission to last token).
        Minimises squared relative error with non-negative coefficients; ``fit_stats`` is the makespan error
        (:meth:`makespan_error`). The design must vary the batch size, the prompt length and how the lengths
        spread (a batch whose requests all finish together says nothing about departures)."""
        import numpy as np

        df, src = _load_batches(batches)
        terms = [k for k in _COEFFICIENTS if quadratic_n or k != "c3"]
        X = np.array([[f[k] for k in terms] for f in (batch_features(l, p) for l, p in zip(df["lengths"], df["prompt_len"]))])
        if len(np.unique(df["n_seqs"])) < 3 or len(np.unique(df["prompt_len"])) < 2:
            raise ValueError(f"{src}: too few distinct points: need >= 3 distinct n_seqs and >= 2 distinct prompt_len values")
        coef = dict(zip(terms, _nnls_relative(X, df["seconds"].to_numpy(float), src)))
        if coef["c0"] + coef["c1"] + coef.get("c3", 0.0) <= 0:
            raise ValueError(f"{src}: fit gave zero time for an iteration; check the 'seconds' column units")
        model = cls(**{k: float(coef.get(k, 0.0)) for k in _COEFFICIENTS}, name=name)
        model.fit_stats = model.makespan_error(df)
        return model

    def makespan_error(self, batches) -> dict:
        """Median / p90 / max absolute percentage error (in %) of :meth:`makespan` over measured batches."""
        import numpy as np

        df, _ = _load_batches(batches)
        pred = np.array([self.makespan(l, p) for l, p in zip(df["lengths"], df["prompt_len"])])
        return {**_ape_summary(pred, df["seconds"].to_numpy(float)), "of": "batch makespan"}

    def fit_error(self, decode_df) -> dict:
        """Median / p90 / max absolute percentage error (in %) of the per-iteration time predicted
        for the rows of ``decode_df`` (same columns as :meth:`fit`), and the number of points."""
        import numpy as np

        ddf, _ = _load_table(decode_df, _DECODE_COLUMNS, "decode measurements")
        n = ddf["n_seqs"].to_numpy(float)
        y = ddf["seconds"].to_numpy(float)
        pred = self.c0 + (self.c1 + self.c3 * n) * n + self.c2 * ddf["ctx_tokens"].to_numpy(float)
        return _ape_summary(pred, y)

    # -- persistence ---------------------------------------------------------------------------

    def to_json(self, path, meta: dict | None = None) -> None:
        """Write the coefficients, the functional form and the fit error to ``path``; ``meta`` (how and
        where it was measured: command, engine, machine) is kept under "measured_by"."""
        payload = {
            "kind": "ProfiledCostModel",
            "name": self.name,
            "units": "seconds",
            "decode_form": _DECODE_FORM,
            "prefill_form": _PREFILL_FORM,
            "decode_coefficients": {"c0": self.c0, "c1": self.c1, "c2": self.c2, "c3": self.c3},
            "prefill_coefficients": {"p0": self.p0, "p1": self.p1},
            "departure_form": _DEPARTURE_FORM,
            "departure_coefficients": {"f0": self.f0, "f1": self.f1},
            "fit_error": self.fit_stats,
            **({"measured_by": meta} if meta else {}),
        }
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")

    @classmethod
    def from_json(cls, path) -> "ProfiledCostModel":
        """Read a model written by :meth:`to_json`; ValueError naming the file when it is missing or bad."""
        if not Path(path).is_file():
            raise ValueError(f"profile {path} does not exist (make one with `lssim profile --out {path}`)")
        try:
            payload = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(payload, dict) or payload.get("kind") != "ProfiledCostModel":
            raise ValueError(f"{path}: not a ProfiledCostModel file (missing kind='ProfiledCostModel')")
        if payload.get("decode_form", _DECODE_FORM) != _DECODE_FORM:
            raise ValueError(f"{path}: unsupported decode_form {payload.get('decode_form')!r}")
        try:
            d = payload["decode_coefficients"]
            p = payload.get("prefill_coefficients") or {"p0": 0.0, "p1": 0.0}
            f = payload.get("departure_coefficients") or {"f0": 0.0, "f1": 0.0}
            return cls(d["c0"], d["c1"], d["c2"], d.get("c3", 0.0), p["p0"], p["p1"], f["f0"], f["f1"],
                       fit_stats=payload.get("fit_error"), name=payload.get("name", "profiled"))
        except KeyError as exc:
            raise ValueError(f"{path}: missing key {exc.args[0]!r}") from None
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def describe(self) -> dict:
        return {
            "kind": "profiled",
            "name": self.name,
            "decode_form": _DECODE_FORM,
            "prefill_form": _PREFILL_FORM,
            "c0": self.c0, "c1": self.c1, "c2": self.c2, "c3": self.c3,
            "p0": self.p0, "p1": self.p1,
            "departure_form": _DEPARTURE_FORM,
            "f0": self.f0, "f1": self.f1,
            "fit_error": self.fit_stats,
        }

    def __repr__(self) -> str:
        return (f"ProfiledCostModel(c0={self.c0:.4g}, c1={self.c1:.4g}, c2={self.c2:.4g}, "
                f"c3={self.c3:.4g}, p0={self.p0:.4g}, p1={self.p1:.4g}, f0={self.f0:.4g}, f1={self.f1:.4g})")


def _ape_summary(predicted, measured) -> dict:
    """Median / p90 / max absolute percentage error (in %) of predictions against measurements, and their count."""
    import numpy as np

    ape = np.abs(predicted - measured) / measured * 100.0
    return {"median_ape_pct": float(np.median(ape)), "p90_ape_pct": float(np.percentile(ape, 90)),
            "max_ape_pct": float(ape.max()), "n_points": int(len(ape))}


def batch_features(lengths, prompt_len: int) -> dict[str, float]:
    """A batch admitted at once (one request per entry of ``lengths``, prompts of ``prompt_len``), run as the
    simulator runs it: one prefill of all prompts, then spans of decode iterations between finishes, a
    departure where requests finish (the last one ends the batch, so it adds nothing). Its makespan under a
    ProfiledCostModel is ``sum(coefficient * feature)``; these are the features, named after the coefficients."""
    L = sorted(int(x) for x in lengths)
    n = len(L)
    f = dict.fromkeys(_COEFFICIENTS, 0.0)
    if not n:
        return f
    f["p0"], f["p1"] = 1.0, float(n * prompt_len)
    ctx, done, i = float(n * prompt_len), 0, 0
    while i < n:
        k = L[i] - done  # iterations until the next finish, at n - i running sequences
        m = n - i
        if k > 0:
            f["c0"] += k
            f["c1"] += m * k
            f["c3"] += m * m * k
            f["c2"] += k * ctx + m * k * (k - 1) / 2
            ctx += m * k
            done = L[i]
        j = i
        while j < n and L[j] == L[i]:
            ctx -= prompt_len + L[j]
            j += 1
        if j < n:
            f["f0"] += 1.0
            f["f1"] += j - i
        i = j
    return f


def _load_batches(data):
    """Batch makespan measurements, checked (see ProfiledCostModel.fit_makespans)."""
    import pandas as pd

    df = pd.read_parquet(data) if isinstance(data, (str, Path)) else data
    source = str(data) if isinstance(data, (str, Path)) else "batch measurements"
    missing = [c for c in _BATCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; need {list(_BATCH_COLUMNS)}")
    if len(df) == 0:
        raise ValueError(f"{source}: no rows")
    bad = [i for i, (l, n) in enumerate(zip(df["lengths"], df["n_seqs"])) if len(l) != n or min(l) < 1]
    if bad:
        raise ValueError(f"{source}: row {bad[0]}: 'lengths' must hold n_seqs lengths, each >= 1")
    if not (df["seconds"] > 0).all():
        raise ValueError(f"{source}: column 'seconds' must be > 0 (measured times)")
    return df, source


def _load_table(data, required: tuple[str, ...], what: str):
    """A DataFrame from ``data`` (DataFrame or .csv/.parquet/.json path), checked: required columns
    present, numeric, finite, non-negative, ``seconds`` > 0. Returns (df, label for messages)."""
    import pandas as pd

    if isinstance(data, (str, Path)):
        source = str(data)
        suffix = Path(data).suffix.lower()
        if not Path(data).exists():
            raise ValueError(f"{source}: {what} file not found")
        reader = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".json": pd.read_json}.get(suffix)
        if reader is None:
            raise ValueError(f"{source}: unsupported file type {suffix!r} (use .csv, .parquet or .json)")
        df = reader(data)
    elif isinstance(data, pd.DataFrame):
        df = data
        source = df.attrs.get("source", f"{what} DataFrame")
    else:
        raise ValueError(f"{what}: expected a pandas DataFrame or a file path, got {type(data).__name__}")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; need {list(required)}, have {list(df.columns)}")
    if len(df) == 0:
        raise ValueError(f"{source}: too few points (no rows)")
    for col in required:
        values = pd.to_numeric(df[col], errors="coerce")
        if values.isna().any():
            raise ValueError(f"{source}: column {col!r} has missing or non-numeric values")
        if not values.abs().lt(_INF).all():
            raise ValueError(f"{source}: column {col!r} has infinite values")
        if (values < 0).any():
            raise ValueError(f"{source}: column {col!r} has negative values")
    if (df["seconds"] <= 0).any():
        raise ValueError(f"{source}: column 'seconds' must be > 0 (measured times)")
    return df, source


def _nnls_relative(X, y, source: str):
    """Non-negative least squares minimising relative error: rows scaled by 1/y, columns
    normalised for conditioning and un-normalised after."""
    import numpy as np
    from scipy.optimize import nnls

    if len(y) < X.shape[1]:
        raise ValueError(f"{source}: too few points ({len(y)}) to fit {X.shape[1]} coefficients")
    A = X / y[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(A / scale, np.ones_like(y))
    return coef / scale


# ----------------------------------------------------------------------------------------------
# Speculative decoding / layer skip at small batch
# ----------------------------------------------------------------------------------------------


class SpeculativeCost:
    """A cost model with speculation (lssim.core.Speculation) applied while ``n_seqs <= max_batch``.

    Speculation changes the time per generated token by a factor that depends on the running batch only,
    ``factor(n)``; within a span ``n`` is constant, so a span of ``k`` iterations costs exactly
    ``factor(n) * base.decode_time(n, ctx, k)`` (an "iteration" stays one generated token per sequence, now
    at the expected speculative cost) and ``iterations_within`` inverts it exactly.

    Lossless methods (ngram, draft), per generated token, relative to plain decoding at batch ``n``:

        factor(n) = (1 - alpha) (gamma * draft_cost + verify(n)) / (1 - alpha^(gamma+1))

    i.e. T_SD = (1 - alpha)(D + T)/(1 - alpha^(gamma+1)) with D = gamma * draft_cost * t(n) and
    T = verify(n) * t(n), where ``verify(n) = t(n*(gamma+1)) / t(n)``, ``t(m) = base.decode_time(m, 0, 1)``:
    verifying gamma+1 tokens for each of n sequences is priced as one iteration of n*(gamma+1) sequences that
    reads the weights once. Taking it at zero context ignores that the KV is read once for all gamma+1
    positions, which makes verify(n) an over-estimate (speculation is priced conservatively). It is ~1 while
    the model is memory-bound and grows to gamma+1 once compute-bound: why speculation pays only at small batch.

    layer_skip: factor(n) = layer_fraction (lossy, no verification).

    An engine does not speculate where it would be slower (TLT's adaptive engine picks "no speculation" for
    such batches; vLLM takes a per-batch-size draft length), so the factor applied is min(1, factor), and
    it is made non-decreasing in ``n`` (a running maximum, which leaves the factor alone where it already
    grows with ``n``, as it does for both cost models here). Both keep ``decode_time`` non-decreasing in
    ``n_seqs``, so the lower bound (lssim.bounds) stays valid when priced with this model.
    """

    def __init__(self, base: CostModel, speculation) -> None:
        self.base, self.speculation = base, speculation
        spec = speculation
        self.max_batch = spec.max_batch
        factors = [1.0]  # index 0 unused (an idle instance decodes nothing)
        for n in range(1, spec.max_batch + 1):
            if spec.lossless:
                t1 = base.decode_time(n, 0, 1)
                verify = base.decode_time(n * (spec.gamma + 1), 0, 1) / t1
                f = (spec.gamma * spec.draft_cost + verify) / spec.tokens_per_verification()
            else:
                f = spec.layer_fraction
            factors.append(min(1.0, max(f, factors[-1] if n > 1 else 0.0)))
        self._factors = factors
        self.name = f"{base.name}+{spec.method}"

    def factor(self, n_seqs: int) -> float:
        """Time per generated token with speculation over time without, at ``n_seqs`` running sequences."""
        return self._factors[n_seqs] if 0 < n_seqs <= self.max_batch else 1.0

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        if 0 < n_seqs <= self.max_batch:
            return self._factors[n_seqs] * self.base.decode_time(n_seqs, ctx_tokens, n_iters)
        return self.base.decode_time(n_seqs, ctx_tokens, n_iters)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        if not 0 < n_seqs <= self.max_batch or self._factors[n_seqs] == 1.0:
            return self.base.iterations_within(n_seqs, ctx_tokens, seconds)
        if seconds <= 0.0:
            return 0
        k = self.base.iterations_within(n_seqs, ctx_tokens, seconds / self._factors[n_seqs])
        # the division may round either way: settle against the forward formula
        return _settle(self.decode_time, n_seqs, ctx_tokens, seconds, k)

    def prefill_time(self, n_tokens: int) -> float:
        return self.base.prefill_time(n_tokens)

    def departure_time(self, n_leaving: int) -> float:
        return self.base.departure_time(n_leaving)

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        # every iteration costs at least the smallest factor times its plain cost
        return min(self._factors[1:] + [1.0]) * self.base.work_time(tokens, context_reads, max_num_seqs)

    def describe(self) -> dict:
        from dataclasses import asdict as _asdict

        return {"kind": "speculative", "name": self.name, "base": self.base.describe(),
                "speculation": _asdict(self.speculation),
                "factor": {n: self.factor(n) for n in sorted({1, 8, 16, self.max_batch}) if n <= self.max_batch}}

    def __repr__(self) -> str:
        return f"SpeculativeCost({self.base!r}, {self.speculation!r})"


# ----------------------------------------------------------------------------------------------
# Bounds used by the simulator's lower bound on makespan
# ----------------------------------------------------------------------------------------------


def solo_decode_time(cost: CostModel, prompt_len: int, n_tokens: int) -> float:
    """Seconds for one sequence alone: ``prefill_time(prompt_len) + decode_time(1, prompt_len, n_tokens)``.

    Convention: the ``n_tokens`` decode iterations start with context ``prompt_len`` (nothing
    generated yet) and the prefill is charged once, as the simulator adds it to the admitting
    iteration.

    Lower bound on that sequence's completion time (from its admission) under any schedule the
    simulator can produce with this cost model: each iteration yields at most one token for the
    sequence, so it needs at least ``n_tokens`` iterations, in which its own context is at least
    ``prompt_len + i`` at the i-th; sharing the engine only raises ``n_seqs`` and ``ctx_tokens``, and
    ``decode_time`` is monotone non-decreasing in both; its prefill is paid at least once.
    """
    return cost.prefill_time(prompt_len) + cost.decode_time(1, prompt_len, n_tokens)


def peak_tokens_per_second(cost: CostModel, max_num_seqs: int, mean_ctx: float) -> float:
    """Largest decode throughput (tokens/s) of one instance: ``max over n in 1..max_num_seqs`` of
    ``n / decode_time(n, n * mean_ctx, 1)``, with ``mean_ctx`` the per-sequence context.

    Used for the "total decode tokens / (instances x capacity)" makespan bound. If per-iteration
    time grows sub-linearly in ``n`` (t(n)/n non-increasing, true for the roofline: a max of
    affine functions of n with non-negative intercepts), the max is at ``n = max_num_seqs``; a
    profiled model with ``c3 > 0`` can violate that, so the max is taken over every n
    (``max_num_seqs`` cheap calls, off the hot path).

    Why it bounds: every iteration with ``n`` sequences and summed context ``n*c`` produces ``n``
    tokens in at least ``n / R(c)`` seconds where ``R(c)`` is this function's value at ``c``. For
    both models per-token time at batch n is convex in the per-sequence context ``c`` and the best
    batch size does not depend on ``c``, so by Jensen the bound holds with ``mean_ctx`` equal to
    the token-weighted mean context over all decode iterations (for a schedule-independent bound
    use a lower bound on it, e.g. the mean prompt length; ``mean_ctx = 0`` is always safe).
    Ignores prefill and per-instance KV limits (both only add time).
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    best = 0.0
    for n in range(1, int(max_num_seqs) + 1):
        rate = n / cost.decode_time(n, n * mean_ctx, 1)
        if rate > best:
            best = rate
    return best
