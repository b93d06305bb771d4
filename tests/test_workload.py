"""The Workload's counterfactual answers: exact where the trace holds them, and says so otherwise."""

import numpy as np
import pandas as pd

from lssim.traces.workload import EXACT, GLOBAL, RESAMPLED, TRUNCATED, Workload


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


# -- the recorded batches, text ids, and answers as recorded -------------------------------------------------

def recorded():
    """Step 7: prompt "b" twice (groups 0 and 1, samples numbered across them), prompt "a" with per-member
    budgets and a member not trained; step 9: "a" aborted at 30 of 64, and a filtered group of "c"."""
    rows = [  # step, prompt, group, sample, length, finish, reward, max_tokens, trained
        (7, "b", 0, 0, 10, "stop", 5.0, 64, True), (7, "b", 0, 1, 64, "length", -5.0, 64, True),
        (7, "b", 1, 2, 12, "stop", -5.0, 32, True),
        (7, "a", 0, 0, 20, "stop", 5.0, 100, True), (7, "a", 0, 1, 50, "length", -5.0, 50, False),
        (9, "a", 0, 0, 30, "abort", -5.0, 64, True), (9, "a", 0, 1, 8, "stop", 5.0, 64, True),
        (9, "c", 0, 0, 3, "stop", 5.0, 64, False), (9, "c", 0, 1, 4, "stop", 5.0, 64, False),
    ]
    df = pd.DataFrame(rows, columns=["step", "prompt_id", "group_id", "sample_idx", "response_len", "finish_reason",
                                     "reward", "max_tokens", "trained"])
    return df.assign(prompt_len=10)


def test_text_ids_run_as_int_codes_in_text_order_and_come_back_as_written():
    w = Workload(recorded())
    assert w.pool.prompt_id.tolist() == [0, 1, 2] and w.prompt_ids_as_written(np.array([2, 0])).tolist() == ["c", "a"]
    assert Workload(trace()).prompt_ids_as_written(np.array([1, 2])).tolist() == [1, 2]  # integer ids are the codes


def test_default_groups_are_the_recorded_batch_whole_with_sizes_budgets_and_trained_flags():
    w = Workload(recorded())
    a, b, c = 0, 1, 2
    step0 = w.default_groups(0, n_groups=1, group_size=8, max_tokens=10)  # the run shape does not cut a record
    assert [(g.prompt_id, g.n_samples, g.max_tokens) for g in step0] == [(a, 2, 100), (b, 2, 64), (b, 1, 32)]
    assert step0[0].member_max_tokens == (100, 50) and step0[0].member_trained == (True, False)
    assert step0[1].member_max_tokens is None and step0[1].member_trained is None
    step1 = w.default_groups(1, 1, 8, 10)
    assert [(g.prompt_id, g.n_samples) for g in step1] == [(a, 2), (c, 2)] and step1[1].member_trained == (False, False)
    assert w.groups_in(2) == 5 and w.groups_in(3) == 8  # past the end it starts over
    assert (w.groups_per_step, w.group_size, w.max_tokens) == (2, 2, 100)


def test_answers_at_the_recorded_budget_end_as_recorded():
    w = Workload(recorded())
    a, b = 0, 1
    assert w.lookup(0, b, 2, 32)[:4] == (12, "stop", -5.0, EXACT)  # the second group of "b": sample 2
    assert w.lookup(1, a, 0, 64)[:4] == (30, "abort", -5.0, EXACT)  # an abort replays as the abort it was
    assert w.lookup(0, a, 1, 50)[:4] == (50, "length", -5.0, EXACT)
    # asked otherwise, it is modelled: cut by a smaller budget it earns the scale's lowest reward (-5, not 0)
    assert w.lookup(0, a, 0, 15)[:4] == (15, "length", -5.0, TRUNCATED)
    assert w.lookup(1, a, 0, 20)[:4] == (20, "length", -5.0, TRUNCATED)
    assert w.lookup(1, a, 0, 80).source == RESAMPLED  # aborted at 30: how it would have ended is not recorded
