"""Fidelity's comparisons (lssim.analysis.fidelity): the round trip that makes a validation mean something (a run
recorded from the simulator and replayed in it is predicted exactly, so every error `lssim validate` reports on vLLM
is the simulator's model, not the bookkeeping), the noise floors, what a policy did on the engine, the per-policy
summary and its markdown, the finish profile and where a step's time went."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.controller import RunConfig
from lssim.cost import ProfiledCostModel
from lssim.analysis.replay import simulate
from lssim.traces.trace import load_trace
from lssim.analysis.fidelity.compare import compare, fidelity_table, length_distance
from lssim.analysis.fidelity.run import RecordedRun, load_run, replay_run
from lssim.traces.workload import Workload

from fidelity_helpers import MODEL, noisy_repeats, profile, REAL_TRACE, replay_twin, speedup_repeats, twin_setup, two_instance_run  # noqa: F401  (profile: a fixture)


def _recorded_from_simulator(policy: str, profile: str, seed: int, steps: int = 3) -> RecordedRun:
    """A 'real' run that is in fact a simulation: what a validation must reproduce exactly."""
    from real_backend.recorder import to_trace

    source = load_trace(REAL_TRACE)
    config = RunConfig(steps=steps, groups_per_step=8, group_size=4, max_tokens=256, seed=seed)
    result = simulate(Workload(source, seed=seed), policy, twin_setup(profile), config=config, prompts=Workload(source, seed=seed))
    return RecordedRun(name=policy, trace=to_trace(result.responses, result.steps), steps=result.steps,
                       responses=result.responses, config=config)


@settings(max_examples=12, deadline=None)
@given(policy=st.sampled_from(["baseline", "hadb", "lpt", "ebs", "seer", "hadb+lpt"]), seed=st.integers(0, 2**16))
def test_a_simulated_run_replayed_is_predicted_exactly(profile, policy, seed):
    run = _recorded_from_simulator(policy, profile, seed)
    sim = replay_run(run, twin_setup(profile), prompts=Workload(load_trace(REAL_TRACE), seed=seed))
    steps, responses = compare(run, sim)
    assert np.allclose(steps["predicted_seconds"], steps["measured_seconds"], rtol=1e-9)
    assert (steps["predicted_tokens"] == steps["measured_tokens"]).all()
    assert len(responses) == len(run.responses)  # every response matched by its key
    assert np.allclose(responses["finish_time_predicted"], responses["finish_time_measured"], rtol=1e-9)
    table = fidelity_table(steps, responses)
    assert table.loc[policy, "makespan_p90_ape_pct"] < 1e-6


def test_fidelity_table_errors_and_speedup():
    steps = pd.DataFrame({
        "policy": ["baseline"] * 2 + ["p"] * 2, "step": [0, 1, 0, 1],
        "measured_seconds": [2.0, 2.0, 1.0, 1.0], "predicted_seconds": [2.2, 1.9, 1.0, 1.1],
        "measured_tokens": [100, 100, 100, 100], "predicted_tokens": [100, 100, 100, 110],
        "exact_fraction": [1.0] * 4, "finish_order_spearman": [1.0, 0.5, 1.0, 1.0]})
    steps["ape_pct"] = (steps["predicted_seconds"] - steps["measured_seconds"]).abs() / steps["measured_seconds"] * 100
    responses = pd.DataFrame(columns=["policy", "end_step_measured", "end_step_predicted", "finish_time_measured",
                                      "finish_time_predicted"])
    table = fidelity_table(steps, responses, groups={"baseline": (10, 10), "p": (10, 10)})
    assert table.loc["baseline", "makespan_median_ape_pct"] == pytest.approx(7.5)
    assert table.loc["p", "tokens_error_pct"] == pytest.approx(5.0)
    assert table.loc["p", "speedup_measured"] == pytest.approx(2.0)
    assert table.loc["p", "speedup_predicted"] == pytest.approx(4.1 / 2.1)
    assert table.loc["p", "speedup_error_points"] == pytest.approx((4.1 / 2.1 - 2.0) * 100)
    assert table.loc["baseline", "finish_order_spearman"] == pytest.approx(0.75)


def test_median_over_repeats_takes_medians_apart_and_measures_the_spread():
    from lssim.analysis.fidelity.compare import median_over_repeats

    rows = []
    for k, (measured, predicted) in enumerate([(1.0, 1.1), (1.2, 1.0), (1.1, 0.9)]):
        rows.append({"policy": "p", "step": 0, "measured_seconds": measured, "predicted_seconds": predicted, "measured_tokens": 10,
                     "predicted_tokens": 10, "exact_fraction": 1.0, "finish_order_spearman": 1.0, "repeat": k})
    steps, spread = median_over_repeats(pd.DataFrame(rows))
    assert len(steps) == 1 and steps["repeats"].iloc[0] == 3
    assert steps["measured_seconds"].iloc[0] == pytest.approx(1.1) and steps["predicted_seconds"].iloc[0] == pytest.approx(1.0)
    assert steps["ape_pct"].iloc[0] == pytest.approx(100 / 11)
    assert sorted(spread["ape_pct"].round(6)) == pytest.approx(sorted([100 / 11, 100 / 11, 0.0]))


def test_the_noise_floor_is_what_an_exact_model_scores_against_noisy_repeats():
    from lssim.analysis.fidelity.noise import noise_floor

    rng = np.random.default_rng(7)
    sigma, steps, k = 0.10, 10, 5
    scored, floors = [], []
    for _ in range(60):  # many validations of an exact model (it predicts each step's truth) on noisy repeats
        rows = noisy_repeats(rng, sigma, steps, k)
        medians = rows.groupby("step").agg(measured=("measured_seconds", "median"), truth=("truth", "first"))
        scored.append(float(((medians["truth"] - medians["measured"]).abs() / medians["measured"] * 100).median()))
        floors.append(noise_floor(rows, draws=300, seed=1).loc["p", "noise_floor_median_pct"])
    # From its repeats alone, the floor says what the exact model scores (within the spread of such estimates).
    assert np.median(floors) == pytest.approx(np.median(scored), rel=0.35)
    assert np.mean(np.array(scored) <= np.percentile(floors, 97)) >= 0.85


@settings(max_examples=15, deadline=None)
@given(sigma=st.floats(0.02, 0.3), seed=st.integers(0, 2**16))
def test_the_noise_floor_falls_with_repeats_and_rises_with_noise(sigma, seed):
    from lssim.analysis.fidelity.noise import noise_floor

    rng = np.random.default_rng(seed)
    # 40 steps: the spread each policy's floor is estimated from is then steady enough that a 2x (repeats) or 3x
    # (noise) difference always shows (with 8 steps one draw in a few hundred estimated half the spread)
    rows = pd.concat([noisy_repeats(rng, sigma, 40, 5, "few"), noisy_repeats(rng, sigma, 40, 20, "many"),
                      noisy_repeats(rng, 3 * sigma, 40, 5, "noisy")])
    floor = noise_floor(rows, draws=400, seed=seed)
    assert floor.loc["many", "noise_floor_median_pct"] < floor.loc["few", "noise_floor_median_pct"]
    assert floor.loc["noisy", "noise_floor_median_pct"] > floor.loc["few", "noise_floor_median_pct"]
    assert (floor["noise_bound_median_pct"] >= floor["noise_floor_median_pct"]).all()
    assert (floor["noise_bound_p90_pct"] >= floor["noise_floor_p90_pct"]).all()
    needed = floor["repeats_for_goal"]
    assert needed.isna().all() or needed.dropna().between(2, 60).all()
    if needed.notna().all():
        assert needed["noisy"] >= needed["few"]  # more noise takes more repeats to test the goal


def test_the_noise_floor_of_one_repeat_or_of_identical_repeats():
    from lssim.analysis.fidelity.noise import noise_floor

    one = pd.DataFrame({"policy": "p", "step": [0, 1], "repeat": 0, "measured_seconds": [1.0, 2.0]})
    assert noise_floor(one).loc["p"].isna().all()  # one repeat: no spread to speak of
    same = pd.DataFrame({"policy": "p", "step": [0, 0, 1, 1], "repeat": [0, 1, 0, 1], "measured_seconds": [1.0, 1.0, 2.0, 2.0]})
    floor = noise_floor(same).loc["p"]
    assert floor["noise_floor_median_pct"] == 0 and floor["noise_bound_p90_pct"] == 0 and floor["repeats_for_goal"] == 2


def test_the_speedup_noise_floor_is_what_an_exact_model_scores_against_noisy_repeats():
    """An exact model predicts the true speedup; against per-step medians of noisy repeats it is off by some points.
    From the repeats alone, speedup_noise_floor says how many: typically (the floor) and at worst (the 95% bound)."""
    from lssim.analysis.fidelity.noise import speedup_noise_floor

    rng = np.random.default_rng(11)
    scored, floors, bounds = [], [], []
    for _ in range(60):
        rows = speedup_repeats(rng, 0.10, 10, 5, speedup=1.6)
        m = rows.groupby(["policy", "step"])[["measured_seconds", "truth"]].median().groupby("policy").sum()
        truth = m.loc["baseline@w", "truth"] / m.loc["p@w", "truth"]
        scored.append(abs(m.loc["baseline@w", "measured_seconds"] / m.loc["p@w", "measured_seconds"] - truth) * 100)
        floor = speedup_noise_floor(rows, draws=300, seed=1).loc["p@w"]
        floors.append(floor["speedup_noise_floor_points"])
        bounds.append(floor["speedup_noise_bound_points"])
    assert np.median(floors) == pytest.approx(np.median(scored), rel=0.35)
    assert np.mean(np.array(scored) <= np.array(bounds)) >= 0.85  # the bound holds the exact model's misses


@settings(max_examples=15, deadline=None)
@given(sigma=st.floats(0.02, 0.3), seed=st.integers(0, 2**16))
def test_the_speedup_noise_floor_falls_with_repeats_and_grows_with_noise_and_speedup(sigma, seed):
    from lssim.analysis.fidelity.noise import speedup_noise_floor

    rng = np.random.default_rng(seed)
    rows = pd.concat([speedup_repeats(rng, sigma, 40, 5, 1.5, "few"), speedup_repeats(rng, sigma, 40, 20, 1.5, "many"),
                      speedup_repeats(rng, 3 * sigma, 40, 5, 1.5, "noisy"), speedup_repeats(rng, sigma, 40, 5, 4.5, "fast")])
    floor = speedup_noise_floor(rows, draws=400, seed=seed)["speedup_noise_floor_points"]
    assert set(floor.index) == {"p@few", "p@many", "p@noisy", "p@fast"}  # one row per policy, none for a baseline
    assert floor["p@many"] < floor["p@few"] < floor["p@noisy"]
    assert floor["p@fast"] > floor["p@few"]  # points of a 4.5x speedup: the same relative noise is 3x the points
    # as if 20 repeats had been recorded: fewer points than the 5 there were
    assert speedup_noise_floor(rows, repeats=20, draws=400, seed=seed).loc["p@few", "speedup_noise_floor_points"] < floor["p@few"]


def test_the_speedup_noise_floor_of_identical_repeats_one_repeat_or_no_baseline():
    from lssim.analysis.fidelity.noise import speedup_noise_floor

    same = pd.DataFrame({"policy": ["baseline@w"] * 4 + ["p@w"] * 4, "step": [0, 0, 1, 1] * 2, "repeat": [0, 1] * 4,
                         "measured_seconds": [2.0, 2.0, 4.0, 4.0, 1.0, 1.0, 2.0, 2.0]})
    row = speedup_noise_floor(same).loc["p@w"]
    assert row["speedup_noise_floor_points"] == 0 and row["speedup_noise_bound_points"] == 0
    assert row["repeats_for_speedup_goal"] == 2
    assert speedup_noise_floor(same[same["repeat"] == 0]).loc["p@w"].isna().all()  # one repeat: no spread
    # a world without its baseline (or a frame with a world column that names none): nothing to compare with
    assert speedup_noise_floor(same[same["policy"] == "p@w"]).empty
    assert speedup_noise_floor(same.assign(world="w", policy=same["policy"].str.replace("baseline@w", "reference"))).empty


def test_anchor_on_baseline_takes_the_machines_speed_from_the_reference_and_drops_it():
    from lssim.analysis.fidelity.compare import anchor_on_baseline

    rows = []
    for step, measured in enumerate([1.2, 1.2, 1.2, 1.2, 1.8]):  # the machine 20% slow; one step an outlier
        rows.append({"policy": "baseline", "repeat": 0, "step": step, "predicted_seconds": 1.0, "measured_seconds": measured})
        rows.append({"policy": "p", "repeat": 0, "step": step, "predicted_seconds": 0.5, "measured_seconds": 0.5 * 1.2 * 1.1})
    out = anchor_on_baseline(pd.DataFrame(rows))
    assert set(out["policy"]) == {"p"} and out.attrs["speed_factor"] == pytest.approx(1.2)  # the median ignores the outlier
    assert out["ape_pct"].tolist() == pytest.approx([100 / 11] * 5)  # what is left is the model's own miss
    with pytest.raises(ValueError, match="baseline"):
        anchor_on_baseline(pd.DataFrame(rows).query("policy == 'p'"))


def test_length_distance():
    same = length_distance(np.arange(100), np.arange(100))
    assert same["ks"] == 0 and same["wasserstein_tokens"] == 0
    shifted = length_distance(np.arange(100), np.arange(100) + 10)
    assert shifted["wasserstein_tokens"] == pytest.approx(10) and shifted["ks"] == pytest.approx(0.1)
    assert np.isnan(length_distance(np.array([]), np.arange(3))["ks"])


def test_load_run_names_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="missing trace.parquet"):
        load_run(tmp_path)


def _responses(rows):
    cols = ["step", "end_step", "prompt_id", "sample_idx", "max_tokens", "finish_reason", "submit_time", "instance"]
    return pd.DataFrame(rows, columns=cols)


def _run(name, rows, max_tokens=64):
    config = RunConfig(steps=2, groups_per_step=2, group_size=2, max_tokens=max_tokens, seed=0)
    return RecordedRun(name=name, trace=pd.DataFrame(), steps=pd.DataFrame(), responses=_responses(rows), config=config)


BASE_ROWS = [(s, s, p, k, 64, "stop", 0.01, -1) for s in (0, 1) for p in (0, 1) for k in (0, 1)]


def test_acted_counts_each_changed_response_once_and_the_baseline_zero():
    from lssim.analysis.fidelity.compare import ACTED_KINDS, acted

    base = _run("baseline", BASE_ROWS)
    assert acted(base, base) == {**{k: 0 for k in ACTED_KINDS}, "acted": 0, "responses": 8}
    rows = [list(r) for r in BASE_ROWS]
    rows[0][5] = "policy_stop"                   # stopped
    rows[1][1] = 1                               # carried into step 1
    rows[2][4] = 32                              # rebudgeted ...
    rows[2][5] = "policy_stop"                   # ... and stopped: one response, counted once in `acted`
    rows[3][6] = 0.5                             # resubmitted half a second into its step (a requeue)
    rows[4][3] = 2                               # a sample the baseline never drew
    rows[5][5] = "abort"                         # dropped
    got = acted(_run("p", rows), base)
    assert {k: got[k] for k in ACTED_KINDS} == {"stopped": 2, "dropped": 1, "carried": 1, "rebudgeted": 1, "resubmitted": 1,
                                                 "placed": 0, "reselected": 1, "speculated": 0}
    assert got["acted"] == 6 and got["responses"] == 8
    on_one = [r[:7] + (0,) for r in BASE_ROWS]   # every response placed, all on one instance: nothing decided
    assert acted(_run("p", on_one), base)["acted"] == 0
    spread = [r[:7] + (i % 2,) for i, r in enumerate(BASE_ROWS)]
    assert acted(_run("p", spread), base)["placed"] == 8  # a baseline that does not say where it ran: all differ
    dispatched = _run("baseline", spread)                  # the baseline's dispatcher alternated the instances
    assert acted(_run("p", spread), dispatched)["placed"] == 0  # pinned where the dispatcher put them: no change
    swapped = [r[:7] + (1 - r[7],) for r in spread]
    assert acted(_run("p", swapped), dispatched)["placed"] == 8


def test_acted_counts_the_responses_of_steps_the_engine_drafted_in():
    from dataclasses import replace

    from lssim.analysis.fidelity.compare import acted

    base = _run("baseline", BASE_ROWS)
    run = _run("tlt", BASE_ROWS)
    assert acted(replace(run, meta={"speculation": {"drafts": 0}}), base)["acted"] == 0
    per_step = {"speculation": {"drafts": 12, "decisions": [{"step": 0, "drafts": 0}, {"step": 1, "drafts": 12}]}}
    got = acted(replace(run, meta=per_step), base)
    assert got["speculated"] == 4 and got["acted"] == 4  # the four responses of step 1
    assert acted(replace(run, meta={"speculation": {"drafts": 5}}), base)["speculated"] == 8  # every step drafted


def _summary():
    steps = pd.DataFrame({"policy": ["baseline@w"] * 2 + ["p"] * 2 + ["q"] * 2, "step": [0, 1] * 3,
                          "measured_seconds": [2.0, 2.0, 1.0, 1.0, 2.0, 2.0], "predicted_seconds": [2.0, 2.0, 1.01, 1.02, 2.4, 2.0],
                          "measured_tokens": [10] * 6, "predicted_tokens": [10] * 6, "exact_fraction": [1.0] * 6,
                          "finish_order_spearman": [1.0] * 6})
    steps["ape_pct"] = (steps["predicted_seconds"] - steps["measured_seconds"]).abs() / steps["measured_seconds"] * 100
    empty = pd.DataFrame(columns=["policy", "end_step_measured", "end_step_predicted", "finish_time_measured", "finish_time_predicted"])
    table = fidelity_table(steps.replace("baseline@w", "baseline"), empty, {"baseline": (4, 4), "p": (4, 4), "q": (4, 4)})
    table = table.rename(index={"baseline": "baseline@w"}).assign(world="w", spec=["baseline", "p", "q"])
    acted_rows = pd.DataFrame([{"policy": "p", "repeat": k, "acted": a, "responses": 8, "stopped": a, "dropped": 0, "carried": 0,
                                "rebudgeted": 0, "resubmitted": 0, "placed": 0, "reselected": 0} for k, a in enumerate([3, 5, 4])]
                              + [{"policy": "q", "repeat": 0, "acted": 0, "responses": 8, "stopped": 0, "dropped": 0,
                                  "carried": 0, "rebudgeted": 0, "resubmitted": 0, "placed": 0, "reselected": 0}])
    noise = pd.DataFrame({"policy": ["p", "p", "q"], "repeat": [0, 1, 0], "step": [0, 0, 0], "ape_pct": [1.0, 3.0, 0.0]})
    return table, acted_rows, noise


def test_policy_summary_json_and_markdown_report_acted_spread_and_the_goal():
    from lssim.analysis.fidelity.report import fidelity_markdown
    from lssim.analysis.fidelity.summary import policy_results, policy_summary, unacted

    summary = policy_summary(*_summary())
    assert summary.loc["p", "acted"] == 4 and summary.loc["p", "acted_min"] == 3  # the median repeat, and the fewest
    assert summary.loc["p", "repeat_spread_median_pct"] == pytest.approx(2.0)
    assert bool(summary.loc["p", "meets_goal"]) and not bool(summary.loc["q", "meets_goal"])  # q: 20% off in one step
    assert unacted(summary) == ["q"]
    result = json.loads(json.dumps(policy_results(summary, "out")))
    assert set(result["policies"]) == {"p", "q"} and set(result["baselines"]) == {"baseline@w"}
    p = result["policies"]["p"]
    for key in ("acted", "step_error_median", "step_error_p90", "speedup_error", "repeat_spread", "world", "acted_by"):
        assert key in p
    assert p["acted"] == 4 and p["acted_by"]["stopped"] == 4 and p["world"] == "w" and result["all_acted"] is False
    text = fidelity_markdown(summary)
    assert text.count("\n| `") == 3 and "4 of 8" in text and "(reference)" in text


def test_policy_summary_reports_the_noise_floor_and_a_miss_within_it():
    from lssim.analysis.fidelity.noise import noise_floor
    from lssim.analysis.fidelity.report import fidelity_markdown
    from lssim.analysis.fidelity.summary import policy_results, policy_summary

    table, acted_rows, noise = _summary()
    table.loc["q", "speedup_error_points"] = -1.0  # q's speedup within the goal: only its step error is in question
    rng = np.random.default_rng(3)
    by_repeat = pd.concat([noisy_repeats(rng, 0.25, 2, 5, name) for name in ("baseline@w", "p", "q")])
    summary = policy_summary(table, acted_rows, noise, steps_by_repeat=by_repeat)
    floor = noise_floor(by_repeat)
    assert summary.loc["q", "noise_floor_median_pct"] == pytest.approx(floor.loc["q", "noise_floor_median_pct"])
    # q misses (20% off one of its two steps), but repeats 25% apart cannot tell that from an exact model
    assert not summary.loc["q", "meets_goal"] and summary.loc["q", "within_noise"]
    entry = json.loads(json.dumps(policy_results(summary), default=float))["policies"]["q"]
    assert entry["within_noise"] is True and entry["noise_floor"]["floor_median"] > 0 and entry["repeats_for_goal"] > 5
    text = fidelity_markdown(summary)
    assert "an exact model's error" in text and "within noise" in text
    quiet = policy_summary(table, acted_rows, noise, steps_by_repeat=pd.concat(
        [noisy_repeats(rng, 0.001, 2, 5, name) for name in ("baseline@w", "p", "q")]))
    assert not quiet.loc["q", "within_noise"]  # on a quiet machine the same miss is the model's


def test_a_miss_within_noise_at_the_worlds_level_reads_within_noise():
    """A slow hour puts the profile alone 30% off; at the world's level (set by its baseline) q is 10% off one step,
    which repeats 25% apart cannot tell from an exact model: within noise. The same at every level outside the bound
    is a miss."""
    from lssim.analysis.fidelity.report import fidelity_markdown
    from lssim.analysis.fidelity.summary import policy_summary

    table, acted_rows, noise = _summary()
    table.loc["q", "speedup_error_points"] = -1.0
    slow = table.assign(makespan_median_ape_pct=30.0, makespan_p90_ape_pct=30.0)
    rng = np.random.default_rng(3)
    by_repeat = pd.concat([noisy_repeats(rng, 0.25, 2, 5, name) for name in ("baseline@w", "p", "q")])

    def anchored(q_pct):
        return pd.DataFrame({"policy": ["p", "p", "q", "q"], "step": [0, 1, 0, 1], "ape_pct": [1.0, 1.0, q_pct, 0.0],
                             "speed_factor": 1.3})

    summary = policy_summary(slow, acted_rows, noise, anchored=anchored(10.0), steps_by_repeat=by_repeat)
    assert summary.loc["q", "noise_bound_median_pct"] > 5.0 and summary.loc["q", "noise_bound_p90_pct"] > 9.0
    assert not summary.loc["q", "meets_goal_anchored"] and summary.loc["q", "within_noise"]
    q_line = next(line for line in fidelity_markdown(summary).splitlines() if line.startswith("| `q`"))
    assert q_line.endswith("within noise |")
    far = policy_summary(slow, acted_rows, noise, anchored=anchored(200.0), steps_by_repeat=by_repeat)
    assert not far.loc["q", "within_noise"]


@pytest.mark.parametrize("policy", ["april", "rollpacker"])
def test_real_cut_points_replayed_on_the_recording_model(tmp_path, policy):
    """with_real_cuts ends each simulated rollout where the recorded run ended it (once every response it ended has
    ended, or as many) and leaves every other decision to the policy: replayed on the model it was recorded with,
    no cut comes earlier than the recorded one, and where the trace holds every length the run is reproduced."""
    from lssim.analysis.fidelity.run import ends_rollouts, with_real_cuts

    other = tmp_path / "other.json"
    ProfiledCostModel(c0=9e-3, c1=2e-5, c2=1e-7, c3=0.0, p0=4e-3, p1=3e-5).to_json(other, meta={"command": "test"})
    run = _recorded_from_simulator(policy, str(other), seed=1, steps=4)
    assert ends_rollouts(policy) and not ends_rollouts("hadb")
    sim = replay_run(run, twin_setup(str(other)), Workload(load_trace(REAL_TRACE), seed=1), policy=with_real_cuts(run))
    steps, _ = compare(run, sim)
    assert len(steps.dropna(subset=["predicted_seconds"])) == len(run.steps)
    ended = lambda r: r.groupby("end_step").size()  # noqa: E731
    # each cut comes once the responses the run ended have ended, or as many: never earlier
    assert (ended(sim.responses).reindex(run.steps["step"], fill_value=0) >= ended(run.responses)).all()
    if policy == "rollpacker":  # every length in its trace: reproduced exactly (april's carried members are modelled)
        assert (steps["predicted_tokens"] == steps["measured_tokens"]).all()
        assert np.allclose(steps["predicted_seconds"], steps["measured_seconds"], rtol=1e-9)


def test_the_fidelity_table_of_a_folder_written_before_the_speedup_noise_floor_gets_it_from_its_repeats():
    from lssim.analysis.fidelity.report import markdown_from

    text = markdown_from("paper/experiments/validation/full5")  # its summary.csv has no speedup_noise_* columns
    assert "(an exact model's 95% bound)" in text
    segment = next(line for line in text.splitlines() if line.startswith("| `segment`"))
    assert "+18.5 (" in segment


def test_policy_summary_reads_a_speedup_miss_against_the_speedups_own_noise():
    """A speedup 8 points off: outside the 5-point goal, but where the repeats' noise puts an exact model's speedup
    further off than that 1 time in 20, it is within noise; the bound is in the JSON and the markdown."""
    from lssim.analysis.fidelity.report import fidelity_markdown
    from lssim.analysis.fidelity.summary import policy_results, policy_summary

    table, acted_rows, noise = _summary()
    table.loc["q", "speedup_error_points"] = -1.0
    table.loc["p", "speedup_error_points"] = 8.0
    table.loc["p", "predicted_seconds"] = table.loc["p", "measured_seconds"]  # p's steps exact: only its speedup in question
    rng = np.random.default_rng(3)
    for sigma, expect in ((0.4, True), (0.001, False)):
        by_repeat = pd.concat([noisy_repeats(rng, sigma, 2, 5, name) for name in ("baseline@w", "p", "q")]).assign(world="w")
        summary = policy_summary(table.assign(makespan_median_ape_pct=0.0, makespan_p90_ape_pct=0.0), acted_rows, noise,
                                 steps_by_repeat=by_repeat)
        bound = summary.loc["p", "speedup_noise_bound_points"]
        assert (bound > 8.0) == expect and bool(summary.loc["p", "within_noise"]) == expect
        assert not summary.loc["p", "meets_goal"]
    entry = json.loads(json.dumps(policy_results(summary), default=float))["policies"]["p"]
    assert entry["speedup_noise"]["bound"] == pytest.approx(bound) and entry["repeats_for_speedup_goal"] >= 2
    assert f"+8.0 ({bound:.1f})" in fidelity_markdown(summary)


def test_the_finish_profile_is_flat_for_a_speed_level_and_humped_for_a_mispriced_phase():
    from lssim.analysis.fidelity.compare import finish_profile

    rng = np.random.default_rng(1)
    rows = []
    for step in range(3):
        predicted = np.sort(rng.uniform(0.1, 1.0, size=40))
        hump = 1 + 0.3 * np.sin(np.pi * np.arange(40) / 39)  # the middle of the step late, its ends on time
        for name, measured in (("level", 1.1 * predicted), ("hump", predicted * hump)):
            rows += [{"policy": name, "step": step, "end_step_measured": step, "end_step_predicted": step,
                      "finish_time_measured": m, "finish_time_predicted": p} for m, p in zip(measured, predicted)]
    profile = finish_profile(pd.DataFrame(rows))
    assert list(profile.columns) == ["0%-25%", "25%-50%", "50%-75%", "75%-90%", "90%-100%"]
    assert profile.loc["level"].to_numpy() == pytest.approx(1.1)
    hump = profile.loc["hump"]
    assert hump["25%-50%"] > hump["0%-25%"] + 0.1 and hump["50%-75%"] > hump["90%-100%"] + 0.1
    # a response the two worlds ended in different steps, or never, says nothing about where in a step
    rows.append({"policy": "level", "step": 0, "end_step_measured": 0, "end_step_predicted": 1,
                 "finish_time_measured": 99.0, "finish_time_predicted": 0.1})
    assert finish_profile(pd.DataFrame(rows)).loc["level"].to_numpy() == pytest.approx(1.1)


def test_instance_phases_split_each_step_into_the_shared_part_and_the_tail():
    """A step is shared while every instance it used is busy, then the last one's tail; a response counts in the
    step it ended in, an unfinished one not at all, and a step on one instance has no tail."""
    from lssim.analysis.fidelity.compare import instance_phases

    trace = pd.DataFrame({"step": [0, 0, 0, 0, 0, 1, 1, 1, 1],
                          "end_step": [0, 0, 0, 0, 1, 1, 1, 1, 1],
                          "instance": [0, 0, 1, 1, 1, 0, 0, 1, -1],  # -1: dropped before it ran anywhere
                          "finish_time": [1.0, 2.0, 0.5, 1.5, 3.0, 0.4, 0.9, np.nan, 0.0]})
    phases = instance_phases(trace).set_index("step")[["instances", "shared_seconds", "tail_seconds"]]
    assert phases.loc[0].to_dict() == pytest.approx({"instances": 2, "shared_seconds": 1.5, "tail_seconds": 0.5})
    # step 1: the carried response ended on instance 1 at 3.0; instance 0's last finish 0.9
    assert phases.loc[1].to_dict() == pytest.approx({"instances": 2, "shared_seconds": 0.9, "tail_seconds": 2.1})
    one = instance_phases(trace.assign(instance=0)).set_index("step")
    assert (one["tail_seconds"] == 0).all() and one.loc[0, "shared_seconds"] == 2.0


def test_admission_runs_from_a_steps_first_submission_to_the_last_first_token_of_its_opening_requests():
    """The opening requests of a step are those submitted before its first token; one submitted later (a refill, a
    requeue) is not waited for. A response counts in the step it ended in, with the times of its last submission."""
    from lssim.analysis.fidelity.compare import admission_seconds, instance_phases

    trace = pd.DataFrame({"step": [0, 0, 0, 0, 0, 1, 1],
                          "end_step": [0, 0, 0, 0, 1, 1, 1],  # the fifth: carried, resumed at step 1's opening
                          "instance": [0] * 7,
                          "submit_time": [0.0, 0.0, 0.002, 0.3, 0.0, 0.0, 0.0],
                          "first_token_time": [0.010, 0.020, 0.050, 0.400, 0.031, 0.006, 0.010],
                          "finish_time": [0.5, 0.6, 0.7, 0.9, 0.2, 0.3, 0.4]})
    assert admission_seconds(trace).to_dict() == pytest.approx({0: 0.050, 1: 0.031})
    assert instance_phases(trace).set_index("step")["admission_seconds"].to_dict() == pytest.approx({0: 0.050, 1: 0.031})
    assert admission_seconds(trace.drop(columns="submit_time")).empty


def test_the_twin_admits_a_steps_opening_requests_as_one_prefill_and_the_table_reads_it_against_the_run(tmp_path):
    """Replayed on the profile it was recorded on, a run's admission and generation are predicted exactly; the
    twin's admission of a step's opening requests is one prefill of their prompts and the iteration that admits
    them. A twin whose engine runs 1.5x faster predicts generation 1.5x short: the table's ratio reads 1.5."""
    from lssim.analysis.fidelity.compare import compare_phases, phases_table
    from lssim.analysis.fidelity.report import phases_markdown

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    run = _recorded_from_simulator("baseline", str(base), seed=3)
    exact = compare_phases(run, replay_twin(run, twin_setup(str(base))), "baseline")
    assert np.allclose(exact["measured_admission_seconds"], exact["predicted_admission_seconds"], rtol=1e-9)
    opening = run.trace[run.trace["step"] == 0]
    n, prompts = len(opening), int(opening["prompt_len"].sum())
    assert exact.loc[exact["step"] == 0, "predicted_admission_seconds"].item() == pytest.approx(
        MODEL.prefill_time(prompts) + MODEL.decode_time(n, prompts, 1))
    fast = tmp_path / "fast.json"
    ProfiledCostModel(**{k: v / 1.5 for k, v in MODEL.coefficients.items()}).to_json(fast, meta={"command": "test"})
    table = phases_table(compare_phases(run, replay_twin(run, twin_setup(str(fast))), "baseline").assign(repeat=0))
    assert table.loc["baseline", "generation_ratio"] == pytest.approx(1.5, rel=1e-6)
    text = phases_markdown(exact.assign(repeat=0))
    assert "| `baseline` |" in text and "several instances" not in text  # one instance: no shared part to show


