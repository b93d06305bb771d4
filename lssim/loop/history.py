"""What a prompt's past responses say about its next one: the length history policies predict from.

Learned only from what a policy is told at the end of each step (`StepOutcome`), so it works the same in
the simulator and on vLLM; no oracle. Several policies keep one (lpt, ebs, segment):

    history = LengthHistory()
    history.update(outcome)                   # in end_step
    history.mean(prompt_id)                   # expected length, or None if the prompt was never seen
    history.mean_square(prompt_id)            # expected squared length (the KV a response reads grows so)
    history.remaining(prompt_id, generated)   # expected tokens still to come for a response this far along
    history.revisited                         # prompts met again: 0 means every prediction was the global mean
    history.means(prompt_ids)                 # the same as arrays over many prompts (NaN: never seen), for a
    history.mean_squares(prompt_ids)          #   step's plan on the simulator's batch route
    history.remainings(prompt_ids, generated) # `remaining` over arrays of (prompt, tokens) pairs (NaN: cannot say)

The lengths are kept as arrays (a row per prompt: its latest `keep` lengths in a ring, and their exact integer sums),
so a step's update and a plan's predictions are a few numpy calls, not a loop over responses; every answer is the
one a list of the prompt's lengths gives (integer sums, one division).

Only responses that ended by themselves or by their budget count (a response stopped by a policy or dropped
at the end of a rollout says nothing about where it would have ended). A truncated response counts at its
budget: a lower bound of its natural length, which is all anyone can know.
"""

from __future__ import annotations

import numpy as np

from lssim.loop.columns import runs, stable_argsort
from lssim.loop.core import LENGTH, STOP
from lssim.loop.prompt_rows import PromptRows, grown


