"""`check_policy`: run anyone's policy through the contract, as Gymnasium's `check_env` does for an Env.

    from lssim.loop.checks import check_policy
    check_policy(MyPolicy())          # raises PolicyCheckError naming the hook and what it did wrong

It replays a small synthetic trace in the simulator with the policy wrapped in a checker that
validates every hook's answer and verifies that no hook changed a request it was shown; then it
checks that the books balance and that two runs with the same seed agree.
"""

from __future__ import annotations

import copy
from dataclasses import fields

import pandas as pd

from lssim.loop.columns import GroupBatch
from lssim.loop.core import Group, GroupSpec, GroupSpecs, Request
from lssim.loop.policy import CARRY, DROP, Action, Policy, PolicyNeeds, StepOutcome, TrainMask


class PolicyCheckError(AssertionError):
    pass


_REQUEST_FIELDS = [f.name for f in fields(Request) if f.name not in ("signals", "tokens")]


def _snapshot(r: Request) -> tuple:
    return tuple(getattr(r, name) for name in _REQUEST_FIELDS)


class _Checked(Policy):
    """Delegates every hook to `inner` and checks the answer."""

    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = inner.name
        self.progress_interval = inner.progress_interval
        if self.progress_interval is not None and (not isinstance(self.progress_interval, int) or self.progress_interval < 1):
            raise PolicyCheckError(f"{inner.name}: progress_interval must be a positive int or None, got {self.progress_interval!r}")
        self._needs = inner.needs()
        if not isinstance(self._needs, PolicyNeeds):
            raise PolicyCheckError(f"{inner.name}: needs() must return an lssim.loop.policy.PolicyNeeds, got {self._needs!r}")

    def needs(self) -> PolicyNeeds:
        return self._needs

    def overrides(self, hook: str) -> bool:
        return self.inner.overrides(hook)

    def _fail(self, hook: str, problem: str):
        raise PolicyCheckError(f"{self.inner.name}.{hook}: {problem}")

    def _unchanged(self, hook: str, requests, call):
        before = [_snapshot(r) for r in requests]
        out = call()
        for r, snap in zip(requests, before):
            if _snapshot(r) != snap:
                changed = [n for n, a, b in zip(_REQUEST_FIELDS, snap, _snapshot(r)) if a != b and a == a]
                if changed:
                    self._fail(hook, f"changed request {r.rid}'s {', '.join(changed)} (requests are read-only to policies)")
        return out

    def plan(self, ctx, proposal):
        plan = self.inner.plan(ctx, list(proposal))
        if not isinstance(plan, (list, GroupSpecs)) or not all(isinstance(g, GroupSpec) for g in plan):
            self._fail("plan", f"must return a list of GroupSpec, got {type(plan).__name__}")
        pool = set(ctx.pool.prompt_id.tolist())
        for g in plan:
            if g.prompt_id not in pool:
                self._fail("plan", f"asked for prompt {g.prompt_id}, which is not in the pool")
        return plan

    def priority(self, request):
        p = self._unchanged("priority", [request], lambda: self.inner.priority(request))
        if p is not None and not isinstance(p, int):
            self._fail("priority", f"must return an int or None, got {p!r}")
        return p

    def place(self, request, loads):
        i = self._unchanged("place", [request], lambda: self.inner.place(request, loads))
        if i is not None and not (isinstance(i, int) and 0 <= i < len(loads)):
            self._fail("place", f"must return an instance index in [0, {len(loads)}) or None, got {i!r}")
        return i

    def on_progress(self, request, state):
        a = self._unchanged("on_progress", [request], lambda: self.inner.on_progress(request, state))
        if a is not None and not (isinstance(a, Action) and a.kind in ("stop", "carry", "requeue")):
            self._fail("on_progress", f"must return an Action (Action.stop / carry / requeue) or None, got {a!r}")
        return a

    def on_finish(self, request, state):
        self._unchanged("on_finish", [request], lambda: self.inner.on_finish(request, state))

    def end_rollout(self, state):
        done = self.inner.end_rollout(state)
        if not isinstance(done, bool):
            self._fail("end_rollout", f"must return a bool, got {done!r}")
        return done

    def top_up(self, state):
        more = self.inner.top_up(state)
        if not isinstance(more, (list, GroupSpecs)) or not all(isinstance(g, GroupSpec) for g in more):  # (ctx.draw's)
            self._fail("top_up", f"must return a list of GroupSpec, got {more!r}")
        return more

    def on_unfinished(self, request):
        d = self._unchanged("on_unfinished", [request], lambda: self.inner.on_unfinished(request))
        if d not in (CARRY, DROP):
            self._fail("on_unfinished", f"must return 'carry' or 'drop', got {d!r}")
        return d

    def select(self, groups, step):
        members = [r for g in groups for r in g.requests]
        chosen = self._unchanged("select", members, lambda: self.inner.select(list(groups), step))
        # (a GroupBatch: groups over one step's columns, as the batch route gives them)
        if not isinstance(chosen, (list, GroupBatch)) or not all(isinstance(g, Group) for g in chosen):
            self._fail("select", f"must return a list of Group or a GroupBatch, got {type(chosen).__name__}")
        # A chosen group is one it was given, or a subset of one (e.g. n of the R samples of a group). Its
        # members are the requests given, or copies of them that differ in the reward only (reward shaping:
        # `dataclasses.replace(r, reward=...)`, never a change to the request itself).
        given = {r.rid: (id(g), r) for g in groups for r in g.requests}
        seen: set[int] = set()
        for g in chosen:
            owners = {given[r.rid][0] if r.rid in given else None for r in g.requests}
            if not g.requests or None in owners or len(owners) != 1:
                self._fail("select", "returned a group that is neither one it was given nor a subset of one")
            for r in g.requests:
                original = given[r.rid][1]
                if r is not original:
                    changed = [n for n, a, b in zip(_REQUEST_FIELDS, _snapshot(original), _snapshot(r))
                               if n != "reward" and a != b and a == a]
                    if changed:
                        self._fail("select", f"a copy of request {r.rid} changes its {', '.join(changed)} (only the reward may differ)")
                if r.rid in seen:
                    self._fail("select", f"request {r.rid} goes to training twice")
                seen.add(r.rid)
        return chosen

    def end_step(self, outcome: StepOutcome):
        self.inner.end_step(outcome)

    def bridge(self, open_groups, step):
        members = [r for g in open_groups for r in g.requests]
        bridged = self._unchanged("bridge", members, lambda: self.inner.bridge(list(open_groups), step))
        if not isinstance(bridged, list) or not all(isinstance(g, Group) for g in bridged):
            self._fail("bridge", f"must return a list of Group, got {type(bridged).__name__}")
        open_rids = {r.rid for r in members}
        if any(r.rid not in open_rids for g in bridged for r in g.requests):
            self._fail("bridge", "bridged a response that is not in an open group")
        return bridged

    def train_mask(self, batch):
        mask = self.inner.train_mask(batch)
        if mask is not None and not isinstance(mask, TrainMask):
            self._fail("train_mask", f"must return an lssim.loop.policy.TrainMask or None, got {type(mask).__name__}")
        return None if mask is None else mask.check(batch, f"{self.inner.name}.train_mask")  # takes away, never adds


