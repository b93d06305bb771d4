"""Real against predicted: per step and per response (`compare`), where a step's time went (`compare_phases`), the
per-step medians over repeats, the per-policy fidelity table with the speedup error's parts, and what a policy did on
the real engine (`acted`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.run import KEY, RecordedRun
from lssim.loop.controller import RunResult


def compare(run: RecordedRun, sim: RunResult, policy: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Step by step and response by response, measured (the run) against predicted (the simulation).

    Steps: measured/predicted rollout seconds, their absolute percentage error, tokens, and the step's
    finish-order agreement (Spearman rank correlation of finish times over the responses both ended
    in that step). Responses: each one both worlds ended, with its measured and predicted finish time
    and length."""
    name = policy or run.name
    real_s, sim_s = run.steps, sim.steps
    steps = pd.DataFrame({"step": real_s["step"].to_numpy()})
    steps["measured_seconds"] = real_s["rollout_seconds"].to_numpy(float)
    predicted = sim_s.set_index("step")["rollout_seconds"]
    steps["predicted_seconds"] = steps["step"].map(predicted).to_numpy(float)
    steps["ape_pct"] = _ape_pct(steps["predicted_seconds"], steps["measured_seconds"])
    steps["measured_tokens"] = real_s["tokens"].to_numpy()
    steps["predicted_tokens"] = steps["step"].map(sim_s.set_index("step")["tokens"]).to_numpy()
    steps["exact_fraction"] = steps["step"].map(sim_s.set_index("step")["exact_fraction"]).to_numpy(float)
    # the driver's own part of each real rollout (real_backend.recorder; NaN where the run did not record it)
    steps["measured_driver_seconds"] = (real_s["driver_seconds"].to_numpy(float) if "driver_seconds" in real_s
                                        else np.full(len(steps), np.nan))

    cols = KEY + ["end_step", "response_len", "finish_time", "finish_reason"]
    responses = run.responses[cols].merge(sim.responses[cols], on=KEY, suffixes=("_measured", "_predicted"))
    responses.insert(0, "policy", name)
    same_step = responses["end_step_measured"] == responses["end_step_predicted"]
    rho = {}
    for step, g in responses[same_step].groupby("end_step_measured"):
        if len(g) >= 3 and g["finish_time_measured"].nunique() > 1 and g["finish_time_predicted"].nunique() > 1:
            rho[step] = float(g["finish_time_measured"].rank().corr(g["finish_time_predicted"].rank()))
    steps["finish_order_spearman"] = steps["step"].map(rho).astype(float)
    steps.insert(0, "policy", name)
    return steps, responses


def instance_last_finish(responses: pd.DataFrame) -> pd.Series:
    """Each instance's last finish in each step, indexed by (step, instance): by the step each response ended in;
    unfinished ones, and ones that never ran on an instance (-1), have no say."""
    ended = responses[responses["finish_time"].notna() & (responses["instance"] >= 0)]  # -1: never on an engine
    if "end_step" in ended:
        ended = ended.assign(step=ended["end_step"])
    return ended.groupby(["step", "instance"])["finish_time"].max()


def admission_seconds(responses: pd.DataFrame) -> pd.Series:
    """Per step (the step each response ended in): seconds from the step's first submission until every request
    submitted before its first token had its own first token. The serving front end takes a step's opening requests
    one by one (real_backend/README.md, "Fidelity"), so this phase grows with how many a step submits at once, which
    a policy sets (april over-provisions, segment resumes the carried ones) and the twin prices as one prefill.
    Only responses that ended in the step have a say (one aborted there and resumed later is counted where it ends)."""
    if not {"submit_time", "first_token_time"} <= set(responses.columns):  # a trace without timings: nothing to say
        return pd.Series(dtype=float, name="admission_seconds")
    ended = responses[responses["first_token_time"].notna() & responses["submit_time"].notna()]
    if "end_step" in ended:
        ended = ended.assign(step=ended["end_step"])
    opening = ended[ended["submit_time"] <= ended.groupby("step")["first_token_time"].transform("min")]
    by_step = opening.groupby("step")
    return (by_step["first_token_time"].max() - by_step["submit_time"].min()).rename("admission_seconds")


