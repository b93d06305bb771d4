"""lssim.analysis.fidelity.levels: the host's level per world read from a validation folder's steps."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.analysis.fidelity.levels import levels_text, world_levels


def _folder(tmp_path, ratios: dict[str, list[float]], probe: float = 1.0):
    """A folder whose world W's baseline ran each repeat at ratios[W][repeat] x its prediction (5 steps each)."""
    rows = []
    for world, per_repeat in ratios.items():
        for repeat, ratio in enumerate(per_repeat):
            for step in range(5):
                predicted = 1.0 + 0.1 * step
                rows.append({"policy": f"baseline@{world}", "world": world, "repeat": repeat, "step": step,
                             "measured_seconds": predicted * ratio * (1 + 0.01 * (step % 2)),
                             "predicted_seconds": predicted, "speed_level": probe})
        rows.append({"policy": "hadb", "world": world, "repeat": 0, "step": 0, "measured_seconds": 9.0,
                     "predicted_seconds": 1.0, "speed_level": probe})  # a policy's rows never set the level
    pd.DataFrame(rows).to_parquet(tmp_path / "steps_by_repeat.parquet")
    return tmp_path


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=2, max_size=6))
def test_level_is_the_median_run_ratio_and_the_floor_its_distance_from_one(tmp_path_factory, ratios):
    folder = _folder(tmp_path_factory.mktemp("v"), {"tail": ratios})
    row = world_levels(folder).loc[(str(folder), "tail")]
    per_run = [np.median([r * (1 + 0.01 * (s % 2)) for s in range(5)]) for r in ratios]
    assert row["level"] == pytest.approx(np.median(per_run))
    assert row["lowest"] == pytest.approx(min(per_run)) and row["highest"] == pytest.approx(max(per_run))
    assert row["floor_pct"] == pytest.approx(abs(np.median(per_run) - 1) * 100)
    assert row["runs"] == len(ratios)


def test_worlds_apart_and_the_text_counts_those_past_the_bound(tmp_path):
    folder = _folder(tmp_path, {"tail": [1.2, 1.21, 1.19], "placed": [1.0, 1.01, 0.99]}, probe=1.2)
    table = world_levels(folder)
    assert table.loc[(str(folder), "tail"), "level"] == pytest.approx(1.2, abs=0.02)
    assert table.loc[(str(folder), "placed"), "floor_pct"] < 2
    text = levels_text([folder])
    assert "floor over 1.5x an exact model's error in 1 of 2" in text


def test_a_folder_without_steps_or_baseline_is_named(tmp_path):
    with pytest.raises(ValueError, match="no steps_by_repeat.parquet"):
        world_levels(tmp_path)
    pd.DataFrame({"policy": ["hadb"], "repeat": [0], "measured_seconds": [1.0], "predicted_seconds": [1.0]}).to_parquet(
        tmp_path / "steps_by_repeat.parquet")
    with pytest.raises(ValueError, match="no baseline rows"):
        world_levels(tmp_path)
    pd.DataFrame({"policy": ["baseline"], "repeat": [0]}).to_parquet(tmp_path / "steps_by_repeat.parquet")
    with pytest.raises(ValueError, match="measured_seconds"):
        world_levels(tmp_path)


def test_the_shipped_modes_folder_reads_one_world_per_mode():
    table = world_levels("paper/experiments/validation/modes38")
    assert sorted(table.index.get_level_values("world")) == ["async", "collocated", "disaggregated", "hybrid"]
    assert (table["runs"] == 3).all()


def test_folders_that_hold_no_validation_are_left_out_saying_so_and_none_read_is_an_error(tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "other").mkdir()
    good = _folder(tmp_path / "good", {"tail": [1.1, 1.1]})
    text = levels_text([good, tmp_path / "other"])
    assert "over 1 worlds" in text and f"left out: {tmp_path / 'other'}: no steps_by_repeat.parquet" in text
    with pytest.raises(ValueError, match="no folder read"):
        levels_text([tmp_path / "other"])
