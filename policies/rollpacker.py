"""rollpacker -- tail batching (RollPacker, Gao et al., NSDI '26, arXiv 2509.21009).

Source: most steps are "short rounds" that launch more prompts, and more responses per prompt, than training
needs (eta * P0 prompts of eta * R0 responses) and keep the first to complete; the prompts that did not make
it are the ones that would have produced the long tail. They wait in a long-prompt queue and, once it holds a
batch, run together in a "long round" with no over-provisioning, so that synchronous training stays on-policy
(every response is generated from scratch by the weights of the step that trains on it).

Rule:
- Short round: the proposal's P0 groups plus ceil(ratio * P0) - P0 more from the data loader (`ctx.draw`),
  each with R = ceil(ratio * n) samples instead of n. The rollout ends (`end_rollout`) as soon as P0 prompts
  have n finished responses each. `select` trains on those P0 prompts, each on the first n of its responses
  to finish (a subset of the group). Prompts with fewer than n finished responses go to the long-prompt
  queue; their responses still running are dropped now (finish reason `abort`, stop reason "rollout ended")
  and none of their tokens train.
- Long round: when the queue holds a batch (P0 prompts, or all the groups the run has left to train), those
  prompts run again from scratch with n samples and the full budget, and the rollout waits for all of them.
- At the end of a run a short round trains fewer than P0 groups, to leave room for the queued prompts, and
  the last one is not over-provisioned: every prompt sent to the queue comes back in a long round, and the
  run trains on as many groups as any other policy.

Costs: the responses dropped (and the over-provisioned samples never trained) are compute spent for nothing
(the summary's dropped count); picking the first n of R to finish biases a short round's groups towards
shorter responses, as RollPacker's race to completion does.

Defaults: ratio=1.25 (RollPacker's eta for both prompts and responses per prompt).
"""

from __future__ import annotations

import math

import numpy as np

from lssim.loop.core import LENGTH, POLICY_STOP, STOP, Group, GroupSpec
from lssim.loop.policy import Policy

_FINISHED = (STOP, LENGTH, POLICY_STOP)


class RollPacker(Policy):
    name = "rollpacker"

    def __init__(self, ratio: float = 1.25):
        if not 1.0 <= ratio <= 4.0:
            raise ValueError(f"rollpacker: ratio must be in [1, 4], got {ratio}")
        self.ratio = ratio
        self.long_queue: list[int] = []  # prompts waiting for a long round
        self.deferred: list[tuple[int, int]] = []  # (step, prompt) sent to the queue, for reports and tests
        self.long_rounds: list[tuple[int, list[int]]] = []  # (step, prompts) of each long round so far
        self._step = 0
        self._round = "short"
        self._target = 0  # groups to train this round
        self._n: dict[int, int] = {}  # prompt -> responses it needs (its nominal group size)
        self._finished: dict[int, list] = {}  # group -> its finished members, in finishing order
        self._complete = 0

    def plan(self, ctx, proposal):
        self._finished, self._complete, self._n, self._step = {}, 0, {}, ctx.step
        budget = max(0, ctx.groups_left - ctx.carried_groups)
        queued = len(self.long_queue)
        if queued and queued >= min(ctx.groups_per_step, budget):
            take = self.long_queue[:ctx.groups_per_step]
            del self.long_queue[:len(take)]
            self.long_rounds.append((ctx.step, list(take)))
            self._round, self._target = "long", len(take)
            return [GroupSpec(pid, ctx.group_size, ctx.max_tokens) for pid in take]
        self._round = "short"
        base = proposal[:max(0, min(len(proposal), budget - queued))]
        self._target = len(base)
        # The run's last short round (what it trains and the queue use up the budget) is not over-provisioned:
        # prompts it sent to the queue would find no room left to train in a long round.
        ratio = self.ratio if len(base) + queued < budget else 1.0
        n_extra = math.ceil(ratio * len(base)) - len(base)
        extra = ctx.draw(n_extra) if (ctx.draw is not None and n_extra) else []
        plan = []
        for g in base + extra:
            self._n[g.prompt_id] = g.n_samples
            plan.append(GroupSpec(g.prompt_id, math.ceil(ratio * g.n_samples), g.max_tokens, g.priority, g.instance))
        return plan

    def on_finish(self, request, state):
        if self._round != "short" or request.finish_reason not in _FINISHED:
            return
        done = self._finished.setdefault(request.group_id, [])
        done.append(request)
        if len(done) == self._n.get(request.prompt_id, len(done) + 1):
            self._complete += 1

    def _ends(self, complete):
        """The rule, for numbers and arrays alike: a short round ends once its target's groups are complete."""
        return (self._round == "short") & (complete >= self._target)

    def end_rollout(self, state):
        return bool(self._ends(self._complete))

    def end_rollout_at(self, progress):
        ended = progress.ended
        finished = np.flatnonzero(np.isin(ended.finish_reason, list(_FINISHED)))
        group = ended.group_id[finished]
        by_group = np.argsort(group, kind="stable")
        sorted_group, at = group[by_group], np.arange(len(finished))
        first = np.maximum.accumulate(np.where(np.r_[True, sorted_group[1:] != sorted_group[:-1]], at, 0))
        count = np.empty(len(finished), np.int64)  # each finished member's place in its group, from 1 (on_finish's len(done))
        count[by_group] = at - first + 1
        needed = np.fromiter((self._n.get(p, -1) for p in ended.prompt_id[finished].tolist()), np.int64, len(finished))
        completions = finished[count == needed]  # where each group's n-th finished member ended, in order
        complete = self._complete + np.searchsorted(completions, progress.boundary_end, side="left")
        ends = np.flatnonzero(self._ends(complete))
        return int(ends[0]) if len(ends) else -1

    def select(self, groups, step):
        if self._round != "short":
            return groups
        complete, queued = [], set(self.long_queue)
        for g in groups:
            n = self._n.get(g.prompt_id, len(g.requests))
            done = [r for r in self._finished.get(g.requests[0].group_id, []) if r.finish_reason in _FINISHED]
            if len(done) >= n:
                complete.append((done[n - 1].finish_time, Group(g.prompt_id, g.step, done[:n])))
            elif g.prompt_id not in queued:
                self.long_queue.append(g.prompt_id)
                self.deferred.append((self._step, g.prompt_id))
                queued.add(g.prompt_id)
        complete.sort(key=lambda item: item[0])
        return [group for _, group in complete[:self._target]]
