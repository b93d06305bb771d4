"""Hybrid's update priced piece by piece (TrainCostModel.streamed_update, SimTrainer.price_streamed,
lssim.loop.modes.Hybrid): each group that ends mid-rollout streams into the update as a piece of its own, padded only
to its own sequences, and what is left (the step's fixed work, its optimizer step) runs once every piece is in."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.core import Group, Request
from lssim.loop.modes import ModeConfig
from lssim.sim.trainer import SimTrainer, TrainTimeModel
from lssim.sim.train_profiled import ProfiledTrainCost
from lssim.sim.training import AnalyticTrainCost, TrainCostAtLevel

PROFILED = ProfiledTrainCost.from_json("real_backend/data/profile_trainer_cpu.json")
MODELS = {"profiled": PROFILED, "analytic": AnalyticTrainCost(mini_batches=1), "linear": TrainTimeModel(),
          "at level": TrainCostAtLevel(PROFILED, 1.7), "analytic, reference": AnalyticTrainCost(mini_batches=1, reference=True)}


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(sorted(MODELS)), seq=st.lists(st.integers(1, 4000), min_size=1, max_size=12),
       devices=st.sampled_from([1, 2, 8]))
def test_one_piece_holding_the_whole_batch_costs_what_the_unstreamed_update_does(model, seq, devices):
    cost, seq = MODELS[model], np.array(seq)
    phases = cost.phases(seq, np.zeros_like(seq), devices, collocated=False)
    streamed = cost.streamed_update([seq], devices)
    assert streamed.pieces.sum() + streamed.rest == pytest.approx(phases.logprob + phases.reference + phases.update,
                                                                  rel=1e-9)


@st.composite
def _one_micro_batch(draw) -> list[list[int]]:
    """Two to six groups whose sequences, padded to the longest, fit one micro-batch of the profile's trainer (drawn so,
    not filtered: most random batches would not fit)."""
    longest = draw(st.integers(1, 3000))
    room = min(36, PROFILED.micro_batch_tokens // longest)  # sequences of `longest` tokens that fit
    k = draw(st.integers(2, min(6, room)))
    sizes, left = [], room
    for i in range(k):  # each at least 1, leaving one for every group after it
        sizes.append(draw(st.integers(1, min(6, left - (k - i - 1)))))
        left -= sizes[-1]
    pieces = [draw(st.lists(st.integers(1, longest), min_size=n, max_size=n)) for n in sizes]
    pieces[draw(st.integers(0, len(pieces) - 1))][0] = longest
    return pieces


@settings(max_examples=30, deadline=None)
@given(pieces=_one_micro_batch())
def test_a_padding_trainer_pays_less_for_its_groups_one_by_one_than_padded_together_less_their_micro_batch_overhead(pieces):
    every = np.concatenate(pieces)
    assert len(every) * every.max() <= PROFILED.micro_batch_tokens  # the whole batch is one micro-batch, padded
    streamed = PROFILED.streamed_update([np.array(p) for p in pieces])
    whole = PROFILED.phases(np.concatenate(pieces), np.zeros(sum(map(len, pieces)), np.int64), 1, collocated=False)
    # each extra micro-batch pays u0 once more; padding every piece to the longest one costs at least that much less
    assert streamed.pieces.sum() + streamed.rest <= whole.update + (len(pieces) - 1) * PROFILED.u0 + 1e-12
    assert streamed.rest == pytest.approx(PROFILED.k0 + PROFILED.o0)


@settings(max_examples=30, deadline=None)
@given(pieces=st.lists(st.lists(st.integers(1, 3000), min_size=1, max_size=6), min_size=1, max_size=6))
def test_a_packing_trainer_fills_its_micro_batches_across_groups_so_a_piece_costs_its_flops_share(pieces):
    model = AnalyticTrainCost()
    streamed = model.streamed_update([np.array(p) for p in pieces] * 2, 8)  # every group twice: each copy the same
    half = len(pieces)
    np.testing.assert_allclose(streamed.pieces[:half], streamed.pieces[half:], rtol=1e-12)
    flops = np.array([model._flops(np.array(p)).sum() for p in pieces * 2])
    np.testing.assert_allclose(streamed.pieces / streamed.pieces.sum(), flops / flops.sum(), rtol=1e-9)


def _group(gid: int, length: int, ended: float, rewards=(0.0, 1.0)) -> Group:
    members = []
    for k, reward in enumerate(rewards):
        r = Request(rid=10 * gid + k, group_id=gid, step=0, prompt_id=gid, sample_idx=k, prompt_len=100,
                    max_tokens=length)
        r.generated, r.reward, r.finish_reason, r.finish_time = length, reward, "stop", ended
        members.append(r)
    return Group(prompt_id=gid, step=0, requests=members)


class _Clock:
    """The engine a mode is bound to, reduced to what hybrid's pricing asks: the time, and no shared host."""
    now = staticmethod(lambda: 0.0)
    streamed_share = staticmethod(lambda: None)


def test_hybrid_trains_each_group_as_its_own_piece_once_it_ends_then_the_rest():
    groups = [_group(0, 2000, ended=1.0), _group(1, 50, ended=2.0)]  # a long group early, a short one later
    trainer = SimTrainer(_Clock(), PROFILED, n_devices=1, collocated=False)
    pieces = PROFILED.streamed_update([np.full(2, 2100), np.full(2, 150)])
    mode = ModeConfig("hybrid", 1, 1, elastic=False).build()
    mode.bind(_Clock(), 2, trainer)
    timing = mode.train(trainer.train(groups, 0), 0, groups, 0.0, 3.0)
    long_done = 1.0 + pieces.pieces[0]
    assert timing.start == 1.0
    assert timing.end == pytest.approx(max(long_done, 2.0) + pieces.pieces[1] + pieces.rest)
    # a mode bound without a trainer shares the padded whole update among the groups by tokens: longer here
    unpriced = ModeConfig("hybrid", 1, 1, elastic=False).build()
    unpriced.bind(_Clock(), 2)
    assert unpriced.train(trainer.train(groups, 0), 0, groups, 0.0, 3.0).end > timing.end


def test_a_group_without_signal_is_a_piece_of_nothing_and_a_train_mask_leaves_the_pricing_to_the_whole_batch():
    groups = [_group(0, 300, 1.0), _group(1, 300, 1.0, rewards=(1.0, 1.0))]
    streamed = SimTrainer(_Clock(), PROFILED, signal_only=True).price_streamed(groups, 0)
    assert streamed.pieces[0] > 0 and streamed.pieces[1] == 0.0
    assert SimTrainer(_Clock(), PROFILED).price_streamed(groups, 0).pieces[1] == pytest.approx(streamed.pieces[0])
    masked = SimTrainer(_Clock(), PROFILED)
    masked.set_train_mask(lambda batch: None)
    assert masked.price_streamed(groups, 0) is None
