"""Hybrid's update streamed in pieces beside the rollout on a shared host (lssim.loop.modes._stream_shared, the
streamed factors of lssim.sim.shared_host.TrainingShare)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lssim.loop.core import Group, Request
from lssim.loop.modes import ModeConfig, _group_ends, _stream, _stream_shared
from lssim.sim.shared_host import DriverPrice, TrainingShare

from test_shared_host import FAST, _run
from test_sim import make_trace

STRICT = ModeConfig("hybrid", 1, 1, elastic=False)


def _by_tokens(groups: list[Group], compute: float, rollout_start: float, rollout_end: float):
    """The pieces' ready times and seconds in order, each group's share of `compute` by tokens (a trainer without
    a streamed price, Hybrid._pieces)."""
    done, tokens = _group_ends(groups, rollout_start, rollout_end)
    order = np.argsort(done, kind="stable")
    return done[order], compute * tokens[order] / tokens.sum()


def _group(gid: int, ready: float | None, tokens: int = 100) -> Group:
    """Two members of `tokens` tokens each (prompt 8), finished at `ready` (None: still open at the rollout's end)."""
    members = []
    for k in range(2):
        r = Request(rid=2 * gid + k, group_id=gid, step=0, prompt_id=gid, sample_idx=k, prompt_len=8, max_tokens=500)
        r.generated = tokens - 8
        if ready is not None:
            r.finish_reason, r.finish_time = "stop", ready
        members.append(r)
    return Group(prompt_id=gid, step=0, requests=members)


def test_pieces_slow_the_rollout_only_while_they_run_hand_computed():
    groups = [_group(0, 10.5), _group(1, 11.0)]  # rollout 10..12; each group 0.2 s of the 0.4 s update alone
    start, end, busy = _stream_shared(*_by_tokens(groups, 0.4, 10.0, 12.0), 10.0, 12.0, STRICT, 0.0, (1.5, 2.0))
    # 0.5 s alone; piece 0 runs 0.4 s (its 0.2 s x 2) while the rollout does 0.4 / 1.5; alone again until group 1 is
    # ready (rollout work 1.0); piece 1 likewise; then the rollout alone to its end: 2 s of work + 0.8 x (1 - 1/1.5)
    assert start == pytest.approx(10.5)
    assert end == pytest.approx(12.0 + 0.8 * (1 - 1 / 1.5))
    assert busy == pytest.approx(0.8)


def test_a_piece_running_past_the_rollouts_end_finishes_at_its_own_speed():
    start, end, busy = _stream_shared(*_by_tokens([_group(0, 0.9)], 0.4, 0.0, 1.0), 0.0, 1.0, STRICT, 0.0, (2.0, 2.0))
    # 0.9 s alone; the piece runs 0.2 s beside (0.1 of the rollout's work, 0.1 of its own), the rest (0.3) alone
    assert (start, end, busy) == (pytest.approx(0.9), pytest.approx(1.4), pytest.approx(0.5))


def test_pieces_after_the_rollout_cost_it_nothing():
    groups = [_group(0, None), _group(1, None)]  # both still open: trained once the rollout stops them
    assert _stream_shared(*_by_tokens(groups, 0.4, 0.0, 2.0), 0.0, 2.0, STRICT, 0.0, (1.7, 1.3)) == pytest.approx(
        _stream(*_by_tokens(groups, 0.4, 0.0, 2.0), 2.0, STRICT, 0.0))


pieces = st.lists(st.tuples(st.one_of(st.none(), st.floats(0.0, 1.0)), st.integers(10, 400)), min_size=1, max_size=8)


@FAST
@given(spec=pieces, compute=st.floats(0.01, 3.0), elastic=st.booleans(), switch=st.floats(0.0, 0.5))
@example(spec=[(0.0, 10)], compute=3.0, elastic=True, switch=0.0)  # a piece the helpers join mid-way: all busy after
def test_a_host_shared_at_no_cost_streams_as_on_devices_of_its_own(spec, compute, elastic, switch):
    groups = [_group(i, None if ready is None else 5.0 + 2.0 * ready, tokens) for i, (ready, tokens) in enumerate(spec)]
    config = ModeConfig("hybrid", 2, 1, elastic=elastic)
    start, end, busy = _stream(*_by_tokens(groups, compute, 5.0, 7.0), 7.0, config, switch)
    # the same, but the update ends no sooner than the rollout whose batch it trains (the next step starts then anyway)
    assert _stream_shared(*_by_tokens(groups, compute, 5.0, 7.0), 5.0, 7.0, config, switch, (1.0, 1.0)) == pytest.approx(
        (start, max(end, 7.0), busy), rel=1e-9, abs=1e-12)


@FAST
@given(spec=pieces, compute=st.floats(0.01, 3.0), engine=st.floats(1.0, 3.0), piece=st.floats(1.0, 3.0))
def test_sharing_the_host_never_makes_the_stream_end_sooner(spec, compute, engine, piece):
    groups = [_group(i, None if ready is None else 2.0 * ready, tokens) for i, (ready, tokens) in enumerate(spec)]
    start, end, busy = _stream_shared(*_by_tokens(groups, compute, 0.0, 2.0), 0.0, 2.0, STRICT, 0.0, (engine, piece))
    assert end >= _stream(*_by_tokens(groups, compute, 0.0, 2.0), 2.0, STRICT, 0.0)[1] - 1e-9
    assert busy >= compute - 1e-9  # the pieces' seconds: their work, slower where beside the rollout


@FAST
@given(readies=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=8), compute=st.floats(0.001, 0.3),
       engine=st.floats(1.0, 3.0), piece=st.floats(1.0, 3.0))
