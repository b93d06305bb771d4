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
the per-request hooks, so a policy needs them only where its rule is costly per request (oracle).

Declarations, read once before the first step (not hooks):

    progress_interval (attribute)              ask on_progress every this many tokens; composed: the smallest
                                               among the members that answer on_progress
    needs() -> PolicyNeeds                     what the policy needs of the world (true lengths, speculation,
                                               masked stale tokens); merged by `PolicyNeeds.merge`: a need of
                                               any member is the composition's, and members may ask for
                                               speculation only if they ask for the same one

The proposal is a read-only sequence of GroupSpec (a loader batch comes as columns, lssim.loop.core.GroupSpecs: a
GroupSpec is made only when read, so a plan that passes it on, or a slice of it, costs nothing); return it, a slice
of it or a list. A plan that wants more groups than it was proposed (over-provisioning, top-ups) takes them from
the data loader with `ctx.draw(n)` (a list), which continues where the proposal left off. Plans chain, so order matters:
in `april+vade` APRIL asks for twice the groups and VADE chooses which prompts fill them; in
`vade+april` VADE chooses the nominal batch and APRIL adds the loader's next groups to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from lssim.loop.core import Group, GroupSpec, InstanceLoad, Request, RolloutState, Speculation, StepContext

CARRY = "carry"
DROP = "drop"


@dataclass(slots=True, frozen=True)
class Action:
    """A policy's answer to a progress checkpoint: stop the response now, carry it to the next step, or
    requeue it in this step (pause, then resume with a new priority and/or on another instance)."""

    kind: str  # "stop", "carry" or "requeue"
    reason: str = ""
    reward: float | None = None  # stop only: the reward the stopped response trains with (soft landing)
    priority: int | None = None  # requeue only: the new priority (None keeps it)
    instance: int | None = None  # requeue only: the instance to resume on (None: placement decides)

    @staticmethod
    def stop(reason: str, reward: float | None = None) -> "Action":
        return Action("stop", reason, reward)

    @staticmethod
    def carry(reason: str = "") -> "Action":
        return Action("carry", reason)

    @staticmethod
    def requeue(priority: int | None = None, instance: int | None = None, reason: str = "") -> "Action":
        return Action("requeue", reason, priority=priority, instance=instance)


