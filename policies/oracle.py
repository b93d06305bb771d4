"""oracle -- knows every response's length before it is generated (simulator only).

Rule: the same prompts and budgets as the proposal; every request is placed longest-first (LPT) on
the instance with the least predicted work so far this step, and runs at a priority equal to minus
its length, so each instance starts its longest responses first. This is the classic LPT schedule,
within 4/3 of the optimal makespan for identical machines; with the per-step lower bound it brackets
what any scheduling policy can reach.
"""

import numpy as np

from lssim.sim.assign import least_work
from lssim.loop.columns import rid_order
from lssim.loop.policy import Policy, PolicyNeeds


class Oracle(Policy):
    name = "oracle"

    def __init__(self):
        self._length = None
        self._work: list[int] = []
        self._asked = None  # (rids sorted, their predictions, tokens generated) from the last `priorities`

    def needs(self):
        return PolicyNeeds(oracle=True)  # ctx.oracle_length: the simulator only

    def plan(self, ctx, proposal):
        if ctx.oracle_length is None:
            raise ValueError("the oracle policy needs a world that knows lengths in advance (the simulator)")
        self._length = ctx.oracle_length
        self._work = []
        return proposal

    def _predict(self, r) -> int:
        step, sample = self._length.key(r)  # lssim.loop.contracts.OracleLength: asks as the engine does
        return self._length(step, r.prompt_id, sample, r.max_tokens) - r.generated

    def priority(self, request):
        return -self._predict(request)

    def place(self, request, loads):
        if len(self._work) != len(loads):
            self._work = [0] * len(loads)
        # The controller places requests in priority order, i.e. longest first: greedy LPT.
        i = min(range(len(loads)), key=self._work.__getitem__)
        self._work[i] += self._predict(request)
        return i

    # The same rules over a whole submission (the simulator's batch route): one lookup, one LPT loop.
    def _predict_many(self, requests) -> np.ndarray:
        step, sample = self._length.keys(requests)
        return self._length.many(step, requests.prompt_id, sample, requests.max_tokens) - requests.generated

    def priorities(self, requests):
        predicted = self._predict_many(requests)
        by_rid = rid_order(requests.rid)
        self._asked = (requests.rid[by_rid], predicted[by_rid], requests.generated[by_rid])  # placements asks them again
        return -predicted

    def placements(self, requests, loads):
        if len(self._work) != len(loads):
            self._work = [0] * len(loads)
        work = np.array(self._work, np.int64)
        out = least_work(work, self._predicted_again(requests))
        self._work = work.tolist()
        return out

    def _predicted_again(self, requests) -> np.ndarray:
        """What `priorities` predicted for these requests (the controller asks both of one submission, reordered),
        else a fresh prediction."""
        asked, self._asked = self._asked, None
        if asked is not None and len(asked[0]) == len(requests):
            rids, predicted, generated = asked
            by_rid = rid_order(requests.rid)  # (one sort: cheaper than a search per request)
            if (requests.rid[by_rid] == rids).all() and (requests.generated[by_rid] == generated).all():
                out = np.empty_like(predicted)
                out[by_rid] = predicted
                return out
        return self._predict_many(requests)
