"""real_backend.engine_config: the VLLMEngine's config is checked before vLLM starts, and maps onto vLLM's
engine arguments as the engine always did. No vLLM needed."""

from __future__ import annotations

import pytest

from lssim.loop.core import Speculation
from real_backend.engine_config import VLLMConfig, engine_args


def test_defaults_map_onto_vllm_arguments():
    args = engine_args(VLLMConfig(model="m"), on_cpu=False)
    assert args["model"] == args["tokenizer"] == "m"
    assert args["enable_prefix_caching"] and args["scheduling_policy"] == "priority"
    assert args["max_logprobs"] == 1 and args["disable_log_stats"]
    for absent in ("data_parallel_size", "max_num_batched_tokens", "speculative_config"):
        assert absent not in args


def test_cpu_instances_logprobs_and_engine_kwargs():
    config = VLLMConfig(model="m", n_instances=2, max_num_seqs=8, max_model_len=100, logprobs=-1,
                        engine_kwargs={"max_num_seqs": 4, "tensor_parallel_size": 2})
    args = engine_args(config, on_cpu=True)
    assert args["data_parallel_size"] == 2
    assert args["max_num_batched_tokens"] == 800  # every step's prefills in one iteration (vLLM 0.32 CPU)
    assert args["max_logprobs"] == -1
    assert args["max_num_seqs"] == 4 and args["tensor_parallel_size"] == 2  # engine_kwargs go on last


def test_speculation_is_dynamic_above_max_batch():
    config = VLLMConfig(model="m", max_num_seqs=64, speculation=Speculation(gamma=3, max_batch=16), ngram_lookup=[2, 5])
    assert config.ngram_lookup == (2, 5)
    spec = engine_args(config, on_cpu=False)["speculative_config"]
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 3
    assert (spec["prompt_lookup_min"], spec["prompt_lookup_max"]) == (2, 5)
    assert spec["num_speculative_tokens_per_batch_size"] == [(1, 16, 3), (17, 64, 0)]
    wide = VLLMConfig(model="m", max_num_seqs=16, speculation=Speculation(gamma=3, max_batch=16))
    assert "num_speculative_tokens_per_batch_size" not in engine_args(wide, on_cpu=False)["speculative_config"]


@pytest.mark.parametrize("bad, names", [
    ({"n_instances": 0}, "n_instances"), ({"n_instances": True}, "n_instances"), ({"max_num_seqs": 2.5}, "max_num_seqs"),
    ({"logprobs": 5}, "logprobs"), ({"kv_cache_gib": 0}, "kv_cache_gib"), ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"stall_timeout": -1}, "stall_timeout"), ({"ngram_lookup": (4, 1)}, "ngram_lookup"), ({"engine_kwargs": [1]}, "engine_kwargs"),
    ({"model": ""}, "model"), ({"speculation": Speculation(method="draft")}, "n-gram"),
])
def test_bad_values_are_refused_naming_the_field(bad, names):
    with pytest.raises(ValueError, match=names):
        VLLMConfig(**{"model": "m", **bad})


def test_unknown_keys_are_errors():
    with pytest.raises(ValueError, match="unknown VLLMConfig key.*max_batch_size"):
        VLLMConfig.from_dict({"model": "m", "max_batch_size": 8})
    with pytest.raises(ValueError, match="unknown VLLMConfig key.*temp"):
        VLLMConfig(model="m").replace(temp=0.0)
    assert VLLMConfig.from_dict({"model": "m", "seed": 3}).replace(seed=4).seed == 4
    with pytest.raises(ValueError, match="n_instances"):
        VLLMConfig(model="m").replace(n_instances=0)


def test_config_keeps_its_own_copy_of_the_kwargs():
    sampling = {"temperature": 0.0}
    config = VLLMConfig(model="m", sampling_kwargs=sampling)
    sampling["temperature"] = 1.0
    assert config.temperature == 0.0 and VLLMConfig(model="m").temperature == 1.0


def test_real_setup_engine_config():
    from real_backend.world import RealSetup

    setup = RealSetup(exact_entropy=True, temperature=0.0, n_instances=2, gpu_memory_utilization=0.5)
    config = setup.engine_config(seed=7)
    assert (config.model, config.seed, config.logprobs, config.n_instances) == (setup.model_dir, 7, -1, 2)
    assert config.temperature == 0.0 and config.gpu_memory_utilization == 0.5
    with pytest.raises(ValueError, match="kv_cache_gib"):
        RealSetup(kv_cache_gib=0).check()