def test_compare_phases_finds_a_twin_exact_and_places_a_host_slowdown_in_the_shared_part(tmp_path):
    """A two-instance run replayed on the profile it was recorded on: every phase predicted exactly. Priced on a
    shared host that slows busy instances 1.5x and an alone one not at all, the shared part is predicted slower."""
    from lssim.analysis.fidelity.compare import compare_phases, phases_table
    from lssim.analysis.fidelity.report import phases_markdown

    base = tmp_path / "profile.json"
    MODEL.to_json(base, meta={"command": "test"})
    run = two_instance_run("baseline", str(base))
    two = dataclasses.replace(twin_setup(str(base)), n_instances=2)
    exact = compare_phases(run, replay_twin(run, two), "baseline")
    assert len(exact) == 3 and (exact["measured_instances"] == 2).all()
    assert np.allclose(exact["measured_shared_seconds"], exact["predicted_shared_seconds"], rtol=1e-9)
    assert np.allclose(exact["measured_tail_seconds"], exact["predicted_tail_seconds"], rtol=1e-9, atol=1e-12)
    shared = compare_phases(run, replay_twin(run, dataclasses.replace(two, host_slowdown=(1.0, 1.5))), "baseline")
    assert (shared["predicted_shared_seconds"] > 1.2 * shared["measured_shared_seconds"]).all()
    table = phases_table(pd.concat([exact.assign(repeat=0), exact.assign(repeat=1)]))
    assert table.loc["baseline", "shared_ratio"] == pytest.approx(1.0) and table.loc["baseline", "steps"] == 3
    assert "| `baseline` |" in phases_markdown(shared.assign(repeat=0))


def test_stop_agreement_counts_the_twins_stops_against_the_engines():
    from lssim.analysis.fidelity.compare import stop_agreement

    r = pd.DataFrame({"finish_reason_measured": ["policy_stop", "policy_stop", "stop", "length", "stop"],
                      "finish_reason_predicted": ["policy_stop", "stop", "policy_stop", "length", "stop"]})
    got = stop_agreement(r)
    assert (got["stops_measured"], got["stops_predicted"]) == (2, 2)
    assert got["stop_precision"] == 0.5 and got["stop_recall"] == 0.5
    none = stop_agreement(r.assign(finish_reason_measured="stop", finish_reason_predicted="stop"))
    assert np.isnan(none["stop_precision"]) and np.isnan(none["stop_recall"])
