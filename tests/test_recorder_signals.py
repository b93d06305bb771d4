"""The recorder's signal columns (real_backend.recorder.SignalColumns), kept between writes, are what looking up every
row each write gives, whatever the order of observations and writes. No engine."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from real_backend.recorder import SIGNAL_COLUMNS, Recorder

KEYS = [(step, pid, k) for step in range(3) for pid in range(2) for k in range(2)]


def _looked_up(signals: dict, keys: list) -> dict[str, list]:
    return {col: [signals.get(key, {}).get(col, default) for key in keys] for col, default in SIGNAL_COLUMNS}


def _frame(keys: list) -> pd.DataFrame:
    return pd.DataFrame({"step": [k[0] for k in keys], "prompt_id": [k[1] for k in keys], "sample_idx": [k[2] for k in keys],
                         "response_len": range(len(keys))})


# each action: ("observe", key index, a value: its loop_start an int, or a float where it has a fraction) or ("write", rows appended to the frame, or -1: the frame reordered)
actions = st.lists(st.one_of(st.tuples(st.just("observe"), st.integers(0, len(KEYS) - 1), st.floats(-5, 5)),
                             st.tuples(st.just("write"), st.integers(-1, 3), st.just(0.0))), max_size=30)


@settings(max_examples=200, deadline=None)
@given(actions)
def test_kept_columns_equal_every_row_looked_up(steps):
    recorder, rows, signals = Recorder("unused"), [], {}
    for what, n, value in steps:
        if what == "observe":
            key = KEYS[n]
            recorder._columns.observed(key)
            signals[key] = recorder._signals[key] = {"entropy_mean": value, "text": f"t{value}", "loop_start": int(value) if value < 2 else value}
            continue
        rows = list(reversed(rows)) if n < 0 else rows + [k for k in KEYS if k not in rows][:n]
        expected = _frame(rows)
        for col, values in _looked_up(signals, rows).items():  # as every row looked up and assigned gives them
            expected[col] = values
        pd.testing.assert_frame_equal(recorder._responses(_frame(rows)), expected)