class LengthHistory:
    """Per prompt, the lengths of its latest `keep` responses; and the mean over every response seen."""

    def __init__(self, keep: int = 32):
        if keep < 1:
            raise ValueError(f"LengthHistory: keep must be >= 1, got {keep}")
        self.keep = keep
        self._rows = PromptRows()  # prompt -> its row in the arrays below
        self._ring = np.zeros((0, keep), np.int64)  # a row's lengths, the n-th one seen at n % keep (0: no length yet)
        self._seen = np.zeros(0, np.int64)  # lengths a row has seen (its ring holds the latest min(seen, keep))
        self._sum = np.zeros(0, np.int64)  # the sum of a row's ring, and of its squares (exact integers)
        self._sum_sq = np.zeros(0, np.int64)
        self._total = 0.0
        self._total_sq = 0.0
        self._count = 0
        self.revisited = 0  # prompts whose responses ended in a step after one where some had ended already

    def __setstate__(self, state: dict) -> None:
        lengths = state.pop("_lengths", None)  # a checkpoint written when each prompt's lengths were a deque
        state.setdefault("revisited", 0)  # a checkpoint from before it was counted
        if lengths is None:
            self.__dict__.update(state)
            return
        self.__init__(state["keep"])
        for pid, q in lengths.items():  # oldest first, as the deque holds them
            self._add(self._rows_adding(np.array([pid] * len(q), np.int64)), np.array(list(q), np.int64))
        self._total, self._total_sq, self._count = state["_total"], state["_total_sq"], state["_count"]

    def update(self, outcome) -> None:
        """Remember the natural lengths of the responses that ended in a step (a `StepOutcome`)."""
        if len(outcome.prompt_id) == 0:
            return
        reason = outcome.finish_reason
        natural = (reason == STOP) | (reason == LENGTH)
        pids, lens = outcome.prompt_id[natural].astype(np.int64), outcome.response_len[natural].astype(np.int64)
        if len(pids):
            known = len(self._rows)  # rows below it: prompts seen in an earlier step
            rows = self._rows_adding(pids)
            self.revisited += len(np.unique(rows[rows < known]))
            self._add(rows, lens)
        self._total += float(int(lens.sum()))
        self._total_sq += float(int((lens * lens).sum()))
        self._count += len(lens)

    def _rows_adding(self, pids: np.ndarray) -> np.ndarray:
        """The rows of `pids`, with a new row for each prompt never seen."""
        rows = self._rows.add(pids)
        n = len(self._rows)
        self._ring, self._seen, self._sum, self._sum_sq = (grown(a, n) for a in (self._ring, self._seen, self._sum, self._sum_sq))
        return rows

    def _add(self, rows: np.ndarray, lens: np.ndarray) -> None:
        """Append each length to its row's ring, in order (as a deque of maxlen `keep` would), and refresh the sums."""
        order = stable_argsort(rows)
        sorted_rows = rows[order]
        starts, sizes = runs(sorted_rows)
        rank = np.arange(len(rows)) - np.repeat(starts, sizes)  # its place among the step's lengths of its row
        last = rank >= np.repeat(sizes, sizes) - self.keep  # only a row's latest `keep` lengths stay in its ring
        touched = sorted_rows[starts]
        slot = (self._seen[sorted_rows] + rank) % self.keep
        self._ring[sorted_rows[last], slot[last]] = lens[order][last]  # distinct (row, slot) pairs
        self._seen[touched] += sizes
        ring = self._ring[touched]
        self._sum[touched] = ring.sum(axis=1)
        self._sum_sq[touched] = (ring * ring).sum(axis=1)

    def blindness(self) -> str | None:
        """Why predictions from this history could not tell prompts apart (no prompt met again once some of its
        responses had ended: each was the mean over all responses, or the budget), None once one was met again.
        The policies that predict from it say so (PolicyHooks.ran_blind): on a trace whose prompts never repeat,
        such a policy runs as if blind."""
        if self.revisited:
            return None
        return (f"no prompt came back once its responses had ended ({len(self)} prompts seen once), so every length "
                "it predicted was the mean over all responses seen (or the budget): it needs prompts that recur")

    def known(self, prompt_id: int) -> bool:
        return prompt_id in self._rows.row

    def __len__(self) -> int:
        return len(self._rows)

    def _held(self, row: int) -> int:
        return min(int(self._seen[row]), self.keep)

    def mean(self, prompt_id: int) -> float | None:
        """The prompt's expected response length (mean of its recent responses); None if never seen."""
        row = self._rows.row.get(prompt_id)
        return None if row is None else int(self._sum[row]) / self._held(row)

    def mean_square(self, prompt_id: int) -> float | None:
        """The prompt's expected squared response length (a long tail weighs in); None if never seen."""
        row = self._rows.row.get(prompt_id)
        return None if row is None else int(self._sum_sq[row]) / self._held(row)

    def means(self, prompt_ids: np.ndarray) -> np.ndarray:
        """`mean` of each prompt, NaN for a prompt never seen."""
        return self._per_prompt(self._sum, prompt_ids)

    def mean_squares(self, prompt_ids: np.ndarray) -> np.ndarray:
        """`mean_square` of each prompt, NaN for a prompt never seen."""
        return self._per_prompt(self._sum_sq, prompt_ids)

    def _per_prompt(self, sums: np.ndarray, prompt_ids: np.ndarray) -> np.ndarray:
        rows = self._rows.find(prompt_ids)
        known = rows >= 0
        if not known.any():
            return np.full(len(rows), np.nan)
        safe = np.where(known, rows, 0)
        # exact integer sums over each prompt's count, one correctly rounded division (as sum(list) / len(list))
        return np.where(known, sums[safe] / np.minimum(self._seen[safe], self.keep), np.nan)

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
        row = self._rows.row.get(prompt_id)
        if row is None:
            return None
        held = self._ring[row, :self._held(row)]
        longer = held[held > generated].tolist()
        return sum(longer) / len(longer) - generated if longer else None

    def remainings(self, prompt_ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """`remaining` of each (prompt, tokens generated) pair, NaN where it is None (segment's carries, decided for
        a whole submission on the simulator's batch kernels): the same sums and one division, over arrays (the scalar
        form stays a few Python operations: the event route asks it a response at a time)."""
        rows = self._rows.find(np.asarray(prompt_ids, np.int64))
        generated = np.asarray(generated, np.int64)
        known = rows >= 0
        if not known.any():
            return np.full(len(rows), np.nan)
        safe = np.where(known, rows, 0)
        ring = self._ring[safe]  # a row per pair: its prompt's ring, the first `held` slots its lengths
        held = np.where(known, np.minimum(self._seen[safe], self.keep), 0)
        longer = (ring > generated[:, None]) & (np.arange(self.keep) < held[:, None])
        count = longer.sum(axis=1)
        total = np.where(longer, ring, 0).sum(axis=1)  # exact integers, then one division (as sum(list) / len(list))
        return np.where(count > 0, total / np.maximum(count, 1) - generated, np.nan)