def instance_phases(responses: pd.DataFrame) -> pd.DataFrame:
    """Per step of a run (a trace, or a simulation's responses): how long the step kept every instance it used busy,
    and how long one ran on alone after that. Rows: step, instances (that ran one of the responses the step ended),
    shared_seconds (to the earliest of those instances' last finish: the part of the rollout where instances that
    share a host slow each other down), tail_seconds (from there to the step's last finish: the instances that
    finished early wait; 0 with one instance), from instance_last_finish; and admission_seconds (admission_seconds:
    the opening, inside the shared part)."""
    last = instance_last_finish(responses).groupby("step")
    out = pd.DataFrame({"instances": last.size(), "shared_seconds": last.min(), "last": last.max()})
    out["tail_seconds"] = out.pop("last") - out["shared_seconds"]
    out["admission_seconds"] = admission_seconds(responses).reindex(out.index)
    return out.reset_index()


def compare_phases(run: RecordedRun, sim: RunResult, policy: str | None = None) -> pd.DataFrame:
    """instance_phases of the run and of its simulated twin, step by step: measured_/predicted_ shared and tail
    seconds, and measured_/predicted_instances. Where a twin of several instances is off: in the part where they
    share the host, or in the tail one instance runs alone (lssim.sim.shared_host prices them with s_2 and s_1)."""
    both = instance_phases(run.trace).merge(instance_phases(sim.responses), on="step", suffixes=("_measured", "_predicted"))
    both = both.rename(columns=lambda c: "_".join(reversed(c.rsplit("_", 1))) if c != "step" else c)
    both.insert(0, "policy", policy or run.name)
    # the driver's own share of each real rollout (real_backend.recorder's driver_seconds; NaN where not recorded)
    steps = run.steps.set_index("step")
    driver = steps["driver_seconds"] if "driver_seconds" in steps else pd.Series(np.nan, index=steps.index)
    both["measured_driver_share"] = both["step"].map(driver / steps["rollout_seconds"]).astype(float)
    return both


def phases_table(phases: pd.DataFrame) -> pd.DataFrame:
    """compare_phases rows (a `repeat` column: each repeat against its own twin) per policy: the median over steps
    of the shared part's measured / predicted ratio, the tail's and the admission's median measured and predicted
    seconds, the rest of the step after the admission (its generation: shared part and tail) as a measured / predicted
    ratio, and the most instances a step used."""
    per_step = phases.groupby(["policy", "step"], sort=False).median(numeric_only=True)
    per_step["shared_ratio"] = per_step["measured_shared_seconds"] / per_step["predicted_shared_seconds"]
    rest = {w: per_step[f"{w}_shared_seconds"] + per_step[f"{w}_tail_seconds"] - per_step[f"{w}_admission_seconds"]
            for w in ("measured", "predicted")}
    per_step["generation_ratio"] = rest["measured"] / rest["predicted"]
    cols = ["shared_ratio", "measured_shared_seconds", "predicted_shared_seconds", "measured_tail_seconds", "predicted_tail_seconds",
            "measured_admission_seconds", "predicted_admission_seconds", "generation_ratio"]
    if "measured_driver_share" in per_step:
        cols.append("measured_driver_share")
    table = per_step.groupby("policy", sort=False)[cols].median()
    table["instances"] = per_step.groupby("policy", sort=False)["measured_instances"].max()
    table["steps"] = per_step.groupby("policy", sort=False).size()
    return table


def _ape_pct(predicted: pd.Series, measured: pd.Series) -> pd.Series:
    """Absolute percentage error of `predicted` against `measured`."""
    return (predicted - measured).abs() / measured * 100


