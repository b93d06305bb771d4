"""The policy interface: a few hooks, each with "no opinion" as its default, and how they compose.

A policy decides; it never touches an engine or a trainer. It runs unchanged in the simulator and on
real vLLM because the controller (lssim.loop.controller) asks it the same questions in both worlds.

    class ShortFirst(Policy):
        name = "short_first"
        def plan(self, ctx, proposal):
            return sorted(proposal, key=lambda g: self.expected[g.prompt_id])

Hooks, in the order the controller calls them during a step, and the rule that composes them
(`Compose([a, b])`, written `a+b` on the command line):

    plan(ctx, proposal) -> [GroupSpec]         chained left to right: each revises the last one's plan
    priority(request) -> int | None            the first policy with an opinion sets it (lower runs first)
    place(request, loads) -> int | None        the first policy with an opinion places the request
    progress_interval (tokens) / on_progress   stop wins over carry, carry over requeue, requeue over none
    on_finish(request, state)                  every policy is told (of every response that ends in the
                                               rollout: by itself, by its budget, or stopped by a policy)
    end_rollout(state) -> bool                 the rollout ends when any policy says so (or all ended)
    top_up(state) -> list[GroupSpec]           asked when the rollout would end; all requests are added
    on_unfinished(request) -> "carry"|"drop"   carried if any policy carries it
    select(groups, step) -> list[Group]        chained left to right: what goes to training (groups, subsets
                                               of groups, or copies whose rewards are reshaped; never mutated)
    bridge(open_groups, step) -> list[Group]   groups still waiting for carried members, offered after select:
                                               copies the trainer trains now beside the selected ones, carried
                                               members' rewards a bootstrapped value (segment's value bridging);
                                               composed: the first member that bridges any
    train_mask(batch) -> TrainMask | None      asked by the trainer for the selected (and bridged) sequences:
                                               which response tokens stay in the loss and which the forward still
                                               runs over; composed: a token is trained only if every member keeps it
    end_step(outcome)                          every policy is told; this is where policies remember

Array forms, for speed (the simulator's batch route prices a whole rollout as arrays, lssim.sim.fastsim): a policy
with a priority or place rule may also answer it for a whole submission at once, `priorities(requests)` and
`placements(requests, loads)` over lssim.loop.columns.RequestColumns. They must answer what the per-request hooks
answer (requests placed one after another in priority order, as the controller asks place); the defaults ask
the per-request hooks, so a policy needs them only where its rule is costly per request (oracle). A policy whose
on_finish only keeps its own books (lpt's outstanding work) answers `on_finishes(ended, state)` for a submission's
ended responses at once; one whose on_progress only stops, reading each response's own tokens and window signals,
answers `progress_stops(checkpoints)` for a whole submission before it runs (breaker, early_exit: one rule function,
for numbers and arrays alike, that both forms call); one whose on_progress only carries, reading each response's own
tokens and a state that moves only between rollouts, answers `progress_carries(checkpoints)` (segment), and the
simulator then schedules each submission whole with the carries where they fall (the carry route,
lssim.sim.carry_route; the event route's books). A policy with end_rollout, or with on_finish or on_progress
and no array form, runs on the event route (`reacts_to_events`); one whose end_rollout reads only the rollout's
counters and its own books of the responses that ended answers `end_rollout_at(progress)` over a submission's whole
schedule (april, rollpacker), and the simulator then schedules each submission whole and cuts it there (the cut
route, lssim.sim.cut_route; the event route's books). top_up needs no array form: the event route asks it
only once nothing is in flight, so the batch route asks it after each submission has run to its end (DAPO's
generation batches).

Declarations, read once before the first step (not hooks):

    progress_interval (attribute)              ask on_progress every this many tokens; composed: the smallest
                                               among the members that answer on_progress
    needs() -> PolicyNeeds                     what the policy needs of the world (true lengths, speculation,
                                               masked stale tokens); merged by `PolicyNeeds.merge`: a need of
                                               any member is the composition's, and members may ask for
                                               speculation only if they ask for the same one
    ran_blind() -> str | None              asked once the run's result is made: why the policy could not
                                               act (what it lacked), None if it could; composed: each member's

The proposal is a read-only sequence of GroupSpec (a loader batch comes as columns, lssim.loop.core.GroupSpecs: a
GroupSpec is made only when read, so a plan that passes it on, or a slice of it, costs nothing); return it, a slice
of it or a list. A plan that wants more groups than it was proposed (over-provisioning, top-ups) takes them from
the data loader with `ctx.draw(n)` (a read-only sequence, as the proposal), which continues where the proposal left
off. Plans chain, so order matters: in `april+vade` APRIL asks for twice the groups and VADE chooses which prompts fill them; in
`vade+april` VADE chooses the nominal batch and APRIL adds the loader's next groups to it.
"""

