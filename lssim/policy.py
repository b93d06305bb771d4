"""The policy interface: a few hooks, each with "no opinion" as its default, and how they compose.

A policy decides; it never touches an engine or a trainer. It runs unchanged in the simulator and on
real vLLM because the controller (lssim.controller) asks it the same questions in both worlds.

    class ShortFirst(Policy):
        name = "short_first"
        def plan(self, ctx, proposal):
            return sorted(proposal, key=lambda g: self.expected[g.prompt_id])

Hooks, in the order the controller calls them during a step, and the rule that composes them
(`Compose([a, b])`, written `a+b` on the command line):

    plan(ctx, proposal) -> list[GroupSpec]     chained left to right: each revises the last one's plan
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
    end_step(outcome)                          every policy is told; this is where policies remember

Declarations, read once before the first step (not hooks):

    progress_interval (attribute)              ask on_progress every this many tokens; composed: the smallest
                                               among the members that answer on_progress
    needs() -> PolicyNeeds                     what the policy needs of the world (true lengths, speculation,
                                               masked stale tokens); merged by `PolicyNeeds.merge`: a need of
                                               any member is the composition's, and members may ask for
                                               speculation only if they ask for the same one

A plan that wants more groups than it was proposed (over-provisioning, top-ups) takes them from the data
loader with `ctx.draw(n)`, which continues where the proposal left off. Plans chain, so order matters:
in `april+vade` APRIL asks for twice the groups and VADE chooses which prompts fill them; in
`vade+april` VADE chooses the nominal batch and APRIL adds the loader's next groups to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .core import Group, GroupSpec, InstanceLoad, Request, RolloutState, Speculation, StepContext

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
    - speculation: an execution feature (lssim.core.Speculation) the controller asks the engine for once
      (`Engine.set_speculation`); an engine that cannot do it refuses the run.
    - mask_stale_tokens: the trainer should mask (leave out of the loss) the tokens generated under weights
      older than the step's (lssim.core.off_policy_tokens); read by the real trainer (the simulator's train
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
            raise ValueError(f"PolicyNeeds.speculation must be an lssim.core.Speculation or None, got {self.speculation!r}")

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


class Policy:
    """Base class: every hook has no opinion. Subclasses override a few."""

    name = "baseline"
    progress_interval: int | None = None  # ask on_progress every this many tokens (None: never)

    def needs(self) -> PolicyNeeds:
        """What this policy needs of the world (PolicyNeeds); the default needs nothing."""
        return NO_NEEDS

    def plan(self, ctx: StepContext, proposal: list[GroupSpec]) -> list[GroupSpec]:
        return proposal

    def priority(self, request: Request) -> int | None:
        return None

    def place(self, request: Request, loads: list[InstanceLoad]) -> int | None:
        return None

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

HOOKS = ("plan", "priority", "place", "on_progress", "on_finish", "end_rollout", "top_up", "on_unfinished", "select", "end_step")


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

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.policies)


def make_policy(spec: str) -> Policy:
    """Build a policy from its command-line spelling: `hadb`, `hadb+breaker`, `hadb(short_batch_factor=3)+april`.

    The name is the module in the top-level `policies` package; its one Policy subclass is used, so adding
    a policy is adding a file. Parameters are the class's keyword arguments; an unknown one is an error.
    """
    import ast
    import importlib
    import inspect
    import re

    parts = [p.strip() for p in re.split(r"\+(?![^()]*\))", spec) if p.strip()]
    if not parts:
        raise ValueError(f"empty policy spec {spec!r}")
    built = []
    for part in parts:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\((.*)\))?", part)
        if not m:
            raise ValueError(f"cannot parse policy {part!r} (expected name or name(key=value, ...))")
        name, args = m.group(1), m.group(2)
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
        kwargs = {}
        if args:
            call = ast.parse(f"f({args})", mode="eval").body
            if call.args:
                raise ValueError(f"policy {name}: parameters must be named (key=value), got {args!r}")
            kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
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
