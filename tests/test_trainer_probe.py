"""The trainer's probe (real_backend.trainer_probe): a fixed GRPO update timed between runs, its level over the trainer
profile's price of it, recorded in each run's meta.json and priced by the modes' twins."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.sim.training import load_train_cost
from real_backend.trainer_probe import (TrainerProbe, probe_lengths, record_trainer_probes, trainer_level,
                                        trainer_probe_record)

PROFILE = "real_backend/data/profile_trainer_cpu.json"


def test_the_probe_times_one_fixed_update_of_the_runs_model():
    pytest.importorskip("transformers")
    from real_backend.world import RealSetup

    probe = TrainerProbe(RealSetup())
    assert probe.lengths == probe_lengths() and len(probe.lengths) % 2 == 0
    assert 0 < probe.measure(updates=1) < 60 and 0 < probe.measure() < 60


@settings(max_examples=25, deadline=None)
@given(window=st.lists(st.floats(0.05, 5.0), min_size=1, max_size=4))
def test_a_runs_trainer_level_is_its_windows_median_over_the_profiles_price_of_the_update(window):
    import numpy as np

    from real_backend.profile_trainer import PROMPT_LEN

    cost = load_train_cost(PROFILE)
    lengths = probe_lengths()
    phases = cost.phases(np.array(lengths), np.full(len(lengths), PROMPT_LEN), 1, collocated=False)
    meta = {"trainer_probe": trainer_probe_record(window, window, lengths)}
    assert trainer_level(meta, cost) == pytest.approx(float(np.median(window)) / (phases.logprob + phases.update))
    assert trainer_level({}, cost) is None


def test_probes_are_recorded_around_each_run_and_bad_ones_refused(tmp_path):
    folders = []
    for k in range(3):
        folders.append(tmp_path / f"run{k}")
        folders[-1].mkdir()
        (folders[-1] / "meta.json").write_text(json.dumps({"repeat": k}))
    probes = [0.4, 0.5, 0.6, 0.7]  # one before the runs, one after each
    for i, folder in enumerate(folders):
        record_trainer_probes(folder, probes, i, [10, 20])
    middle = json.loads((folders[1] / "meta.json").read_text())
    assert middle["repeat"] == 1 and middle["trainer_probe"]["seconds"] == [0.5, 0.6]
    assert middle["trainer_probe"]["window"] == [0.4, 0.5, 0.6, 0.7] and middle["trainer_probe"]["level_s"] == 0.55
    with pytest.raises(ValueError, match="trainer probe"):
        trainer_probe_record([0.0], [0.0], [10])
    with pytest.raises(ValueError, match="trainer_probe"):
        trainer_level({"trainer_probe": {"seconds": [1.0]}}, load_train_cost(PROFILE))


@settings(max_examples=30, deadline=None)
@given(level=st.floats(0.2, 5.0), lengths=st.lists(st.integers(2, 400), min_size=1, max_size=24),
       devices=st.integers(1, 4), collocated=st.booleans())
def test_a_trainer_at_a_host_level_takes_level_times_each_phase(level, lengths, devices, collocated):
    from lssim.sim.training import TrainCostAtLevel, load_train_cost

    base = load_train_cost(PROFILE)
    seq, prompts = np.array(lengths), np.minimum(np.array(lengths) - 1, 16)
    slow = TrainCostAtLevel(base, level)
    p, q = base.phases(seq, prompts, devices, collocated=collocated), slow.phases(seq, prompts, devices, collocated=collocated)
    for name in ("logprob", "reference", "update", "sync", "switch"):
        assert getattr(q, name) == pytest.approx(level * getattr(p, name))
    assert slow.micro_batch_seconds(seq, devices) == pytest.approx(level * base.micro_batch_seconds(seq, devices))
    assert slow.optimizer_step_seconds(devices) == pytest.approx(level * base.optimizer_step_seconds(devices))
    assert slow.describe()["level"] == level


@pytest.mark.parametrize("level", [0, -1.0, float("inf"), float("nan"), True])
def test_a_trainer_level_must_be_a_finite_number_above_zero(level):
    from lssim.sim.training import TrainCostAtLevel, load_train_cost

    with pytest.raises(ValueError, match="TrainCostAtLevel.level"):
        TrainCostAtLevel(load_train_cost(PROFILE), level)
