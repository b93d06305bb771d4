"""vLLM's speculative-decoding counters, summed over engine steps for `VLLMEngine.spec_counters()`, and the
switch that turns drafting off above a batch size while the engine runs.

vLLM reports drafts, drafted and accepted tokens with its scheduler stats; a stat logger (the only way
AsyncLLM hands them out) adds each step's into a `SpecCounts`. world.speculation_meta turns the sums
into the acceptance rate a run's meta.json reports. With `keep_iterations` it also keeps one row per
engine step (time, running requests, tokens generated, drafts), which measure_speculation.py reads.

Switching speculation at run time (`limit_drafts`): vLLM 0.32 fixes the speculative config at engine start
(`speculative_config`; its dynamic `num_speculative_tokens_per_batch_size` is a table fixed at start too),
and a request cannot opt out (SamplingParams has no such field). But the n-gram proposer runs inside the
model runner after every step (`GPUModelRunner.propose_draft_token_ids` -> `NgramProposer.propose`, vLLM
0.32 vllm/v1/worker/gpu_model_runner.py), and a request with no draft tokens is scheduled as a plain one-token
decode (vllm/v1/core/sched/scheduler.py: `scheduled_spec_decode_tokens` only for requests with
`spec_token_ids`). So wrapping the proposer to return no drafts while the batch is above a limit switches
speculation off from the next engine step on, and back on the same way: `_worker_limit_drafts`, run in every
worker through `collective_rpc` (as weights.py's weight push), is that wrapper.
"""

from __future__ import annotations

import threading
import weakref


class SpecCounts:
    """Spec-decode counters summed over engine steps (written by the stat logger on the asyncio thread)."""

    def __init__(self, keep_iterations: bool = False):
        self._lock = threading.Lock()
        self.keep_iterations = keep_iterations
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.drafts = self.draft_tokens = self.accepted_tokens = self.steps = self.generation_tokens = 0
            self.accepted_per_position: list[int] = []
            self.iterations: list[dict] = []

    def add(self, scheduler_stats, iteration_stats) -> None:
        with self._lock:
            d = scheduler_stats.spec_decoding_stats if scheduler_stats is not None else None
            if d is not None:
                self.drafts += d.num_drafts
                self.draft_tokens += d.num_draft_tokens
                self.accepted_tokens += d.num_accepted_tokens
                pos = list(d.num_accepted_tokens_per_pos)
                if len(self.accepted_per_position) < len(pos):
                    self.accepted_per_position += [0] * (len(pos) - len(self.accepted_per_position))
                for i, n in enumerate(pos):
                    self.accepted_per_position[i] += n
            if iteration_stats is not None:
                self.steps += 1
                self.generation_tokens += iteration_stats.num_generation_tokens
                if self.keep_iterations:
                    self.iterations.append({
                        "time": float(iteration_stats.iteration_timestamp),
                        "running": int(scheduler_stats.num_running_reqs) if scheduler_stats is not None else 0,
                        "generation_tokens": int(iteration_stats.num_generation_tokens),
                        "prompt_tokens": int(iteration_stats.num_prompt_tokens),
                        "drafts": int(d.num_drafts) if d is not None else 0,
                        "draft_tokens": int(d.num_draft_tokens) if d is not None else 0,
                        "accepted_tokens": int(d.num_accepted_tokens) if d is not None else 0})

    def snapshot(self) -> dict:
        with self._lock:
            return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                    "accepted_per_position": list(self.accepted_per_position), "steps": self.steps,
                    "generation_tokens": self.generation_tokens}


    def take_iterations(self) -> list[dict]:
        """The per-step rows kept since the last call (and forgets them)."""
        with self._lock:
            rows, self.iterations = self.iterations, []
            return rows


_WRAPPED: "weakref.WeakSet" = weakref.WeakSet()  # drafters whose propose is wrapped (in this worker process)
ALWAYS = 1 << 30  # a draft limit no batch reaches: speculation wherever vLLM's own config allows it


def _worker_limit_drafts(worker, max_batch: int) -> bool:
    """Runs inside vLLM's worker: from the next engine step on, the proposer drafts only while the step's batch
    holds at most `max_batch` requests (0: never). Returns False if the engine has no proposer (no speculation)."""
    runner = worker.model_runner
    if not runner.speculative_config:  # vLLM makes a drafter only for a speculative config
        return False
    drafter = runner.drafter
    if drafter not in _WRAPPED:
        _WRAPPED.add(drafter)
        drafter._lssim_propose = drafter.propose

        def propose(num_speculative_tokens, sampled_token_ids, *args, **kwargs):
            if len(sampled_token_ids) > drafter._lssim_max_batch:
                return [[] for _ in sampled_token_ids]  # no drafts: every request decodes one token plainly
            return drafter._lssim_propose(num_speculative_tokens, sampled_token_ids, *args, **kwargs)

        drafter.propose = propose
    drafter._lssim_max_batch = int(max_batch)
    return True


def limit_drafts(llm, call, max_batch: int) -> bool:
    """Every worker of the running engine drafts only at batches of at most `max_batch` (see the module's
    docstring); True if every one has a proposer to limit."""
    from .weights import RPC_TIMEOUT

    return all(call(llm.collective_rpc(_worker_limit_drafts, args=(int(max_batch),)), timeout=RPC_TIMEOUT))


def make_spec_logger_class():
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SpecLogger(StatLoggerBase):
        """A vLLM stat logger that only sums the spec-decode counters into a SpecCounts."""

        def __init__(self, counts: SpecCounts):
            self.counts = counts

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0, **_):
            self.counts.add(scheduler_stats, iteration_stats)

        def log_engine_initialized(self):
            pass

    return SpecLogger


__all__ = ["SpecCounts", "make_spec_logger_class", "limit_drafts", "ALWAYS"]