def check_policy(policy: Policy, steps: int = 6, seed: int = 0) -> dict:
    """Run `policy` (a fresh copy each time) against the contract; returns a summary if all is well."""
    from lssim.analysis.replay import SimSetup, simulate
    from lssim.traces.synth import SynthConfig, synthesize
    from lssim.traces.workload import Workload

    if not isinstance(policy, Policy):
        raise PolicyCheckError(f"{policy!r} is not an lssim.loop.policy.Policy")
    trace = synthesize(SynthConfig(n_prompts=48, steps=steps, prompts_per_step=16, group_size=4, max_tokens=2048, seed=seed))
    workload = Workload(trace, seed=seed)
    setup = SimSetup(n_instances=2, max_num_seqs=32, kv_capacity_tokens=40_000)
    runs = [simulate(workload, _Checked(copy.deepcopy(policy)), setup, seed=seed) for _ in range(2)]
    s = runs[0].steps
    balance = s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]
    if not (s["responses_in"] == balance).all():
        raise PolicyCheckError(f"{policy.name}: the books do not balance at steps {s.loc[s['responses_in'] != balance, 'step'].tolist()}")
    try:
        pd.testing.assert_frame_equal(runs[0].responses, runs[1].responses)
        pd.testing.assert_frame_equal(runs[0].steps, runs[1].steps)
    except AssertionError as e:
        raise PolicyCheckError(f"{policy.name}: two runs with the same seed differ (use ctx.rng, not global randomness): {e}") from None
    return {"policy": policy.name, "steps": len(s), "responses": len(runs[0].responses), "groups_trained": int(s["groups_trained"].sum())}
