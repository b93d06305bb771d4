"""The objects passed between the controller, the policy and an engine.

One `Request` is one response being generated (a member of a prompt's group). The controller owns it;
an engine fills in what happened (tokens, finish reason, reward, times); a policy reads it. Engines in
both worlds -- the simulator and real vLLM -- implement the `Engine` contract (lssim.loop.contracts).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from lssim.loop.rewards import RewardScale
from lssim.loop.speculation import SPECULATION_METHODS, Speculation  # noqa: F401  (imported from here by most callers)

# How a response ended. Every response ends in exactly one of these (or is carried to the next step).
STOP = "stop"  # ended by itself (EOS)
LENGTH = "length"  # hit its max_tokens budget
POLICY_STOP = "policy_stop"  # a policy stopped it; Request.stop_reason says why
ABORT = "abort"  # the rollout ended without it and the policy dropped it
FINISH_REASONS = (STOP, LENGTH, POLICY_STOP, ABORT)

# What an engine reports (Event.kind). Plain strings, compared on the hot path: the simulator keeps them in
# its heaps as they are, so an event costs no conversion between the engine and the controller.
FINISHED = "finished"  # a request ended (Request.finish_reason says how)
PROGRESS = "progress"  # a request passed a progress checkpoint (every Engine.set_progress_interval tokens)
WAKE = "wake"  # a timer set with Engine.wake_at went off (Event.request is None): the execution modes' clock
EVENT_KINDS = (FINISHED, PROGRESS, WAKE)


@dataclass(slots=True)
class GroupSpec:
    """What a policy asks for one prompt: how many samples, with which budget, priority and placement."""

    prompt_id: int
    n_samples: int
    max_tokens: int
    priority: int = 0  # lower runs first, as in vLLM's priority scheduling
    instance: int | None = None  # pin to an engine instance; None lets the engine/placement decide
    # A recorded group (lssim.traces.workload replays a trace's batches as recorded), where its members differ:
    # member k's own budget, capped by max_tokens (a policy that lowers max_tokens lowers them all), and
    # whether the recorded run trained member k (False: generated, then left out of training, e.g. a group
    # DAPO filtered out). None: every member gets max_tokens and may train.
    member_max_tokens: tuple[int, ...] | None = None
    member_trained: tuple[bool, ...] | None = None
    # The data loader's batch (step of the trace or dataset) the group came from; None for groups a policy made.
    # A group generated in another step than its batch's (drawn ahead, admitted early by an async mode) is still
    # that batch's sample: the simulator answers it from the batch's recorded responses.
    batch: int | None = None

    def __post_init__(self):
        if self.n_samples < 1:
            raise ValueError(f"GroupSpec(prompt_id={self.prompt_id}): n_samples must be >= 1, got {self.n_samples}")
        if self.max_tokens < 1:
            raise ValueError(f"GroupSpec(prompt_id={self.prompt_id}): max_tokens must be >= 1, got {self.max_tokens}")
        if self.member_max_tokens is not None or self.member_trained is not None:
            self._check_members()

    def _check_members(self) -> None:
        for name in ("member_max_tokens", "member_trained"):
            members = getattr(self, name)
            if members is not None and len(members) != self.n_samples:
                raise ValueError(f"GroupSpec(prompt_id={self.prompt_id}): {name} has {len(members)} entries for "
                                 f"{self.n_samples} samples")
        if self.member_max_tokens is not None and min(self.member_max_tokens) < 1:
            raise ValueError(f"GroupSpec(prompt_id={self.prompt_id}): member_max_tokens must be >= 1")


_SPEC_COLUMNS = ("prompt_id", "n_samples", "max_tokens", "batch")  # GroupSpecs' arrays, in its constructor's order


class GroupSpecs(Sequence):
    """A data loader's batch of groups as columns: a read-only sequence of GroupSpec, each made when first read.

    A trace's Workload gives its recorded batches so (`Workload.default_groups`): the controller slices them and
    lssim.loop.plan_columns.plan_requests reads the columns, so a step whose policy passes the proposal on (or a slice of it)
    makes no GroupSpec at all. Read a member and it is a GroupSpec kept for the next reader, so changing one still
    counts (the plan is then read from the objects). Concatenated with more of it (`proposal + ctx.draw(n)`) it stays
    columns; with anything else it gives a list."""

    __slots__ = ("prompt_id", "n_samples", "max_tokens", "batch", "members", "_made")

    def __init__(self, prompt_id: np.ndarray, n_samples: np.ndarray, max_tokens: np.ndarray, batch: np.ndarray | None = None,
                 members: dict[int, tuple] | None = None):
        self.prompt_id, self.n_samples, self.max_tokens = prompt_id, n_samples, max_tokens
        self.batch = np.full(len(prompt_id), -1, np.int64) if batch is None else batch  # -1: None
        self.members = members or {}  # group -> (member_max_tokens, member_trained), where its members differ
        self._made: dict[int, GroupSpec] = {}

    @property
    def untouched(self) -> bool:
        """No member was read: the columns are the whole truth."""
        return not self._made

    def from_batch(self, k: int) -> "GroupSpecs":
        """The same groups, each of loader batch `k` unless it says otherwise (lssim.loop.loader.DataLoader.take)."""
        if self._made:  # read already: the objects carry it, as a plain list of specs would
            for g in self:
                if g.batch is None:
                    g.batch = k
            return self
        return GroupSpecs(self.prompt_id, self.n_samples, self.max_tokens, np.where(self.batch < 0, k, self.batch),
                          self.members)

    def __len__(self) -> int:
        return len(self.prompt_id)

    def __getitem__(self, i):
        if isinstance(i, slice):
            if self._made:
                return [self[j] for j in range(*i.indices(len(self)))]
            members = self.members
            if members:
                start, stop, stride = i.indices(len(self))
                kept = range(start, stop, stride)
                members = {kept.index(j): m for j, m in members.items() if j in kept}
            return GroupSpecs(self.prompt_id[i], self.n_samples[i], self.max_tokens[i], self.batch[i], members)
        n = len(self)
        j = i + n if -n <= i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"group {i} of {n}")
        made = self._made.get(j)
        if made is None:
            member_max, member_trained = self.members.get(j, (None, None))
            batch = int(self.batch[j])
            made = self._made[j] = GroupSpec(int(self.prompt_id[j]), int(self.n_samples[j]), int(self.max_tokens[j]), 0,
                                             None, member_max, member_trained, None if batch < 0 else batch)
        return made

    def __iter__(self):
        return (self[j] for j in range(len(self)))

    def __add__(self, other):
        """Columns where both are columns no one has read a group of (`proposal + ctx.draw(n)`), or the other is empty
        (an empty proposal: the carried groups fill the step), else a list."""
        if not len(other) and self.untouched:
            return self
        if not (isinstance(other, GroupSpecs) and self.untouched and other.untouched):
            return list(self) + list(other)
        members = {**self.members, **{len(self) + j: m for j, m in other.members.items()}}
        return GroupSpecs(*(np.concatenate([getattr(self, k), getattr(other, k)]) for k in _SPEC_COLUMNS), members)

    def __radd__(self, other):
        return self if not len(other) and self.untouched else list(other) + list(self)

    def __eq__(self, other):
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    __hash__ = None  # a sequence compared by its contents, as a list is

    def __repr__(self) -> str:
        return f"GroupSpecs({list(self)!r})"


@dataclass(slots=True, eq=False)
class Request:
    """One response in flight. Policies must treat it as read-only (`check_policy` verifies this)."""

    rid: int
    group_id: int  # the group (one prompt's samples, submitted together) it belongs to
    step: int  # the step it was first submitted in
    prompt_id: int
    sample_idx: int
    prompt_len: int
    max_tokens: int  # budget for the whole response, tokens already generated included
    priority: int = 0
    instance: int | None = None
    seed: int = 0
    batch: int = -1  # the data loader's batch it came from (GroupSpec.batch); -1: its own step's
    batch_sample: int = -1  # its index among the samples of its prompt in that batch (sample_idx counts in the step)
    # filled in by the engine
    generated: int = 0  # tokens generated so far (a carried response resumes from here)
    finish_reason: str = ""
    stop_reason: str = ""
    reward: float = float("nan")
    submit_time: float = float("nan")  # seconds on the world's clock, for the latest submission
    first_token_time: float = float("nan")
    finish_time: float = float("nan")
    first_version: int = -1  # weights versions (train steps applied) that generated its first and last tokens
    last_version: int = -1
    # (version, tokens generated before it) each time it resumed under other weights than it last ran with:
    # a carried response resumed next step, or an async rollout interrupted by new weights. None: never.
    resumes: list[tuple[int, int]] | None = None
    tokens_before_resume: int = 0  # tokens generated under older weights (off-policy after a carry)
    # the engine instance its latest submission ran on: `instance` where pinned, else the engine's dispatcher's
    # choice (-1: not submitted yet). Kept apart from `instance` so a carried response is not pinned by it.
    ran_on: int = -1
    exact: bool = True  # simulator: replayed exactly from the trace (False: modelled)
    tokens: list[int] | None = None  # real world: generated token ids so far
    signals: dict = field(default_factory=dict)  # early-exit signals (world-specific), read by policies

    @property
    def done(self) -> bool:
        return self.finish_reason != ""


# What a request is created with, and what the engine and the controller fill in (lssim.loop.core.Request's fields).
REQUEST_INTS = ("rid", "group_id", "step", "prompt_id", "sample_idx", "prompt_len", "max_tokens", "priority", "instance", "seed",
         "batch", "batch_sample", "generated", "first_version", "last_version", "tokens_before_resume", "ran_on")
REQUEST_FLOATS = ("reward", "submit_time", "first_token_time", "finish_time")


REQUEST_DTYPES = {**{n: np.int64 for n in REQUEST_INTS}, **{n: float for n in REQUEST_FLOATS}, "exact": bool}


def field_of(requests: list[Request], name: str) -> np.ndarray:
    """One field of Request objects, as the column RequestColumns holds it (instance None as -1)."""
    values = map(operator.attrgetter(name), requests)  # (a generator's frame per object costs twice the read)
    if name == "instance":
        return instance_column(list(values))
    if name in REQUEST_DTYPES:
        return np.fromiter(values, REQUEST_DTYPES[name], len(requests))
    return object_array(list(values))


def instance_column(instances: Sequence[int | None]) -> np.ndarray:
    """Request.instance of each request as the column holds it: None (the dispatcher chooses) as -1."""
    if instances.count(None) == len(instances):  # the usual submission: nobody pinned any
        return np.full(len(instances), -1, np.int64)
    return np.fromiter((-1 if i is None else i for i in instances), np.int64, len(instances))


def object_array(values: list) -> np.ndarray:
    """A list as a numpy object array (a column of strings or lists)."""
    out = np.empty(len(values), object)
    out[:] = values
    return out


@dataclass(slots=True)
class Event:
    """Something an engine reports: a request finished, or passed a progress checkpoint."""

    kind: str  # FINISHED, PROGRESS or WAKE
    request: Request | None  # None for WAKE
    time: float


@dataclass(slots=True, frozen=True)
class InstanceLoad:
    """What placement rules may see of one engine instance."""

    running: int
    waiting: int
    pending_tokens: int  # sum over its unfinished requests of (max_tokens - generated): an upper bound of its work


@dataclass(slots=True, frozen=True)
class PromptPool:
    """The prompts a policy may choose from, as arrays (fast to filter and sort)."""

    prompt_id: np.ndarray
    prompt_len: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt_id)


@dataclass(slots=True, frozen=True)
class StepContext:
    """What a policy sees when it plans a step."""

    step: int
    groups_per_step: int  # the run's nominal number of groups (prompts) per step
    group_size: int
    max_tokens: int
    groups_left: int  # groups the run may still train on (the run ends at zero)
    carried_groups: int  # groups carried over from the last step, resubmitted before the plan
    pool: PromptPool
    rng: np.random.Generator  # the policy's own generator, seeded by the run
    oracle_length: object = None  # simulator only: f(step, prompt_id, sample_idx, max_tokens) -> length; None in the real world
    # draw(n): n more groups from the data loader, continuing where this step's proposal (and earlier draws) left
    # off; what is drawn is consumed, as in slime's data source. For over-provisioning and top-ups (during the
    # step's rollout too). A read-only sequence, as the proposal is (columns where the loader's batches are).
    # None where no loader is attached (a hand-made context).
    draw: Callable[[int], Sequence[GroupSpec]] | None = None
    reward_scale: RewardScale = RewardScale()  # the run's reward range: what "correct" and "lowest" mean (lssim.loop.rewards)


def spec_columns(proposal) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompt_id, n_samples, max_tokens) of each group of a plan, as int64 arrays: read from the columns of a
    GroupSpecs no one has read a member of (so the plan stays columns for the controller), else from the objects."""
    if isinstance(proposal, GroupSpecs) and proposal.untouched:
        return proposal.prompt_id, proposal.n_samples, proposal.max_tokens
    fields = np.array([(g.prompt_id, g.n_samples, g.max_tokens) for g in proposal], np.int64).reshape(-1, 3)
    return fields[:, 0], fields[:, 1], fields[:, 2]


