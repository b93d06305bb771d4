"""The controller's books: what it tracks while a step runs, and the records a step leaves behind.

The controller (lssim.controller) creates a `StepState` when a step starts and fills it as the step runs;
once the step has trained it closes the step with a `StepEnd` and hands both here:

    ResponseTable.settle(end, step)       members that ended in earlier steps, whose groups completed now:
                                          their rows learn whether (and when) they trained
    ResponseTable.add(state, end, ...)    one row per response that ended in the step (RESPONSE_COLUMNS)
    step_row(state, end, ...)             the step's row (RunResult.steps)
    step_outcome(state, end)              what the policy is told (Policy.end_step)

Both worlds keep the same books: nothing here knows whether the engine is simulated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Container

import numpy as np
import pandas as pd

from .core import ABORT, LENGTH, POLICY_STOP, STOP, Group, Request, RolloutState, off_policy_tokens, token_lags
from .policy import StepOutcome

# Lower bound of a step's rollout time, given its responses' prompt lengths, context at the start of
# the step (prompt + tokens carried in), tokens generated in the step, and which were still generating when
# it began (None: none). See lssim.bounds.
LowerBound = Callable[..., float]

RESPONSE_COLUMNS = ("step", "end_step", "prompt_id", "sample_idx", "group_id", "prompt_len", "response_len", "max_tokens",
                    "reward", "finish_reason", "stop_reason", "policy_version_first", "policy_version_last",
                    "tokens_before_resume", "instance", "submit_time", "first_token_time", "finish_time", "exact", "trained",
                    "train_step", "off_policy_tokens", "natural_len", "natural_reward")
# trained / train_step: whether (and in which step) the response's group went to training; a member that ended
#   before its group completed is settled when the group is (partial rollouts), so its row is updated then.
# off_policy_tokens: its leading tokens generated under weights older than those of the step that trained it
#   (lssim.core.off_policy_tokens; for a response never trained, relative to the step it ended in).
# natural_len / natural_reward: what the response would have been had no policy stopped it (the simulator's
#   Workload at its budget; -1 / NaN where the engine cannot tell, as on vLLM: Engine.counterfactual).


@dataclass(slots=True, eq=False)
class StepState:
    """One step's books, created when the step starts and read by the records when it ends."""

    step: int
    started: float  # the world's clock at the step's start
    busy_at_start: tuple[float, float]  # Engine.utilization() at the step's start
    rollout: RolloutState  # the counters policies read during the rollout
    carried_in: list[Request]  # unfinished responses of the last step, resubmitted first
    members: dict[int, list[Request]] = field(default_factory=dict)  # group id -> every member (carried groups too)
    open_members: dict[int, int] = field(default_factory=dict)  # group id -> members not yet ended
    context_at_start: dict[int, int] = field(default_factory=dict)  # rid -> prompt + tokens generated before the step
    samples_planned: dict[int, int] = field(default_factory=dict)  # prompt -> samples planned (keeps sample_idx unique)
    fresh: list[Request] = field(default_factory=list)  # submitted by the plan
    topped_up: list[Request] = field(default_factory=list)  # submitted by top-ups during the rollout
    in_flight: dict[int, Request] = field(default_factory=dict)  # rid -> submitted and not yet ended or carried
    ended: list[Request] = field(default_factory=list)  # ended in this step, in the order they ended
    carried_out: list[Request] = field(default_factory=list)  # unfinished, to resume next step (or kept generating)
    kept_in: list[Request] = field(default_factory=list)  # still generating since an earlier step (async modes)
    version: int = 0  # the weights version on the rollout engine when the step's rollout started
    waited: float = 0.0  # seconds between the last rollout's end and this one's start (weights, switches)
    dropped_groups: set[int] = field(default_factory=set)  # cancelled as stale: never trained


@dataclass(slots=True, frozen=True)
class StepEnd:
    """How a step ended: its clock readings, the engine's utilization over its rollout, what trained."""

    rollout_end: float
    step_end: float
    busy_at_rollout_end: tuple[float, float]  # Engine.utilization() when the rollout ended
    done_groups: list[Group]  # groups whose every member has ended (this step or before)
    trained: list[Group]  # what the policy selected from them (possibly subsets or reshaped copies)
    trained_ids: frozenset[int]  # rids of the trained responses (select may train on copies: match by rid)
    train_metrics: dict
    timing: "TrainTiming | None" = None  # when the training ran (lssim.modes); None: ended with the rollout
    previous_end: float = float("nan")  # when the previous step's training ended (the step's time runs from it)