from __future__ import annotations

import numpy as np

from lssim.loop.contracts import POLICY_HOOKS, PolicyHooks
# What a policy's hooks answer with (lssim.loop.decisions), named here too: a policy's author imports them from here.
from lssim.loop.decisions import (CARRY, DROP, NO_NEEDS, Action, PolicyNeeds, ProgressStops, StepOutcome, TrainBatch, TrainMask,
                                  intersect_masks)


class Policy(PolicyHooks):
    """Base class: every hook has no opinion (lssim.loop.contracts.PolicyHooks declares them). Subclasses override a few."""

    # -- composition and introspection -------------------------------------------------------
    def overrides(self, hook: str) -> bool:
        """True if this policy has an opinion on `hook` (the controller skips hooks nobody overrides)."""
        return getattr(type(self), hook) is not getattr(PolicyHooks, hook)

    def reacts_to_events(self) -> bool:
        """True when a rollout under this policy needs the event route (lssim.sim.world): it acts on single events
        (on_progress, end_rollout) or hears of finishes with no array form (on_finishes); otherwise the simulator
        may run its rollouts on the batch route (lssim.sim.fastsim), top-ups included."""
        return self.overrides("end_rollout") or not self.progress_in_batches() or not self.finishes_in_batches()

    def _answers_as_array(self, hook: str, form: str) -> bool:
        """Whether `form`, the array form of `hook`, answers for this policy's own `hook`: defined by the class that
        defines `hook`, or by a subclass of it. A subclass that changes a hook and not its array form (a policy
        extended to watch or tweak its on_progress) runs its hooks one event at a time instead."""
        classes = type(self).__mro__
        hook_owner = next(c for c in classes if hook in c.__dict__)
        form_owner = next(c for c in classes if form in c.__dict__)
        return form_owner is not Policy and issubclass(form_owner, hook_owner)

    def progress_in_batches(self) -> bool:
        """True when the policy has no on_progress, or answers it as an array too (`progress_stops`)."""
        return not self.overrides("on_progress") or self._answers_as_array("on_progress", "progress_stops")

    def progress_stops(self, checkpoints) -> ProgressStops:
        """on_progress for a whole submission, before it runs: where each response is stopped. Only a rule that
        stops (never carries or requeues) and reads nothing but each response's own tokens and window signals at its
        checkpoints, and its own books of that response, may answer it. `checkpoints` (lssim.sim.checkpoints.Checkpoints,
        of `len(checkpoints)` responses): iterate for (rows, generated, signals, has), the responses at their next
        checkpoint, in order, every one reached (a rule skips those it already stopped), the window signals there
        (lssim.loop.signals, arrays) and which rows have any. It must stop what on_progress at each checkpoint in turn
        stops, and leave the policy as those calls and on_finish would."""
        raise NotImplementedError(f"policy {self.name} has no array form of on_progress (progress_stops)")

    def carries_in_batches(self) -> bool:
        """True when the policy reacts to single events only by carrying responses at progress checkpoints, answered as
        an array (`progress_carries`): no end_rollout, no top_up. The simulator may then schedule each submission whole
        with the carries where they fall (the carry route, lssim.sim.carry_route; the event route's books)."""
        return (self.overrides("on_progress") and self._answers_as_array("on_progress", "progress_carries")
                and not self.overrides("end_rollout") and not self.overrides("top_up"))

    def progress_carries(self, checkpoints) -> ProgressStops:
        """on_progress for a whole submission, before it runs, of a rule that only carries (segment): where each
        response is carried (`at`, -1: never) and the carry's reason (`reward` and `score` unused). Only a rule that
        reads nothing but each response's own tokens and books (`checkpoints.requests`) and its own state, which moves
        only between rollouts, may answer it. `checkpoints`: as progress_stops reads them. It must carry what
        on_progress at each checkpoint in turn carries, and leave the policy as those calls would."""
        raise NotImplementedError(f"policy {self.name} has no array form of on_progress's carries (progress_carries)")

    def requeues_in_batches(self) -> bool:
        """True when the policy reacts to single events only by requeueing responses at progress checkpoints by seer's
        rules (lssim.sim.requeue_rules), answered for a whole submission (`progress_requeues`), with array forms of its
        priority, place and on_finish, all defined by the class that defines those hooks (a subclass that changes one
        runs event by event); no end_rollout, no top_up, no speculation. The simulator may then run each rollout whole
        in one kernel (lssim.sim.requeue_route), booked as the batch route books it."""
        hooks = (("on_progress", "progress_requeues"), ("priority", "priorities"),
                 ("place", "placements"), ("on_finish", "on_finishes"), ("priority", "progress_requeues"),
                 ("place", "progress_requeues"), ("on_finish", "progress_requeues"))
        return (self.overrides("on_progress") and all(self._answers_as_array(h, form) for h, form in hooks)
                and not self.overrides("end_rollout") and not self.overrides("top_up")
                and self.needs().speculation is None)

    def progress_requeues(self, requests):
        """on_progress for a whole submission (`requests`: lssim.loop.columns.RequestColumns, placed by `placements`),
        of a rule that only requeues, by seer's chunk rules (lssim.sim.requeue_rules: `rank` gives the new priority,
        `moves` says whether a request at a checkpoint goes back to the scheduler, placement the instance with the
        fewest of the policy's requests): an lssim.sim.requeue_rules.RequeueRules. It must requeue what on_progress
        at each checkpoint in turn requeues, with the priority and place priority and place then give."""
        raise NotImplementedError(f"policy {self.name} has no array form of on_progress's requeues (progress_requeues)")

    def finishes_in_batches(self) -> bool:
        """True when the policy has no on_finish, or answers it as an array too (`on_finishes`): the batch route
        may then run its rollouts."""
        return not self.overrides("on_finish") or self._answers_as_array("on_finish", "on_finishes")

    def on_finishes(self, ended, state) -> None:
        """on_finish for many responses at once: `ended` (lssim.loop.columns.RequestColumns) in the order they ended,
        `state` the rollout's counters once they all had. The batch route calls it once a submission has run to its
        end, so only a policy whose on_finish keeps books nothing reads before then (no on_progress or end_rollout)
        may answer it; it must leave the policy as on_finish on each response in that order does. The cut route
        (lssim.sim.cut_route) calls it once for the responses that ended by the cut (end_rollout_at has read the
        policy's books before any of them)."""
        raise NotImplementedError(f"policy {self.name} has no array form of on_finish (on_finishes)")

    def unfinished_in_batches(self) -> bool:
        """True when the policy has no on_unfinished, or answers it as an array too (`on_unfinished_rows`)."""
        return not self.overrides("on_unfinished") or self._answers_as_array("on_unfinished", "on_unfinished_rows")

    def on_unfinished_rows(self, unfinished) -> np.ndarray:
        """on_unfinished for the responses still running when a rollout ended, at once: `unfinished`
        (lssim.loop.columns.RequestColumns, aborted, in the order on_unfinished would be asked); which are carried
        (bool per row; the rest are dropped). It must leave the policy as on_unfinished on each in that order does."""
        raise NotImplementedError(f"policy {self.name} has no array form of on_unfinished (on_unfinished_rows)")

    def ends_in_batches(self) -> bool:
        """True when the policy has no end_rollout, or answers it as an array too (`end_rollout_at`)."""
        return not self.overrides("end_rollout") or self._answers_as_array("end_rollout", "end_rollout_at")

    def cuts_in_batches(self) -> bool:
        """True when only end_rollout, answered as an array (`end_rollout_at`), cuts a rollout short: no progress
        checkpoints and no top-ups. The simulator may then schedule a submission whole and cut it where the rule says
        (the cut route, lssim.sim.cut_route)."""
        return (self.overrides("end_rollout") and self.ends_in_batches() and not self.overrides("on_progress")
                and not self.overrides("top_up"))

    def end_rollout_at(self, progress) -> int:
        """end_rollout for a whole submission's schedule: the first boundary after which end_rollout would say the
        rollout ends, or -1 for none. `progress` (lssim.loop.rollout_cut.RolloutProgress): the counters after each
        boundary at which responses ended, in the order the event route asks end_rollout, and the responses ended by
        then (on_finish has not been told of them: the rule reads its books as they stood before the first, and
        what each ended response would change in them). It must answer what end_rollout, asked after each boundary
        with on_finish told of that boundary's responses, first answers True at."""
        raise NotImplementedError(f"policy {self.name} has no array form of end_rollout (end_rollout_at)")

    @property
    def members(self) -> list["Policy"]:
        return [self]

    def __add__(self, other: "Policy") -> "Compose":
        return Compose(self.members + other.members)

    def __repr__(self) -> str:
        params = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        inner = ", ".join(f"{k}={v!r}" for k, v in params.items() if np.isscalar(v) or v is None)
        return f"{type(self).__name__}({inner})"


