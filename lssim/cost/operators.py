"""A GPU cost model built from measured kernel times: an iteration is the SUM of its kernels.

The roofline prices an iteration as ``max(memory, compute) + overhead`` over the whole model. On an H100 that
is optimistic where it matters (lssim/profiles/README.md; issue 16): kernels run one after another, so their
times add; every kernel has a fixed cost (launch, tail) that a 28-layer model pays about 200 times per
iteration; a weight-streaming GEMM reaches less than datasheet bandwidth and a GEMM over a few hundred rows
far less than its peak FLOP/s. Here one forward pass is priced kernel by kernel, as Vidur's execution-time
predictor composes a batch (vidur/entities/execution_time.py at microsoft/vidur 7d47513: the per-layer
operations summed, times the layers), but with a fitted curve per kind of kernel instead of a table per model:

* GEMM of ``rows`` tokens through a ``K x N`` weight:
  ``launch + max(bytes / bandwidth, 2 K N (ceil(rows / tile) * tile + ramp) / flops)``: a streaming read of
  the weight and activations, or the FLOPs with the rows padded to the kernel's tile and a ramp that stands
  for the lower efficiency of short GEMMs (at ``ramp`` rows a GEMM runs at half its large-batch FLOP/s).
* element-wise kernels (norms, rotary embedding, KV-cache write, activation, residual add, embedding
  gather): ``launch + tokens * bytes_per_token / bandwidth``.
* decode attention per layer: ``launch + context_tokens * kv_bytes_per_token / bandwidth`` (it reads the KV);
  causal prefill attention per layer: ``launch + 2 heads head_dim sum(prompt_len^2) / flops``.
* LM head (a GEMM over the batch's last tokens) and sampling: ``launch + rows * vocab * 16 / bandwidth``
  (fp32 logits written, softmax, exponential noise and argmax read them), and a fixed time per forward pass.

The coefficients of one GPU and software stack are a :class:`KernelProfile`, fitted to measurements by
:mod:`lssim.cost.operator_fit` (the H100 one ships in ``lssim/cost/data``; ``python -m
lssim.benchmarks.gpu_cost_model`` prints its error on every held-out point).

A decode iteration of ``n`` sequences with summed context ``ctx`` costs ``A(n) + B * ctx``: every kernel but
attention depends on ``n`` only, and attention is linear in the context. Within a span ``n`` is constant and
``ctx`` grows by ``n`` per iteration, so spans are summed and inverted in closed form, exactly as for
:class:`~lssim.cost.profiled.ProfiledCostModel`; ``A(n)`` is computed once per batch size and kept.
Tensor parallelism divides the heads, the MLP width and the vocabulary between GPUs; its all-reduces are
not modelled (as in the roofline).
"""

from __future__ import annotations

import functools
import json
import numbers
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from lssim.cost.catalog import MODELS, SHAPES, DecoderShape, ModelSpec, lookup_spec
from lssim.loop.cost_contracts import CostModel
from lssim.cost.protocol import INF, ramp_count, settle_iterations, no_time_to_run

__all__ = ["KernelProfile", "LayerKernels", "GemmTable", "load_gemm_table", "decoder_kernels", "gemm_seconds", "elementwise_seconds",
           "OperatorCostModel", "KERNEL_PROFILES", "load_kernel_profile"]

DATA_DIR = Path(__file__).with_name("data")
# Fitted profiles shipped with lssim, by hardware key (lssim.cost.HARDWARE).
KERNEL_PROFILES: dict[str, Path] = {"H100": DATA_DIR / "h100_kernels.json"}
# GEMMs measured on that hardware (lssim.cost.gpu_gemm_sweep), and the profile fitted around them.
GEMM_TABLES: dict[str, Path] = {"H100": DATA_DIR.parents[1] / "profiles" / "h100_gemm_sweep.csv"}
GEMM_TABLE_PROFILES: dict[str, Path] = {"H100": DATA_DIR / "h100_kernels_gemms.json"}
SAMPLING_BYTES_PER_LOGIT = 16  # fp32 logits written, read by softmax, noise written and read, argmax