@dataclass(slots=True)
class RolloutState:
    """Counters of the rollout phase in progress, kept by the controller and read by policies."""

    step: int
    started: float
    now: float = 0.0
    groups_submitted: int = 0
    groups_done: int = 0  # groups whose every member has ended
    groups_effective: int = 0  # of those, groups whose rewards differ (the ones GRPO learns from)
    requests_in_flight: int = 0
    responses_done: int = 0
    extra_rounds: int = 0  # top-up rounds submitted after the first (DAPO-style)

    @property
    def elapsed(self) -> float:
        return self.now - self.started


class Group:
    """A prompt's group as it goes to training: its members and their rewards.

    Members are `Request` objects (policies' copies), rows of the step's columns (lssim.loop.columns.RequestColumns,
    the batch route: then `requests` makes the objects on first use), or both: the event route's objects and the rows
    they were gathered into when the step closed (lssim.loop.records.StepState.close). `column(name)` reads a field of
    every member from the columns where it has them."""

    __slots__ = ("prompt_id", "step", "_requests", "columns", "rows")

    def __init__(self, prompt_id: int, step: int, requests: list[Request] | None = None, *, columns=None, rows=None):
        if requests is None and columns is None:
            raise ValueError("Group: give its members as requests, as columns and rows, or both")
        if (columns is None) != (rows is None):
            raise ValueError("Group: columns and rows go together")
        self.prompt_id, self.step, self._requests, self.columns, self.rows = prompt_id, step, requests, columns, rows

    @property
    def requests(self) -> list[Request]:
        if self._requests is None:
            self._requests = self.columns.to_requests(self.rows)
        return self._requests

    @property
    def held(self) -> list[Request] | None:
        """Its members as the Request objects it holds (with what columns lack: a real engine's token ids, signals);
        None where it is rows only."""
        return self._requests

    def column(self, name: str) -> np.ndarray:
        """A field of every member, in member order (lssim.loop.columns.RequestColumns's names and dtypes)."""
        if self.columns is not None:
            return getattr(self.columns, name)[self.rows]
        return field_of(self._requests, name)

    def __len__(self) -> int:
        return len(self._requests) if self._requests is not None else len(self.columns.rid[self.rows])

    def subset(self, keep: np.ndarray) -> "Group":
        """The same group with only the members where `keep` (a boolean per member) is True."""
        return self.take(np.flatnonzero(keep))

    def take(self, members: np.ndarray) -> "Group":
        """The same group with only the members at positions `members`, in that order."""
        requests = None if self._requests is None else list(map(self._requests.__getitem__, members.tolist()))
        if self.columns is None:
            return Group(self.prompt_id, self.step, requests)
        rows = np.arange(len(self.columns))[self.rows] if isinstance(self.rows, slice) else np.asarray(self.rows)
        return Group(self.prompt_id, self.step, requests, columns=self.columns, rows=rows[members])

    @property
    def rewards(self) -> np.ndarray:
        return np.asarray(self.column("reward"), dtype=float)

    @property
    def has_signal(self) -> bool:
        """GRPO learns nothing from a group whose rewards are all equal."""
        rewards = self.rewards
        return len(rewards) > 1 and float(rewards.max() - rewards.min()) > 0.0

    def __eq__(self, other) -> bool:
        return (isinstance(other, Group) and (self.prompt_id, self.step) == (other.prompt_id, other.step)
                and self.requests == other.requests)

    __hash__ = None

    def __repr__(self) -> str:
        return f"Group(prompt_id={self.prompt_id}, step={self.step}, members={len(self)})"


