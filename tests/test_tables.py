"""lssim.analysis.tables: the terminal table and the per-step line both worlds print."""

from __future__ import annotations

import math

import pandas as pd

from lssim.analysis.tables import TABLE_COLUMNS, format_step, format_summary


def _summary_row(**over) -> dict:
    row = {col: 0.5 for col in TABLE_COLUMNS}
    row.update(steps=3, rollout_seconds=1234.5, speedup=1.25)
    row.update(over)
    return row


def test_format_summary_one_aligned_row_per_policy_and_dash_for_nan():
    table = pd.DataFrame.from_dict({"baseline": _summary_row(speedup=1.0),
                                    "hadb+april(ratio=0.5)": _summary_row(lower_bound_efficiency=math.nan)}, orient="index")
    lines = format_summary(table).splitlines()
    assert lines[0].split()[:5] == ["policy", "step", "s", "speedup", "rollout"]  # end to end first (issue 14)
    assert len(lines) == 2 + len(table)
    assert len({len(line) for line in lines}) == 1  # every column padded to one width
    assert lines[2].startswith("baseline ") and "1.000x" in lines[2] and "1,234" in lines[2]
    assert "1.250x" in lines[3] and " - " in lines[3] + " "  # NaN: nothing to report
    assert " - " not in lines[2] + " "


def test_format_step_numbers_and_missing_values():
    row = {"step": 2, "mean_reward": math.nan, "rollout_seconds": 3.14159, "tokens": 12345, "tokens_per_second": 3929.6,
           "train_seconds": 0.5, "responses_in": 8, "finished": 5, "truncated": 1, "policy_stopped": 1, "dropped": 0,
           "carried_out": 1, "groups_trained": 2, "effective_groups": 1, "trainer_loss": None}
    line = format_step(row)
    assert line.startswith("step   2  reward -  rollout   3.14 s  tokens 12,345 (3,930 tok/s)")
    assert "responses 8 = 5 stop + 1 length + 1 policy + 0 dropped + 1 carried" in line
    assert line.endswith("groups 2 (1 with signal)  loss -")