_RANK = {"stop": 0, "carry": 1, "requeue": 2}  # which on_progress answer wins when policies disagree



class Compose(Policy):
    """Several policies acting as one, each hook combined by the rule in this module's docstring."""

    def __init__(self, policies: list[Policy]):
        if not policies:
            raise ValueError("Compose needs at least one policy")
        self.policies = list(policies)
        self.name = "+".join(p.name for p in self.policies)
        # Only the members with an opinion are asked, so an unused hook costs nothing on the hot path.
        self._by_hook = {h: [p for p in self.policies if p.overrides(h)] for h in POLICY_HOOKS}
        intervals = [p.progress_interval for p in self._by_hook["on_progress"] if p.progress_interval]
        self.progress_interval = min(intervals) if intervals else None
        self._needs = PolicyNeeds.merge([p.needs() for p in self.policies], self.name)  # a conflict fails here

    @property
    def members(self) -> list[Policy]:
        return list(self.policies)

    def needs(self) -> PolicyNeeds:
        return self._needs

    def ran_blind(self) -> str | None:
        said = [f"{p.name}: {why}" for p in self.policies if (why := p.ran_blind())]
        return "; ".join(said) or None

    def overrides(self, hook: str) -> bool:
        return bool(self._by_hook[hook])

    def plan(self, ctx, proposal):
        for p in self._by_hook["plan"]:
            proposal = p.plan(ctx, proposal)
        return proposal

    def priority(self, request):
        for p in self._by_hook["priority"]:
            choice = p.priority(request)
            if choice is not None:
                return choice
        return None

    def place(self, request, loads):
        for p in self._by_hook["place"]:
            choice = p.place(request, loads)
            if choice is not None:
                return choice
        return None

    def priorities(self, requests):
        deciders = self._by_hook["priority"]
        return deciders[0].priorities(requests) if len(deciders) == 1 else super().priorities(requests)

    def placements(self, requests, loads):
        deciders = self._by_hook["place"]
        return deciders[0].placements(requests, loads) if len(deciders) == 1 else super().placements(requests, loads)

    def on_progress(self, request, state):
        best = None
        for p in self._by_hook["on_progress"]:
            action = p.on_progress(request, state)
            if action is not None and (best is None or _RANK[action.kind] < _RANK[best.kind]):
                best = action
        return best

    def on_finish(self, request, state):
        for p in self._by_hook["on_finish"]:
            p.on_finish(request, state)

    def finishes_in_batches(self):
        return all(p.finishes_in_batches() for p in self._by_hook["on_finish"])

    def progress_in_batches(self):
        # One member's stops only: members that disagree at a checkpoint are settled one checkpoint at a time.
        deciders = self._by_hook["on_progress"]
        return not deciders or (len(deciders) == 1 and deciders[0].progress_in_batches())

    def progress_stops(self, checkpoints):
        return self._by_hook["on_progress"][0].progress_stops(checkpoints)

    def carries_in_batches(self):
        # One member's carries only (as progress_in_batches), and no member ends or tops up the rollout.
        deciders = self._by_hook["on_progress"]
        return (len(deciders) == 1 and deciders[0].carries_in_batches() and not self.overrides("end_rollout")
                and not self.overrides("top_up"))

    def progress_carries(self, checkpoints):
        return self._by_hook["on_progress"][0].progress_carries(checkpoints)

    def on_finishes(self, ended, state):
        for p in self._by_hook["on_finish"]:
            p.on_finishes(ended, state)

    def end_rollout(self, state):
        return any(p.end_rollout(state) for p in self._by_hook["end_rollout"])

    def ends_in_batches(self):
        return all(p.ends_in_batches() for p in self._by_hook["end_rollout"])

    def end_rollout_at(self, progress):
        # The rollout ends when any member says so: at the earliest boundary any member answers.
        answers = [b for p in self._by_hook["end_rollout"] if (b := p.end_rollout_at(progress)) >= 0]
        return min(answers) if answers else -1

    def top_up(self, state):
        return [g for p in self._by_hook["top_up"] for g in p.top_up(state)]

    def on_unfinished(self, request):
        decisions = [p.on_unfinished(request) for p in self._by_hook["on_unfinished"]]
        return CARRY if CARRY in decisions else DROP

    def unfinished_in_batches(self):
        return all(p.unfinished_in_batches() for p in self._by_hook["on_unfinished"])

    def on_unfinished_rows(self, unfinished):
        carried = np.zeros(len(unfinished), bool)
        for p in self._by_hook["on_unfinished"]:  # (each asked of every one, as on_unfinished asks them)
            carried |= p.on_unfinished_rows(unfinished)
        return carried

    def select(self, groups, step):
        for p in self._by_hook["select"]:
            groups = p.select(groups, step)
        return groups

    def end_step(self, outcome):
        for p in self._by_hook["end_step"]:
            p.end_step(outcome)

    def bridge(self, open_groups, step):
        for p in self._by_hook["bridge"]:
            bridged = p.bridge(open_groups, step)
            if bridged:
                return bridged
        return []

    def train_mask(self, batch):
        masks = [m.check(batch, p.name) for p in self._by_hook["train_mask"] if (m := p.train_mask(batch)) is not None]
        return intersect_masks(masks) if masks else None

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.policies)


