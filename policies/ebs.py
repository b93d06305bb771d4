"""ebs -- elastic bucket scheduling (seed plan §4.3, after RhymeRL's history-based length prediction).

Source: the seed plan's third step (§4.3): record each prompt's past lengths; before dispatch, split the
step's prompts into Short / Medium / Long buckets by predicted length; give each bucket its own batch size
(its example: 128 for short, so they run fast, 16 for long, so they run apart and do not hold the short ones
back); and replace random dispatch by a greedy dispatch on predicted length.

Rule:
- Prediction: a request's length is its prompt's mean past length (lssim.loop.history, learned in end_step); a
  prompt never seen gets the mean over every response seen, and before anything has been seen, its budget.
- Buckets by predicted length over the budget: short up to `short_max`, long from `long_min`, medium between.
- Batches: each bucket's requests, longest predicted first, are cut into batches of the bucket's batch size
  (`batch_sizes`: short, medium, long).
- Load of a batch: the KV its responses will read, the sum over them of E[L^2]/2 (the prompt's mean squared
  past length, so a prompt that sometimes runs to the budget weighs in). Decode is memory-bound: an
  instance's time is about one weight read per iteration, and nearly every instance holds a response that
  runs to the budget (a 16k budget, 3.7% truncated: about 10 per instance in math7b), so instances differ by
  the KV they read, which grows with the square of the lengths.
- Dispatch, greedy by predicted length (LPT over batches): batches, longest first, each go whole to the
  instance with the least load; requests run longest predicted first on every instance (priority = minus the
  predicted remaining length). So long responses are spread over the instances a small batch at a time
  instead of piling up, and short ones are packed in large batches.
- The batches are made from the step's plan as this policy sees it (put ebs after policies that change the
  plan); a request it did not see planned (carried in, topped up) goes to the instance with the least
  predicted time, as a batch of its own.

The engine runs continuous batching, so an instance's batches overlap rather than run one after another: a
batch size is a dispatch unit here, not a cap on the running batch (that is the engine's max_num_seqs).

Defaults: short_max=0.125, long_min=0.375 (of the budget: 2k and 6k tokens of a 16k budget),
batch_sizes=(128, 64, 16) for short, medium, long (the plan's 128 and 16); keep=32 (responses remembered
per prompt).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from lssim.loop.history import LengthHistory
from lssim.loop.policy import Policy

SHORT, MEDIUM, LONG = 0, 1, 2


class EBS(Policy):
    name = "ebs"

    def __init__(self, short_max: float = 0.125, long_min: float = 0.375, batch_sizes: tuple = (128, 64, 16),
                 keep: int = 32):
        if not 0.0 < short_max <= long_min <= 1.0:
            raise ValueError(f"ebs: need 0 < short_max <= long_min <= 1, got {short_max}, {long_min}")
        batch_sizes = tuple(batch_sizes)
        if len(batch_sizes) != 3 or not all(isinstance(b, int) and b >= 1 for b in batch_sizes):
            raise ValueError(f"ebs: batch_sizes must be three ints >= 1 (short, medium, long), got {batch_sizes!r}")
        self.short_max, self.long_min, self.batch_sizes, self.keep = short_max, long_min, batch_sizes, keep
        self.history = LengthHistory(keep)
        self.batches: list[tuple[float, float, int, list[int]]] = []  # this step's (longest, load, bucket, prompts)
        self._slots: dict[int, deque] | None = None  # prompt -> instances of its planned members, in order
        self._load: list[float] = []  # instance -> predicted KV its responses read

    def predicted(self, prompt_id: int, budget: int) -> float:
        return min(float(budget), self.history.predict(prompt_id, default=budget))

    def bucket(self, predicted: float, budget: int) -> int:
        if predicted <= self.short_max * budget:
            return SHORT
        return LONG if predicted >= self.long_min * budget else MEDIUM

    def plan(self, ctx, proposal):
        members: list[list[tuple[float, float, int]]] = [[], [], []]
        for g in proposal:
            p = self.predicted(g.prompt_id, g.max_tokens)
            members[self.bucket(p, g.max_tokens)].extend([(p, self.load(g.prompt_id, g.max_tokens), g.prompt_id)] * g.n_samples)
        self.batches = []
        for b, items in enumerate(members):
            items.sort(key=lambda item: -item[0])
            size = self.batch_sizes[b]
            for start in range(0, len(items), size):
                chunk = items[start:start + size]
                self.batches.append((chunk[0][0], sum(w for _, w, _ in chunk), b, [pid for _, _, pid in chunk]))
        self._slots, self._load = None, []
        return proposal

    def load(self, prompt_id: int, budget: int) -> float:
        """The KV a response of this prompt is predicted to read: E[L^2] / 2 (budget^2 / 2 if nothing is known)."""
        sq = self.history.mean_square(prompt_id)
        if sq is None:
            sq = self.history.global_mean_square()
        return min(sq if sq is not None else float(budget) ** 2, float(budget) ** 2) / 2

    def dispatch(self, n_instances: int) -> dict[int, deque]:
        """Greedy LPT over this step's batches (longest first, each to the least-loaded instance):
        prompt -> the instances of its members."""
        self._load = [0.0] * n_instances
        slots: dict[int, deque] = {}
        for _, load, _, pids in sorted(self.batches, key=lambda batch: (-batch[0], -batch[1])):
            i = min(range(n_instances), key=self._load.__getitem__)
            self._load[i] += load
            for pid in pids:
                slots.setdefault(pid, deque()).append(i)
        return slots

    def priority(self, request):
        return -int(round(self._remaining(request)))

    def place(self, request, loads):
        if self._slots is None or len(self._load) != len(loads):
            self._slots = self.dispatch(len(loads))
        slots = self._slots.get(request.prompt_id)
        if slots:
            return slots.popleft()
        i = min(range(len(loads)), key=self._load.__getitem__)
        self._load[i] += self.load(request.prompt_id, request.max_tokens)
        return i

    # The same rules over a whole submission (the simulator's batch route): a prediction per distinct prompt and
    # budget, the planned slots taken prompt by prompt, in request order.
    def priorities(self, requests):
        keys, inverse = np.unique(np.stack([requests.prompt_id, requests.max_tokens]), axis=1, return_inverse=True)
        predicted = np.array([self.predicted(int(p), int(b)) for p, b in keys.T.tolist()], float)[inverse.ravel()]
        return -np.round(np.maximum(1.0, predicted - requests.generated)).astype(np.int64)

    def placements(self, requests, loads):
        if self._slots is None or len(self._load) != len(loads):
            self._slots = self.dispatch(len(loads))
        out = np.full(len(requests), -1, np.int64)
        order = np.argsort(requests.prompt_id, kind="stable")
        pids = requests.prompt_id[order]
        bounds = np.flatnonzero(np.r_[True, pids[1:] != pids[:-1], True]) if len(pids) else np.zeros(1, np.int64)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            slots = self._slots.get(int(pids[a]))
            k = min(len(slots), b - a) if slots else 0
            out[order[a:a + k]] = [slots.popleft() for _ in range(k)]
        for j in np.flatnonzero(out < 0).tolist():  # not planned: the least-loaded instance, one after another
            i = min(range(len(loads)), key=self._load.__getitem__)
            self._load[i] += self.load(int(requests.prompt_id[j]), int(requests.max_tokens[j]))
            out[j] = i
        return out

    def end_step(self, outcome):
        self.history.update(outcome)

    def _remaining(self, request) -> float:
        return max(1.0, self.predicted(request.prompt_id, request.max_tokens) - request.generated)
