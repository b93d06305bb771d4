"""What VLLMEngine (real_backend.engine) runs on AsyncLLM's side and makes of what comes back: the requests added,
each with a drain task (its DELTA stream into the engine's queue), the warm-up generation, the shutdown, a response's
window signals from its tokens, and the record of a request in flight (`Live`)."""

from __future__ import annotations

import asyncio
from typing import Callable

from lssim.loop.core import Request
from lssim.loop.signals import WINDOW_KEY, SignalSpec, loop_start, signals_from_tokens, token_entropy


class Live:
    """A request in flight: the request it serves, whether its first token came, the instance it runs on."""

    __slots__ = ("request", "started", "instance")

    def __init__(self, request: Request, instance: int = 0):
        self.request = request
        self.started = False
        self.instance = instance  # the data-parallel rank it runs on


async def drain(key: str, collector, put: Callable[[tuple], None], now: Callable[[], float],
                exact_entropy: bool) -> None:
    """One request's DELTA stream into the engine's queue (`put`), each output as (key, `now()`, token ids, logprobs,
    entropies (`exact_entropy`: from the whole distribution, else none), finish reason or None); when the engine dies
    or the request fails, (key, `now()`, None, None, None, the exception)."""
    try:
        while True:
            out = collector.get_nowait() or await collector.get()
            o = out.outputs[0]
            lps = [pos[tok].logprob for tok, pos in zip(o.token_ids, o.logprobs)] if o.logprobs else []
            ents = [token_entropy(pos) for pos in o.logprobs] if exact_entropy and o.logprobs else []
            put((key, now(), list(o.token_ids), lps, ents, o.finish_reason if out.finished else None))
            if out.finished:
                return
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # the engine died, or this request failed
        put((key, now(), None, None, None, e))


async def add_requests(llm, batch, put: Callable[[tuple], None], now: Callable[[], float],
                       exact_entropy: bool) -> None:
    """Add each (key, prompt, params, priority, rank) of `batch` to `llm`, and start its drain task (`drain`)."""
    for key, prompt, params, priority, rank in batch:
        collector = await llm.add_request(key, prompt, params, priority=priority, data_parallel_rank=rank)
        asyncio.get_running_loop().create_task(drain(key, collector, put, now, exact_entropy))


async def shutdown(llm) -> None:
    """Shut `llm` down and cancel every other task on its loop (the drain tasks)."""
    llm.shutdown()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.cancel()


def warm_up(llm, n_instances: int, logprobs: int):
    """The coroutine that pays the first generation's slow start (lazy initialization) on every instance of `llm`:
    4 requests per instance of 8 tokens each, `logprobs` as the engine asks for them."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=8, min_tokens=8, ignore_eos=True, temperature=1.0, logprobs=logprobs, seed=0)

    async def run(i):  # on every instance: each engine core pays its own first generation
        rank = i % n_instances if n_instances > 1 else None
        collector = await llm.add_request(f"warmup.{i}", TokensPrompt(prompt_token_ids=[0] * 8), params,
                                          data_parallel_rank=rank)
        while not (collector.get_nowait() or await collector.get()).finished:
            pass

    async def all_of():
        await asyncio.gather(*(run(i) for i in range(4 * n_instances)))

    return all_of()


def update_signals(r: Request, spec: SignalSpec, exact_entropy: bool) -> None:
    """The shared window signals (lssim.loop.signals) and, if the response ends in a loop, where it starts
    (`exact_entropy`: the streamed entropies are exact, else estimated from the log-probs)."""
    r.signals[WINDOW_KEY] = signals_from_tokens(r.tokens, r.signals["logprobs"], spec.window_for(r.max_tokens), spec.ngram,
                                                entropies=r.signals["entropy"] if exact_entropy else None)
    start = loop_start(r.tokens)
    if start >= 0:
        r.signals["loop_start"] = start
    else:
        r.signals.pop("loop_start", None)
