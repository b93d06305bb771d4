"""The analytic roofline cost model: per-iteration time = max(memory, compute) + a fixed overhead."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from lssim.cost.catalog import HARDWARE, MODELS, Hardware, ModelSpec, lookup_spec
from lssim.loop.cost_contracts import CostModel
from lssim.cost.protocol import INF, ramp_count, settle_iterations, no_time_to_run

__all__ = ["RooflineCostModel"]


class RooflineCostModel(CostModel):
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
        self.model = model = lookup_spec(model, MODELS, "model")
        self.hardware = hw = lookup_spec(hardware, HARDWARE, "hardware")
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be an int >= 1, got {tp!r}")
        for label, value in (("bandwidth_efficiency", bandwidth_efficiency), ("mfu", mfu), ("prefill_mfu", prefill_mfu)):
            if not 0 < value <= 1:
                raise ValueError(f"{label} must be in (0, 1], got {value}")
        if not 0 <= iteration_overhead_s < INF:
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
        if no_time_to_run(n_seqs, seconds):
            return 0  # every iteration takes > 0 s (the weight read)
        v0, s0, v1, s1 = self._sides(n_seqs, ctx_tokens)
        ov = self._ov
        est = ramp_count(v0 + ov, s0, seconds)
        if s1 > s0:
            j = int((v0 - v1) / (s1 - s0)) + 1
            if est > j:
                rest = seconds - j * (v0 + s0 * (j - 1) * 0.5 + ov)
                est = j + ramp_count(v1 + s1 * j + ov, s1, max(rest, 0.0))
        return settle_iterations(self.decode_time, n_seqs, ctx_tokens, seconds, int(est))

    def prefill_time(self, n_tokens: int) -> float:
        if n_tokens <= 0:
            return 0.0
        return self._pf_a * n_tokens + self._pf_w

    def departure_time(self, n_leaving: int) -> float:
        return 0.0  # a GPU engine's scheduler work overlaps the previous iteration; its overhead is in `_ov`

    # -- the same over arrays (the simulator's batch route prices a step's spans at once) -----------
    # Each is its scalar twin's operations in the same order, so equal to it to the last bit
    # (tests/test_fastpath.py checks decode_times; the batch route's frames check the rest). A subclass that
    # changes a scalar form changes its array form too.

    def decode_times(self, n_seqs: np.ndarray, ctx_tokens: np.ndarray, n_iters: np.ndarray) -> np.ndarray:
        from lssim.cost.roofline_arrays import decode_times  # numba, loaded on the first batch-route step

        return decode_times(n_seqs, ctx_tokens, n_iters, self._mem_a, self._mem_b, self._cmp_a, self._cmp_b, self._ov)

    def kernel_coefficients(self) -> np.ndarray:
        """(mem_a, mem_b, cmp_a, cmp_b, ov, pf_a, pf_w): what a kernel that prices spans as it schedules them needs
        (lssim.cost.roofline_arrays.decode_time_at, iterations_within_at; prefill pf_a * tokens + pf_w)."""
        return np.array([self._mem_a, self._mem_b, self._cmp_a, self._cmp_b, self._ov, self._pf_a, self._pf_w])

    def prefill_times(self, n_tokens: np.ndarray) -> np.ndarray:
        return np.where(n_tokens > 0, self._pf_a * n_tokens + self._pf_w, 0.0)

    def departure_times(self, n_leaving: np.ndarray) -> np.ndarray:
        return np.zeros(len(n_leaving))

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

