"""The Workload's counterfactual answers: exact where the trace holds them, and says so otherwise."""

import pandas as pd

from lssim.workload import EXACT, GLOBAL, RESAMPLED, TRUNCATED, Workload


def trace():
    rows = [  # step, prompt, sample, length, finish, reward
        (0, 1, 0, 100, "stop", 1.0), (0, 1, 1, 300, "stop", 0.0),
        (0, 2, 0, 500, "length", 0.0), (0, 2, 1, 40, "stop", 1.0),
        (2, 1, 0, 120, "stop", 1.0), (2, 1, 1, 140, "stop", 0.0),
        (5, 1, 0, 900, "stop", 1.0), (5, 1, 1, 950, "stop", 1.0),
    ]
    df = pd.DataFrame(rows, columns=["step", "prompt_id", "sample_idx", "response_len", "finish_reason", "reward"])
    return df.assign(prompt_len=10, max_tokens=500)


def test_exact_replay():
    w = Workload(trace())
    out = w.response(0, 1, 1, 500)
    assert (out.length, out.finish_reason, out.reward, out.source) == (300, "stop", 0.0, EXACT)


def test_smaller_budget_truncates_with_zero_reward():
    out = Workload(trace()).response(0, 1, 1, 200)
    assert (out.length, out.finish_reason, out.reward, out.source) == (200, "length", 0.0, TRUNCATED)


def test_recorded_truncation_under_the_same_budget_is_exact():
    out = Workload(trace()).response(0, 2, 0, 500)
    assert (out.length, out.finish_reason, out.source) == (500, "length", EXACT)


def test_unrecorded_step_resamples_from_the_nearest_step_of_the_same_prompt():
    w = Workload(trace())
    for sample in range(20):
        out = w.response(1, 1, sample, 10_000)  # run steps count the trace's steps (0, 2, 5) as 0, 1, 2
        assert out.source == EXACT or out.length in (120, 140)
        out = w.response(7, 1, sample, 10_000)  # past the end: the last recorded step is nearest
        assert out.source == RESAMPLED and out.length in (900, 950)


def test_extra_samples_resample_within_the_same_step():
    out = Workload(trace()).response(1, 1, 7, 10_000)
    assert out.source == RESAMPLED and out.length in (120, 140)


def test_unknown_prompt_falls_back_to_the_global_distribution():
    out = Workload(trace()).response(0, 99, 0, 10_000)
    assert out.source == GLOBAL and out.length in (100, 300, 500, 40)


def test_larger_budget_than_recorded_truncation_takes_a_longer_response_or_runs_on():
    out = Workload(trace()).response(0, 2, 0, 2000)  # recorded only to 500; prompt 2 has nothing longer
    assert (out.length, out.finish_reason, out.source) == (2000, "length", RESAMPLED)


def test_answers_are_deterministic_and_seeded():
    a, b = Workload(trace(), seed=1), Workload(trace(), seed=1)
    assert [a.response(1, 1, k, 10_000) for k in range(10)] == [b.response(1, 1, k, 10_000) for k in range(10)]


def test_default_groups_are_the_recorded_ones_in_step_order():
    w = Workload(trace().assign(step=lambda d: d["step"] + 100))  # a trace need not start at step 0
    assert [g.prompt_id for g in w.default_groups(0, 10, 2, 500)] == [1, 2]
    assert [g.prompt_id for g in w.default_groups(1, 10, 2, 500)] == [1]
    assert w.response(0, 1, 1, 500).source == EXACT


def test_nearest_step_wins_and_the_earlier_one_on_a_tie():
    df = pd.concat([trace(), pd.DataFrame({"step": [2], "prompt_id": [7], "sample_idx": [0], "response_len": [11],
                                            "finish_reason": ["stop"], "reward": [1.0], "prompt_len": [10], "max_tokens": [500]}),
                    pd.DataFrame({"step": [0], "prompt_id": [7], "sample_idx": [0], "response_len": [22],
                                  "finish_reason": ["stop"], "reward": [1.0], "prompt_len": [10], "max_tokens": [500]})])
    w = Workload(df)  # prompt 7 recorded at run steps 0 and 1 (trace steps 0 and 2); prompt 1 also at step 2 (trace 5)
    assert w.response(2, 7, 0, 500).length == 11  # nearest recorded step of prompt 7 is run step 1
    assert Workload._nearest([0, 2], 1) == 0 and Workload._nearest([0, 2, 5], 4) == 5


def test_a_group_resampled_at_another_step_keeps_its_recorded_members():
    w = Workload(trace())
    for step in (3, 4, 9):  # prompt 2 is recorded only at step 0: (500 truncated, 40)
        got = sorted(w.response(step, 2, k, 500).length for k in range(2))
        assert got == [40, 500]