def median_over_repeats(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-step rows of several recordings of each policy (`compare` frames concatenated, a `repeat` column),
    each repeat predicted from its own trace, reduced to one row per policy and step: the median measured and
    the median predicted seconds. A policy whose decisions depend on wall time (april stops at a count of
    finished groups) makes other tokens in each repeat, so the two medians are taken apart, not per response.

    Also returns the spread: each repeat's measured seconds against its step's median, the run-to-run timing
    noise of the machine (for timing-dependent policies, schedule changes too) that no model can predict."""
    cols = ["measured_seconds", "predicted_seconds", "measured_tokens", "predicted_tokens", "exact_fraction",
            "finish_order_spearman"] + [c for c in ("measured_driver_seconds",) if c in steps]
    median = steps.groupby(["policy", "step"], sort=False)[cols].median().reset_index()
    median["ape_pct"] = _ape_pct(median["predicted_seconds"], median["measured_seconds"])
    median["repeats"] = steps.groupby(["policy", "step"], sort=False).size().to_numpy()
    spread = steps[["policy", "repeat", "step", "measured_seconds"]].merge(
        median[["policy", "step", "measured_seconds"]].rename(columns={"measured_seconds": "median_seconds"}), on=["policy", "step"])
    spread["ape_pct"] = _ape_pct(spread["measured_seconds"], spread["median_seconds"])
    return median, spread


FINISH_QUANTILES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


def finish_profile(responses: pd.DataFrame, quantiles=FINISH_QUANTILES) -> pd.DataFrame:
    """Where in a step the twin runs fast or slow: per policy, the median of measured over predicted finish time of
    the responses whose measured finish lies in each quantile band of their step's finish times (`validate`'s
    responses frame: both worlds ended them in the same step). A flat row is a speed level; a hump is a phase of the
    step the cost model misprices (the first quarter, the bulk, the tail)."""
    r = responses[(responses["end_step_measured"] == responses["end_step_predicted"])
                  & (responses["finish_time_measured"] > 0) & (responses["finish_time_predicted"] > 0)]
    keys = ["policy", "repeat", "step"] if "repeat" in r else ["policy", "step"]
    r = r.assign(rank=r.groupby(keys)["finish_time_measured"].rank(pct=True),
                 ratio=r["finish_time_measured"] / r["finish_time_predicted"])
    bands = pd.cut(r["rank"], list(quantiles), include_lowest=True,
                   labels=[f"{a:.0%}-{b:.0%}" for a, b in zip(quantiles[:-1], quantiles[1:])])
    out = r.groupby(["policy", bands.rename("finish band")], observed=True, sort=False)["ratio"].median().unstack()
    out.columns = out.columns.astype(str)
    return out


def anchor_on_baseline(steps: pd.DataFrame, reference: str = "baseline") -> pd.DataFrame:
    """Per-repeat `compare` rows with every prediction scaled by the machine's speed during the recordings:
    the median, over the reference policy's steps (all repeats), of measured over predicted seconds. What is
    left is the model's shape; the drift in the VM's speed between profiling and recording (about 5% either way
    here) is gone. A median over many steps, not one run's sum: single steps of this VM run 20-30% slow. The
    reference is then calibrated, not predicted, so its rows are dropped."""
    ref = steps[steps["policy"] == reference]
    if ref.empty:
        raise ValueError(f"no {reference!r} runs to anchor the machine's speed on")
    factor = float((ref["measured_seconds"] / ref["predicted_seconds"]).median())
    out = steps[steps["policy"] != reference].copy()
    out["predicted_seconds"] = out["predicted_seconds"] * factor
    out["ape_pct"] = _ape_pct(out["predicted_seconds"], out["measured_seconds"])
    out.attrs["speed_factor"] = factor
    return out


def fidelity_table(steps: pd.DataFrame, responses: pd.DataFrame, groups: dict[str, tuple[int, int]] | None = None) -> pd.DataFrame:
    """Per policy: median / p90 APE of step makespan, mean finish-order Spearman, median APE of finish
    times, token error, and (with `groups`: policy -> (measured, predicted) groups trained) the speedup
    over baseline in rollout seconds per trained group, measured and predicted, and the error in points."""
    rows = {}
    for name, s in steps.groupby("policy", sort=False):
        r = responses[responses["policy"] == name]
        finished = r[(r["end_step_measured"] == r["end_step_predicted"]) & (r["finish_time_measured"] > 0)]
        finish_ape = ((finished["finish_time_predicted"] - finished["finish_time_measured"]).abs()
                      / finished["finish_time_measured"] * 100)
        rows[name] = {
            "steps": len(s),
            "makespan_median_ape_pct": float(s["ape_pct"].median()),
            "makespan_p90_ape_pct": float(np.percentile(s["ape_pct"], 90)),
            "measured_seconds": float(s["measured_seconds"].sum()),
            "predicted_seconds": float(s["predicted_seconds"].sum()),
            "finish_order_spearman": float(s["finish_order_spearman"].mean()),
            "finish_time_median_ape_pct": float(finish_ape.median()) if len(finish_ape) else float("nan"),
            "tokens_error_pct": float((s["predicted_tokens"].sum() - s["measured_tokens"].sum()) / s["measured_tokens"].sum() * 100),
            "exact_fraction": float(s["exact_fraction"].mean()),
            **stop_agreement(r),
            # NaN unless every step recorded it
            "measured_driver_seconds": float(s["measured_driver_seconds"].sum(min_count=len(s)))
            if "measured_driver_seconds" in s else float("nan"),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "policy"
    if groups and "baseline" in table.index:
        per_group = {k: (table.loc[k, "measured_seconds"] / groups[k][0], table.loc[k, "predicted_seconds"] / groups[k][1])
                     for k in table.index if k in groups}
        base = per_group["baseline"]
        table["speedup_measured"] = [base[0] / per_group[k][0] if k in per_group else np.nan for k in table.index]
        table["speedup_predicted"] = [base[1] / per_group[k][1] if k in per_group else np.nan for k in table.index]
        table["speedup_error_points"] = (table["speedup_predicted"] - table["speedup_measured"]) * 100
        _speedup_error_parts(table, groups)
    return table


def stop_agreement(responses: pd.DataFrame) -> dict:
    """Which responses the policy stopped (finish_reason policy_stop) on the engine and in the twin, over the
    responses both ended: the counts (per repeat, where the frame has several), the twin's precision (its stops the engine made too) and recall (the engine's
    stops the twin made); NaN where there is nothing to divide by."""
    if "finish_reason_measured" not in responses:  # a comparison written before finish reasons were kept
        return {"stops_measured": float("nan"), "stops_predicted": float("nan"), "stop_precision": float("nan"),
                "stop_recall": float("nan")}
    measured = (responses["finish_reason_measured"] == "policy_stop").to_numpy()
    predicted = (responses["finish_reason_predicted"] == "policy_stop").to_numpy()
    both = int((measured & predicted).sum())
    repeats = responses["repeat"].nunique() if "repeat" in responses and len(responses) else 1
    return {"stops_measured": measured.sum() / repeats, "stops_predicted": predicted.sum() / repeats,  # per repeat
            "stop_precision": both / predicted.sum() if predicted.any() else float("nan"),
            "stop_recall": both / measured.sum() if measured.any() else float("nan")}


def _speedup_error_parts(table: pd.DataFrame, groups: dict[str, tuple[float, float]]) -> None:
    """The speedup error in points split in two that add up to it: from groups trained (the twin trained more or
    fewer than the run, against the baseline's counts), then from rollout seconds (the policy's predicted off by
    another factor than its baseline's: the machine's speed level cancels)."""
    g = pd.DataFrame({k: groups.get(k, (np.nan, np.nan)) for k in table.index}, index=["measured", "predicted"]).T
    base = groups["baseline"]
    with_groups = table["speedup_measured"] * (g["predicted"] / base[1]) / (g["measured"] / base[0])
    table["speedup_points_groups"] = (with_groups - table["speedup_measured"]) * 100
    table["speedup_points_seconds"] = (table["speedup_predicted"] - with_groups) * 100
    # The seconds part split again where the runs recorded the driver's own time (the twin prices it only where its
    # world has a driver price): the
    # points it makes (the measured speedup recomputed on each run's rollout seconds less the driver's, both the
    # policy's and the baseline's), and the rest, the engine's.
    engine = table["measured_seconds"] - table["measured_driver_seconds"]
    if "baseline" in engine and engine.notna().any():
        base_engine = engine["baseline"] / base[0]
        engine_speedup = base_engine / (engine / g["measured"])
        engine_with_groups = engine_speedup * (g["predicted"] / base[1]) / (g["measured"] / base[0])
        table["speedup_points_driver"] = (engine_with_groups - with_groups) * 100
        table["speedup_points_engine"] = (table["speedup_predicted"] - engine_with_groups) * 100


def speedup_by_repeat(steps_by_repeat: pd.DataFrame, groups: pd.DataFrame, reference: str = "baseline") -> pd.DataFrame:
    """Per policy and repeat: the measured speedup of repeat k over the reference's repeat k (recorded in the same
    minutes: `lssim validate` records repeat-major), in rollout seconds per trained group. `steps_by_repeat`: the
    `compare` rows with a repeat column; `groups`: rows of policy, repeat, measured_groups. Their spread is the real
    engine's run-to-run noise in the speedup itself, beside which a speedup error is read."""
    seconds = steps_by_repeat.groupby(["policy", "repeat"])["measured_seconds"].sum()
    per_group = seconds / groups.set_index(["policy", "repeat"])["measured_groups"].reindex(seconds.index)
    ref = per_group.xs(reference, level="policy").sort_index()
    rows = [(p, k, ref.iloc[k % len(ref)] / v) for (p, k), v in per_group.items() if p != reference]
    return pd.DataFrame(rows, columns=["policy", "repeat", "speedup_measured"])