@dataclass(frozen=True)
class KernelProfile:
    """The fitted coefficients of one GPU and software stack (seconds, bytes/s, FLOP/s)."""

    name: str
    gemm_launch_s: float
    gemm_bandwidth: float
    gemm_flops: float
    gemm_ramp_rows: float
    elementwise_launch_s: float
    elementwise_bandwidth: float
    attention_launch_s: float
    attention_bandwidth: float
    attention_flops: float
    sampling_launch_s: float
    sampling_bandwidth: float
    forward_s: float  # once per forward pass: graph launch, input copies
    gemm_tile_rows: int = 64  # not fitted: rows are padded to a multiple of this for the FLOP term
    source: str = ""  # how it was measured and fitted

    def __post_init__(self) -> None:
        for f in fitted_fields():
            value = getattr(self, f)
            positive = f.endswith(("bandwidth", "flops"))
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 <= value < INF) \
                    or (positive and value <= 0):
                raise ValueError(f"KernelProfile.{f} must be {'> 0' if positive else '>= 0'} and finite, got {value!r}")
        if isinstance(self.gemm_tile_rows, bool) or not isinstance(self.gemm_tile_rows, int) or self.gemm_tile_rows < 1:
            raise ValueError(f"KernelProfile.gemm_tile_rows must be an int >= 1, got {self.gemm_tile_rows!r}")

    def to_json(self, path) -> None:
        Path(path).write_text(json.dumps({"kind": "KernelProfile", **asdict(self)}, indent=2) + "\n")

    @classmethod
    def from_json(cls, path) -> "KernelProfile":
        """Read a profile written by :meth:`to_json`; ValueError naming the file and key when it is bad."""
        try:
            payload = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(f"kernel profile {path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(payload, dict) or payload.pop("kind", None) != "KernelProfile":
            raise ValueError(f"{path}: not a KernelProfile file (missing kind='KernelProfile')")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise ValueError(f"{path}: unknown key(s) {unknown}")
        try:
            return cls(**payload)
        except TypeError as exc:
            raise ValueError(f"{path}: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def fitted_fields() -> tuple[str, ...]:
    """The profile's fitted coefficients, in order (every numeric field but the tile)."""
    return tuple(f.name for f in fields(KernelProfile) if f.name not in ("name", "gemm_tile_rows", "source"))


@functools.lru_cache(maxsize=None)
def load_gemm_table(hardware: str) -> "GemmTable | None":
    """The measured GEMMs shipped for ``hardware``, or None (read once)."""
    path = GEMM_TABLES.get(hardware)
    return None if path is None else GemmTable(path, source=f"lssim/profiles/{path.name}")


def load_kernel_profile(hardware: str) -> KernelProfile:
    """The profile shipped for ``hardware`` (a key of KERNEL_PROFILES)."""
    if hardware not in KERNEL_PROFILES:
        raise ValueError(f"no measured kernel profile for hardware {hardware!r}; have: {sorted(KERNEL_PROFILES)}")
    return KernelProfile.from_json(KERNEL_PROFILES[hardware])


# ----------------------------------------------------------------------------------------------
# The kernels of a forward pass
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerKernels:
    """What one GPU runs for a decoder, with the shapes that price it. Kernel names follow Vidur's
    operation names (``attn_pre_proj`` is the fused QKV projection, ``mlp_up_proj`` the fused gate/up)."""

    n_layers: int
    gemms: tuple[tuple[str, int, int], ...]  # per layer: (name, K, N) of a rows x K @ K x N product
    elementwise: tuple[tuple[str, int], ...]  # per layer: (name, bytes moved per token)
    pass_elementwise: tuple[tuple[str, int], ...]  # once per pass: embedding gather, final norm
    kv_bytes_per_token: int  # per layer: K and V bytes decode attention reads per context token
    attention_flops_per_token_sq: int  # per layer: causal prefill attention FLOPs per prompt_len^2
    hidden: int
    vocab: int  # LM head columns on this GPU


def decoder_kernels(model: ModelSpec | str, shape: DecoderShape | None = None, tp: int = 1) -> LayerKernels:
    """The kernels of ``model`` on one of ``tp`` GPUs: heads, MLP width and vocabulary split between them
    (KV heads replicated when ``tp`` exceeds them, as vLLM does)."""
    spec = lookup_spec(model, MODELS, "model")
    if shape is None:
        if spec.name not in SHAPES:
            raise ValueError(f"no DecoderShape for model {spec.name!r}; pass shape= (known: {sorted(SHAPES)})")
        shape = SHAPES[spec.name]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or spec.n_heads % tp or shape.intermediate % tp:
        raise ValueError(f"tp must be an int >= 1 dividing n_heads ({spec.n_heads}) and intermediate "
                         f"({shape.intermediate}), got {tp!r}")
    b, h, d = spec.dtype_bytes, spec.hidden, spec.head_dim
    q, kv = spec.n_heads // tp * d, -(-spec.n_kv_heads // tp) * d
    inter = shape.intermediate // tp
    gemms = (("attn_pre_proj", h, q + 2 * kv), ("attn_post_proj", q, h),
             ("mlp_up_proj", h, 2 * inter), ("mlp_down_proj", inter, h))
    elementwise = (("input_layernorm", 2 * h * b), ("attn_rope", 2 * (q + kv) * b), ("kv_write", 4 * kv * b),
                   ("post_attention_layernorm", 2 * h * b), ("mlp_act", 3 * inter * b), ("add", 3 * h * b))
    return LayerKernels(spec.n_layers, gemms, elementwise, (("embedding", 2 * h * b), ("final_norm", 2 * h * b)),
                        2 * kv * b, 2 * q, h, -(-shape.vocab // tp))


def gemm_seconds(p: KernelProfile, rows, k, n):
    """One GEMM of ``rows`` tokens through a ``k x n`` bf16 weight (numbers or numpy arrays)."""
    padded = -(-rows // p.gemm_tile_rows) * p.gemm_tile_rows
    memory = 2.0 * (k * n + rows * (k + n)) / p.gemm_bandwidth
    compute = 2.0 * k * n * (padded + p.gemm_ramp_rows) / p.gemm_flops
    return p.gemm_launch_s + np.maximum(memory, compute)


def elementwise_seconds(p: KernelProfile, tokens, bytes_per_token):
    """One element-wise kernel over ``tokens`` tokens moving ``bytes_per_token`` each."""
    return p.elementwise_launch_s + tokens * bytes_per_token / p.elementwise_bandwidth


class GemmTable:
    """Measured GEMM times, one curve per ``K x N`` product over the token count (lssim.cost.gpu_gemm_sweep's file:
    columns k, n, tokens, seconds). A product measured here is priced by linear interpolation between the two
    nearest measured token counts, and beyond the last one at its time per token (a GEMM that large is
    compute-bound); a product not measured falls back to the profile's fitted curve. This is Vidur's approach (a
    table per model and GPU) inside the kernel sum: the kernel library's steps in the token count (cuBLAS picks a
    kernel per shape) are in the table, exact at every measured count, where a smooth curve cannot follow them."""

    def __init__(self, table, source: str = "") -> None:
        import pandas as pd

        frame = table if isinstance(table, pd.DataFrame) else pd.read_csv(table)
        missing = [c for c in ("k", "n", "tokens", "seconds") if c not in frame.columns]
        if missing:
            raise ValueError(f"{source or table}: GEMM table without column(s) {missing}")
        bad = frame[~(frame["seconds"] > 0) | ~(frame["tokens"] >= 1)]
        if len(bad):
            r = bad.index[0]
            raise ValueError(f"{source or table}: row {r} has tokens {frame.at[r, 'tokens']} and seconds "
                             f"{frame.at[r, 'seconds']} (need tokens >= 1, seconds > 0)")
        self.source = str(source or (Path(table).name if not isinstance(table, pd.DataFrame) else "a DataFrame"))
        self.frame = frame
        mean = frame.groupby(["k", "n", "tokens"], as_index=False)["seconds"].median()
        # The curves are kept as measured, not forced monotone: cuBLAS's choice of kernel makes some counts slower
        # than larger ones (the H100 sweep has 34 such spikes of 30-90%, e.g. 3584 x 37888 at 448 tokens), and an
        # envelope over them would lift every count after a spike or erase the steps.
        self._curves = {(int(k), int(n)): (g["tokens"].to_numpy(float), g["seconds"].to_numpy(float))
                        for (k, n), g in mean.sort_values("tokens").groupby(["k", "n"])}

    def __contains__(self, product) -> bool:
        return tuple(int(x) for x in product) in self._curves

    def products(self) -> list[tuple[int, int]]:
        return sorted(self._curves)

    def seconds(self, p: KernelProfile, rows, k: int, n: int):
        """One GEMM of ``rows`` tokens (a number or an array) through a ``k x n`` weight."""
        curve = self._curves.get((int(k), int(n)))
        if curve is None:
            return gemm_seconds(p, rows, k, n)
        counts, times = curve
        rows = np.asarray(rows, dtype=float)
        inside = np.interp(rows, counts, times)
        beyond = times[-1] * rows / counts[-1]
        out = np.where(rows > counts[-1], beyond, inside)
        return float(out) if out.ndim == 0 else out

    def __repr__(self) -> str:
        return f"GemmTable({len(self._curves)} products, {self.source})"


def _gemm(p: KernelProfile, gemms: "GemmTable | None", rows, k, n):
    """One GEMM: from the measured table where there is one (it falls back to the curve itself), else the curve."""
    return gemm_seconds(p, rows, k, n) if gemms is None else gemms.seconds(p, rows, k, n)


def layer_seconds(p: KernelProfile, kernels: LayerKernels, tokens, gemms: GemmTable | None = None) -> dict:
    """One layer's GEMMs and element-wise kernels over ``tokens`` tokens (attention apart), by kind; GEMMs from
    ``gemms`` where it measured them."""
    gemm = sum(_gemm(p, gemms, tokens, k, n) for _, k, n in kernels.gemms)
    elementwise = sum(elementwise_seconds(p, tokens, b) for _, b in kernels.elementwise)
    return {"gemm": gemm, "elementwise": elementwise}


def head_seconds(p: KernelProfile, kernels: LayerKernels, rows, tokens, gemms: GemmTable | None = None) -> dict:
    """What a forward pass runs once: embedding gather and final norm over ``tokens`` tokens, the LM head and
    sampling over ``rows`` (the tokens that are sampled), the fixed per-pass time."""
    return {"lm_head": _gemm(p, gemms, rows, kernels.hidden, kernels.vocab),
            "sampling": p.sampling_launch_s + rows * kernels.vocab * SAMPLING_BYTES_PER_LOGIT / p.sampling_bandwidth,
            "pass_elementwise": sum(elementwise_seconds(p, tokens, b) for _, b in kernels.pass_elementwise),
            "forward": p.forward_s}


# ----------------------------------------------------------------------------------------------
# The cost model
# ----------------------------------------------------------------------------------------------


class OperatorCostModel(CostModel):
    """The CostModel of a decoder on a GPU whose kernels were measured (module docstring).

    ``profile``: a KernelProfile, or a hardware key whose fitted profile ships with lssim (``"H100"``).
    ``iteration_overhead_s``: engine CPU time per decode iteration that the GPU does not hide (scheduling,
    input preparation); 0 by default, because the profile measured GPU time only (CUDA graphs).
    ``gemms``: a :class:`GemmTable` (or its CSV file) of GEMMs measured on the same GPU and stack; the products it
    holds are priced from it, the rest by the profile's curve. Use it with a profile fitted with the same table
    (``lssim.cost.operator_fit.fit_profile(points, gemms=...)``), so the other kernels' coefficients match; a
    hardware key (``gemms="H100"``) names the table shipped for it (GEMM_TABLES), and with the same key as the
    profile (``OperatorCostModel(model, "H100", gemms="H100")``) the profile shipped fitted around it
    (GEMM_TABLE_PROFILES). Not the default, and not for
    the simulator: the table follows cuBLAS's steps and spikes, so its times are neither monotone in the batch
    nor subadditive in the prefill, which the CostModel protocol and the lower bound rely on; it is the
    predictor to read one iteration's time with.

    ``prefill_time(tokens)`` is one forward pass over ``tokens`` prompt tokens without the quadratic part of
    causal attention (the tokens may be several prompts; it cannot know their lengths); it is a sum of
    maxima of affine functions with non-negative intercepts, hence subadditive, as the protocol needs.
    ``prompt_prefill_time(prompt_lens)`` prices the prompts' attention too.
    """

    def __init__(self, model: ModelSpec | str, profile: KernelProfile | str = "H100", tp: int = 1, *,
                 shape: DecoderShape | None = None, iteration_overhead_s: float = 0.0,
                 gemms: GemmTable | str | Path | None = None) -> None:
        self.model = lookup_spec(model, MODELS, "model")
        if isinstance(gemms, str) and gemms in GEMM_TABLES:  # a hardware key: the GEMMs measured on it
            if isinstance(profile, str) and profile == gemms:  # ... with the profile fitted around them
                profile = KernelProfile.from_json(GEMM_TABLE_PROFILES[gemms])
            gemms = load_gemm_table(gemms)
        self.gemms = gemms if gemms is None or isinstance(gemms, GemmTable) else GemmTable(gemms)
        self.profile = load_kernel_profile(profile) if isinstance(profile, str) else profile
        if not isinstance(self.profile, KernelProfile):
            raise ValueError(f"profile must be a KernelProfile or a hardware key, got {type(profile).__name__}")
        if not 0 <= iteration_overhead_s < INF:
            raise ValueError(f"iteration_overhead_s must be >= 0 and finite, got {iteration_overhead_s}")
        self.kernels = decoder_kernels(self.model, shape, tp)
        self.tp = tp
        self.iteration_overhead_s = float(iteration_overhead_s)
        self.name = f"operators[{self.model.name or 'model'}@{self.profile.name}x{tp}{'' if self.gemms is None else '+gemm table'}]"
        p, kern = self.profile, self.kernels
        # decode: t(n, ctx) = A(n) + B*ctx ; A(n) cached per batch size
        self._b = kern.n_layers * kern.kv_bytes_per_token / p.attention_bandwidth
        self._a: dict[int, float] = {}
        self._per_token_floor: dict[int, float] = {}

    # -- decode --------------------------------------------------------------------------------

    def _decode_fixed(self, n_seqs: int) -> float:
        """A(n): the part of a decode iteration of n sequences that does not grow with their context."""
        p, kern = self.profile, self.kernels
        layer = layer_seconds(p, kern, n_seqs, self.gemms)
        per_layer = layer["gemm"] + layer["elementwise"] + p.attention_launch_s
        a = float(kern.n_layers * per_layer + sum(head_seconds(p, kern, n_seqs, n_seqs, self.gemms).values())) + self.iteration_overhead_s
        self._a[n_seqs] = a
        return a

    def decode_time(self, n_seqs: int, ctx_tokens: float, n_iters: int) -> float:
        if n_iters <= 0 or n_seqs <= 0:
            return 0.0
        a = self._a.get(n_seqs)
        if a is None:
            a = self._decode_fixed(n_seqs)
        b = self._b
        return n_iters * (a + b * ctx_tokens + b * n_seqs * (n_iters - 1) * 0.5)

    def iterations_within(self, n_seqs: int, ctx_tokens: float, seconds: float) -> int:
        if no_time_to_run(n_seqs, seconds):
            return 0
        a = self._a.get(n_seqs)
        if a is None:
            a = self._decode_fixed(n_seqs)
        k = int(ramp_count(a + self._b * ctx_tokens, self._b * n_seqs, seconds))
        return settle_iterations(self.decode_time, n_seqs, ctx_tokens, seconds, k)

    def work_time(self, tokens: float, context_reads: float, max_num_seqs: int) -> float:
        # Iterations with n_i sequences cost sum A(n_i) + B * context_reads, and sum A(n_i) = sum n_i * A(n_i)/n_i
        # >= tokens * min over n <= max_num_seqs of A(n)/n, whatever the schedule.
        if tokens <= 0:
            return 0.0
        floor = self._per_token_floor.get(max_num_seqs)
        if floor is None:
            floor = min(self.decode_time(n, 0.0, 1) / n for n in range(1, int(max_num_seqs) + 1))
            self._per_token_floor[max_num_seqs] = floor
        return tokens * floor + self._b * context_reads

    def departure_time(self, n_leaving: int) -> float:
        return 0.0  # not measured on a GPU; a GPU engine's batch bookkeeping overlaps the previous iteration

    # -- prefill -------------------------------------------------------------------------------

    def prefill_time(self, n_tokens: int) -> float:
        if n_tokens <= 0:
            return 0.0
        return self._prefill(n_tokens, rows=1, attention_flops=0.0)

    def prompt_prefill_time(self, prompt_lens) -> float:
        """One forward pass over these prompts, with their causal attention (quadratic in each length) and the
        LM head and sampling on each prompt's last token."""
        lens = [int(x) for x in prompt_lens if int(x) > 0]
        if not lens:
            return 0.0
        flops = self.kernels.attention_flops_per_token_sq * float(sum(x * x for x in lens))
        return self._prefill(sum(lens), rows=len(lens), attention_flops=flops)

    def _prefill(self, tokens: int, rows: int, attention_flops: float) -> float:
        p, kern = self.profile, self.kernels
        layer = layer_seconds(p, kern, tokens, self.gemms)
        attention = p.attention_launch_s + attention_flops / p.attention_flops
        per_layer = layer["gemm"] + layer["elementwise"] + attention
        return float(kern.n_layers * per_layer + sum(head_seconds(p, kern, rows, tokens, self.gemms).values()))

    # -- reports -------------------------------------------------------------------------------

    def iteration_breakdown(self, n_seqs: int, ctx_tokens: float) -> dict:
        """Seconds of one decode iteration by kind of kernel (they add up to ``decode_time(n, ctx, 1)``)."""
        p, kern = self.profile, self.kernels
        layer = layer_seconds(p, kern, n_seqs, self.gemms)
        head = head_seconds(p, kern, n_seqs, n_seqs, self.gemms)
        parts = {"gemm_s": kern.n_layers * layer["gemm"], "elementwise_s": kern.n_layers * layer["elementwise"],
                 "attention_s": kern.n_layers * p.attention_launch_s + self._b * ctx_tokens,
                 "lm_head_s": head["lm_head"], "sampling_s": head["sampling"],
                 "pass_s": head["pass_elementwise"] + head["forward"] + self.iteration_overhead_s}
        parts = {k: float(v) for k, v in parts.items()}
        parts["total_s"] = sum(parts.values())
        return parts

    def describe(self) -> dict:
        return {"kind": "operators", "name": self.name, "model": asdict(self.model), "tp": self.tp,
                "kernels": asdict(self.kernels), "profile": asdict(self.profile),
                "gemm_table": None if self.gemms is None else self.gemms.source,
                "iteration_overhead_s": self.iteration_overhead_s}

    def __repr__(self) -> str:
        return f"OperatorCostModel({self.name})"

