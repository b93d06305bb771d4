"""oracle -- knows every response's length before it is generated (simulator only).

Rule: the same prompts and budgets as the proposal; every request is placed longest-first (LPT) on
the instance with the least predicted work so far this step, and runs at a priority equal to minus
its length, so each instance starts its longest responses first. This is the classic LPT schedule,
within 4/3 of the optimal makespan for identical machines; with the per-step lower bound it brackets
what any scheduling policy can reach.
"""

from lssim.policy import Policy, PolicyNeeds


class Oracle(Policy):
    name = "oracle"

    def __init__(self):
        self._length = None
        self._work: list[int] = []

    def needs(self):
        return PolicyNeeds(oracle=True)  # ctx.oracle_length: the simulator only

    def plan(self, ctx, proposal):
        if ctx.oracle_length is None:
            raise ValueError("the oracle policy needs a world that knows lengths in advance (the simulator)")
        self._length = ctx.oracle_length
        self._work = []
        return proposal

    def _predict(self, r) -> int:
        if r.batch >= 0:  # a loader group: the engine answers it from its batch (lssim.core.Request.batch)
            return self._length(r.batch, r.prompt_id, r.batch_sample, r.max_tokens) - r.generated
        return self._length(r.step, r.prompt_id, r.sample_idx, r.max_tokens) - r.generated

    def priority(self, request):
        return -self._predict(request)

    def place(self, request, loads):
        if len(self._work) != len(loads):
            self._work = [0] * len(loads)
        # The controller places requests in priority order, i.e. longest first: greedy LPT.
        i = min(range(len(loads)), key=self._work.__getitem__)
        self._work[i] += self._predict(request)
        return i
