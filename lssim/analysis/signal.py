"""What a run gave the learner: the summary's `signal` record (issue 35, point 4).

A replay's speedup says what a policy saves; these say what it costs to learning, from the run's responses and
steps frames:

    nonzero_advantage_groups     trained groups whose rewards differ (the only ones GRPO learns from)
    trained_tokens               response tokens of the trained responses (the loss's tokens before any mask)
    trained_tokens_by_staleness  those tokens by the weight versions they lag the step that trained them (0: on-policy)
    lost_correct                 responses truncated or policy-stopped short of an end the Workload knows was correct
    lost_correct_unknown         truncated or stopped responses whose uncut end nobody knows (a real engine's)
    dropped_correct              responses dropped (aborted, e.g. over async's staleness bound) that would have been correct
    pruned_tokens                response tokens a train mask took out of the loss (0 without one)
    length_bias                  mean trained response length over the trace's mean response length (`length_bias`)
    length_bias_within_prompts   the same, prompt by prompt: over the trace's mean for the prompts trained
                                 (a run summarized without the trace it replayed has neither)

    trace_lengths(trace, steps)       the trace's response tokens and rows, in all and per prompt (what length_bias
                                      compares with)
    run_signal(res, lengths)          one run's flat summary fields (`lssim.analysis.replay.run_summary`)
    signal_record(row, baseline)      the `signal` object of one summary row, with its ratios to the baseline's row
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lssim.loop.rewards import RewardScale

# The flat summary fields run_signal adds (the summary's other columns hold the rest of the record).
SIGNAL_COLUMNS = ("nonzero_advantage_groups", "trained_response_tokens", "lost_correct", "lost_correct_unknown",
                  "dropped_correct", "pruned_tokens", "length_bias", "length_bias_within_prompts")
# The record's fields a ratio to the baseline's is given for (policy's / baseline's).
COMPARED = ("nonzero_advantage_groups", "trained_tokens", "lost_correct", "pruned_tokens", "length_bias",
            "length_bias_within_prompts")


@dataclass(frozen=True)
class TraceLengths:
    """The replayed trace's response lengths that length_bias compares with: `tokens` over `rows` in all (the
    trace's mean response length), and `per_prompt` (index prompt_id; columns `tokens`, `rows`)."""

    tokens: int
    rows: int
    per_prompt: pd.DataFrame


def trace_lengths(trace: pd.DataFrame, steps: int | None = None) -> TraceLengths:
    """The trace's response lengths over its first `steps` recorded steps (all of them by default, or past its end:
    a run over more steps starts the trace over), the steps a replay of `steps` steps runs."""
    recorded = np.unique(trace["step"].to_numpy())
    if steps is not None and steps < len(recorded):
        trace = trace[trace["step"].isin(recorded[:steps])]
    grouped = trace.groupby("prompt_id", sort=False)["response_len"]
    per_prompt = pd.DataFrame({"tokens": grouped.sum().astype(np.int64), "rows": grouped.size().astype(np.int64)})
    return TraceLengths(int(trace["response_len"].sum()), len(trace), per_prompt)


def run_signal(res, lengths: TraceLengths | None = None, reasons: dict[str, np.ndarray] | None = None) -> dict:
    """The run's signal fields (SIGNAL_COLUMNS) from its responses and steps frames; `lengths`: the replayed
    trace's `trace_lengths` (None: no length_bias fields, as where a run is summarized without its trace);
    `reasons`: the responses' finish reasons as masks, where the caller has them (`cut_correct`)."""
    r, s = res.responses, res.steps
    trained = r["trained"].to_numpy(bool)
    trained_lengths = r["response_len"].to_numpy()[trained]
    lost, unknown, dropped = cut_correct(r, RewardScale(*res.meta.get("reward_scale", (0.0, 1.0))), reasons)
    fields = {
        "nonzero_advantage_groups": int(s["effective_groups"].sum()),
        "trained_response_tokens": int(trained_lengths.sum()),
        "lost_correct": lost,
        "lost_correct_unknown": unknown,
        "dropped_correct": dropped,
        "pruned_tokens": pruned_tokens(s),
    }
    if lengths is not None:
        fields["length_bias"] = length_bias(trained_lengths, lengths)
        fields["length_bias_within_prompts"] = length_bias_within_prompts(r.loc[trained, "prompt_id"], trained_lengths,
                                                                          lengths.per_prompt)
    return fields


def cut_correct(r: pd.DataFrame, scale: RewardScale, reasons: dict[str, np.ndarray] | None = None) -> tuple[int, int, int]:
    """(lost_correct, lost_correct_unknown, dropped_correct). A truncated (`length`) or policy-stopped response is
    lost correct when it ended short of its natural length (natural_len > response_len: the policy, or a lower cap,
    cut it) and its natural reward is correct on the run's scale (lssim.loop.rewards); one at its natural length
    ended as the trace's did and lost nothing. Unknown: natural_len < 0 or natural_reward NaN (no Workload behind
    it). dropped_correct: the same test over the aborted responses (dropped, never trained). `reasons`: {finish
    reason: mask} where the caller has them (lssim.analysis.replay.finish_reason_masks)."""
    if reasons is None:
        reasons = {reason: (r["finish_reason"] == reason).to_numpy(bool, na_value=False) for reason in ("length", "policy_stop", "abort")}
    natural_len, length = r["natural_len"].to_numpy(), r["response_len"].to_numpy()
    natural_reward = r["natural_reward"].to_numpy(float)
    known = (natural_len >= 0) & np.isfinite(natural_reward)
    lost = known & (natural_len > length) & scale.correct(np.where(known, natural_reward, scale.low))
    cut, dropped = reasons["length"] | reasons["policy_stop"], reasons["abort"]
    return int((cut & lost).sum()), int((cut & ~known).sum()), int((dropped & lost).sum())


