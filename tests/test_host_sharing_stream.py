"""The streamed factors of `lssim profile --shared-host` (real_backend.host_sharing: the engine beside an update
streamed in pieces, as hybrid runs it): their fit, their record in the profile and what the twins say they used.
Without vLLM."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from real_backend.host_sharing import (PAIRED, STREAMED, fit_piece_loss, fit_sharing, fit_streaming, training_share,
                                       write_sharing)
from real_backend.validate_modes import share_said

from test_validate_modes import _bare_profile


def _rows(engine: float = 1.5, piece: float = 1.2, rounds: int = 3) -> pd.DataFrame:
    """measure_sharing's rows where, while a piece runs, the engine does 1 / engine of its work, and a piece takes
    `piece` x its time alone (whole-update phases: engine 1.6x, trainer 1.3x)."""
    rows = []
    for rnd in range(rounds):
        rows += [{"round": rnd, "phase": "engine_alone", "seconds": s} for s in (1.0, 1.0, 1.0)]
        rows += [{"round": rnd, "phase": "engine_beside", "seconds": 1.6},
                 {"round": rnd, "phase": "trainer_alone", "seconds": 2.0}, {"round": rnd, "phase": "trainer_beside", "seconds": 2.6}]
        rows += [{"round": rnd, "phase": "piece_alone", "piece": k, "seconds": 0.1 * (k + 1)} for k in range(3)]
        for busy in (0.3, 0.6):  # a cell with `busy` s of pieces in it: late by busy x (1 - 1 / engine)
            rows.append({"round": rnd, "phase": PAIRED, "seconds": 1.0, "busy": 0.0})
            rows.append({"round": rnd, "phase": "engine_streamed", "seconds": 1.0 + busy * (1 - 1 / engine), "busy": busy})
        rows.append({"round": rnd, "phase": PAIRED, "seconds": 1.0, "busy": 0.0})
        rows += [{"round": rnd, "phase": "piece_streamed", "piece": k, "seconds": 0.1 * (k + 1) * piece} for k in (0, 2)]
    return pd.DataFrame(rows)


def _cells(lost: float, drift: list[float], noise: list[list[float]], busy: float = 0.44) -> pd.DataFrame:
    """A round per `drift` entry: the engine alone takes 1.1 + drift s in it (the machine's speed that moment),
    streamed cells lose `lost` of each of their `busy` piece-seconds, each cell off by its `noise` (alternating
    alone, streamed, ..., alone)."""
    rows = []
    for rnd, (d, off) in enumerate(zip(drift, noise)):
        rows.append({"round": rnd, "phase": "engine_alone", "seconds": 1.1})  # measured minutes before
        for k, e in enumerate(off):
            b = busy * (1 + 0.1 * (k % 3)) if k % 2 else 0.0
            rows.append({"round": rnd, "phase": "engine_streamed" if k % 2 else PAIRED,
                         "seconds": 1.1 + d + lost * b + e, "busy": b})
    return pd.DataFrame(rows)


def test_the_streamed_factors_are_the_engines_loss_per_piece_second_and_the_pieces_over_their_time_alone():
    fit = fit_streaming(_rows(1.5, 1.2))
    assert fit["engine_slowdown"] == pytest.approx(1.5) and fit["trainer_slowdown"] == pytest.approx(1.2)
    assert fit["lost_per_piece_second"] == pytest.approx(1 / 3) and fit["lost_by_round"] == pytest.approx([1 / 3] * 3)
    assert fit["spread"] == pytest.approx(0, abs=1e-12) and fit["cells"] == 6
    assert fit["median_busy_seconds"] == pytest.approx(0.45)
    assert fit_streaming(_rows(0.9, 0.8))["trainer_slowdown"] == 1.0  # "faster" beside the engine: noise, no slow-down
    assert fit_streaming(_rows(0.9, 0.8))["engine_slowdown"] == 1.0
    whole = fit_sharing(_rows())
    assert (whole["engine_slowdown"], whole["trainer_slowdown"]) == (pytest.approx(1.6), pytest.approx(1.3))
    assert whole[STREAMED]["engine_slowdown"] == pytest.approx(1.5)
    assert STREAMED not in fit_sharing(_rows().query("phase in ['engine_alone', 'engine_beside', 'trainer_alone', "
                                                     "'trainer_beside']"))  # measured without pieces: none fitted
    with pytest.raises(ValueError, match="no round measured a piece both alone"):
        fit_streaming(_rows().query("phase != 'piece_streamed'"))


def test_drift_between_the_alone_and_the_streamed_cells_does_not_enter_the_loss():
    # modes38's alone-measured profile: rounds 28.9x, 1.60x, 6.99x, from an alone baseline taken minutes before the
    # streamed cells; the machine 0.35 s, 0.0 s and 0.27 s slower by then. The paired alone cells carry the drift.
    noise = [[0.02, -0.01, 0.0, 0.015, -0.02, 0.01, 0.0, -0.005, 0.01]] * 3
    rows = _cells(0.38, [0.35, 0.0, 0.27], noise)
    fit = fit_piece_loss(rows)
    assert fit["lost_per_piece_second"] == pytest.approx(0.38, abs=0.05)
    assert fit["spread"] < 0.1 and all(f == pytest.approx(0.38, abs=0.06) for f in fit["lost_by_round"])
    assert fit["lost_stderr"] < 0.05


@settings(max_examples=60, deadline=None)
@given(lost=st.floats(0.0, 0.9), drift=st.lists(st.floats(-0.5, 0.5), min_size=1, max_size=4),
       shift=st.floats(-0.3, 0.3))
def test_the_loss_is_exact_without_noise_whatever_the_rounds_drift(lost, drift, shift):
    rows = _cells(lost, drift, [[0.0] * 7] * len(drift))
    moved = rows.assign(seconds=rows["seconds"] + shift)  # the whole machine slower or faster: no change
    for fit in (fit_piece_loss(rows), fit_piece_loss(moved)):
        assert fit["lost_per_piece_second"] == pytest.approx(lost, abs=1e-9)
        assert fit["spread"] == pytest.approx(0, abs=1e-9)


def test_a_fit_that_is_not_a_share_of_the_pieces_seconds_is_refused_naming_why():
    with pytest.raises(ValueError, match="lost 1.50 s per piece-second.*not a share"):
        fit_piece_loss(_cells(1.5, [0.0], [[0.0] * 5]))  # the engine lost more than the pieces ran: a busy machine
    with pytest.raises(ValueError, match="lost -0.90 s per piece-second"):
        fit_piece_loss(_cells(-0.9, [0.0], [[0.0] * 5]))
    with pytest.raises(ValueError, match=f"no round measured both {PAIRED}"):
        fit_piece_loss(_rows().query(f"phase != '{PAIRED}'"))  # rows measured before the paired cells
    with pytest.raises(ValueError, match="never varied"):
        fit_piece_loss(_rows().assign(busy=0.0))


def test_the_streamed_factors_round_trip_through_the_profile_and_an_old_one_prices_pieces_with_the_whole(tmp_path):
    profile = _bare_profile(tmp_path)
    write_sharing(profile, fit_sharing(_rows(1.4, 1.1)))
    share = training_share(profile)
    assert (share.engine_slowdown, share.trainer_slowdown) == (pytest.approx(1.6), pytest.approx(1.3))
    assert (share.streamed.engine_slowdown, share.streamed.trainer_slowdown) == (pytest.approx(1.4), pytest.approx(1.1))
    assert share.for_pieces() is share.streamed
    assert "x1.400 / piece x1.100 (measured streamed)" in share_said(share)
    old = fit_sharing(_rows())
    del old[STREAMED]
    write_sharing(profile, old)  # a profile measured before the streamed factors
    share = training_share(profile)
    assert share.streamed is None and share.for_pieces() is share
    assert "x1.600 / piece x1.300 (the whole update's: the profile has no streamed measurement" in share_said(share)


@pytest.mark.parametrize("streamed, problem", [({"engine_slowdown": "fast", "trainer_slowdown": 1.1}, "could not convert"),
                                               ({"engine_slowdown": 1.2}, "trainer_slowdown"),
                                               ({"engine_slowdown": -1.0, "trainer_slowdown": 1.1}, "finite number > 0"),
                                               (1.3, "not subscriptable")])
def test_a_bad_streamed_record_is_refused_naming_it(tmp_path, streamed, problem):
    profile = _bare_profile(tmp_path)
    write_sharing(profile, {"engine_slowdown": 1.6, "trainer_slowdown": 1.3, STREAMED: streamed})
    with pytest.raises(ValueError, match=f"measured_by.shared_host.streamed is not a streamed measurement.*{problem}"):
        training_share(profile)
    payload = json.loads(profile.read_text())
    payload["measured_by"]["shared_host"] = {"engine_slowdown": 1.6}
    profile.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="measured_by.shared_host is not a measurement"):
        training_share(profile)


def _timed(log: list, name: str, seconds: float):
    """A stand-in for a cell or an update: sleeps `seconds`, logs (name, start, end)."""
    import time

    def run():
        t0 = time.monotonic()
        time.sleep(seconds)
        log.append((name, t0, time.monotonic()))
        return seconds
    return run


def test_the_probe_pairs_each_cell_beside_the_trainer_with_a_cell_alone_just_before_it():
    """Each round's whole-update engine factor compares cells at the same moment: alone (no update running at any
    point of it), then beside updates running back to back from before its start to past its end."""
    from real_backend.host_sharing import _cells_paired

    log: list = []
    rows = _cells_paired(_timed(log, "cell", 0.03), _timed(log, "update", 0.02), cells=4)
    assert [r["phase"] for r in rows] == ["engine_alone", "engine_beside"] * 4
    cells = sorted((a, b) for name, a, b in log if name == "cell")
    updates = sorted((a, b) for name, a, b in log if name == "update")
    for (a0, a1), (b0, b1) in zip(cells[::2], cells[1::2]):
        assert not any(u0 < a1 and u1 > a0 for u0, u1 in updates)  # alone: no update overlaps it
        within = [(u0, u1) for u0, u1 in updates if u0 < b1 and u1 > b0]
        assert within[0][0] <= b0 + 0.005 and within[-1][1] >= b1  # beside: from (as good as) its start to past its end
        assert all(n0 - p1 < 0.01 for (_, p1), (n0, _) in zip(within, within[1:]))  # back to back


def test_an_update_that_fails_beside_the_probe_s_cells_fails_the_probe():
    from real_backend.host_sharing import _cells_paired

    def broken():
        raise RuntimeError("the update broke")

    with pytest.raises(RuntimeError, match="the update broke"):
        _cells_paired(lambda: 0.01, broken, cells=3)
