"""The trainer's lane (real_backend.train_job.TrainLane): while one lives the interpreter hands its lock between threads
every LANE_SWITCH_INTERVAL, and the last to end puts back what was there. No engine, no model."""

from __future__ import annotations

import sys

import pytest

# the interpreter keeps its switch interval in whole microseconds: compared at 5%

from real_backend.train_job import LANE_SWITCH_INTERVAL, TrainLane, lane_switching


@pytest.fixture
def interval(monkeypatch):
    """Python's own interval, and no lane alive (another test's trainer may have left one running)."""
    from real_backend import train_job

    saved = sys.getswitchinterval()
    monkeypatch.setattr(train_job, "_switching", {"lanes": 0, "saved": None})
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(saved)


def test_a_lane_switches_threads_often_while_it_lives_and_the_last_one_puts_back_the_interval(interval):
    first, second = TrainLane(), TrainLane()
    assert first.submit(sys.getswitchinterval).result() == pytest.approx(LANE_SWITCH_INTERVAL, rel=0.05)
    second.submit(lambda: None).result()
    first.shutdown()
    assert sys.getswitchinterval() == pytest.approx(LANE_SWITCH_INTERVAL, rel=0.05)  # the second still lives
    second.shutdown()
    assert sys.getswitchinterval() == pytest.approx(0.005, rel=0.05)
    second.shutdown()  # a lane ended twice changes nothing
    assert sys.getswitchinterval() == pytest.approx(0.005, rel=0.05)
    third = TrainLane()  # a later job starts a new thread, and switching again
    third.submit(lambda: None).result()
    assert sys.getswitchinterval() == pytest.approx(LANE_SWITCH_INTERVAL, rel=0.05)
    third.shutdown()


def test_a_shorter_interval_already_set_is_kept(interval):
    sys.setswitchinterval(LANE_SWITCH_INTERVAL / 2)
    lane_switching(True)
    assert sys.getswitchinterval() == pytest.approx(LANE_SWITCH_INTERVAL / 2, rel=0.05)
    lane_switching(False)
    assert sys.getswitchinterval() == pytest.approx(LANE_SWITCH_INTERVAL / 2, rel=0.05)
    lane_switching(False)  # more ends than starts: nothing to put back
    assert sys.getswitchinterval() == pytest.approx(LANE_SWITCH_INTERVAL / 2, rel=0.05)
