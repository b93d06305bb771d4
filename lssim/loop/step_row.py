"""A step's row of the step table and what a policy may remember of it: functions of the step's books
(lssim.loop.records) that the controller calls once the step's responses are booked and trained.
"""

from __future__ import annotations

import json

import numpy as np

from lssim.loop.columns import prompt_ids
from lssim.loop.core import ABORT, POLICY_STOP
from lssim.loop.decisions import StepOutcome
from lssim.loop.records import LowerBound, StepBooks, StepEnd, StepState


def step_row(s: StepState, books: StepBooks, end: StepEnd, lower_bound: LowerBound | None, n_instances: int) -> dict:
    """The step's row: times, tokens, how its responses ended (the books balance: responses_in equals the
    five outcomes), what trained, how busy the engine was."""
    rollout_s = end.rollout_end - s.started
    tokens, bound = _tokens_and_bound(books, lower_bound)
    reasons, trained, step = books.ended.finish_reason, books.trained, s.step
    stopped, truncated = books.stopped, books.truncated
    natural = stopped | truncated
    others = reasons if not natural.all() else reasons[:0]  # (most steps end every response so: no more to compare)
    # Off-policy share of what trains now: tokens generated under weights older than this step's.
    off_policy = int(trained.off_policy_tokens(step, books.trained_spans).sum())
    trained_tokens = int(trained.generated.sum())
    busy = end.busy_at_rollout_end[0] - s.busy_at_start[0]
    seq_seconds = end.busy_at_rollout_end[1] - s.busy_at_start[1]
    row = {
        "step": step,
        "rollout_seconds": rollout_s,
        "train_seconds": end.step_end - end.rollout_end if end.timing is None else sum(end.timing.phases.values()),
        "step_seconds": end.step_end - (s.started if end.timing is None else end.previous_end),
        "tokens": tokens,
        "tokens_per_second": _per_second(float(tokens), rollout_s),
        "responses_in": len(s.carried_in) + len(s.kept_in) + len(s.fresh) + s.fresh_rows_only + len(s.topped_up) + (len(s.batch) if s.batch is not None else 0),
        "carried_in": len(s.carried_in) + len(s.kept_in),
        "finished": int(stopped.sum()),
        "truncated": int(truncated.sum()),
        "policy_stopped": int((others == POLICY_STOP).sum()),
        "dropped": int((others == ABORT).sum()),
        "carried_out": len(s.carried_out),
        "groups_trained": len(end.trained),
        "effective_groups": int(books.trained_signal.sum()),
        "lower_bound_seconds": bound,
        "lower_bound_efficiency": _per_second(bound, rollout_s),
        "long_tail_ratio": _long_tail_ratio(books.ended.finish_time[natural] - s.started),
        "off_policy_token_fraction": off_policy / trained_tokens if trained_tokens else 0.0,
        "exact_fraction": np.count_nonzero(books.ended.exact) / len(books.ended) if len(books.ended) else float("nan"),
        "mean_reward": _nanmean(trained.reward) if len(end.trained) else float("nan"),
        "busy_fraction": _per_second(busy, n_instances * rollout_s),  # of the instances' time
        "mean_running": _per_second(seq_seconds, n_instances * rollout_s),  # sequences per instance
    }
    row.update({f"trainer_{k}": v for k, v in end.train_metrics.items()})
    return row


def _nanmean(values: np.ndarray) -> float:
    """np.nanmean, without its NaN masks where there is no NaN (the same sum over the same count: equal bits)."""
    mean = float(np.mean(values))
    return mean if mean == mean else float(np.nanmean(values))


def _per_second(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else float("nan")


def _tokens_and_bound(books: StepBooks, lower_bound: LowerBound | None) -> tuple[int, float]:
    """Tokens generated in the step by the responses that ran in it (ended or carried out), and the lower
    bound of the time the rollout needed to generate them (NaN without a bound)."""
    ran = books.ran
    ctx0 = ran.context_at_start
    step_tokens = ran.prompt_len + ran.generated - ctx0
    bound = lower_bound(ran.prompt_len, ctx0, step_tokens, books.running) if lower_bound and len(ran) else float("nan")
    return int(step_tokens.sum()), bound


def _long_tail_ratio(finish: np.ndarray) -> float:
    """The last finish over the median one (`finish`: of the responses that ended by themselves or at their budget,
    from the step's start)."""
    if not len(finish):
        return float("nan")
    median = _median(finish)
    return float(finish.max() / median) if median > 0 else float("nan")


def _median(values: np.ndarray) -> float:
    """np.median, to the bit, by one partition (np.median's checks and copies cost more than the partition here)."""
    n = len(values)
    if n < 2 or np.isnan(values).any():
        return float(np.median(values))
    half = n // 2
    if n % 2:
        return float(np.partition(values, half)[half])
    part = np.partition(values, (half - 1, half))
    return float((part[half - 1] + part[half]) / 2)


def step_outcome(s: StepState, books: StepBooks, end: StepEnd) -> StepOutcome:
    """What a policy may remember of the step (Policy.end_step): the responses that ended in it."""
    e = books.ended
    return StepOutcome(
        step=s.step, prompt_id=e.prompt_id, sample_idx=e.sample_idx, response_len=e.generated, max_tokens=e.max_tokens,
        reward=e.reward, finish_reason=e.finish_reason, rollout_seconds=end.rollout_end - s.started,
        trained_prompt_ids=prompt_ids(end.trained),
    )


def mode_fields(s: StepState, books: StepBooks, end: StepEnd, mode, n_instances: int) -> dict:
    """The step's end-to-end fields under an execution mode (lssim.loop.modes.ModeConfig): when its rollout and
    training ran, each train phase, the devices kept busy, the tokens trained and how stale they were."""
    timing, trained = end.timing, books.trained
    lags = trained.token_lags(s.step, books.trained_spans)
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
        "trained_tokens": int((trained.prompt_len + trained.generated).sum()),
        "max_staleness": max(lags) if lags else 0,
        "staleness_histogram": json.dumps({str(k): v for k, v in sorted(lags.items())}),
        "dropped_stale": sum(len(s.members[g]) for g in s.dropped_groups),
    }
    return row