class ResponseTable:
    """The response rows of a run, column by column (one list per column is several times faster than a
    dict per row), with the rows of members whose groups are still open, to settle when the groups complete."""

    def __init__(self):
        self.columns: dict[str, list] = {k: [] for k in RESPONSE_COLUMNS}
        self._pending: dict[int, int] = {}  # rid -> its row, for members of groups not yet settled

    def frame(self) -> pd.DataFrame:
        """The rows as one frame, built once: each column of plain numbers goes to numpy in one call (what
        pandas would infer from the list, at a fraction of its cost); any other column is left to pandas."""
        return pd.DataFrame({name: _as_column(values) for name, values in self.columns.items()})

    def settle(self, end: StepEnd, step: int) -> None:
        """Members of the groups completed this step that ended in earlier steps: trained now, or never."""
        cols = self.columns
        for g in end.done_groups:
            for r in g.requests:
                idx = self._pending.pop(r.rid, None)
                if idx is not None and r.rid in end.trained_ids:
                    cols["trained"][idx] = True
                    cols["train_step"][idx] = step
                    cols["off_policy_tokens"][idx] = off_policy_tokens(r, step)

    def add(self, s: StepState, end: StepEnd, counterfactual: Callable[[Request], tuple[int, float] | None],
            open_groups: Container[int]) -> None:
        """A row for each response that ended in step `s`; one whose group is in `open_groups` (not complete)
        is settled in a later step."""
        ended, step, t0, cols = s.ended, s.step, s.started, self.columns
        natural = [counterfactual(r) for r in ended]
        natural = [(-1, float("nan")) if c is None else c for c in natural]
        trained_now = [r.rid in end.trained_ids for r in ended]
        first_row = len(cols["step"])
        for i, r in enumerate(ended):
            if r.group_id in open_groups:
                self._pending[r.rid] = first_row + i
        for col, values in (
            ("step", [r.step for r in ended]), ("end_step", [step] * len(ended)), ("prompt_id", [r.prompt_id for r in ended]),
            ("sample_idx", [r.sample_idx for r in ended]), ("group_id", [r.group_id for r in ended]),
            ("prompt_len", [r.prompt_len for r in ended]), ("response_len", [r.generated for r in ended]),
            ("max_tokens", [r.max_tokens for r in ended]), ("reward", [r.reward for r in ended]),
            ("finish_reason", [r.finish_reason for r in ended]), ("stop_reason", [r.stop_reason for r in ended]),
            ("policy_version_first", [r.first_version for r in ended]), ("policy_version_last", [r.last_version for r in ended]),
            ("tokens_before_resume", [r.tokens_before_resume for r in ended]),
            ("instance", [-1 if r.instance is None else r.instance for r in ended]),
            ("submit_time", [r.submit_time - t0 for r in ended]), ("first_token_time", [r.first_token_time - t0 for r in ended]),
            ("finish_time", [r.finish_time - t0 for r in ended]), ("exact", [r.exact for r in ended]),
            ("trained", trained_now), ("train_step", [step if t else -1 for t in trained_now]),
            ("off_policy_tokens", [off_policy_tokens(r, step) for r in ended]),
            ("natural_len", [c[0] for c in natural]), ("natural_reward", [c[1] for c in natural]),
        ):
            cols[col].extend(values)


def _as_column(values: list):
    if not values or not isinstance(values[0], (bool, int, float)):
        return values
    array = np.array(values)
    return array if array.dtype.kind in "biuf" else values


def step_row(s: StepState, end: StepEnd, lower_bound: LowerBound | None, n_instances: int) -> dict:
    """The step's row: times, tokens, how its responses ended (the books balance: responses_in equals the
    five outcomes), what trained, how busy the engine was."""
    rollout_s = end.rollout_end - s.started
    tokens, bound = _tokens_and_bound(s, lower_bound)
    reasons = [r.finish_reason for r in s.ended]
    trained, step = end.trained, s.step
    # Off-policy share of what trains now: tokens generated under weights older than this step's.
    trained_requests = [r for g in trained for r in g.requests]
    off_policy = sum(off_policy_tokens(r, step) for r in trained_requests)
    trained_tokens = sum(r.generated for r in trained_requests)
    busy = end.busy_at_rollout_end[0] - s.busy_at_start[0]
    seq_seconds = end.busy_at_rollout_end[1] - s.busy_at_start[1]
    row = {
        "step": step,
        "rollout_seconds": rollout_s,
        "train_seconds": end.step_end - end.rollout_end if end.timing is None else sum(end.timing.phases.values()),
        "step_seconds": end.step_end - (s.started if end.timing is None else end.previous_end),
        "tokens": tokens,
        "tokens_per_second": _per_second(float(tokens), rollout_s),
        "responses_in": len(s.carried_in) + len(s.kept_in) + len(s.fresh) + len(s.topped_up),
        "carried_in": len(s.carried_in) + len(s.kept_in),
        "finished": reasons.count(STOP),
        "truncated": reasons.count(LENGTH),
        "policy_stopped": reasons.count(POLICY_STOP),
        "dropped": reasons.count(ABORT),
        "carried_out": len(s.carried_out),
        "groups_trained": len(trained),
        "effective_groups": sum(g.has_signal for g in trained),
        "lower_bound_seconds": bound,
        "lower_bound_efficiency": _per_second(bound, rollout_s),
        "long_tail_ratio": _long_tail_ratio(s),
        "off_policy_token_fraction": off_policy / trained_tokens if trained_tokens else 0.0,
        "exact_fraction": float(np.mean([r.exact for r in s.ended])) if s.ended else float("nan"),
        "mean_reward": float(np.nanmean([r.reward for r in trained_requests])) if trained else float("nan"),
        "busy_fraction": _per_second(busy, n_instances * rollout_s),  # of the instances' time
        "mean_running": _per_second(seq_seconds, n_instances * rollout_s),  # sequences per instance
    }
    row.update({f"trainer_{k}": v for k, v in end.train_metrics.items()})
    return row