@dataclass(slots=True, frozen=True)
class PolicyNeeds:
    """What a policy needs of the world it runs in, declared by `Policy.needs()` and read before the first step.
    The default of each is "nothing": a policy that needs nothing runs in every world.

    - oracle: it reads `StepContext.oracle_length` (every response's true length in advance), which only the
      simulator knows; the real world refuses such a policy before it starts.
    - speculation: an execution feature (lssim.loop.core.Speculation) the controller asks the engine for once
      (`Engine.set_speculation`); an engine that cannot do it refuses the run.
    - mask_stale_tokens: the trainer should mask (leave out of the loss) the tokens generated under weights
      older than the step's (lssim.loop.core.off_policy_tokens); read by the real trainer (the simulator's train
      time does not depend on it).
    """

    oracle: bool = False
    speculation: Speculation | None = None
    mask_stale_tokens: bool = False

    def __post_init__(self):
        for name in ("oracle", "mask_stale_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"PolicyNeeds.{name} must be a bool, got {getattr(self, name)!r}")
        if self.speculation is not None and not isinstance(self.speculation, Speculation):
            raise ValueError(f"PolicyNeeds.speculation must be an lssim.loop.core.Speculation or None, got {self.speculation!r}")

    @staticmethod
    def merge(needs: list["PolicyNeeds"], name: str) -> "PolicyNeeds":
        """The needs of policies acting as one (`Compose`): a need any of them has, and the one speculation
        those that ask for it agree on (`name`, the composition's, names a disagreement in the error)."""
        asked = {n.speculation for n in needs if n.speculation is not None}
        if len(asked) > 1:
            raise ValueError(f"{name}: members ask the engine for different speculation: {sorted(map(repr, asked))}")
        return PolicyNeeds(oracle=any(n.oracle for n in needs), speculation=asked.pop() if asked else None,
                           mask_stale_tokens=any(n.mask_stale_tokens for n in needs))


NO_NEEDS = PolicyNeeds()


@dataclass(slots=True, frozen=True)
class StepOutcome:
    """What a policy may remember about a finished step: one entry per response that ended in it."""

    step: int
    prompt_id: np.ndarray
    sample_idx: np.ndarray
    response_len: np.ndarray  # tokens generated (the whole response, across steps if it was carried)
    max_tokens: np.ndarray
    reward: np.ndarray
    finish_reason: np.ndarray  # str array
    rollout_seconds: float
    trained_prompt_ids: np.ndarray  # prompts whose groups went to training this step


@dataclass(frozen=True, eq=False)
class TrainBatch:
    """What a step is about to train, one entry per sequence (read-only; `Policy.train_mask` decides on it).

    Built by the trainer from the selected groups: the real GRPOTrainer from the samples it will run (groups with
    signal, members with a reward), the simulator's SimTrainer from every sequence it prices. `advantage` is
    GRPO's, (reward - group mean) / (group std + eps), 0 in a group without signal. `logprobs` (the behaviour
    log-prob of each sampled response token, vLLM's) and `in_loss` (1 where a token is in the loss before any
    pruning, e.g. 0 for stale tokens masked by `mask_stale_tokens`) exist where the world has tokens; the
    simulator has none (None), and a pruning policy there decides per sequence from a measured saving."""

    step: int
    prompt_len: np.ndarray  # int64, per sequence
    response_len: np.ndarray  # int64, per sequence
    advantage: np.ndarray  # float, per sequence
    group: np.ndarray  # int64, per sequence: its group's index in the selected batch
    logprobs: tuple[np.ndarray, ...] | None = None  # per sequence, float per response token
    in_loss: tuple[np.ndarray, ...] | None = None  # per sequence, bool per response token (None: all in the loss)
    rid: np.ndarray | None = None  # int64 per sequence: its request's id (which response it is)

    def __post_init__(self):
        n = len(self.response_len)
        for name in ("prompt_len", "advantage", "group", "rid"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"TrainBatch.{name} has {len(getattr(self, name))} entries for {n} sequences")
        for name in ("logprobs", "in_loss"):
            per_token = getattr(self, name)
            if per_token is not None and [len(x) for x in per_token] != [int(r) for r in self.response_len]:
                raise ValueError(f"TrainBatch.{name} must hold one value per response token of each sequence")

    def __len__(self) -> int:
        return len(self.response_len)

    def loss_before(self) -> np.ndarray:
        """Per sequence, the response tokens in the loss before pruning."""
        if self.in_loss is None:
            return np.asarray(self.response_len, dtype=np.int64)
        return np.array([int(np.count_nonzero(m)) for m in self.in_loss], dtype=np.int64)


@dataclass(frozen=True, eq=False)
class TrainMask:
    """A policy's answer to `train_mask`: per sequence, the response tokens left in the loss (`loss_tokens`) and
    the response tokens the forward passes still run over (`computed`: 0 drops the sequence; less than its length
    cuts the suffix, which no kept token depends on in a causal model). `keep`, where the world has tokens, says
    exactly which tokens stay in the loss; `computed` is then what compaction leaves (`TrainMask.from_keep`).
    Without tokens (the simulator) a policy gives the counts alone (`TrainMask.from_counts`).

    Pruning takes away, never adds: 0 <= loss_tokens <= computed <= response_len, every kept token inside the
    computed prefix, and a kept token was in the loss before (checked against the batch by `check`)."""

    computed: np.ndarray  # int64, per sequence
    loss_tokens: np.ndarray  # int64, per sequence
    keep: tuple[np.ndarray, ...] | None = None  # per sequence, bool per response token
    notes: dict = field(default_factory=dict)  # counts the policy reports in the step's row (e.g. bridged_tokens)

    @staticmethod
    def from_keep(keep, compact: bool = True, notes: dict | None = None) -> "TrainMask":
        """From exact per-token masks; `compact`: cut each sequence after its last kept token (a sequence with
        none leaves the batch); otherwise only mask (the forward runs over everything: saves nothing)."""
        keep = tuple(np.asarray(k, dtype=bool) for k in keep)
        loss = np.array([int(k.sum()) for k in keep], dtype=np.int64)
        if compact:
            computed = _last_kept(keep)
        else:
            computed = np.array([len(k) for k in keep], dtype=np.int64)
        return TrainMask(computed, loss, keep, dict(notes or {}))

    @staticmethod
    def from_counts(computed, loss_tokens, notes: dict | None = None) -> "TrainMask":
        return TrainMask(np.asarray(computed, dtype=np.int64), np.asarray(loss_tokens, dtype=np.int64), notes=dict(notes or {}))

    def check(self, batch: TrainBatch, who: str = "train_mask") -> "TrainMask":
        """This mask, if it only takes away from `batch`; ValueError naming `who` otherwise."""
        n, resp = len(batch), np.asarray(batch.response_len, dtype=np.int64)
        if len(self.computed) != n or len(self.loss_tokens) != n:
            raise ValueError(f"{who}: a mask for {len(self.computed)} sequences, the batch has {n}")
        if (self.loss_tokens < 0).any() or (self.loss_tokens > self.computed).any() or (self.computed > resp).any():
            raise ValueError(f"{who}: need 0 <= loss_tokens <= computed <= response_len for every sequence")
        if (self.loss_tokens > batch.loss_before()).any():
            raise ValueError(f"{who}: a mask keeps more tokens in the loss than the batch had")
        if self.keep is not None:
            for i, k in enumerate(self.keep):
                before = np.ones(len(k), bool) if batch.in_loss is None else np.asarray(batch.in_loss[i], bool)
                if len(k) != resp[i] or (k & ~before).any() or k[self.computed[i]:].any():
                    raise ValueError(f"{who}: sequence {i}: a kept token outside the batch's loss or the computed prefix")
        return self

    def summary(self, batch: TrainBatch) -> dict:
        """What the pruning did, for the step's row: loss and forward tokens before and after, and their ratios."""
        prompt, resp = np.asarray(batch.prompt_len, np.int64), np.asarray(batch.response_len, np.int64)
        loss_before, loss_after = int(batch.loss_before().sum()), int(self.loss_tokens.sum())
        fwd_before = int((prompt + resp).sum())
        fwd_after = int((prompt + self.computed)[self.computed > 0].sum())
        return {"loss_tokens_before": loss_before, "loss_tokens_after": loss_after,
                "forward_tokens_before": fwd_before, "forward_tokens_after": fwd_after,
                "pruned_loss_fraction": 1 - loss_after / loss_before if loss_before else 0.0,
                "computed_token_fraction": fwd_after / fwd_before if fwd_before else 1.0,
                "sequences_dropped": int((self.computed == 0).sum()), **self.notes}


def _last_kept(keep: tuple[np.ndarray, ...]) -> np.ndarray:
    """Per sequence, one past its last kept token (0 if none): the prefix compaction leaves."""
    return np.array([int(np.flatnonzero(k)[-1]) + 1 if k.any() else 0 for k in keep], dtype=np.int64)


def intersect_masks(masks: list[TrainMask]) -> TrainMask:
    """Several policies' masks as one: a token stays in the loss only if every mask keeps it. Exact where all have
    per-token `keep`: the forward is cut after the last token all keep if any member compacts (cutting what no kept
    token depends on never changes the update), else it runs as far as the members' shortest. Otherwise, per
    sequence, the smallest counts (each member's counts bound the composition's)."""
    if len(masks) == 1:
        return masks[0]
    notes = {k: v for m in masks for k, v in m.notes.items()}
    if all(m.keep is not None for m in masks):
        keep = tuple(np.logical_and.reduce(ks) for ks in zip(*(m.keep for m in masks)))
        loss = np.array([int(k.sum()) for k in keep], dtype=np.int64)
        compacts = any(np.array_equal(m.computed, _last_kept(m.keep)) for m in masks)
        computed = _last_kept(keep) if compacts else np.minimum.reduce([m.computed for m in masks])
        return TrainMask(computed, loss, keep, notes)
    computed = np.minimum.reduce([m.computed for m in masks])
    loss = np.minimum(np.minimum.reduce([m.loss_tokens for m in masks]), computed)
    return TrainMask(computed, loss, notes=notes)


class Policy:
    """Base class: every hook has no opinion. Subclasses override a few."""

    name = "baseline"
    progress_interval: int | None = None  # ask on_progress every this many tokens (None: never)

    def needs(self) -> PolicyNeeds:
        """What this policy needs of the world (PolicyNeeds); the default needs nothing."""
        return NO_NEEDS

    def plan(self, ctx: StepContext, proposal: Sequence[GroupSpec]) -> Sequence[GroupSpec]:
        # The proposal is a read-only sequence (a loader batch as columns, lssim.loop.core.GroupSpecs, or a list): return
        # it, a slice of it, or a list of your own; `proposal + ctx.draw(n)` is a list.
        return proposal

    def priority(self, request: Request) -> int | None:
        return None

    def place(self, request: Request, loads: list[InstanceLoad]) -> int | None:
        return None

    def priorities(self, requests) -> np.ndarray:
        """`priority` of every request of a submission (lssim.loop.columns.RequestColumns), a request's own priority
        where the policy has no opinion."""
        return np.array([r.priority if (p := self.priority(r)) is None else p for r in requests.to_requests()], np.int64)

    def placements(self, requests, loads: list[InstanceLoad]) -> np.ndarray:
        """`place` of every request of a submission, in its order (priority order); a request's own instance (-1:
        the engine's dispatcher) where the policy has no opinion."""
        out = requests.instance.copy()
        for i, r in enumerate(requests.to_requests()):
            choice = self.place(r, loads)
            if choice is not None:
                out[i] = choice
        return out

    def on_progress(self, request: Request, state: RolloutState) -> Action | None:
        return None

    def on_finish(self, request: Request, state: RolloutState) -> None:
        return None

    def end_rollout(self, state: RolloutState) -> bool:
        return False

    def top_up(self, state: RolloutState) -> list[GroupSpec]:
        return []

    def on_unfinished(self, request: Request) -> str:
        return DROP

    def select(self, groups: list[Group], step: int) -> list[Group]:
        return groups

    def end_step(self, outcome: StepOutcome) -> None:
        return None

    def bridge(self, open_groups: list[Group], step: int) -> list[Group]:
        """Groups to train now although some members are still carried (open: waiting for them): copies whose
        members' rewards are what the trainer takes as each one's return (a carried member's: a bootstrapped value).
        Which of their tokens are trained is this policy's `train_mask`; none: nothing is bridged."""
        return []

    def train_mask(self, batch: TrainBatch) -> TrainMask | None:
        """Which of `batch`'s tokens are trained (TrainMask); None: all of them. Asked once per step by the trainer,
        after `select`, before the log-prob recompute and the update, so what is pruned is never computed."""
        return None

    # -- composition and introspection -------------------------------------------------------
    def overrides(self, hook: str) -> bool:
        """True if this policy has an opinion on `hook` (the controller skips hooks nobody overrides)."""
        return getattr(type(self), hook) is not getattr(Policy, hook)

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

HOOKS = ("plan", "priority", "place", "on_progress", "on_finish", "end_rollout", "top_up", "on_unfinished", "select", "end_step",
         "bridge", "train_mask")


class Compose(Policy):
    """Several policies acting as one, each hook combined by the rule in this module's docstring."""

    def __init__(self, policies: list[Policy]):
        if not policies:
            raise ValueError("Compose needs at least one policy")
        self.policies = list(policies)
        self.name = "+".join(p.name for p in self.policies)
        # Only the members with an opinion are asked, so an unused hook costs nothing on the hot path.
        self._by_hook = {h: [p for p in self.policies if p.overrides(h)] for h in HOOKS}
        intervals = [p.progress_interval for p in self._by_hook["on_progress"] if p.progress_interval]
        self.progress_interval = min(intervals) if intervals else None
        self._needs = PolicyNeeds.merge([p.needs() for p in self.policies], self.name)  # a conflict fails here

    @property
    def members(self) -> list[Policy]:
        return list(self.policies)

    def needs(self) -> PolicyNeeds:
        return self._needs

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

    def end_rollout(self, state):
        return any(p.end_rollout(state) for p in self._by_hook["end_rollout"])

    def top_up(self, state):
        return [g for p in self._by_hook["top_up"] for g in p.top_up(state)]

    def on_unfinished(self, request):
        decisions = [p.on_unfinished(request) for p in self._by_hook["on_unfinished"]]
        return CARRY if CARRY in decisions else DROP

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