def split_policy_spec(spec: str) -> list[tuple[str, str | None]]:
    """A spec's members as (name, the text between its parentheses or None), not yet read:
    `hadb(short_batch_factor=3)+april` -> [("hadb", "short_batch_factor=3"), ("april", None)]. What
    parse_policy_spec reads and lssim.analysis.sweep.expand_grid expands."""
    import re

    parts = [p.strip() for p in re.split(r"\+(?![^()]*\))", spec) if p.strip()]  # '+' outside parentheses
    if not parts:
        raise ValueError(f"empty policy spec {spec!r}")
    out = []
    for part in parts:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\((.*)\))?", part)
        if not m:
            raise ValueError(f"cannot parse policy {part!r} (expected name or name(key=value, ...))")
        out.append((m.group(1), m.group(2)))
    return out


def parse_policy_spec(spec: str) -> list[tuple[str, dict]]:
    """A policy spec's parts as (name, keyword arguments): `hadb(short_batch_factor=3)+april` ->
    [("hadb", {"short_batch_factor": 3}), ("april", {})]. Values are Python literals."""
    import ast

    out = []
    for name, args in split_policy_spec(spec):
        kwargs = {}
        if args:
            call = ast.parse(f"f({args})", mode="eval").body
            if call.args:
                raise ValueError(f"policy {name}: parameters must be named (key=value), got {args!r}")
            kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        out.append((name, kwargs))
    return out


