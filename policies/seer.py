"""seer -- divided rollout and context-aware scheduling (Seer, Qin et al. 2025, arXiv 2511.14617).

Source: Seer splits each group into its requests and each request into chunks that go back to a global
scheduler one at a time, so a long response can move to a lightly loaded instance between chunks ("divided
rollout"); it runs one request of each group first as a probe to learn the group's length (members of a
group have similar lengths), and schedules the rest longest-first by that estimate ("context-aware
scheduling", an approximation of the longest-first schedule an oracle would run; the paper reports 96% of
an oracle longest-first scheduler's throughput). Its third part, grouped speculative decoding, is
`spec_tail`'s business here (compose them: `seer+spec_tail`).

Rule:
- Chunks: a progress checkpoint every `chunk` tokens (the request's next chunk is `min(chunk, what is left of
  its budget)`). At a checkpoint the request is requeued (Action.requeue: the controller aborts it and
  resubmits it in the same step, with its new priority and no instance, so placement picks one) when its
  instance holds at least `rebalance` more of this policy's requests than the least-loaded one (at least 2,
  so that a move makes things better rather than swapping which instance is ahead); otherwise it keeps
  running where it is. `every_chunk=True` is the paper's literal rule: every chunk goes back to the
  scheduler. The simulator charges a requeued request the prefill of its prompt and everything generated so
  far (lssim.sim.world); on vLLM, prefix caching keeps that prefix's KV on the instance, so a requeue that stays
  on its instance is nearly free and one that moves pays the prefill (Seer avoids even that with a global
  KV pool, which neither world here has).
- Placement: the instance with the fewest of this policy's requests (placed there and not yet ended).
- Probe: the first member of each group is its probe: it runs ahead of everything else, shortest-first
  by tokens generated (priority = probe band + generated).
- Estimate: a group's length estimate is its longest finished member so far; until one finishes, the
  prompt's mean length in earlier steps (lssim.loop.history, learned in end_step), and for a prompt never seen,
  the budget.
- Other members run longest-first by their group's estimate (priority = -estimate). Starvation guard: a
  request that has started (resumed after a requeue) runs ahead of members that have not (but behind the
  probes), so a requeue never sends a half-done response to the back of a queue it may never leave while
  fresh long-estimate work keeps arriving.
- Limitation: an engine queues a request at the priority it was submitted with, and a policy hears of a
  waiting request only once it runs, so a member queued before its probe finished keeps the estimate it
  had then (its prompt's history) until its first chunk boundary. Seer's global scheduler re-ranks waiting
  chunks as estimates arrive; doing that here needs the controller to let a policy requeue waiting requests.

Defaults: chunk=2048 tokens, rebalance=2, every_chunk=False.

On the simulator seer runs on the requeue route (lssim.sim.requeue_route): a requeue moves a running response to
another instance at its checkpoint's time, and where it is admitted there depends on both instances' clocks, so one
numba kernel runs the event engine's multi-instance loop with these rules inside it. `rank` and `moves`
(lssim.sim.requeue_rules) are the rules on numbers and arrays alike: the hooks below call them, the kernel runs them
compiled; `priorities`, `placements`, `on_finishes` and `progress_requeues` are the hooks' array forms. A subclass
that changes a hook runs event by event (Policy.requeues_in_batches).
"""

from __future__ import annotations

import numpy as np

from lssim.loop.core import LENGTH, STOP
from lssim.loop.history import LengthHistory
from lssim.loop.policy import Action, Policy
from lssim.sim.requeue_rules import RequeueRules, moves, rank

__all__ = ["Seer", "rank", "moves"]


