"""What a policy and the controller exchange: a progress answer (Action), what a policy needs of the world
(PolicyNeeds), what it may remember of a step (StepOutcome), and the trainer's question and its answer (TrainBatch,
TrainMask). Plain data; the hooks that use them are declared in lssim.loop.contracts.PolicyHooks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lssim.loop.core import Speculation
from lssim.loop.signals import SIGNAL_NAMES

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
    score: bool = False  # stop only: train with the world's score of what was written (Engine.score_partial)

    @staticmethod
    def stop(reason: str, reward: float | None = None, score: bool = False) -> "Action":
        if score and reward is not None:
            raise ValueError("Action.stop: give a reward or ask for the partial response's score, not both")
        return Action("stop", reason, reward, score=score)

    @staticmethod
    def carry(reason: str = "") -> "Action":
        return Action("carry", reason)

    @staticmethod
    def requeue(priority: int | None = None, instance: int | None = None, reason: str = "") -> "Action":
        return Action("requeue", reason, priority=priority, instance=instance)


@dataclass(slots=True, frozen=True)
class ProgressStops:
    """The array form of on_progress's stops (Policy.progress_stops) for a submission, one entry per request: where
    the policy stops it and how, as `Action.stop` would say at that checkpoint."""

    at: np.ndarray  # int: tokens generated at the checkpoint where it is stopped; -1: never
    reason: np.ndarray  # object: the stop's reason ("" where none)
    reward: np.ndarray  # float: the reward it trains with; NaN: none given (its own, or the world's score if `score`)
    score: np.ndarray  # bool: trains with the world's score of what it wrote (Action.stop(score=True))

    @staticmethod
    def of(at: np.ndarray, reason: np.ndarray, reward: float | None = None, score: bool = False) -> "ProgressStops":
        """Stops at `at` with their reasons, every one with the same `reward` (None: none given) or `score`."""
        n = len(at)
        return ProgressStops(at, reason, np.full(n, np.nan if reward is None else reward), np.full(n, bool(score)))


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
    - signals: the early-exit signals it reads at progress events (lssim.loop.signals.SIGNAL_NAMES: "repetition",
      "entropy"); an engine that cannot give them (a trace without them) refuses the run
      (lssim.loop.contracts.Engine.set_signals).
    """

    oracle: bool = False
    speculation: Speculation | None = None
    mask_stale_tokens: bool = False
    signals: frozenset[str] = frozenset()

    def __post_init__(self):
        for name in ("oracle", "mask_stale_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"PolicyNeeds.{name} must be a bool, got {getattr(self, name)!r}")
        if self.speculation is not None and not isinstance(self.speculation, Speculation):
            raise ValueError(f"PolicyNeeds.speculation must be an lssim.loop.core.Speculation or None, got {self.speculation!r}")
        object.__setattr__(self, "signals", frozenset(self.signals))
        if unknown := self.signals - set(SIGNAL_NAMES):
            raise ValueError(f"PolicyNeeds.signals: unknown {sorted(unknown)}; the signals are {', '.join(SIGNAL_NAMES)}")

    @staticmethod
    def merge(needs: list["PolicyNeeds"], name: str) -> "PolicyNeeds":
        """The needs of policies acting as one (`Compose`): a need any of them has, and the one speculation
        those that ask for it agree on (`name`, the composition's, names a disagreement in the error)."""
        asked = {n.speculation for n in needs if n.speculation is not None}
        if len(asked) > 1:
            raise ValueError(f"{name}: members ask the engine for different speculation: {sorted(map(repr, asked))}")
        return PolicyNeeds(oracle=any(n.oracle for n in needs), speculation=asked.pop() if asked else None,
                           mask_stale_tokens=any(n.mask_stale_tokens for n in needs),
                           signals=frozenset().union(*(n.signals for n in needs)))


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
