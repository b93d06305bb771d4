"""What a prompt's past responses say about its next one: the length history policies predict from.

Learned only from what a policy is told at the end of each step (`StepOutcome`), so it works the same in
the simulator and on vLLM; no oracle. Several policies keep one (lpt, ebs, segment):

    history = LengthHistory()
    history.update(outcome)                   # in end_step
    history.mean(prompt_id)                   # expected length, or None if the prompt was never seen
    history.mean_square(prompt_id)            # expected squared length (the KV a response reads grows so)
    history.remaining(prompt_id, generated)   # expected tokens still to come for a response this far along

Only responses that ended by themselves or by their budget count (a response stopped by a policy or dropped
at the end of a rollout says nothing about where it would have ended). A truncated response counts at its
budget: a lower bound of its natural length, which is all anyone can know.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from lssim.loop.core import LENGTH, STOP


class LengthHistory:
    """Per prompt, the lengths of its latest `keep` responses; and the mean over every response seen."""

    def __init__(self, keep: int = 32):
        if keep < 1:
            raise ValueError(f"LengthHistory: keep must be >= 1, got {keep}")
        self.keep = keep
        self._lengths: dict[int, deque] = {}
        self._total = 0.0
        self._total_sq = 0.0
        self._count = 0

    def update(self, outcome) -> None:
        """Remember the natural lengths of the responses that ended in a step (a `StepOutcome`)."""
        if len(outcome.prompt_id) == 0:
            return
        natural = np.isin(outcome.finish_reason.astype(str), (STOP, LENGTH))
        pids = outcome.prompt_id[natural].tolist()
        lens = outcome.response_len[natural].tolist()
        for pid, n in zip(pids, lens):
            q = self._lengths.get(pid)
            if q is None:
                q = self._lengths[pid] = deque(maxlen=self.keep)
            q.append(n)
        self._total += float(sum(lens))
        self._total_sq += float(sum(n * n for n in lens))
        self._count += len(lens)

    def known(self, prompt_id: int) -> bool:
        return prompt_id in self._lengths

    def __len__(self) -> int:
        return len(self._lengths)

    def mean(self, prompt_id: int) -> float | None:
        """The prompt's expected response length (mean of its recent responses); None if never seen."""
        q = self._lengths.get(prompt_id)
        return sum(q) / len(q) if q else None

    def mean_square(self, prompt_id: int) -> float | None:
        """The prompt's expected squared response length (a long tail weighs in); None if never seen."""
        q = self._lengths.get(prompt_id)
        return sum(n * n for n in q) / len(q) if q else None

    def global_mean_square(self) -> float | None:
        return self._total_sq / self._count if self._count else None

    def global_mean(self) -> float | None:
        """Mean length over every response seen so far (the guess for a prompt never seen)."""
        return self._total / self._count if self._count else None

    def predict(self, prompt_id: int, default: float) -> float:
        """`mean`, else `global_mean`, else `default`."""
        m = self.mean(prompt_id)
        if m is None:
            m = self.global_mean()
        return default if m is None else m

    def remaining(self, prompt_id: int, generated: int) -> float | None:
        """Expected tokens still to come for a response of this prompt that has generated `generated`: the mean,
        over the prompt's past responses longer than that, of what they had left. None when none of them was
        longer (or the prompt was never seen): the history cannot say, and the response may be a long one."""
        q = self._lengths.get(prompt_id)
        if not q:
            return None
        longer = [n for n in q if n > generated]
        return sum(longer) / len(longer) - generated if longer else None
