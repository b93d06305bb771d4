"""vLLM's speculative-decoding counters, summed over engine steps for `VLLMEngine.spec_counters()`.

vLLM reports drafts, drafted and accepted tokens with its scheduler stats; a stat logger (the only way
AsyncLLM hands them out) adds each step's into a `SpecCounts`. world.speculation_meta turns the sums
into the acceptance rate a run's meta.json reports.
"""

from __future__ import annotations

import threading


class SpecCounts:
    """Spec-decode counters summed over engine steps (written by the stat logger on the asyncio thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.drafts = self.draft_tokens = self.accepted_tokens = self.steps = self.generation_tokens = 0
            self.accepted_per_position: list[int] = []

    def add(self, scheduler_stats, iteration_stats) -> None:
        with self._lock:
            d = getattr(scheduler_stats, "spec_decoding_stats", None) if scheduler_stats is not None else None
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

    def snapshot(self) -> dict:
        with self._lock:
            return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                    "accepted_per_position": list(self.accepted_per_position), "steps": self.steps,
                    "generation_tokens": self.generation_tokens}


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


__all__ = ["SpecCounts", "make_spec_logger_class"]
