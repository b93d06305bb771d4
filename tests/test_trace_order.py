"""Validation sorts by key only when the rows are not in key order already, and finds duplicate keys among sorted
neighbours: the same frame, and the same error (rows named as in the input), as pandas' sort and `duplicated`."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.traces.trace import TraceError, validate_trace


def frame(keys: list[tuple[int, int, int]], text_ids: bool, groups: list[int]) -> pd.DataFrame:
    step, pid, sample = (list(c) for c in zip(*keys))
    return pd.DataFrame({
        "step": step, "prompt_id": [f"p{p}" for p in pid] if text_ids else pid, "sample_idx": sample,
        "prompt_len": 3, "response_len": list(range(len(keys))), "reward": 1.0, "finish_reason": "stop",
        "max_tokens": len(keys) + 1, "group_id": groups[:len(keys)] + [0] * (len(keys) - len(groups)),
    })


def pandas_duplicate_error(df: pd.DataFrame) -> str | None:
    """The message check_unique_key gave when it found duplicates with DataFrame.duplicated (keep='first')."""
    key = ["step", "prompt_id", "sample_idx"]
    dup = df[key].duplicated(keep="first").to_numpy()
    if not dup.any():
        return None
    second = int(np.flatnonzero(dup)[0])
    kv = [df[k].iloc[second] for k in key]
    first = int(np.flatnonzero((df[key] == kv).all(axis=1).to_numpy())[0])
    desc = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={int(v)}" for k, v in zip(key, kv))
    more = f"; {int(dup.sum())} duplicate rows in all" if dup.sum() > 1 else ""
    hint = (" (the two rows are in different groups: number a prompt's samples in one step across its groups)"
            if df["group_id"].iloc[first] != df["group_id"].iloc[second] else "")
    return (f"<t>: key columns 'step', 'prompt_id', 'sample_idx': row {second}: duplicate key ({desc}), first seen at "
            f"row {first}{more}{hint}")


keys = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(0, 3)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(keys=keys, text_ids=st.booleans(), groups=st.lists(st.integers(0, 1), max_size=40))
def test_duplicates_are_reported_as_pandas_finds_them_and_the_rest_sorts_as_a_full_sort(keys, text_ids, groups):
    df = frame(keys, text_ids, groups)
    expected = pandas_duplicate_error(df)
    if expected is not None:
        with pytest.raises(TraceError) as err:
            validate_trace(df, "<t>")
        assert str(err.value) == expected
        return
    out = validate_trace(df, "<t>")
    ids = df["prompt_id"].astype(str) if text_ids else df["prompt_id"]
    order = np.lexsort((df["sample_idx"], pd.factorize(ids, sort=True)[0], df["step"]))
    assert out["response_len"].tolist() == df["response_len"].to_numpy()[order].tolist()
    assert out["prompt_id"].tolist() == df["prompt_id"].to_numpy()[order].tolist()


def test_rows_in_key_order_are_taken_as_they_are():
    df = frame([(0, 1, 0), (0, 1, 1), (0, 2, 0), (1, 1, 0)], False, [])
    out = validate_trace(df, "<t>")
    assert out["response_len"].tolist() == [0, 1, 2, 3]
    shuffled = validate_trace(df.iloc[[3, 1, 2, 0]], "<t>")
    assert shuffled["response_len"].tolist() == [0, 1, 2, 3]


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3).map(float)),
                       min_size=1, max_size=12))
def test_a_column_the_quick_range_check_passes_has_no_bad_row(values):
    """check_column_range returns early when a column's min and max say it holds: then no row may break a rule."""
    from lssim.traces.trace import COLUMNS
    from lssim.traces.checks import _range_holds

    for c in COLUMNS:
        if c.kind not in ("int", "float", "id"):
            continue
        a = np.array(values) if c.kind == "float" else np.clip(np.nan_to_num(np.array(values)), -1e9, 1e9).astype(np.int64)
        if not _range_holds(c, a):
            continue
        with np.errstate(invalid="ignore"):
            assert c.allow_nan or not np.isnan(a.astype(float)).any(), c.name
            assert not np.isinf(a.astype(float)).any(), c.name
            assert c.min is None or not (a < c.min).any(), c.name
            assert c.max is None or not (a > c.max).any(), c.name
