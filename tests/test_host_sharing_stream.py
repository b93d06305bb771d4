"""The streamed factors of `lssim profile --shared-host` (real_backend.host_sharing: the engine beside an update
streamed in pieces, as hybrid runs it): their fit, their record in the profile and what the twins say they used.
Without vLLM."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from real_backend.host_sharing import STREAMED, fit_sharing, fit_streaming, training_share, write_sharing
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
            rows.append({"round": rnd, "phase": "engine_streamed", "seconds": 1.0 + busy * (1 - 1 / engine), "busy": busy})
        rows += [{"round": rnd, "phase": "piece_streamed", "piece": k, "seconds": 0.1 * (k + 1) * piece} for k in (0, 2)]
    return pd.DataFrame(rows)


def test_the_streamed_factors_are_the_engines_over_the_pieces_seconds_and_the_pieces_over_their_time_alone():
    fit = fit_streaming(_rows(1.5, 1.2))
    assert fit["engine_slowdown"] == pytest.approx(1.5) and fit["trainer_slowdown"] == pytest.approx(1.2)
    assert fit["median_busy_seconds"] == pytest.approx(0.45)
    assert fit_streaming(_rows(0.9, 0.8))["trainer_slowdown"] == 1.0  # "faster" beside the engine: noise, no slow-down
    whole = fit_sharing(_rows())
    assert (whole["engine_slowdown"], whole["trainer_slowdown"]) == (pytest.approx(1.6), pytest.approx(1.3))
    assert whole[STREAMED]["engine_slowdown"] == pytest.approx(1.5)
    assert STREAMED not in fit_sharing(_rows().query("phase in ['engine_alone', 'engine_beside', 'trainer_alone', "
                                                     "'trainer_beside']"))  # measured without pieces: none fitted
    with pytest.raises(ValueError, match="no round measured a piece both alone"):
        fit_streaming(_rows().query("phase != 'piece_streamed'"))
    lost_more = _rows().assign(busy=0.01)  # the pieces ran less than the engine lost: that is not their doing
    with pytest.raises(ValueError, match="more than they ran"):
        fit_streaming(lost_more)


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