ACTED_KINDS = ("stopped", "dropped", "carried", "rebudgeted", "resubmitted", "placed", "reselected", "speculated")


def acted(run: RecordedRun, baseline: RecordedRun) -> dict[str, int]:
    """How much a policy acted in a recorded run: its responses that the policy changed against the baseline
    recorded in the same world (same seed, engine and run shape), each counted once in `acted` and under every
    kind that applies:

        stopped      ended by the policy (finish_reason policy_stop)
        dropped      abandoned when the rollout ended (abort)
        carried      ran across a step boundary (end_step after the step it began in)
        rebudgeted   a token budget other than the baseline's
        resubmitted  submitted again during its step after the step's first submission (requeued to another
                     chunk or instance, or a top-up)
        placed       ran on another engine instance than the baseline's same response (the records say where
                     each ran: the policy's pin, or the engine's least-loaded choice); a placement that agrees
                     with the baseline's dispatch changed nothing and counts zero, as does a run on one instance
        reselected   a (step, prompt, sample) the baseline did not draw: other prompts, other group sizes
        speculated   generated in a step in which the engine drafted for the policy (speculative decoding
                     changes how fast tokens come, not which: greedy, the tokens are the baseline's); from the
                     run's speculation counters (meta.json), per step where the policy recorded its decisions

    From the records alone (responses.parquet), so it counts what happened on the engine, not what the policy
    asked for. A priority that changed only the order inside a batch the engine ran at once leaves no trace
    and counts nothing. The baseline against itself counts zero (its placement, draws and budgets are
    deterministic for a seed)."""
    r, b = run.responses, baseline.responses
    flags = {}
    flags["stopped"] = (r["finish_reason"] == "policy_stop").to_numpy()
    flags["dropped"] = (r["finish_reason"] == "abort").to_numpy()
    flags["carried"] = (r["end_step"] != r["step"]).to_numpy()
    flags["rebudgeted"] = (r["max_tokens"] != b["max_tokens"].max()).to_numpy()
    same_step = r["end_step"] == r["step"]
    first_submit = r[same_step].groupby("step")["submit_time"].transform("min")
    late = (r.loc[same_step, "submit_time"] - first_submit) > 1e-3
    flags["resubmitted"] = late.reindex(r.index, fill_value=False).to_numpy()
    both = r[KEY + ["instance"]].merge(b[KEY + ["instance"]], on=KEY, how="left", suffixes=("", "_baseline"), indicator=True)
    flags["reselected"] = (both["_merge"] == "left_only").to_numpy()
    several = r.loc[r["instance"] >= 0, "instance"].nunique() > 1  # on one instance a placement decides nothing
    flags["placed"] = (several & (both["_merge"] == "both") & (both["instance"] != both["instance_baseline"])).to_numpy()
    flags["speculated"] = _speculated(run, r)
    counts = {k: int(flags[k].sum()) for k in ACTED_KINDS}
    counts["acted"] = int(np.logical_or.reduce([flags[k] for k in ACTED_KINDS]).sum()) if len(r) else 0
    counts["responses"] = len(r)
    return counts


