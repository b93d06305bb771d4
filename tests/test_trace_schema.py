"""The schema grown to real traces: text prompt ids, rewards on any scale, group_id, trained."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lssim.traces.trace import TraceError, load_trace, validate_trace, write_trace
from lssim.traces.summary import trace_info


def frame(ids=("a", "b", "c"), rewards=(5.0, -5.0)) -> pd.DataFrame:
    rows = [(s, pid, k, 7, 10 + k, rewards[k % len(rewards)], "stop", 64) for s in (3, 9) for pid in ids for k in range(2)]
    return pd.DataFrame(rows, columns=["step", "prompt_id", "sample_idx", "prompt_len", "response_len", "reward",
                                       "finish_reason", "max_tokens"])


def test_text_prompt_ids_are_kept_as_written_and_sorted_as_text(tmp_path):
    ids = ("uid-9f2", "uid-10a", "What is 2+2?")
    df = frame(ids).sample(frac=1.0, random_state=0)
    out = validate_trace(df)
    assert pd.api.types.is_string_dtype(out["prompt_id"].dtype)
    assert out["prompt_id"].tolist()[:2] == [sorted(ids)[0]] * 2  # step 3, text order
    assert set(out["prompt_id"]) == set(ids)
    back = load_trace(write_trace(df, tmp_path / "t.parquet") is not None and tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(back, out)
    assert trace_info(out)["prompts"] == 3


def test_numeric_text_ids_stay_text():
    out = validate_trace(frame(ids=("007", "7")))
    assert sorted(set(out["prompt_id"])) == ["007", "7"]


@pytest.mark.parametrize("rewards", [(5.0, -5.0), (1e9, -3.25), (0.0, 0.0)])
def test_rewards_on_any_finite_scale(rewards):
    out = validate_trace(frame(rewards=rewards))
    assert sorted(set(out["reward"])) == sorted(set(rewards))


@pytest.mark.parametrize("value, expect", [(np.inf, "infinite value"), (np.nan, "NaN not allowed"), (-np.inf, "infinite")])
def test_rewards_must_be_finite(value, expect):
    df = frame()
    df.loc[4, "reward"] = value
    with pytest.raises(TraceError, match=f"r.parquet: column 'reward': row 4: {expect}"):
        validate_trace(df, source="r.parquet")


@pytest.mark.parametrize("mutate, expect", [
    (lambda d: d.assign(prompt_id=["a", 3] * (len(d) // 2)), "column 'prompt_id': row 1: identifiers mix text and numbers"),
    (lambda d: d.assign(prompt_id=[3, "a"] * (len(d) // 2)), "column 'prompt_id': row 1: identifiers mix text and numbers "
     r"\(row 0 has 3\) \(value 'a'\)"),
    (lambda d: d.assign(prompt_id=np.where(d.index == 5, "", d["prompt_id"])), "column 'prompt_id': row 5: empty identifier"),
    (lambda d: d.assign(prompt_id=np.where(d.index == 2, None, d["prompt_id"])), "column 'prompt_id': row 2: missing value"),
    (lambda d: d.assign(prompt_id=np.where(d.index == 2, -1, 3)), "column 'prompt_id': row 2: must be >= 0"),
    (lambda d: d.assign(trained=np.where(d.index == 3, 2, 1)), "column 'trained': row 3: expected a bool"),
    (lambda d: d.assign(trained=["yes"] * len(d)), "column 'trained': row 0: expected a bool"),
    (lambda d: d.assign(trained=pd.array([True, None] * (len(d) // 2), dtype="boolean")), "column 'trained': row 1: missing"),
    (lambda d: d.assign(group_id=np.where(d.index == 6, -2, 0)), "column 'group_id': row 6: must be >= 0"),
])
def test_bad_new_columns_name_file_column_and_row(mutate, expect):
    with pytest.raises(TraceError, match=f"^b.parquet: {expect}"):
        validate_trace(mutate(frame()), source="b.parquet")


def test_duplicate_text_key_names_the_key():
    df = frame()
    df.loc[7, ["step", "prompt_id", "sample_idx"]] = df.loc[1, ["step", "prompt_id", "sample_idx"]].to_numpy()
    with pytest.raises(TraceError, match=r"row 7: duplicate key \(step=3, prompt_id='a', sample_idx=1\), first seen at row 1"):
        validate_trace(df)


def test_trained_and_group_id_are_kept_and_groups_counted_by_group_id():
    df = frame(ids=("a",))  # 2 steps x 1 prompt x 2 samples; then a second group of the prompt in each step
    df = pd.concat([df, df.assign(sample_idx=df["sample_idx"] + 2, group_id=1)], ignore_index=True)
    df["group_id"] = np.where(df["sample_idx"] >= 2, 1, 0)
    df["trained"] = np.where(df["group_id"] == 1, 0, 1)  # 0/1 numbers are bools
    out = validate_trace(df)
    assert out["trained"].dtype == bool and out["trained"].tolist() == [True, True, False, False] * 2
    info = trace_info(out)
    assert info["groups"] == 4 and info["group_size"] == 2 and info["trained_fraction"] == 0.5


def test_groups_of_one_prompt_number_their_samples_across_them():
    df = frame(ids=("a",))
    second = df.assign(group_id=1)  # the same sample_idx 0, 1 again: the numbering must go on (2, 3)
    with pytest.raises(TraceError, match="duplicate key .* in different groups: number a prompt's samples"):
        validate_trace(pd.concat([df.assign(group_id=0), second], ignore_index=True))
    validate_trace(pd.concat([df.assign(group_id=0), second.assign(sample_idx=second["sample_idx"] + 2)]))