class Seer(Policy):
    name = "seer"

    def __init__(self, chunk: int = 2048, rebalance: int = 2, every_chunk: bool = False):
        if not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"seer: chunk must be an int >= 1, got {chunk!r}")
        if not isinstance(rebalance, int) or rebalance < 2:
            raise ValueError(f"seer: rebalance must be an int >= 2, got {rebalance!r}")
        self.chunk, self.rebalance, self.every_chunk = chunk, rebalance, bool(every_chunk)
        self.progress_interval = chunk
        self._estimate: dict[int, int] = {}  # group -> longest finished member so far
        self._past: dict[tuple, int] = {}  # (prompt, budget) -> its estimate from earlier steps, asked once a step
        self._probe: dict[int, int] = {}  # group -> rid of its probe
        self._count: list[int] = []  # instance -> this policy's requests on it, not yet ended
        self._where: dict[int, int] = {}  # rid -> instance
        self.history = LengthHistory()

    def plan(self, ctx, proposal):
        self._estimate, self._past, self._probe, self._count, self._where = {}, {}, {}, [], {}
        return proposal

    def estimate(self, request) -> int:
        """The request's group's length estimate: its longest finished member, else its prompt's mean length
        in earlier steps, else the budget."""
        known = self._estimate.get(request.group_id)
        if known is not None:
            return known
        key = (request.prompt_id, request.max_tokens)  # the history moves only in end_step
        past = self._past.get(key)
        if past is None:
            mean = self.history.mean(request.prompt_id)
            past = self._past[key] = request.max_tokens if mean is None else int(round(min(mean, request.max_tokens)))
        return past

    def moves(self, here, least):
        """At a chunk boundary, whether a request goes back to the scheduler: its instance holds `here` of this
        policy's requests and the least-loaded one `least` (numbers, or arrays elementwise)."""
        return moves(here, least, self.rebalance, self.every_chunk)

    def priority(self, request):
        probe = self._probe.setdefault(request.group_id, request.rid) == request.rid
        return rank(probe, request.generated, 0 if probe else self.estimate(request))

    def place(self, request, loads):
        if len(self._count) != len(loads):
            self._count, self._where = [0] * len(loads), {}
        count = self._count
        self._leave(request.rid)
        least = min(count)
        i = count.index(least)
        if count.count(least) > 1:  # a tie: the least busy of them, then the first
            i = min((j for j, c in enumerate(count) if c == least), key=lambda j: loads[j].running + loads[j].waiting)
        count[i] += 1
        self._where[request.rid] = i
        return i

    def on_progress(self, request, state):
        i = self._where.get(request.rid)
        if i is None:  # placed by another policy: it keeps its place
            return None
        if not self.moves(self._count[i], min(self._count)):
            return None
        return Action.requeue(priority=self.priority(request), instance=None, reason="seer: next chunk")

    def on_finish(self, request, state):
        self._leave(request.rid)
        if request.finish_reason in (STOP, LENGTH):
            g = request.group_id
            self._estimate[g] = max(self._estimate.get(g, 0), request.generated)

    # -- array forms (the simulator's requeue route) ----------------------------------------------------------
    def priorities(self, requests):
        probe = self._probes(requests, first=True)
        estimate = np.zeros(len(requests), np.int64)
        estimate[~probe] = self._estimates(requests, np.flatnonzero(~probe))  # (asked for members only, as priority)
        return np.asarray(rank(probe, requests.generated, estimate), np.int64)

    def placements(self, requests, loads):
        if len(self._count) != len(loads):
            self._count, self._where = [0] * len(loads), {}
        rids = requests.rid.tolist()
        busy = {load.running + load.waiting for load in loads}
        if len(set(self._count)) > 1 or len(busy) > 1 or not self._where.keys().isdisjoint(rids):
            return super().placements(requests, loads)  # place, request after request
        # every instance as loaded as the next: `place` picks the first of the least, in turn
        chosen = np.arange(len(rids)) % len(loads)
        self._count = [c + k for c, k in zip(self._count, np.bincount(chosen, minlength=len(loads)).tolist())]
        self._where.update(zip(rids, chosen.tolist()))
        return chosen

    def on_finishes(self, ended, state):
        rids, where = ended.rid.tolist(), self._where
        if len(rids) == len(where) and where.keys() == set(rids):  # every request it placed ended: all leave at once
            left = np.bincount(np.fromiter(where.values(), np.int64, len(where)), minlength=len(self._count))
            self._count = [c - k for c, k in zip(self._count, left.tolist())]
            where.clear()
        else:
            for rid in rids:
                self._leave(rid)
        learn = (ended.finish_reason == STOP) | (ended.finish_reason == LENGTH)
        groups, inverse = np.unique(ended.group_id[learn], return_inverse=True)
        longest = np.zeros(len(groups), np.int64)
        np.maximum.at(longest, inverse, ended.generated[learn])
        estimate = self._estimate
        for g, n in zip(groups.tolist(), longest.tolist()):
            estimate[g] = max(estimate.get(g, 0), n)

    def progress_requeues(self, requests):
        probe = self._probes(requests)
        known = np.fromiter(map(self._estimate.__contains__, requests.group_id.tolist()), bool, len(requests))
        estimate = np.zeros(len(requests), np.int64)
        estimate[~probe] = self._estimates(requests, np.flatnonzero(~probe))
        return RequeueRules(probe=probe, estimate=estimate, known=known & ~probe, counts=np.array(self._count, np.int64),
                            rebalance=self.rebalance, every_chunk=self.every_chunk)

    def _probes(self, requests, first: bool = False) -> np.ndarray:
        """Which rows are their group's probe; `first`: a group's first row asked is its probe unless it has one
        (priority's setdefault, row after row)."""
        groups, at, inverse = np.unique(requests.group_id, return_index=True, return_inverse=True)
        firsts = requests.rid[at].tolist()
        probes = np.array([self._probe.setdefault(g, rid) if first else self._probe.get(g, -1)
                           for g, rid in zip(groups.tolist(), firsts)], np.int64)
        return requests.rid == probes[inverse]

    def _estimates(self, requests, rows: np.ndarray) -> np.ndarray:
        """`estimate` of each of `rows`: its group's where known, else its (prompt, budget)'s, each asked once."""
        out = np.full(len(rows), -1, np.int64)
        if self._estimate:
            groups, inverse = np.unique(requests.group_id[rows], return_inverse=True)
            out = np.array([self._estimate.get(g, -1) for g in groups.tolist()], np.int64)[inverse]
        rest = rows[out < 0]
        prompts, budgets = requests.prompt_id[rest], requests.max_tokens[rest]
        span = int(budgets.max()) + 1 if len(rest) else 1
        keys, inverse = np.unique(prompts * span + budgets, return_inverse=True)  # (prompt, budget) as one int
        pairs = (keys // span).tolist(), (keys % span).tolist()
        past = self._past
        values = [past.get(key) for key in zip(*pairs)]
        for j, (prompt, budget) in enumerate(zip(*pairs)):
            if values[j] is None:
                mean = self.history.mean(prompt)
                values[j] = past[(prompt, budget)] = budget if mean is None else int(round(min(mean, budget)))
        out[out < 0] = np.array(values, np.int64)[inverse.ravel()]
        return out

    def end_step(self, outcome):
        self.history.update(outcome)

    def _leave(self, rid: int) -> None:
        i = self._where.pop(rid, None)
        if i is not None:
            self._count[i] -= 1