def _per_second(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else float("nan")


def _tokens_and_bound(s: StepState, lower_bound: LowerBound | None) -> tuple[int, float]:
    """Tokens generated in the step by the responses that ran in it (ended or carried out), and the lower
    bound of the time the rollout needed to generate them (NaN without a bound)."""
    ran = s.ended + s.carried_out
    ctx0 = np.array([s.context_at_start[r.rid] for r in ran], dtype=np.int64)
    ctx1 = np.array([r.prompt_len + r.generated for r in ran], dtype=np.int64)
    step_tokens = ctx1 - ctx0
    prompt_lens = np.array([r.prompt_len for r in ran], dtype=np.int64)
    running = None
    if s.kept_in:  # still generating when the step began (async): no prefill, maybe mid-iteration
        kept = {r.rid for r in s.kept_in}
        running = np.array([r.rid in kept for r in ran], dtype=bool)
    bound = lower_bound(prompt_lens, ctx0, step_tokens, running) if lower_bound and len(ran) else float("nan")
    return int(step_tokens.sum()), bound


def _long_tail_ratio(s: StepState) -> float:
    """The last finish over the median one, among responses that ended by themselves or at their budget."""
    finish = np.array([r.finish_time - s.started for r in s.ended if r.finish_reason in (STOP, LENGTH)], dtype=float)
    return float(finish.max() / np.median(finish)) if len(finish) and np.median(finish) > 0 else float("nan")


def step_outcome(s: StepState, end: StepEnd) -> StepOutcome:
    """What a policy may remember of the step (Policy.end_step): the responses that ended in it."""
    ended = s.ended
    return StepOutcome(
        step=s.step,
        prompt_id=np.array([r.prompt_id for r in ended], dtype=np.int64),
        sample_idx=np.array([r.sample_idx for r in ended], dtype=np.int64),
        response_len=np.array([r.generated for r in ended], dtype=np.int64),
        max_tokens=np.array([r.max_tokens for r in ended], dtype=np.int64),
        reward=np.array([r.reward for r in ended], dtype=float),
        finish_reason=np.array([r.finish_reason for r in ended], dtype=object),
        rollout_seconds=end.rollout_end - s.started,
        trained_prompt_ids=np.array([g.prompt_id for g in end.trained], dtype=np.int64),
    )


def mode_fields(s: StepState, end: StepEnd, mode, n_instances: int) -> dict:
    """The step's end-to-end fields under an execution mode (lssim.modes.ModeConfig): when its rollout and
    training ran, each train phase, the devices kept busy, the tokens trained and how stale they were."""
    timing, trained = end.timing, [r for g in end.trained for r in g.requests]
    lags: dict[int, int] = {}
    step = s.step
    for r in trained:
        if r.resumes is None:  # one span (token_lags' common case, inlined: this runs once per trained response)
            if r.generated > 0:
                lag = step - r.first_version
                lags[lag] = lags.get(lag, 0) + r.generated
            continue
        for lag, n in token_lags(r, step):
            lags[lag] = lags.get(lag, 0) + n
    busy_instance_seconds = end.busy_at_rollout_end[0] - s.busy_at_start[0]
    row = {
        "rollout_start": s.started,
        "rollout_end": end.rollout_end,
        "train_start": timing.start,
        "train_end": timing.end,
        "wait_seconds": s.waited,
        "weights_version": s.version,
        **{f"{phase}_seconds": seconds for phase, seconds in timing.phases.items()},
        "rollout_busy_device_seconds": busy_instance_seconds * mode.rollout_devices / n_instances,
        "train_busy_device_seconds": timing.busy_device_seconds,
        "trained_tokens": sum(r.prompt_len + r.generated for r in trained),
        "max_staleness": max(lags) if lags else 0,
        "staleness_histogram": json.dumps({str(k): v for k, v in sorted(lags.items())}),
        "dropped_stale": sum(len(s.members[g]) for g in s.dropped_groups),
    }
    return row