def version_spans(r: Request) -> list[tuple[int, int]]:
    """(weights version, tokens generated under it) of a response, oldest first; versions with no token left out."""
    starts = [(r.first_version, 0)] + (r.resumes or [])
    ends = [g for _, g in starts[1:]] + [r.generated]
    return [(v, end - g0) for (v, g0), end in zip(starts, ends) if end > g0]


def note_resume(r: Request, version: int) -> None:
    """A response resumes under weights `version`: its next tokens are that version's (see version_spans)."""
    if r.generated == 0:  # it never started: its first token comes from these weights
        r.first_version, r.resumes = version, None
    elif (r.resumes[-1][0] if r.resumes else r.first_version) != version:
        r.resumes = (r.resumes or []) + [(version, r.generated)]
    r.tokens_before_resume = r.generated


def off_policy_tokens(r: Request, train_step: int) -> int:
    """How many of a response's tokens were generated under weights older than those `train_step` trains from
    (version `train_step`): tokens before its last resume if it resumed under those weights, all of them if it
    ended before (its group completed later, as with partial rollouts). A trainer that masks stale tokens masks
    exactly these."""
    if r.first_version < 0:  # no version history (a hand-made request): what the last resume says
        return r.tokens_before_resume if r.last_version >= train_step else r.generated
    if r.resumes is None:
        return 0 if r.first_version >= train_step else r.generated
    return sum(n for v, n in version_spans(r) if v < train_step)


