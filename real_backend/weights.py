"""The served model, reached inside a running vLLM engine: new weights in, a parameter out, logprobs of
given tokens. `VLLMEngine.update_weights`, `.parameter` and `.score` are these, with the engine's checks.

    reset = push_weights(llm, call, model.state_dict())   # every rank reloads; True once the prefix cache is reset
    tensor = read_parameter(llm, call, "model.norm.weight")
    logprobs = score(llm, call, "score.0", prompt_ids, continuation)

`llm` is the engine's AsyncLLM and `call(coroutine, timeout)` runs a coroutine on the engine's event loop and
returns its result (VLLMEngine._call). Weights and parameters travel by `collective_rpc`, which runs a Python
function in every engine core's worker (each data-parallel rank): the two `_worker_*` functions below run
there, in vLLM's processes, so they import what they need themselves. vLLM accepts a callable only with
VLLM_ALLOW_INSECURE_SERIALIZATION=1, which VLLMEngine sets before vLLM starts.
"""

from __future__ import annotations

from typing import Any, Callable

RPC_TIMEOUT = 600.0  # seconds: a weight push of a large model is slow, a stuck one is an error


def _worker_reload_weights(worker, blob: bytes) -> int:
    """Runs inside vLLM's worker process: load checkpoint-format weights.

    `reload_weights` re-runs the platform's post-load processing (on CPU the linear layers are
    repacked for oneDNN, so copying into `model.parameters()` directly would not reach the kernels).
    """
    from safetensors.torch import load as load_safetensors

    weights = load_safetensors(blob)
    worker.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
    return len(weights)


def _worker_read_parameter(worker, name: str) -> list:
    """Runs inside vLLM's worker: one parameter of the served model, as nested lists (for checks and tests).
    On CPU the linear layers' weights are repacked into kernel handles and cannot be read back; embeddings
    and norms can."""
    return worker.model_runner.model.get_parameter(name).detach().float().cpu().tolist()


def push_weights(llm, call: Callable[..., Any], state_dict: dict) -> bool:
    """Load `state_dict` (Hugging Face names, e.g. a transformers model's state_dict()) into every rank of the
    running engine, then reset the prefix cache (its KV was computed by the old weights). Returns whether vLLM
    reset it; raises whatever vLLM raised.

    The weights travel as one safetensors blob through collective_rpc: fine for small models; for multi-GB
    models on GPUs vLLM's weight-transfer engines (NCCL/IPC) are the way (future work).
    """
    from safetensors.torch import save as save_safetensors

    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    blob = save_safetensors(tensors)
    call(llm.collective_rpc(_worker_reload_weights, args=(blob,)), timeout=RPC_TIMEOUT)
    return bool(call(llm.reset_prefix_cache(), timeout=RPC_TIMEOUT))


def read_parameter(llm, call: Callable[..., Any], name: str):
    """A parameter of the served model (vLLM's name, e.g. "model.norm.weight"), as a CPU tensor (rank 0's)."""
    import torch

    return torch.tensor(call(llm.collective_rpc(_worker_read_parameter, args=(name,)), timeout=RPC_TIMEOUT)[0])


def score(llm, call: Callable[..., Any], request_id: str, prompt_ids: list[int], continuation: list[int]) -> list[float]:
    """The served model's logprob of each token of `continuation` after `prompt_ids` (vLLM's prompt logprobs of
    one request named `request_id`, which generates one token nobody reads)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ids = list(prompt_ids) + list(continuation)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)

    async def run():
        collector = await llm.add_request(request_id, TokensPrompt(prompt_token_ids=ids), params)
        while True:
            out = collector.get_nowait() or await collector.get()
            if out.finished:
                return out

    plps = call(run(), timeout=RPC_TIMEOUT).prompt_logprobs
    return [plps[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]


__all__ = ["push_weights", "read_parameter", "score", "RPC_TIMEOUT"]
