"""lssim.loop.records.ResponseTable: rows written step by step into preallocated blocks (a new one when outgrown) give the
frame that concatenating the steps' columns gives (dtypes included), whatever the first capacity; a frame taken between
steps stays as taken; a final one is a view where the rows fit one block;
a checkpoint pickled before the blocks still loads."""

import pickle

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.loop.records import STRING_COLUMNS, RESPONSE_COLUMNS, ResponseTable, string_column

FLOATS = {"reward", "submit_time", "first_token_time", "finish_time", "natural_reward"}
BOOLS = {"exact", "trained"}


def chunk(rng: np.random.Generator, n: int, widen: str | None = None) -> dict[str, np.ndarray]:
    """One step's columns as ResponseTable.add makes them; `widen`: that int column arrives as float this time."""
    out = {}
    for name in RESPONSE_COLUMNS:
        if name in STRING_COLUMNS:
            out[name] = np.array(["stop", "length", ""], object)[rng.integers(0, 3, n)]
        elif name in FLOATS or name == widen:
            out[name] = rng.random(n) * 100
        elif name in BOOLS:
            out[name] = rng.random(n) < 0.5
        else:
            out[name] = rng.integers(-1, 1000, n)
    return out


def concatenated(chunks) -> pd.DataFrame:
    """The frame as the table built it before its blocks: each column's chunks concatenated at the end."""
    return pd.DataFrame({name: string_column([c[name] for c in chunks]) if name in STRING_COLUMNS else
                         np.concatenate([c[name] for c in chunks]) for name in RESPONSE_COLUMNS})


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=8), capacity=st.sampled_from([0, 1, 50, 10_000]),
       widen_at=st.integers(-1, 7), seed=st.integers(0, 2**31))
def test_rows_in_blocks_are_the_concatenated_steps(sizes, capacity, widen_at, seed):
    rng = np.random.default_rng(seed)
    chunks = [chunk(rng, n, "sample_idx" if i == widen_at else None) for i, n in enumerate(sizes)]
    table = ResponseTable(capacity)
    for c in chunks:
        table._store(c)
    want = concatenated(chunks)
    pd.testing.assert_frame_equal(table.frame(), want, check_exact=True)
    pd.testing.assert_frame_equal(table.frame(share=True), want, check_exact=True)
    assert table.frame(["reward", "step"]).columns.tolist() == ["step", "reward"]


def test_a_frame_taken_between_steps_stays_as_taken_and_a_final_one_shares():
    rng = np.random.default_rng(0)
    table = ResponseTable(10)
    table._store(chunk(rng, 8))
    before = table.frame()
    kept = before.copy()
    table._settled.append((3, 1, 7))  # a member of an open group settled later
    table._store(chunk(rng, 30))  # outgrows the blocks
    pd.testing.assert_frame_equal(before, kept, check_exact=True)
    after = table.frame(share=True)
    assert len(after) == 38 and after["train_step"].iloc[3] == 1 and after["off_policy_tokens"].iloc[3] == 7
    # outgrown, the first block kept its rows where they were: the final frame gathers the blocks once
    assert not np.shares_memory(after["reward"].to_numpy(), table._columns["reward"])
    fits = ResponseTable(40)
    fits._store(chunk(rng, 8))
    fits._store(chunk(rng, 30))
    assert np.shares_memory(fits.frame(share=True)["reward"].to_numpy(), fits._columns["reward"])
    assert not np.shares_memory(fits.frame()["reward"].to_numpy(), fits._columns["reward"])


def test_a_checkpoint_pickled_before_the_blocks_loads():
    """A ResponseTable pickled by the earlier layout (a list of step chunks) is read back into blocks."""
    rng = np.random.default_rng(1)
    chunks = [chunk(rng, n) for n in (5, 0, 12)]
    table = ResponseTable.__new__(ResponseTable)  # what unpickling such a checkpoint does
    table.__setstate__(dict(_chunks=chunks, _rows=17, _pending={4: 2}, _settled=[(1, 2, 3)]))
    want = concatenated(chunks)
    want.loc[1, ["trained", "train_step", "off_policy_tokens"]] = [True, 2, 3]
    pd.testing.assert_frame_equal(table.frame(), want, check_exact=True)
    assert table._pending == {4: 2}
    table._store(chunk(rng, 3))  # and goes on taking rows
    assert len(table.frame()) == 20


@settings(max_examples=30, deadline=None)
@given(before=st.lists(st.integers(0, 200), max_size=4), after=st.lists(st.integers(0, 200), max_size=4),
       seed=st.integers(0, 2**31))
def test_a_pickled_table_holds_only_its_rows_and_goes_on_as_the_one_never_pickled(before, after, seed):
    """A checkpoint pickles the rows written, not the blocks preallocated for the run, and the table read back takes
    the next steps' rows exactly as the original does."""
    rng = np.random.default_rng(seed)
    first, then = [chunk(rng, n) for n in before], [chunk(rng, n) for n in after]
    kept, pickled = ResponseTable(1_000_000), ResponseTable(1_000_000)
    for c in first:
        kept._store(c)
        pickled._store(c)
    blob = pickle.dumps(pickled)
    assert len(blob) < 200_000 + 200 * sum(before)  # a million preallocated rows would be tens of MB
    back = pickle.loads(blob)
    for c in then:
        kept._store(c)
        back._store(c)
    pd.testing.assert_frame_equal(back.frame(), kept.frame(), check_exact=True)


def test_an_empty_table_gives_the_empty_frame():
    frame = ResponseTable(100).frame()
    assert frame.columns.tolist() == list(RESPONSE_COLUMNS) and len(frame) == 0


def test_string_columns_kept_as_numbers_give_the_same_strings():
    """A step whose responses all ended by themselves or at their budget keeps finish_reason as numbers, and a
    stop_reason of one str throughout as numbers too (records._finish_reasons, coded_if_one); mixed with steps
    kept as objects, the frame has the strings the objects give."""
    from lssim.loop.records import coded_if_one, Coded

    rng = np.random.default_rng(2)
    chunks = [chunk(rng, n) for n in (6, 4, 0, 9)]
    table = ResponseTable(0)
    for i, c in enumerate(chunks):
        c = dict(c)
        if i % 2 == 0:
            stopped = rng.random(len(c["step"])) < 0.5
            c["finish_reason"] = Coded(stopped.view(np.int8), ("length", "stop"))
            chunks[i]["finish_reason"] = np.where(stopped, "stop", "length").astype(object)
            chunks[i]["stop_reason"] = np.full(len(c["step"]), "", object)
            c["stop_reason"] = coded_if_one(chunks[i]["stop_reason"])
            assert isinstance(c["stop_reason"], Coded) or not len(c["step"])
        table._store(c)
    pd.testing.assert_frame_equal(table.frame(), concatenated(chunks), check_exact=True)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(-5, 50), max_size=30), values=st.lists(st.integers(-8, 60), max_size=30),
       far=st.booleans())
def test_in_sorted_is_isin(keys, values, far):
    """Keys in a short range (a mask over it) and spread out (`far`: np.isin's sort)."""
    from lssim.loop.records import in_sorted

    keys, values = np.sort(np.array(keys + [10**9] * far, np.int64)), np.array(values + [10**9] * far, np.int64)
    assert in_sorted(values, keys).tolist() == np.isin(values, keys).tolist()