def pruned_tokens(s: pd.DataFrame) -> float:
    """Response tokens the train masks took out of the loss over the run (0 without a train mask). NaN with value
    bridging: its batch holds copies of open groups, so "taken out" has no batch to be measured against
    (lssim.analysis.replay.pruning_summary)."""
    if "trainer_loss_tokens_before" not in s:
        return 0
    if "trainer_bridged_tokens" in s:
        return float("nan")
    return int(s["trainer_loss_tokens_before"].sum() - s["trainer_loss_tokens_after"].sum())


def length_bias(trained_lengths: np.ndarray, lengths: TraceLengths) -> float:
    """The mean length of the trained responses over the mean length of the trace's responses (`trace_lengths`:
    those of the steps the run replayed):

        length_bias = (sum_r len(r) / N) / (T / R)

    over the N trained responses r, the trace holding T response tokens in R rows. 1.0: the run trains responses as
    long as the trace's; below 1: shorter ones. Whatever makes them shorter counts: stops and lower caps, and which
    prompts train (async over a staleness bound drops the groups of long prompts and trains later, shorter ones in
    their place; `length_bias_within_prompts` leaves that part out). Computed as (sum len * R) / (T * N) in integers,
    so a run that trains each of the trace's responses once (the baseline's exact replay) gets exactly 1.0. NaN when
    nothing trained."""
    n, total = len(trained_lengths), int(trained_lengths.sum())
    if n == 0 or lengths.tokens == 0:
        return float("nan")
    return (total * lengths.rows) / (lengths.tokens * n)


def length_bias_within_prompts(trained_prompts: pd.Series, trained_lengths: np.ndarray, per_prompt: pd.DataFrame) -> float:
    """`length_bias` for the same prompts: the mean trained response length over the mean the trace's responses to
    the same prompts have, each prompt weighted by how many of its responses the run trained:

        length_bias_within_prompts = sum_r len(r) / sum_p n_p * T_p / R_p

    over the trained responses r, with n_p of them to prompt p, whose T_p response tokens over R_p rows the trace
    holds (`trace_lengths`' per_prompt). Below 1: the run trains shorter responses than the trace has for the very
    prompts it trains (stops, caps, retries that finish in time), whichever prompts those are. n_p * T_p is summed in
    integers before the division, so a run that trains each of the trace's responses once gets exactly 1.0.
    Responses to prompts the trace lacks are left out of both sums; NaN when none is left."""
    trained_prompts = trained_prompts.reset_index(drop=True)
    present = trained_prompts.isin(per_prompt.index).to_numpy()
    if not present.any():
        return float("nan")
    counts = trained_prompts[present].value_counts()
    prompts = per_prompt.loc[counts.index]
    expected = float(np.sum(counts.to_numpy(np.int64) * prompts["tokens"].to_numpy() / prompts["rows"].to_numpy()))
    return float(trained_lengths[present].sum()) / expected if expected > 0 else float("nan")


def signal_record(row: dict, baseline: dict | None) -> dict:
    """The `signal` object of a summary row (`run_summary`'s fields): counts as ints, unknowns as None, and
    `vs_baseline`, each COMPARED field over the baseline row's (None without a baseline, or where the baseline's
    is 0 or unknown)."""
    record = _record(row)
    if baseline is not None:
        base = _record(baseline)
        record["vs_baseline"] = {k: _ratio(record[k], base[k]) for k in COMPARED}
    else:
        record["vs_baseline"] = None
    return record


def _record(row: dict) -> dict:
    groups = row.get("groups_trained", 0)
    return {
        "nonzero_advantage_groups": _count(row["nonzero_advantage_groups"]),
        "nonzero_advantage_fraction": row["nonzero_advantage_groups"] / groups if groups else None,
        "trained_tokens": _count(row["trained_response_tokens"]),
        "trained_tokens_by_staleness": json.loads(row.get("staleness_histogram", "{}")),
        "lost_correct": _count(row["lost_correct"]),
        "lost_correct_unknown": _count(row["lost_correct_unknown"]),
        "dropped_correct": _count(row["dropped_correct"]),
        "pruned_tokens": _count(row["pruned_tokens"]),
        "length_bias": _number(row.get("length_bias")),
        "length_bias_within_prompts": _number(row.get("length_bias_within_prompts")),
    }


def _count(v) -> int | None:
    return None if v is None or v != v else int(v)


def _number(v) -> float | None:
    return None if v is None or v != v else float(v)


def _ratio(value, base) -> float | None:
    if value is None or base is None or base == 0 or not math.isfinite(base):
        return None
    return value / base


__all__ = ["SIGNAL_COLUMNS", "COMPARED", "TraceLengths", "trace_lengths", "run_signal", "cut_correct", "pruned_tokens",
           "length_bias", "length_bias_within_prompts", "signal_record"]
