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

from dataclasses import dataclass

import numpy as np

from lssim.loop.columns import runs, stable_argsort
from lssim.loop.core import spec_columns
from lssim.loop.history import LengthHistory
from lssim.loop.policy import Policy

SHORT, MEDIUM, LONG = 0, 1, 2


@dataclass(slots=True)
class Batches:
    """A step's dispatch batches as arrays: batch k holds items[start[k]:start[k + 1]] (one prompt id per request, each
    bucket's requests longest predicted first), with its longest prediction, its load and its bucket."""

    longest: np.ndarray
    load: np.ndarray
    bucket: np.ndarray
    start: np.ndarray  # len(batches) + 1 offsets into items
    items: np.ndarray

    @staticmethod
    def empty() -> "Batches":
        return Batches(np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64))

    def as_tuples(self) -> list[tuple[float, float, int, list[int]]]:
        return [(lo, w, b, self.items[a:z].tolist()) for lo, w, b, a, z in zip(
            self.longest.tolist(), self.load.tolist(), self.bucket.tolist(), self.start[:-1].tolist(), self.start[1:].tolist())]


class Slots:
    """Each planned prompt's instances, one per member in dispatch order; members take them in the order asked."""

    def __init__(self, prompt_ids: np.ndarray, instances: np.ndarray):
        order = stable_argsort(prompt_ids)  # by prompt, each prompt's slots in dispatch order
        sorted_ids = prompt_ids[order]
        first, sizes = runs(sorted_ids)
        self.ids, self.instances = sorted_ids[first], instances[order]
        self.next, self.end = first.copy(), first + sizes

    def take_one(self, prompt_id: int) -> int | None:
        at = int(np.searchsorted(self.ids, prompt_id))
        if at == len(self.ids) or self.ids[at] != prompt_id or self.next[at] == self.end[at]:
            return None
        self.next[at] += 1
        return int(self.instances[self.next[at] - 1])

    def take(self, prompt_ids: np.ndarray) -> np.ndarray:
        """`take_one` for each request in order, at once (-1 where its prompt has no slot left)."""
        out = np.full(len(prompt_ids), -1, np.int64)
        if not len(prompt_ids) or not len(self.ids):
            return out
        order = stable_argsort(prompt_ids)
        ids = prompt_ids[order]
        first, sizes = runs(ids)
        at = np.minimum(np.searchsorted(self.ids, ids[first]), len(self.ids) - 1)
        left = np.where(self.ids[at] == ids[first], self.end[at] - self.next[at], 0)
        rank = np.arange(len(ids)) - np.repeat(first, sizes)  # its place among the requests of its prompt
        ok = rank < np.repeat(left, sizes)
        out[order[ok]] = self.instances[(np.repeat(self.next[at], sizes) + rank)[ok]]
        found = left > 0  # each prompt found once: its `at` is its own
        self.next[at[found]] += np.minimum(sizes, left)[found]
        return out


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
        self._batches = Batches.empty()  # this step's
        self._slots: Slots | None = None
        self._load: list[float] = []  # instance -> predicted KV its responses read

    def __setstate__(self, state: dict) -> None:
        if "_batches" not in state:  # a checkpoint written when the batches were tuples (between steps: plan remakes them)
            state = {**{k: v for k, v in state.items() if k != "batches"}, "_batches": Batches.empty(), "_slots": None}
        self.__dict__.update(state)

    @property
    def batches(self) -> list[tuple[float, float, int, list[int]]]:
        """This step's batches as (longest prediction, load, bucket, prompt ids)."""
        return self._batches.as_tuples()

    def predicted(self, prompt_id: int, budget: int) -> float:
        return min(float(budget), self.history.predict(prompt_id, default=budget))

    def predictions(self, prompt_ids: np.ndarray, budgets: np.ndarray) -> np.ndarray:
        """`predicted` of each prompt and budget."""
        mean = self.history.means(prompt_ids)
        unknown = np.isnan(mean)
        if unknown.any():
            seen = self.history.global_mean()
            mean = np.where(unknown, budgets if seen is None else seen, mean)
        return np.minimum(budgets.astype(float), mean)

    def bucket(self, predicted: float, budget: int) -> int:
        if predicted <= self.short_max * budget:
            return SHORT
        return LONG if predicted >= self.long_min * budget else MEDIUM

    def load(self, prompt_id: int, budget: int) -> float:
        """The KV a response of this prompt is predicted to read: E[L^2] / 2 (budget^2 / 2 if nothing is known)."""
        sq = self.history.mean_square(prompt_id)
        if sq is None:
            sq = self.history.global_mean_square()
        return min(sq if sq is not None else float(budget) ** 2, float(budget) ** 2) / 2

    def loads(self, prompt_ids: np.ndarray, budgets: np.ndarray) -> np.ndarray:
        """`load` of each prompt and budget."""
        square = budgets.astype(float) ** 2
        sq = self.history.mean_squares(prompt_ids)
        unknown = np.isnan(sq)
        if unknown.any():
            seen = self.history.global_mean_square()
            sq = np.where(unknown, square if seen is None else seen, sq)
        return np.minimum(sq, square) / 2

    def plan(self, ctx, proposal):
        pids, sizes, budgets = (np.asarray(c, np.int64) for c in spec_columns(proposal))
        predicted = self.predictions(pids, budgets)
        bucket = np.where(predicted <= self.short_max * budgets, SHORT,
                          np.where(predicted >= self.long_min * budgets, LONG, MEDIUM))
        self._batches = self._make_batches(predicted, self.loads(pids, budgets), bucket, pids, sizes)
        self._slots, self._load = None, []
        return proposal

    def _make_batches(self, predicted, load, bucket, pids, sizes) -> Batches:
        """Each bucket's requests (a group's `sizes` members each), longest predicted first, cut into batches of its
        batch size. A group's members are equal and consecutive: sorting the groups stably sorts the members so."""
        longest, loads, buckets, starts, items = [], [], [], [], []
        done = 0
        for b, size in enumerate(self.batch_sizes):
            groups = np.flatnonzero(bucket == b)
            groups = groups[np.argsort(-predicted[groups], kind="stable")]
            members = np.repeat(groups, sizes[groups])
            chunks = range(0, len(members), size)
            weights = load[members].tolist()
            longest.append(predicted[members[::size]])
            loads.extend(sum(weights[a:a + size]) for a in chunks)  # summed in order, as a list of them sums
            buckets.extend([b] * len(chunks))
            starts.append(done + np.arange(0, len(members), size))
            items.append(pids[members])
            done += len(members)
        return Batches(np.concatenate(longest), np.array(loads, float), np.array(buckets, np.int64),
                       np.r_[np.concatenate(starts), done].astype(np.int64), np.concatenate(items))

    def dispatch(self, n_instances: int) -> Slots:
        """Greedy LPT over this step's batches (longest first, each to the least-loaded instance): each planned
        prompt's instances, one per member."""
        self._load = [0.0] * n_instances
        batches = self._batches
        order = np.lexsort((-batches.load, -batches.longest))  # stable: (-longest, -load), ties in plan order
        placed = np.zeros(len(order), np.int64)
        loads = batches.load.tolist()
        for k in order.tolist():
            i = min(range(n_instances), key=self._load.__getitem__)
            self._load[i] += loads[k]
            placed[k] = i
        rank = np.empty(len(order), np.int64)
        rank[order] = np.arange(len(order))
        sizes = np.diff(batches.start)
        in_order = stable_argsort(np.repeat(rank, sizes))  # the items, batch after batch in dispatch order
        return Slots(batches.items[in_order], np.repeat(placed, sizes)[in_order])

    def priority(self, request):
        return -int(round(self._remaining(request)))

    def place(self, request, loads):
        if self._slots is None or len(self._load) != len(loads):
            self._slots = self.dispatch(len(loads))
        slot = self._slots.take_one(request.prompt_id)
        if slot is not None:
            return slot
        return self._least_loaded(request.prompt_id, request.max_tokens)

    def _least_loaded(self, prompt_id: int, budget: int) -> int:
        """A request not planned: to the instance with the least predicted load, which it adds to."""
        i = min(range(len(self._load)), key=self._load.__getitem__)
        self._load[i] += self.load(prompt_id, budget)
        return i

    # The same rules over a whole submission (the simulator's batch route): predictions as arrays, the planned slots
    # taken prompt by prompt, in request order.
    def priorities(self, requests):
        predicted = self.predictions(requests.prompt_id, requests.max_tokens)
        return -np.round(np.maximum(1.0, predicted - requests.generated)).astype(np.int64)

    def placements(self, requests, loads):
        if self._slots is None or len(self._load) != len(loads):
            self._slots = self.dispatch(len(loads))
        out = self._slots.take(requests.prompt_id)
        for j in np.flatnonzero(out < 0).tolist():  # not planned: the least-loaded instance, one after another
            out[j] = self._least_loaded(int(requests.prompt_id[j]), int(requests.max_tokens[j]))
        return out

    def end_step(self, outcome):
        self.history.update(outcome)

    def ran_blind(self):
        return self.history.blindness()

    def _remaining(self, request) -> float:
        return max(1.0, self.predicted(request.prompt_id, request.max_tokens) - request.generated)
