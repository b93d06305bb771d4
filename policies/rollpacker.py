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

Its hooks also answer over a submission's columns (on_finishes, end_rollout_at, select over rows), each rule written
once for numbers and arrays, so the simulator's cut route (lssim.sim.cut_route) makes no object per ended response.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from lssim.loop.columns import GroupBatch, gather, prompt_ids, rows_by_rid, rows_of_one, runs, stable_argsort
from lssim.loop.core import ABORT, GroupSpec, GroupSpecs, spec_columns
from lssim.loop.policy import Policy


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
        # The round's books of its finished responses: how many each group has, (rids, finish times) in finishing
        # order (a chunk per on_finishes or on_finish), and how many groups have reached their n.
        self._counts: dict[int, int] = {}
        self._finished: list[tuple] = []
        self._complete = 0

    def plan(self, ctx, proposal):
        self._counts, self._finished, self._complete, self._n, self._step = {}, [], 0, {}, ctx.step
        budget = max(0, ctx.groups_left - ctx.carried_groups)
        queued = len(self.long_queue)
        if queued and queued >= min(ctx.groups_per_step, budget):
            take = self.long_queue[:ctx.groups_per_step]
            del self.long_queue[:len(take)]
            self.long_rounds.append((ctx.step, list(take)))
            self._round, self._target = "long", len(take)
            return GroupSpecs(np.array(take, np.int64), np.full(len(take), ctx.group_size, np.int64),
                              np.full(len(take), ctx.max_tokens, np.int64))
        self._round = "short"
        base = proposal[:max(0, min(len(proposal), budget - queued))]
        self._target = len(base)
        # The run's last short round (what it trains and the queue use up the budget) is not over-provisioned:
        # prompts it sent to the queue would find no room left to train in a long round.
        ratio = self.ratio if len(base) + queued < budget else 1.0
        n_extra = math.ceil(ratio * len(base)) - len(base)
        extra = ctx.draw(n_extra) if (ctx.draw is not None and n_extra) else []
        prompt, n, max_tokens = (np.concatenate(c) for c in zip(spec_columns(base), spec_columns(extra)))
        self._n = dict(zip(prompt.tolist(), n.tolist()))
        samples = np.ceil(ratio * n).astype(np.int64)  # (math.ceil of the same double)
        if _unplaced(base) and _unplaced(extra):  # the usual plan: as columns (no GroupSpec made)
            return GroupSpecs(prompt, samples, max_tokens)
        return [GroupSpec(p, k, m, g.priority, g.instance) for p, k, m, g in
                zip(prompt.tolist(), samples.tolist(), max_tokens.tolist(), itertools.chain(base, extra))]

    @staticmethod
    def _counts_towards(reason):
        """The rule, for numbers and arrays alike: an ended response counts towards its group's n once it finished (by
        itself, by its budget, or stopped by a policy: every ending of lssim.loop.core.FINISH_REASONS but an abort)."""
        return reason != ABORT

    @staticmethod
    def _completes(place, needed):
        """The rule, for numbers and arrays alike: a group is complete at its n-th finished response (`place`: the
        response's place among its group's finished ones, from 1; `needed`: n, -1 for a group the round did not plan)."""
        return place == needed

    def _ends(self, complete):
        """The rule, for numbers and arrays alike: a short round ends once its target's groups are complete."""
        return (self._round == "short") & (complete >= self._target)

    def _needed(self, prompts: np.ndarray, unknown: np.ndarray | int = -1) -> np.ndarray:
        """n of each of `prompts` (`self._n`), `unknown` where the round did not plan it."""
        needed = np.fromiter(map(self._n.get, prompts.tolist(), itertools.repeat(-1)), np.int64, len(prompts))
        return np.where(needed >= 0, needed, unknown)  # (n >= 1: -1 is never one)

    def _completions(self, groups: np.ndarray, prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of finished responses (their groups and prompts, in finishing order, after those the books hold): those at
        which a group completes, in that order; the groups they fall in and each one's count of finished after them."""
        order = stable_argsort(groups)
        starts, sizes = runs(groups[order])
        first = order[starts]
        keys = groups[first]
        before = np.fromiter(map(self._counts.get, keys.tolist(), itertools.repeat(0)), np.int64, len(keys))
        place = np.arange(len(groups)) - np.repeat(starts - before, sizes) + 1  # in `order`
        completes = self._completes(place, np.repeat(self._needed(prompts[first]), sizes))
        return np.sort(order[completes]), keys, before + sizes

    def on_finish(self, request, state):
        if self._round != "short" or not self._counts_towards(request.finish_reason):
            return
        place = self._counts[request.group_id] = self._counts.get(request.group_id, 0) + 1
        self._finished.append(((request.rid,), (request.finish_time,)))
        self._complete += bool(self._completes(place, self._n.get(request.prompt_id, -1)))

    def on_finishes(self, ended, state):
        if self._round != "short":
            return
        finished = np.flatnonzero(self._counts_towards(ended.finish_reason))
        completions, keys, counts = self._completions(ended.group_id[finished], ended.prompt_id[finished])
        self._counts.update(zip(keys.tolist(), counts.tolist()))
        self._finished.append((ended.rid[finished], ended.finish_time[finished]))
        self._complete += len(completions)

    def end_rollout(self, state):
        return bool(self._ends(self._complete))

    def end_rollout_at(self, progress):
        ended = progress.ended
        finished = np.flatnonzero(self._counts_towards(ended.finish_reason))
        completions = finished[self._completions(ended.group_id[finished], ended.prompt_id[finished])[0]]
        complete = self._complete + np.searchsorted(completions, progress.boundary_end, side="left")
        ends = np.flatnonzero(self._ends(complete))
        return int(ends[0]) if len(ends) else -1

    def select(self, groups, step):
        """Each group that completed trains on its first n members to finish, the first `_target` groups to complete;
        the prompts of the others go to the long-prompt queue. Over rows where the groups are rows of one step's
        columns (lssim.loop.columns.GroupBatch: no Group made until one is read), each keeping the objects it held."""
        if self._round != "short":
            return groups
        one = rows_of_one(groups)
        rid, sizes = (one[0].rid[one[1]], one[2]) if one is not None else gather(groups, "rid")
        prompts = prompt_ids(groups)
        needed = self._needed(prompts, sizes)
        heard, finish_time = self._heard()
        rank = rows_by_rid(heard, np.arange(len(heard)), rid)  # each member's place in finishing order; -1: none
        chosen, counts = self._by_finish(rank, sizes)
        first = np.cumsum(counts) - counts
        complete = np.flatnonzero(counts >= needed)
        nth = chosen[first[complete] + needed[complete] - 1]  # each complete group's n-th member to finish
        trained = complete[np.argsort(finish_time[rank[nth]], kind="stable")][:self._target]
        self._defer(prompts[counts < needed])
        n = needed[trained]
        at = np.cumsum(n) - n
        picked = chosen[np.repeat(first[trained] - at, n) + np.arange(n.sum())]  # group after group
        at = at.tolist()
        member = picked - np.repeat(np.cumsum(sizes) - sizes, sizes)[picked]  # each one's place in its group
        kept = [groups[g] for g in trained.tolist()]
        if one is None:
            return [g.take(member[a:a + k]) for g, a, k in zip(kept, at, n.tolist())]
        # (a real engine's objects hold the token ids the trainer reads)
        held = [None if g.held is None else list(map(g.held.__getitem__, member[a:a + k].tolist()))
                for g, a, k in zip(kept, at, n.tolist())]
        return GroupBatch(one[0], one[1][picked], n, None if held.count(None) == len(held) else held)

    def _heard(self) -> tuple[np.ndarray, np.ndarray]:
        """The round's finished responses on_finish (or its array form) heard of: rids and finish times, in that order."""
        if not self._finished:
            return np.zeros(0, np.int64), np.zeros(0)
        rids, times = zip(*self._finished)
        return np.concatenate(rids).astype(np.int64, copy=False), np.concatenate(times).astype(float, copy=False)

    @staticmethod
    def _by_finish(rank: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The finished members (`rank`: each member's place in finishing order, -1 for none; the groups' members
        group after group, `sizes` each), as positions among them, group after group and in finishing order within
        each; how many each group has."""
        members = np.full(int(rank.max(initial=-1)) + 1, -1, np.int64)
        members[rank[rank >= 0]] = np.flatnonzero(rank >= 0)
        members = members[members >= 0]  # in finishing order
        owner = np.repeat(np.arange(len(sizes)), sizes)[members]
        return members[stable_argsort(owner)], np.bincount(owner, minlength=len(sizes))

    def _defer(self, prompts: np.ndarray) -> None:
        """The prompts of the groups that did not complete go to the long-prompt queue, once."""
        queued = set(self.long_queue)
        for pid in prompts.tolist():
            if pid not in queued:
                self.long_queue.append(pid)
                self.deferred.append((self._step, pid))
                queued.add(pid)


def _unplaced(groups) -> bool:
    """Every group of a plan at the default priority and placement (a loader batch as columns is)."""
    return (isinstance(groups, GroupSpecs) and groups.untouched) or all(g.priority == 0 and g.instance is None for g in groups)