def format_policy_spec(name: str, kwargs: dict) -> str:
    """One part of a spec, as parse_policy_spec reads it back."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})" if kwargs else name


def make_policy(spec: str) -> Policy:
    """Build a policy from its command-line spelling: `hadb`, `hadb+breaker`, `hadb(short_batch_factor=3)+april`.

    The name is the module in the top-level `policies` package; its one Policy subclass is used, so adding
    a policy is adding a file. Parameters are the class's keyword arguments; an unknown one is an error.
    """
    import importlib
    import inspect

    built = []
    for name, kwargs in parse_policy_spec(spec):
        try:
            module = importlib.import_module(f"policies.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"policies.{name}":
                raise
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(available_policies())}") from None
        classes = [c for _, c in inspect.getmembers(module, inspect.isclass)
                   if issubclass(c, Policy) and c.__module__ == module.__name__]
        if len(classes) != 1:
            raise ValueError(f"policies/{name}.py must define exactly one Policy subclass, found {len(classes)}")
        try:
            built.append(classes[0](**kwargs))
        except TypeError as e:
            raise ValueError(f"policy {name}: {e}") from None
    return built[0] if len(built) == 1 else Compose(built)


def available_policies() -> list[str]:
    """Names of the modules in the `policies` package (each one policy)."""
    import pkgutil

    import policies

    return sorted(m.name for m in pkgutil.iter_modules(policies.__path__) if not m.name.startswith("_"))


__all__ = ["Policy", "Compose", "make_policy", "available_policies", "split_policy_spec", "parse_policy_spec",
           "format_policy_spec", "CARRY", "DROP", "NO_NEEDS", "Action", "PolicyNeeds", "ProgressStops", "StepOutcome", "TrainBatch", "TrainMask",
           "intersect_masks"]
