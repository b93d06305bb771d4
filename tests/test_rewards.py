"""The reward scale, and the policies that read rewards meaning the same thing on every scale."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.core import LENGTH, STOP, Group, Request
from lssim.loop.difficulty import PromptPosterior
from lssim.loop.policy import StepOutcome, make_policy
from lssim.loop.rewards import RewardScale


def test_scale_of_rewards_and_its_degenerate_cases():
    assert RewardScale.of([5.0, -5.0, 5.0]) == RewardScale(-5.0, 5.0)
    assert RewardScale.of([0.0, 1.0, np.nan]) == RewardScale(0.0, 1.0)
    assert RewardScale.of([0.0, 0.0]) == RewardScale(0.0, 1.0)  # never solved: still a 0/1 task
    assert RewardScale.of([5.0]) == RewardScale(0.0, 5.0)
    assert RewardScale.of([]) == RewardScale(0.0, 1.0)
    with pytest.raises(ValueError, match="low < high"):
        RewardScale(1.0, 1.0)


@settings(max_examples=50, deadline=None)
@given(low=st.floats(-1e6, 1e6), span=st.floats(1e-3, 1e6), x=st.floats(-3, 3))
def test_normalized_and_value_are_inverse_and_correct_is_the_upper_half(low, span, x):
    s = RewardScale(low, low + span)
    assert s.normalized(s.value(x)) == pytest.approx(x, abs=1e-6 * max(1.0, abs(low) / span))
    assert bool(s.correct(s.value(0.75))) and not bool(s.correct(s.value(0.25))) and not s.correct(float("nan"))


def test_on_a_binary_scale_nothing_changes():
    s = RewardScale()
    r = np.array([0.0, 1.0, -1.0, 0.9, np.nan])
    assert np.array_equal(s.normalized(r), r, equal_nan=True)
    assert s.correct(r).tolist() == (r > 0.5).tolist() and s.value(-1.0) == -1.0


def outcome(pids, rewards, step=0):
    n = len(pids)
    return StepOutcome(step, np.array(pids, np.int64), np.arange(n), np.full(n, 100), np.full(n, 1000),
                       np.array(rewards, float), np.array([STOP] * n, dtype=object), 1.0, np.array(pids, np.int64))


def test_posterior_counts_the_same_evidence_on_any_scale():
    binary, pm5 = PromptPosterior(), PromptPosterior()
    binary.update(0, np.array([1, 1, 2]), np.array([1.0, 0.0, -1.0]))
    pm5.update(0, np.array([1, 1, 2]), np.array([5.0, -5.0, -15.0]), RewardScale(-5.0, 5.0))
    for a, b in zip(binary.params(np.array([1, 2]), 0), pm5.params(np.array([1, 2]), 0)):
        assert np.allclose(a, b)


class Ctx:  # the one field these policies read from a step's context when the proposal is empty
    def __init__(self, scale):
        self.reward_scale = scale


@pytest.mark.parametrize("scale, right, wrong", [(RewardScale(), 1.0, 0.0), (RewardScale(-5.0, 5.0), 5.0, -5.0)])
def test_hadb_counts_hopeless_groups_by_correct_answers_on_any_scale(scale, right, wrong):
    hadb = make_policy("hadb")
    hadb._scale = scale
    hadb.end_step(outcome([1, 1, 2, 2], [wrong, wrong, wrong, right]))
    assert hadb.zero_streak == {1: 1, 2: 0}


def test_breaker_lands_a_range_below_the_lowest_reward():
    breaker = make_policy("breaker")
    assert breaker._scale.value(breaker.stop_reward) == -1.0  # the plan's -1 on 0/1 rewards
    breaker.plan(Ctx(RewardScale(-5.0, 5.0)), [])
    assert breaker._scale.value(breaker.stop_reward) == -15.0


def test_alc_penalty_is_a_fraction_of_the_reward_range():
    alc = make_policy("alc")
    alc.budget = 100
    alc._scale = RewardScale(-5.0, 5.0)
    r = Request(rid=0, group_id=0, step=0, prompt_id=1, sample_idx=0, prompt_len=4, max_tokens=100, generated=100,
                finish_reason=LENGTH, reward=-5.0)
    (g,) = alc.select([Group(1, 0, [r])], 0)
    assert g.requests[0].reward == pytest.approx(-6.0) and r.reward == -5.0  # 0.1 of a range of 10, on a copy


def test_run_config_keeps_its_scale_through_json():
    """A run's meta.json holds dataclasses.asdict(config); lssim.analysis.fidelity reads it back into a RunConfig."""
    import json
    from dataclasses import asdict

    from lssim.loop.controller import RunConfig

    config = RunConfig(steps=2, groups_per_step=3, group_size=2, max_tokens=8, reward_scale=RewardScale(-5.0, 5.0))
    back = RunConfig(**json.loads(json.dumps(asdict(config))))
    assert back == config and back.reward_scale.value(-1.0) == -15.0
    with pytest.raises(ValueError, match="reward_scale"):
        RunConfig(steps=2, groups_per_step=3, group_size=2, max_tokens=8, reward_scale=(0.0, 1.0))