def token_lags(r: Request, train_step: int) -> list[tuple[int, int]]:
    """(versions behind `train_step`, tokens) of a response trained at `train_step`: its staleness by token."""
    return [(train_step - v, n) for v, n in version_spans(r)]


def loader_key(request, drawn_ahead: dict | None = None) -> tuple[int, int]:
    """The (step, sample) a request is answered by (lssim.loop.core.Request.batch): a loader group's from its batch, unless
    `drawn_ahead` (a Workload's `_drawn_ahead`: its trace's `batch` column) says its run recorded the group at a step of
    its own (april draws batch k + 1 in step k), then from there; any other request from its own step."""
    if request.batch < 0:
        return request.step, request.sample_idx
    drawn = drawn_ahead.get((request.batch, request.prompt_id)) if drawn_ahead else None
    if drawn is not None and request.batch_sample < len(drawn):
        return drawn[request.batch_sample]
    return request.batch, request.batch_sample


def loader_keys(requests, drawn_ahead: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`loader_key` of every request of columns (lssim.loop.columns.RequestColumns): (step, sample) arrays."""
    loader = requests.batch >= 0
    step = np.where(loader, requests.batch, requests.step)
    sample = np.where(loader, requests.batch_sample, requests.sample_idx)
    if drawn_ahead:
        batch, pid = requests.batch, requests.prompt_id
        for i in np.flatnonzero(loader).tolist():
            drawn = drawn_ahead.get((int(batch[i]), int(pid[i])))
            if drawn is not None and sample[i] < len(drawn):
                step[i], sample[i] = drawn[sample[i]]
    return step, sample
