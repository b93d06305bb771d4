"""lpt -- longest predicted first onto the least-loaded instance: a placement rule for any policy.

Source: Graham's LPT list scheduling ("Bounds on multiprocessing timing anomalies", 1969; within 4/3 of the
optimal makespan on identical machines), which `oracle` runs with the true lengths. Here the lengths are
predicted from history, as RhymeRL and HADB do: a prompt's responses are about as long as its past ones.

Rule:
- Prediction: a request's remaining length is its prompt's mean past response length (lssim.loop.history, learned
  in end_step from what ended) minus what it has generated, at least 1; a prompt never seen gets the mean over
  every response seen so far, and before anything has been seen, its budget. No oracle: it runs on vLLM too.
- Order: priority = minus the predicted remaining length, so the controller places the requests longest
  first and each instance admits its longest first.
- Placement: each request goes to the instance with the least predicted outstanding work this step (the sum
  of the predicted remaining lengths of the requests placed there that have not ended). A request placed
  again (requeued, or carried into a new step) is taken off its old instance's account first.

Composes as a placement rule: `lpt+x` places and orders every request by prediction whatever x does to
plans and budgets. In `x+lpt` a priority set by x comes first (the first priority opinion wins) and lpt
places in x's order (list scheduling, no longer longest first); a placement by x likewise wins.

Defaults: keep=32 (responses remembered per prompt).
"""

from __future__ import annotations

import numpy as np

from lssim.loop.history import LengthHistory
from lssim.sim.assign import least_work
from lssim.loop.policy import Policy


class LPT(Policy):
    name = "lpt"

    def __init__(self, keep: int = 32):
        self.keep = keep
        self.history = LengthHistory(keep)
        self._work: list[float] = []
        self._placed: dict[int, tuple[int, float]] = {}  # rid -> (instance, predicted work put there)

    def predicted_remaining(self, request) -> float:
        total = self.history.predict(request.prompt_id, default=request.max_tokens)
        return max(1.0, min(total, request.max_tokens) - request.generated)

    def predicted_remainings(self, requests) -> np.ndarray:
        """predicted_remaining of every request (lssim.loop.columns.RequestColumns), asked once per prompt."""
        prompts, inverse = np.unique(requests.prompt_id, return_inverse=True)
        total = np.array([self.history.predict(p, default=np.nan) for p in prompts.tolist()], float)[inverse]
        total = np.where(np.isnan(total), requests.max_tokens, total)  # nothing seen yet: the budget
        return np.maximum(1.0, np.minimum(total, requests.max_tokens) - requests.generated)

    def plan(self, ctx, proposal):
        self._work, self._placed = [], {}  # a new step: every instance's account starts empty
        return proposal

    def priority(self, request):
        return -int(round(self.predicted_remaining(request)))

    def priorities(self, requests):
        return -np.round(self.predicted_remainings(requests)).astype(np.int64)  # round half to even, as round()

    def place(self, request, loads):
        if len(self._work) != len(loads):
            self._work, self._placed = [0.0] * len(loads), {}
        self._forget(request.rid)
        i = min(range(len(loads)), key=self._work.__getitem__)
        amount = self.predicted_remaining(request)
        self._work[i] += amount
        self._placed[request.rid] = (i, amount)
        return i

    def placements(self, requests, loads):
        if len(self._work) != len(loads):
            self._work, self._placed = [0.0] * len(loads), {}
        rids = requests.rid.tolist()
        for rid in rids:
            self._forget(rid)
        amounts = self.predicted_remainings(requests)
        work = np.array(self._work, float)
        chosen = least_work(work, amounts)  # `place`'s loop, request after request
        self._work = work.tolist()
        self._placed.update(zip(rids, zip(chosen.tolist(), amounts.tolist())))
        return chosen

    def on_finish(self, request, state):
        self._forget(request.rid)

    def on_finishes(self, ended, state):
        for rid in ended.rid.tolist():
            self._forget(rid)

    def _forget(self, rid: int) -> None:
        old = self._placed.pop(rid, None)
        if old is not None:
            self._work[old[0]] -= old[1]

    def end_step(self, outcome):
        self.history.update(outcome)

    def ran_blind(self):
        return self.history.blindness()
