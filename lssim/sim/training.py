"""The training phase of an RL step, as a cost model: seconds per phase for the sequences one step trains.

    from lssim.sim.training import AnalyticTrainCost, ProfiledTrainCost
    cost = AnalyticTrainCost("qwen2.5-7b", "H100")
    p = cost.phases(seq_lens, prompt_lens, n_devices=8, collocated=True)   # a TrainPhases
    p.logprob, p.reference, p.update, p.sync, p.switch, p.total

One step, as verl runs it (verl b178a3cd, 2026-01-29: verl/trainer/ppo/ray_trainer.py, verl/workers/fsdp_workers.py,
verl/workers/actor/dp_actor.py):

* ``logprob``: the old policy's log-probs recomputed, one forward pass over every prompt+response token
  (``compute_log_prob``);
* ``reference``: the same forward on the frozen reference model, when a KL term needs it (GRPO here has none);
* ``update``: forward + backward over each mini-batch's micro-batches, one optimizer step per mini-batch
  (``update_policy``). With ``use_dynamic_bsz`` verl packs sequences without padding: a mini-batch becomes
  ``min(n_seqs, ceil(tokens / ppo_max_token_len_per_gpu))`` micro-batches balanced by a workload estimate
  (verl/utils/seqlen_balancing.py ``rearrange_micro_batches``, Karmarkar-Karp over ``calculate_workload``), and
  ``_balance_batch`` first spreads the batch over the data-parallel ranks the same way;
* ``sync``: the new weights pushed into the rollout engines (CUDA IPC when collocated, NCCL broadcast otherwise);
* ``switch``: collocated only, the context switch between rollout and training: the engine sleeps and wakes
  (vLLM sleep level 2 discards its weights and KV cache, nothing is copied) and, where the training state does
  not fit beside the rollout's memory, the FSDP parameters and optimizer state go to host memory and back
  (``offload_fsdp_model_to_cpu`` / ``offload_fsdp_optimizer`` around each phase).

Two calibrations: :class:`AnalyticTrainCost` for GPU clusters (FLOPs at a stated MFU, bytes over stated
bandwidths, every constant with its source in ``describe()``) and :class:`ProfiledTrainCost`, fitted on this
machine by ``python -m real_backend.profile_trainer`` (lssim/sim/train_profiled.py). :class:`TrainTimeModel` in
lssim/sim/trainer.py, the old linear placeholder, speaks the same protocol. docs/training.md says what is modelled.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from lssim.cost import HARDWARE, MODELS
from lssim.loop.cost_contracts import TrainCostModel
from lssim.sim.train_batches import (StreamedUpdate, TrainPhases, check_devices, check_lengths, pack_padded,
                                     padded_shapes, read_train_cost_file)
from lssim.sim.train_profiled import ProfiledTrainCost

__all__ = ["TrainPhases", "TrainCostModel", "AnalyticTrainCost", "ProfiledTrainCost", "ScaledTrainCost", "TrainCostAtLevel", "Links", "LINKS",
           "ANALYTIC_SOURCES", "pack_padded", "padded_shapes", "packed_micro_batches", "check_lengths",
           "load_train_cost"]

def _split_bounds(n: int, k: int) -> list[int]:
    """Where np.array_split cuts n items into k parts (the first n % k one longer), as k + 1 offsets."""
    q, r = divmod(n, k)
    return [i * q + min(i, r) for i in range(k + 1)]


# ----------------------------------------------------------------------------------------------
# Packing rules
# ----------------------------------------------------------------------------------------------


def packed_micro_batches(n_seqs: int, tokens: int, longest: int, max_token_len: int) -> int:
    """How many micro-batches verl's ``rearrange_micro_batches`` makes of ``n_seqs`` sequences holding ``tokens``
    tokens: ``min(n_seqs, ceil(tokens / max_token_len))``. verl asserts max_token_len >= the longest sequence;
    here a longer sequence raises the limit to its own length instead."""
    if n_seqs <= 0:
        return 0
    return min(n_seqs, -(-tokens // max(max_token_len, longest)))


# ----------------------------------------------------------------------------------------------
# Analytic model for GPU clusters
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Links:
    """Per-GPU link bandwidths, bytes/s per direction."""

    nvlink: float  # GPU to GPU inside a node
    network: float  # GPU to GPU across nodes (the GPU's own NIC)
    pcie: float  # GPU to host memory


LINKS: dict[str, Links] = {
    # H100 SXM datasheet: NVLink 900 GB/s, PCIe Gen5 128 GB/s (both bidirectional: 450 / 64 per direction).
    # DGX H100: one ConnectX-7 400 Gb/s NIC per GPU (50 GB/s).
    "H100": Links(450e9, 50e9, 64e9),
    # H200 SXM datasheet: NVLink 900 GB/s, PCIe Gen5 128 GB/s; same NICs as DGX H100 (DGX H200).
    "H200": Links(450e9, 50e9, 64e9),
    # A100 SXM datasheet: NVLink 600 GB/s, PCIe Gen4 64 GB/s (bidirectional); DGX A100: ConnectX-6 200 Gb/s per GPU.
    "A100": Links(300e9, 25e9, 32e9),
}

ANALYTIC_SOURCES = {
    "mfu": "model FLOPs utilisation of the actor's forward/backward, counted as verl counts it (verl/utils/flops_counter.py: "
           "6 x dense params x tokens + 6 x sum(seqlen^2) x head_dim x heads x layers; recompute from gradient checkpointing "
           "is inside the MFU, not the FLOPs). verl docs/perf/dpsk.md reports actor MFU 0.40/0.37/0.31 on 8/16/32 GPUs "
           "(Qwen3-30B-A3B, Megatron) and 0.19 for DeepSeek-671B; FSDP pretraining of 7B models on H100 reaches ~0.46 "
           "(foundation-model-stack/fms-fsdp README, issue #89). 0.35: mid-range for RL's variable-length batches",
    "packing": "verl actor.use_dynamic_bsz with model.use_remove_padding (sequence packing: no padding FLOPs); "
               "False: micro-batches of micro_batch_size_per_gpu sequences padded to the batch's longest",
    "max_token_len_per_gpu": "verl trainer/config/actor/actor.yaml ppo_max_token_len_per_gpu default 16384",
    "logprob_max_token_len_per_gpu": "verl trainer/config/rollout/rollout.yaml log_prob_max_token_len_per_gpu "
                                     "(defaults to ppo_max_token_len_per_gpu, 16384)",
    "micro_batch_size_per_gpu": "verl examples/grpo_trainer/run_qwen2-7b.sh ppo_micro_batch_size_per_gpu=40 (used without packing)",
    "mini_batches": "verl examples/grpo_trainer/run_qwen2-7b.sh: train_batch_size 1024 / ppo_mini_batch_size 256 = 4 "
                    "optimizer steps per RL step (ppo_epochs 1)",
    "reference": "a reference-model forward for a KL term (verl use_kl_loss); the project's GRPO has no KL term: off",
    "ref_param_offload": "verl examples/grpo_trainer/run_qwen2-7b.sh ref.fsdp_config.param_offload=True: the reference "
                         "model's bf16 weights stream from host memory for every micro-batch's forward",
    "param_offload": "verl actor.fsdp_config.param_offload; None: on when the training state (16 bytes/param: fp32 "
                     "params, grads, Adam m and v, verl keeps the actor in fp32, fsdp_workers.py) per device does not "
                     "fit in the memory the rollout leaves (1 - rollout_memory_fraction)",
    "optimizer_offload": "verl actor.fsdp_config.optimizer_offload; None: decided as param_offload",
    "rollout_memory_fraction": "verl trainer/config/rollout/rollout.yaml gpu_memory_utilization default 0.5",
    "gpus_per_node": "8 GPUs per node (DGX/HGX H100, H200, A100)",
    "link_efficiency": "assumption: NCCL collectives reach ~80% of the link's per-direction peak",
    "host_copy_efficiency": "assumption: host<->device copies of pageable memory (verl offloads with non_blocking "
                            "copies, FSDP1 without pinned memory) reach ~half of PCIe peak",
    "colocated_sync_bytes_per_s": "vllm-project/vime issue #175: slime's collocated CUDA-IPC weight sync of "
                                  "Qwen3-30B-A3B (~61 GB bf16) takes ~20 s on H200: ~3 GB/s effective (per-tensor "
                                  "gathers and loads, far under link speed; dense models with fewer tensors do better)",
    "disaggregated_sync_bytes_per_s": "verl verl/checkpoint_engine/README.md benchmark: NCCL broadcast of "
                                      "Qwen3-30B-A3B to 30 rollout replicas, 4x8 H100 with ConnectX-7 400 Gb/s: ~7 s, "
                                      "8.25 GB/s (verl PR #7324 measured 1.5 GB/s for an 8B full broadcast: a range)",
    "sync_fixed_s": "assumption: pausing the engines, resetting the prefix cache and the RPCs around a sync",
    "engine_sleep_wake_s": "assumption: vLLM sleep(level=2) and wake_up (verl vllm_async_server.py, HYBRID mode): "
                           "frees and re-allocates weights and KV cache, no bytes copied",
    "phase_overhead_s": "assumption: Ray dispatch and DataProto transfer per worker call (compute_log_prob, update_actor)",
    "micro_batch_overhead_s": "assumption: kernel launches and Python per micro-batch",
    "optimizer_bytes_per_param": "AdamW in fp32 reads param, grad, m, v and writes param, m, v: 7 x 4 bytes per "
                                 "parameter, memory-bound at 85% of HBM bandwidth (lssim.cost RooflineCostModel's "
                                 "bandwidth_efficiency)",
}


@dataclass(frozen=True)
class AnalyticTrainCost(TrainCostModel):
    """Training-phase seconds on a GPU cluster from FLOPs and bytes (constants and sources: ANALYTIC_SOURCES).

    Compute: a sequence of ``s`` tokens costs ``2 x params x s + 2 x s^2 x heads x head_dim x layers`` FLOPs forward
    (verl's flops_counter: the attention term for a causal mask) and three times that forward + backward, at
    ``mfu`` of the devices' dense peak. Data parallelism spreads the sequences over the devices as verl's
    ``_balance_batch`` does; a device's work is the fluid share or the largest single sequence, whichever is more
    (the bound a Karmarkar-Karp partition approaches when every device holds several sequences). FSDP's all-gathers
    and reduce-scatter per micro-batch overlap the compute (``max``). Bytes: weights in bf16 for sync, fp32 state
    for offload."""

    model: str = "qwen2.5-7b"
    hardware: str = "H100"
    mfu: float = 0.35
    packing: bool = True
    max_token_len_per_gpu: int = 16384
    logprob_max_token_len_per_gpu: int = 16384
    micro_batch_size_per_gpu: int = 40
    mini_batches: int = 4
    reference: bool = False
    ref_param_offload: bool = True
    param_offload: bool | None = None
    optimizer_offload: bool | None = None
    rollout_memory_fraction: float = 0.5
    gpus_per_node: int = 8
    link_efficiency: float = 0.8
    host_copy_efficiency: float = 0.5
    colocated_sync_bytes_per_s: float = 3.0e9
    disaggregated_sync_bytes_per_s: float = 8.25e9
    sync_fixed_s: float = 0.5
    engine_sleep_wake_s: float = 1.0
    phase_overhead_s: float = 0.5
    micro_batch_overhead_s: float = 0.005
    optimizer_bytes_per_param: float = 28.0

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"AnalyticTrainCost: unknown model {self.model!r}; known: {', '.join(MODELS)}")
        if self.hardware not in HARDWARE or self.hardware not in LINKS:
            raise ValueError(f"AnalyticTrainCost: unknown hardware {self.hardware!r}; known: {', '.join(LINKS)}")
        for name in ("mfu", "rollout_memory_fraction", "link_efficiency", "host_copy_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"AnalyticTrainCost.{name} must be in (0, 1], got {getattr(self, name)!r}")
        for name in ("max_token_len_per_gpu", "logprob_max_token_len_per_gpu", "micro_batch_size_per_gpu", "mini_batches",
                     "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"AnalyticTrainCost.{name} must be an int >= 1, got {value!r}")
        for name in ("colocated_sync_bytes_per_s", "disaggregated_sync_bytes_per_s", "optimizer_bytes_per_param"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"AnalyticTrainCost.{name} must be > 0 and finite, got {getattr(self, name)!r}")
        for name in ("sync_fixed_s", "engine_sleep_wake_s", "phase_overhead_s", "micro_batch_overhead_s"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"AnalyticTrainCost.{name} must be >= 0 and finite, got {getattr(self, name)!r}")
        for name in ("packing", "reference", "ref_param_offload"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"AnalyticTrainCost.{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("param_offload", "optimizer_offload"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ValueError(f"AnalyticTrainCost.{name} must be a bool or None (decided by memory), got {getattr(self, name)!r}")

    # -- what the model and hardware give ----------------------------------------------------------

    @property
    def spec(self):
        return MODELS[self.model]

    @property
    def gpu(self):
        return HARDWARE[self.hardware]

    def _flops_per_second(self) -> float:
        return self.gpu.peak_flops * self.mfu

    def _collective_bytes_per_s(self, n: int) -> float:
        links = LINKS[self.hardware]
        return (links.nvlink if n <= self.gpus_per_node else links.network) * self.link_efficiency

    def _host_bytes_per_s(self) -> float:
        return LINKS[self.hardware].pcie * self.host_copy_efficiency

    def offloads(self, n_devices: int) -> tuple[bool, bool]:
        """(param_offload, optimizer_offload) as set, or as memory decides: offload when the fp32 training state
        per device (16 bytes/param) exceeds what the rollout leaves, (1 - rollout_memory_fraction) x memory."""
        fits = 16.0 * self.spec.params / n_devices <= (1.0 - self.rollout_memory_fraction) * self.gpu.memory_bytes
        params = (not fits) if self.param_offload is None else self.param_offload
        optimizer = (not fits) if self.optimizer_offload is None else self.optimizer_offload
        return params, optimizer

    # -- compute -------------------------------------------------------------------------------------

    def _flops(self, seq: np.ndarray) -> np.ndarray:
        """Each sequence's FLOPs for one forward pass (weights, and attention over its own tokens)."""
        m = self.spec
        s = seq.astype(float)
        return 2.0 * m.params * s + 2.0 * m.n_heads * m.head_dim * m.n_layers * s * s

    def _work(self, seq: np.ndarray, passes: float, flops: np.ndarray | None = None) -> tuple[float, float]:
        """(FLOPs of all, FLOPs of the largest) for ``passes`` forward-equivalents (1 forward, 3 forward+backward);
        ``flops``: `_flops(seq)` where the caller has it (packed sequences only: padding changes it)."""
        if not self.packing and len(seq):
            seq = np.full(len(seq), int(seq.max()), dtype=np.int64)  # padded to the longest
            flops = None
        per = passes * (self._flops(seq) if flops is None else flops)
        return float(per.sum()), float(per.max()) if len(per) else 0.0

    def _pass_seconds(self, seq: np.ndarray, n: int, *, backward: bool, max_token_len: int,
                      flops: np.ndarray | None = None) -> float:
        """Seconds for one pass (forward, or forward+backward) over ``seq`` on ``n`` data-parallel devices."""
        if not len(seq):
            return 0.0
        n_eff = min(n, len(seq))
        total, largest = self._work(seq, 3.0 if backward else 1.0, flops)
        compute = max(total / n_eff, largest) / self._flops_per_second()
        per_rank = -(-len(seq) // n_eff)
        if self.packing:
            tokens = max(-(-int(seq.sum()) // n_eff), int(seq.max()))
            micro = packed_micro_batches(per_rank, tokens, int(seq.max()), max_token_len)
        else:
            micro = -(-per_rank // self.micro_batch_size_per_gpu)
        # FSDP per micro-batch: all-gather bf16 weights for forward (and again for backward), reduce-scatter fp32 grads.
        gathered = (2.0 * 2 + 4.0) if backward else 2.0
        comm = gathered * self.spec.params * (n - 1) / n / self._collective_bytes_per_s(n) if n > 1 else 0.0
        return max(compute, micro * comm) + micro * self.micro_batch_overhead_s

    def micro_batch_seconds(self, seq_lens, n_devices: int = 1, *, forward_only: bool = False) -> float:
        seq, _ = check_lengths(seq_lens)
        n = check_devices(n_devices)
        if not len(seq):
            return 0.0
        big = max(int(seq.sum()), 1)  # one micro-batch, whatever the packing limit says
        return self._pass_seconds(seq, n, backward=not forward_only, max_token_len=big)

    def optimizer_step_seconds(self, n_devices: int = 1) -> float:
        n = check_devices(n_devices)
        hbm = self.gpu.bandwidth_bytes_per_s * 0.85
        return self.optimizer_bytes_per_param * self.spec.params / n / hbm

    # -- the step ------------------------------------------------------------------------------------

    def phases(self, seq_lens, prompt_lens, n_devices: int, *, collocated: bool) -> TrainPhases:
        seq, _ = check_lengths(seq_lens, prompt_lens)
        n = check_devices(n_devices)
        if not len(seq):
            return TrainPhases.zero()
        flops = self._flops(seq) if self.packing else None  # per sequence, once for every pass and mini-batch
        logprob = self.phase_overhead_s + self._pass_seconds(seq, n, backward=False,
                                                             max_token_len=self.logprob_max_token_len_per_gpu, flops=flops)
        reference = self._reference_seconds(seq, n, logprob)
        bounds = _split_bounds(len(seq), min(self.mini_batches, len(seq)))
        slices = [(seq[a:b], None if flops is None else flops[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        update = self.phase_overhead_s + sum(
            self._pass_seconds(s, n, backward=True, max_token_len=self.max_token_len_per_gpu, flops=f) for s, f in slices)
        update += len(slices) * self.optimizer_step_seconds(n)
        weight_bytes = 2.0 * self.spec.params  # bf16, as the rollout engines hold them
        rate = self.colocated_sync_bytes_per_s if collocated else self.disaggregated_sync_bytes_per_s
        sync = self.sync_fixed_s + weight_bytes / rate
        switch = self._switch_seconds(n) if collocated else 0.0
        return TrainPhases(logprob, reference, update, sync, switch)

    def _reference_seconds(self, seq: np.ndarray, n: int, logprob: float) -> float:
        """The reference model's forward over `seq`: the same pass as the log-prob one (`logprob` seconds), plus
        its parameters brought in from the host per micro-batch where they are offloaded; 0 without a reference."""
        if not self.reference:
            return 0.0
        if not self.ref_param_offload:
            return logprob
        micro = packed_micro_batches(-(-len(seq) // min(n, len(seq))), -(-int(seq.sum()) // min(n, len(seq))),
                                     int(seq.max()), self.logprob_max_token_len_per_gpu)
        return logprob + micro * 2.0 * self.spec.params / n / self._host_bytes_per_s()

    def streamed_update(self, pieces, n_devices: int = 1) -> StreamedUpdate:
        """A packing trainer (verl's dynamic batch size, RLinf's pipelined micro-batches) fills each micro-batch from
        whatever sequences have finished, not one group per micro-batch, so a piece costs its FLOPs' share of the whole
        step's passes (log-prob and reference forwards, forward + backward); the rest is the phases' fixed overheads
        and the optimizer steps."""
        n = check_devices(n_devices)
        seqs = [check_lengths(piece)[0] for piece in pieces]
        flops = np.array([float(self._flops(seq).sum()) if len(seq) else 0.0 for seq in seqs])
        every = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
        if not len(every) or flops.sum() <= 0:
            return StreamedUpdate(np.zeros(len(pieces)), np.zeros(len(pieces)), 0.0)
        whole = self.phases(every, np.zeros_like(every), n, collocated=False)
        phases = 3 if self.reference else 2  # log-prob, reference (its own phase), update: each pays its overhead once
        rest = phases * self.phase_overhead_s + min(self.mini_batches, len(every)) * self.optimizer_step_seconds(n)
        share = flops / flops.sum()
        forward = share * (whole.logprob + whole.reference - (phases - 1) * self.phase_overhead_s)
        update = share * (whole.update - self.phase_overhead_s - (rest - phases * self.phase_overhead_s))
        return StreamedUpdate(forward, update, rest)

    def _switch_seconds(self, n: int) -> float:
        """Collocated: the engine sleeps and wakes, and what is offloaded goes to the host and back, per verl's
        fsdp_workers.py: fp32 params out and in around compute_log_prob, update_actor and rollout_mode (3 round
        trips), the optimizer state around update_actor (1 round trip). Grads are freed (zero_grad sets them to
        None), the engine's KV cache and weights are discarded (sleep level 2): neither moves."""
        params, optimizer = self.offloads(n)
        moved = (6 * 4.0 * self.spec.params if params else 0.0) + (2 * 8.0 * self.spec.params if optimizer else 0.0)
        return self.engine_sleep_wake_s + moved / n / self._host_bytes_per_s()

    # -- persistence and reports ---------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"kind": "AnalyticTrainCost", **asdict(self)}

    @classmethod
    def from_dict(cls, payload: dict, source: str = "AnalyticTrainCost") -> "AnalyticTrainCost":
        if not isinstance(payload, dict) or payload.get("kind") != "AnalyticTrainCost":
            raise ValueError(f"{source}: not an AnalyticTrainCost (missing kind='AnalyticTrainCost')")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(payload) - known - {"kind"})
        if unknown:
            raise ValueError(f"{source}: unknown keys {unknown}; known: {sorted(known)}")
        try:
            return cls(**{k: v for k, v in payload.items() if k != "kind"})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None

    def describe(self) -> dict:
        constants = {name: {"value": getattr(self, name), "source": ANALYTIC_SOURCES[name]}
                     for name in (f.name for f in fields(self)) if name in ANALYTIC_SOURCES}
        return {
            "kind": "analytic",
            "model": asdict(self.spec),
            "hardware": asdict(self.gpu),
            "hardware_source": "lssim.cost.HARDWARE (datasheets)",
            "links_bytes_per_s": asdict(LINKS[self.hardware]),
            "links_source": "lssim.sim.training.LINKS (datasheets)",
            "constants": constants,
            "forms": {
                "forward_flops": "2 x params x s + 2 x s^2 x heads x head_dim x layers per sequence of s tokens",
                "update_flops": "3 x forward (backward = 2 x forward)",
                "per_device": "max(FLOPs / devices, largest sequence's FLOPs) / (peak x mfu), overlapped with FSDP "
                              "collectives per micro-batch, + overhead per micro-batch",
                "sync": "sync_fixed_s + 2 x params bytes / (colocated or disaggregated sync bandwidth)",
                "switch": "collocated: engine_sleep_wake_s + offloaded bytes (6 x 4 x params if param_offload, "
                          "2 x 8 x params if optimizer_offload) / devices / (PCIe x host_copy_efficiency)",
            },
        }


@dataclass(frozen=True)
class ScaledTrainCost(TrainCostModel):
    """Another TrainCostModel with its forward phases (log-prob, reference) and its update scaled by measured
    factors: what training-side token pruning saves (paper/experiments/measure_pruning.py measures them on the real
    trainer; docs/training.md says where the saving comes from). Sync and switch are unchanged."""

    base: TrainCostModel
    logprob_factor: float = 1.0
    update_factor: float = 1.0
    source: str = ""

    def __post_init__(self):
        if not isinstance(self.base, TrainCostModel):
            raise ValueError(f"ScaledTrainCost.base must be a TrainCostModel, got {self.base!r}")
        for name in ("logprob_factor", "update_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
                raise ValueError(f"ScaledTrainCost.{name} must be in (0, 1] (a saving), got {value!r}")

    @classmethod
    def from_measurement(cls, base: TrainCostModel, path, variant: str, basis: str = "time") -> "ScaledTrainCost":
        """The factors of ``variant`` (e.g. "entropy-compact") from a PruningMeasurement JSON. ``basis="time"``: the
        measured time ratios of the CPU trainer, which pads each micro-batch to its longest sequence (a factor above
        1, noise where nothing is saved, is taken as 1); ``basis="tokens"``: the share of tokens the forward passes
        still run over, what a packing trainer (verl's use_dynamic_bsz, AnalyticTrainCost) pays in linear FLOPs
        (its attention FLOPs fall at least as much: truncation cuts the longest parts)."""
        if basis not in ("time", "tokens"):
            raise ValueError(f"basis must be 'time' or 'tokens', got {basis!r}")
        try:
            payload = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(f"pruning measurement {path} does not exist (make one with "
                             f"`python -m paper.experiments.measure_pruning --out {path}`)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(payload, dict) or payload.get("kind") != "PruningMeasurement":
            raise ValueError(f"{path}: not a pruning measurement (missing kind='PruningMeasurement')")
        variants = payload.get("variants") or {}
        if variant not in variants:
            raise ValueError(f"{path}: no variant {variant!r}; measured: {sorted(variants)}")
        v = variants[variant]
        keys = ("logprob_factor", "update_factor") if basis == "time" else ("computed_token_fraction",) * 2
        try:
            return cls(base, min(1.0, float(v[keys[0]])), min(1.0, float(v[keys[1]])),
                       source=f"{path} [{variant}, by {basis}]: {payload.get('command', '')}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: variant {variant!r}: {exc}") from None

    def phases(self, seq_lens, prompt_lens, n_devices: int, *, collocated: bool) -> TrainPhases:
        p = self.base.phases(seq_lens, prompt_lens, n_devices, collocated=collocated)
        return TrainPhases(p.logprob * self.logprob_factor, p.reference * self.logprob_factor, p.update * self.update_factor,
                           p.sync, p.switch)

    def micro_batch_seconds(self, seq_lens, n_devices: int = 1, *, forward_only: bool = False) -> float:
        factor = self.logprob_factor if forward_only else self.update_factor
        return factor * self.base.micro_batch_seconds(seq_lens, n_devices, forward_only=forward_only)

    def optimizer_step_seconds(self, n_devices: int = 1) -> float:
        return self.base.optimizer_step_seconds(n_devices)

    def streamed_update(self, pieces, n_devices: int = 1) -> StreamedUpdate:
        return self.base.streamed_update(pieces, n_devices).scaled(self.logprob_factor, self.update_factor,
                                                                  self.update_factor)  # as phases(): update whole

    def describe(self) -> dict:
        return {"kind": "scaled", "logprob_factor": self.logprob_factor, "update_factor": self.update_factor,
                "source": self.source, "base": self.base.describe()}


@dataclass(frozen=True)
class TrainCostAtLevel(TrainCostModel):
    """Another TrainCostModel on a host running `level` times slower than when it was measured (a speed probe's
    level: real_backend.speed_probe): every phase, micro-batch and optimizer step takes `level` x its base's time.
    The trainer shares the engine's cores, so the level the probe measures on the engine is the trainer's too
    (docs/fidelity.md shows how closely the collocated runs' updates follow it)."""

    base: TrainCostModel
    level: float

    def __post_init__(self):
        if not isinstance(self.base, TrainCostModel):
            raise ValueError(f"TrainCostAtLevel.base must be a TrainCostModel, got {self.base!r}")
        if isinstance(self.level, bool) or not isinstance(self.level, numbers.Real) or not 0 < self.level < math.inf:
            raise ValueError(f"TrainCostAtLevel.level must be a finite number > 0, got {self.level!r}")

    def phases(self, seq_lens, prompt_lens, n_devices: int, *, collocated: bool) -> TrainPhases:
        p = self.base.phases(seq_lens, prompt_lens, n_devices, collocated=collocated)
        level = self.level
        return TrainPhases(level * p.logprob, level * p.reference, level * p.update, level * p.sync, level * p.switch)

    def micro_batch_seconds(self, seq_lens, n_devices: int = 1, *, forward_only: bool = False) -> float:
        return self.level * self.base.micro_batch_seconds(seq_lens, n_devices, forward_only=forward_only)

    def optimizer_step_seconds(self, n_devices: int = 1) -> float:
        return self.level * self.base.optimizer_step_seconds(n_devices)

    def streamed_update(self, pieces, n_devices: int = 1) -> StreamedUpdate:
        return self.base.streamed_update(pieces, n_devices).scaled(self.level, self.level, self.level)

    def describe(self) -> dict:
        return {"kind": "at level", "level": self.level, "base": self.base.describe()}


def load_train_cost(path) -> TrainCostModel:
    """A training-phase model from a JSON file: a trainer profile (ProfiledTrainCost, from
    `python -m real_backend.profile_trainer`) or an AnalyticTrainCost's to_dict(). ValueError naming the file."""
    payload = read_train_cost_file(path)
    kind = payload.get("kind") if isinstance(payload, dict) else None
    if kind == "AnalyticTrainCost":
        return AnalyticTrainCost.from_dict(payload, str(path))
    if kind == "ProfiledTrainCost":
        return ProfiledTrainCost.from_dict(payload, str(path))
    raise ValueError(f"{path}: not a training-cost file (kind must be 'ProfiledTrainCost' or 'AnalyticTrainCost', "
                     f"got {kind!r})")