def _speculated(run: RecordedRun, responses: pd.DataFrame) -> np.ndarray:
    """Responses generated in steps in which the engine drafted (see `acted`)."""
    spec = (run.meta or {}).get("speculation") or {}
    if not spec.get("drafts"):
        return np.zeros(len(responses), dtype=bool)
    decisions = spec.get("decisions")
    if not decisions:  # a policy that speculates in every step (spec_tail): every response ran on a drafting engine
        return np.ones(len(responses), dtype=bool)
    drafting_steps = {d["step"] for d in decisions if d.get("drafts", 0) > 0}
    return responses["step"].isin(drafting_steps).to_numpy()


def length_distance(measured: np.ndarray, modelled: np.ndarray) -> dict:
    """How far modelled response lengths are from measured ones: two-sample Kolmogorov-Smirnov statistic
    (and its p-value), Wasserstein-1 distance in tokens, and the two means."""
    from scipy import stats

    measured, modelled = np.asarray(measured, float), np.asarray(modelled, float)
    if not len(measured) or not len(modelled):
        return {"ks": np.nan, "ks_pvalue": np.nan, "wasserstein_tokens": np.nan, "measured_mean": np.nan, "modelled_mean": np.nan}
    ks = stats.ks_2samp(measured, modelled)
    return {"ks": float(ks.statistic), "ks_pvalue": float(ks.pvalue),
            "wasserstein_tokens": float(stats.wasserstein_distance(measured, modelled)),
            "measured_mean": float(measured.mean()), "modelled_mean": float(modelled.mean())}