def test_the_rollout_loses_one_minus_one_over_the_engine_factor_of_each_second_a_piece_runs_beside_it(
        readies, compute, engine, piece):
    # groups ready in the rollout's first half and at most 0.9 s of pieces: every piece ends before the rollout
    groups = [_group(i, 2.0 * ready, 50 + 10 * i) for i, ready in enumerate(readies)]
    start, end, busy = _stream_shared(*_by_tokens(groups, compute, 0.0, 2.0), 0.0, 2.0, STRICT, 0.0, (engine, piece))
    assert busy == pytest.approx(compute * piece, rel=1e-9)  # every piece ran beside the rollout, `piece` x slower
    assert start == pytest.approx(2.0 * min(readies))  # nothing ran before the first group was ready
    assert end == pytest.approx(2.0 + busy * (1 - 1 / engine), rel=1e-9)


TRACE = make_trace(np.random.default_rng(3).integers(20, 200, size=(3, 4, 4)), max_tokens=200)


def test_the_hybrid_twin_prices_its_pieces_with_the_streamed_factors_and_an_old_profile_with_the_whole_updates():
    plain = _run(TRACE, "hybrid").steps
    whole = _run(TRACE, "hybrid", shared_training=TrainingShare(1.7, 1.3)).steps  # a profile without streamed factors
    streamed = _run(TRACE, "hybrid", shared_training=TrainingShare(1.7, 1.3, streamed=TrainingShare(1.3, 1.1))).steps
    assert (plain["train_start"] < plain["rollout_end"]).any()  # pieces overlap the rollout: there is something to price
    assert plain["step_seconds"].sum() < streamed["step_seconds"].sum() < whole["step_seconds"].sum()
    same_as_streamed = _run(TRACE, "hybrid", shared_training=TrainingShare(1.3, 1.1)).steps
    np.testing.assert_allclose(streamed["step_seconds"], same_as_streamed["step_seconds"], rtol=1e-12)
    # the rollout's own seconds are the engine's: what the pieces cost it lands on the step (the update's end)
    np.testing.assert_allclose(plain["rollout_seconds"], streamed["rollout_seconds"], rtol=1e-12)


def test_a_streamed_share_must_be_two_factors():
    assert TrainingShare(1.7, 1.3).for_pieces() == TrainingShare(1.7, 1.3)
    assert TrainingShare(1.7, 1.3, TrainingShare(1.2, 1.1)).for_pieces() == TrainingShare(1.2, 1.1)
    with pytest.raises(ValueError, match="TrainingShare.streamed"):
        TrainingShare(1.7, 1.3, streamed=(1.2, 1.1))
    with pytest.raises(ValueError, match="TrainingShare.streamed"):
        TrainingShare(1.7, 1.3, streamed=TrainingShare(1.2, 1.1, TrainingShare(1.0, 1.0)))
    with pytest.raises(ValueError, match="TrainingShare.engine_slowdown"):
        TrainingShare(1.7, 1.3, streamed=TrainingShare(0.0, 1.1))


@FAST
@given(spec=pieces, compute=st.floats(0.01, 3.0), engine=st.floats(1.0, 3.0), piece=st.floats(1.0, 3.0),
       hold=st.floats(0.0, 0.2))
def test_the_drivers_hold_at_the_rollouts_end_moves_the_updates_end_by_itself_and_nothing_else(spec, compute, engine,
                                                                                              piece, hold):
    groups = [_group(i, None if ready is None else 2.0 * ready, tokens) for i, (ready, tokens) in enumerate(spec)]
    args = (*_by_tokens(groups, compute, 0.0, 2.0), 0.0, 2.0, STRICT, 0.0, (engine, piece))
    start, end, busy = _stream_shared(*args)
    held = _stream_shared(*args, hold)
    assert held == pytest.approx((start, end + hold, busy), rel=1e-9, abs=1e-12)


def test_the_hybrid_twin_on_a_shared_host_holds_the_update_past_the_rollout_by_the_drivers_seconds_between_steps():
    share = TrainingShare(1.0, 1.0)  # sharing at no cost: only the driver's hold moves the update
    free = _run(TRACE, "hybrid", shared_training=share, driver=DriverPrice(per_step=0.0)).steps
    held = _run(TRACE, "hybrid", shared_training=share, driver=DriverPrice(per_step=0.04)).steps
    np.testing.assert_allclose(held["rollout_seconds"], free["rollout_seconds"], rtol=1e-12)
    np.testing.assert_allclose(held["train_end"] - held["rollout_end"], free["train_end"] - free["rollout_end"] + 0.04,
                               atol=1e-9)
