"""`lssim import`: dumps written here in each framework's own format (tests/importer_dumps.py; see each importer's
docstring for the writer it follows) import with one command, match what was dumped, and replay exactly; bad dumps
fail with one line naming the file and the record, exit 2, and leave no file behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.cli import main
from lssim.traces.importers import FRAMEWORKS, DumpError
from lssim.traces.importers.areal import read_areal
from lssim.traces.importers.slime import read_slime
from lssim.traces.trace import SCHEMA

torch = pytest.importorskip("torch")

from importer_dumps import (AREAL_BATCH, CAP, EOS_TEXT, PROMPTS, Group, decoded, dump, expected,  # noqa: E402
                            imported, make_run, needs_real_traces, observed, response_ids, run_for, tokenizer_dir,
                            write_areal, write_slime, write_verl)  # tokenizer_dir: a fixture


# --------------------------------------------------------------------------
# Good dumps: what was dumped is what was imported
# --------------------------------------------------------------------------

@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_import_gives_back_every_response_as_dumped(framework, tmp_path, tokenizer_dir):
    run = run_for(framework)
    src, options = dump(framework, tmp_path, run, tokenizer_dir)
    result = imported(framework, src, options)
    frame = result.frame
    want = expected(run, {"verl": 1}.get(framework, 0))
    if framework == "trl":  # logging steps 10, 20, ...; the reward is the sum of two reward functions: (r - 1) + 1
        want = {10 * (s + 1): v for s, v in want.items()}
    assert observed(frame) == want
    # the framework's own token count: every stopped response's EOS counted, the one at the cap included
    assert int(frame["response_len"].sum()) == sum(sum(g.lengths) for step in run for g in step)
    assert int((frame["finish_reason"] == "length").sum()) == sum(e is False for step in run for g in step for e in g.eos)
    assert ((frame["finish_reason"] == "stop") & (frame["response_len"] == CAP)).sum() == 1  # EOS as the last allowed token
    assert (frame.loc[frame["finish_reason"] == "length", "response_len"] == CAP).all()
    assert (frame["max_tokens"] == CAP).all()
    assert set(frame["length_source"]) == {"retokenized" if framework in ("verl", "trl") else "measured"}
    assert set(frame["finish_source"]) == {"measured" if framework == "slime" else "inferred"}
    groups = frame.groupby(["step", "group_id"]).size()
    assert sorted(groups.tolist()) == sorted(len(g.lengths) for step in run for g in step)  # verl: by uid
    assert not frame.duplicated(["step", "prompt_id", "sample_idx"]).any()


def test_slime_keeps_weight_versions_and_filtered_groups(tmp_path):
    run = make_run()
    frame = read_slime(write_slime(tmp_path / "d", run)).frame
    carried = frame[(frame["group_id"] == 0) & (frame["step"] > 0)]
    assert (carried["policy_version_first"] == carried["step"] - 1).all() and (carried["policy_version_last"] == carried["step"]).all()
    untrained = frame[~frame["trained"]]
    assert set(zip(untrained["step"], untrained["group_id"])) == {(2, 1)}
    assert len(untrained) == len(run[2][1].lengths)


def test_areal_steps_are_the_runs_rounds_not_its_version_folders(tmp_path, tokenizer_dir):
    """4 submit/wait rounds write 5 version folders (the tasks submitted ahead finish under the last update's
    weights) and a task submitted ahead of its round sits in the previous round's folder: 4 steps, as run."""
    run = run_for("areal")
    src, options = dump("areal", tmp_path, run, tokenizer_dir)
    assert sorted(int(d.name) for d in (src / "rollout").iterdir()) == [0, 1, 2, 3, 4]
    result = imported("areal", src, options)
    f = result.frame
    assert observed(f) == expected(run)
    assert sorted(f["step"].unique()) == [0, 1, 2, 3]
    assert f["trained"].all()
    assert "policy_version_last" not in f and "policy_version_first" not in f  # the dump has each task's extremes only
    assert any("2 task(s) after the last full step of 4 (ids 16..17)" in n for n in result.notes)
    assert any("does not say which tasks the run rejected" in n for n in result.notes)


def test_areal_a_rejected_task_is_untrained_and_not_counted(tmp_path, tokenizer_dir):
    run = run_for("areal")
    src = write_areal(tmp_path / "d", run, rejected=(1, 2))  # task 6 rejected, task 7 waited for in its place
    result = read_areal(src, max_tokens=CAP, batch_size=AREAL_BATCH, tokenizer=tokenizer_dir, rejected=[6])
    f = result.frame
    untrained = f[~f["trained"]]
    assert set(untrained["source_file"]) == {str(src / "rollout" / "1" / "6.jsonl")}
    assert set(untrained["step"]) == {1} and len(untrained) == len(run[1][2].lengths)
    assert observed(f[f["trained"]]) == expected(run)


def test_areal_refuses_a_task_finished_after_its_step(tmp_path, tokenizer_dir):
    """A batch size that is not the run's puts task 4 (finished under version 1) in step 0: the order is wrong."""
    src = write_areal(tmp_path / "d", run_for("areal"))
    with pytest.raises(DumpError, match=r"1/4\.jsonl: task 4 finished at weight version 1, but the order of task ids puts it in step 0"):
        read_areal(src, max_tokens=CAP, batch_size=AREAL_BATCH + 1, tokenizer=tokenizer_dir)


def test_areal_eos_as_the_last_allowed_token_is_a_stop(tmp_path, tokenizer_dir):
    src = write_areal(tmp_path / "d", run_for("areal"))
    with pytest.raises(DumpError, match=r"0/0\.jsonl: line 2: the response reaches --max-tokens 24; .*needs --eos-token"):
        read_areal(src, max_tokens=CAP, batch_size=AREAL_BATCH)
    by_text = read_areal(src, max_tokens=CAP, batch_size=AREAL_BATCH, eos_tokens=[EOS_TEXT]).frame
    by_tokenizer = read_areal(src, max_tokens=CAP, batch_size=AREAL_BATCH, tokenizer=tokenizer_dir).frame
    pd.testing.assert_frame_equal(by_text, by_tokenizer[list(by_text.columns)])  # the tokenizer adds the measured signals
    assert set(by_tokenizer["signal_source"]) == {"measured"} and "signal_source" not in by_text
    task0 = by_text[by_text["source_file"] == str(src / "rollout" / "0" / "0.jsonl")].sort_values("source_record")
    assert task0["response_len"].tolist()[1:3] == [CAP, CAP]
    assert task0["finish_reason"].tolist()[1:3] == ["length", "stop"]  # sample 1 cut at the cap, sample 2's EOS the last token
    with pytest.raises(DumpError, match=r"response length 24 > the cap 20"):
        read_areal(src, max_tokens=20, batch_size=AREAL_BATCH, tokenizer=tokenizer_dir)


def test_areal_pointed_at_the_fileroot_names_the_rollout_folder(tmp_path):
    trial = tmp_path / "fileroot" / "logs" / "me" / "exp" / "trial0"
    write_areal(trial, run_for("areal"))
    with pytest.raises(DumpError, match=f"give the trial's folder or its rollout folder: {trial / 'rollout'}"):
        read_areal(tmp_path / "fileroot", max_tokens=CAP, batch_size=AREAL_BATCH, eos_tokens=[EOS_TEXT])
    assert len(read_areal(trial, max_tokens=CAP, batch_size=AREAL_BATCH, eos_tokens=[EOS_TEXT]).frame) > 0


def test_verl_without_uid_groups_the_responses_of_one_prompt(tmp_path, tokenizer_dir):
    """Before the uid field, two groups of one prompt in one step cannot be told apart: they import as one."""
    run = make_run()
    src = write_verl(tmp_path / "d", run, uid=False)
    frame = imported("verl", src, ["--tokenizer", str(tokenizer_dir), "--max-tokens", str(CAP)]).frame
    assert observed(frame) == expected(run, 1)
    assert frame[frame["step"] == 2].groupby("group_id").size().max() == 8  # step 2's prompt sampled twice


def test_verl_refuses_a_uid_shared_by_two_prompts(tmp_path, tokenizer_dir):
    src = write_verl(tmp_path / "d", make_run())
    rows = [json.loads(line) for line in (src / "1.jsonl").read_text().splitlines()]
    other = next(i for i, r in enumerate(rows) if r["input"] != rows[0]["input"])
    rows[other]["uid"] = rows[0]["uid"]
    (src / "1.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DumpError, match=f"1\\.jsonl: line {other + 1}: 'uid' uid-1-\\d+ is shared by two prompts"):
        imported("verl", src, ["--tokenizer", str(tokenizer_dir), "--max-tokens", str(CAP)])


@pytest.mark.parametrize("framework", ["verl", "trl"])
def test_a_max_tokens_below_a_response_is_refused(framework, tmp_path, tokenizer_dir):
    src, options = dump(framework, tmp_path, run_for(framework), tokenizer_dir)
    options[options.index("--max-tokens") + 1] = "10"
    needle = r"\d\.jsonl: line \d+: 'output'" if framework == "verl" else r"completions_00010\.parquet: record \d+: 'completion'"
    with pytest.raises(DumpError, match=needle + r": \d+ tokens > --max-tokens 10; is --max-tokens the run's"):
        imported(framework, src, options)


def test_trl_never_sums_a_log_extra_int_column_into_the_reward(tmp_path, tokenizer_dir):
    run = run_for("trl")
    src, options = dump("trl", tmp_path, run, tokenizer_dir)
    assert pd.read_parquet(src / "completions" / "completions_00010.parquet")["answer_digits"].dtype == np.int64
    result = imported("trl", src, options)
    assert "reward = sum of accuracy_reward, format_reward" in result.notes
    assert sorted(result.frame["reward"]) == sorted(r for step in run for g in step for r in g.rewards)


def test_trl_drops_a_batch_logged_twice_and_cuts_runs_of_one_prompt(tmp_path, tokenizer_dir):
    run = run_for("trl")
    src, options = dump("trl", tmp_path, run, tokenizer_dir)
    result = imported("trl", src, options)
    assert sorted(result.frame["step"].unique()) == [10, 20, 30, 40]
    assert any("logged twice" in n for n in result.notes)
    step20 = result.frame[result.frame["step"] == 20]
    assert step20.groupby("group_id").size().tolist() == [4] * 5  # the prompt sampled twice is two groups


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.lists(st.integers(1, CAP), min_size=1, max_size=5), min_size=1, max_size=4), min_size=1, max_size=4),
       st.integers(0, 10**6))
def test_slime_import_is_exact_for_any_run(tmp_path_factory, lengths, seed):
    rng = np.random.default_rng(seed)
    run = [[Group(PROMPTS[int(rng.integers(len(PROMPTS)))], ls, [float(rng.choice([-5.0, 5.0, 0.5]))] * len(ls)) for ls in step]
           for step in lengths]
    frame = read_slime(write_slime(tmp_path_factory.mktemp("s"), run, split_step=None, drop_group=None), max_tokens=CAP).frame
    assert observed(frame) == expected(run)
    assert frame.groupby(["step", "group_id"]).size().tolist() == [len(g.lengths) for step in run for g in step]


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_import_measures_the_early_exit_signals_from_the_tokens(framework, tmp_path, tokenizer_dir):
    """Every importer with the responses' token ids (slime's own; the others' text retokenized) keeps the signals,
    one value every --signal-stride tokens, and says how it measured them."""
    src, options = dump(framework, tmp_path, run_for(framework), tokenizer_dir)
    result = imported(framework, src, options + ["--signal-stride", "4"])
    f = result.frame
    assert set(f["signal_source"]) == {"measured"} and set(f["signal_stride"]) == {4}
    assert [len(a) for a in f["signal_repetition"]] == (f["response_len"] // 4).tolist()
    said = result.measured if framework == "slime" else result.inferred
    assert any(s.startswith("early-exit signals measured from") and "stride 4)" in s for s in said)
    assert all(np.isnan(a).all() for a in f["signal_entropy"])  # none of these dumps has log-probs
    off = imported(framework, src, options + ["--no-signals", "1"])  # (the helper reads options in pairs)
    assert "signal_source" not in off.frame and "early-exit signals not measured (--no-signals)" in off.notes


def test_areal_without_a_tokenizer_measures_no_signals_and_says_why(tmp_path):
    src = write_areal(tmp_path / "d", run_for("areal"))
    result = read_areal(src, max_tokens=CAP, batch_size=AREAL_BATCH, eos_tokens=[EOS_TEXT])
    assert "signal_source" not in result.frame
    assert any("the dump has no token ids; pass --tokenizer" in n for n in result.notes)


def test_areal_fits_a_retokenized_completion_to_the_dumps_count_and_says_so(tmp_path, tokenizer_dir):
    src = write_areal(tmp_path / "d", run_for("areal"))
    path = src / "rollout" / "0" / "0.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["completion"] = "h " + rec["completion"]  # one token more than the dump's seqlen - prompt_len
    path.write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    result = read_areal(src, max_tokens=CAP, batch_size=AREAL_BATCH, tokenizer=tokenizer_dir)
    assert any(n.startswith("1 retokenized completion(s) differ") and "0/0.jsonl: line 1" in n for n in result.notes)
    assert set(result.frame["signal_source"]) == {"measured"}


def test_a_signal_stride_below_one_is_refused(tmp_path, capsys):
    src = write_slime(tmp_path / "d", make_run())
    with pytest.raises(SystemExit) as e:
        main(["import", "slime", str(src), "-o", str(tmp_path / "t.parquet"), "--signal-stride", "0"])
    assert e.value.code == 2 and "--signal-stride must be >= 1, got 0" in capsys.readouterr().err


# --------------------------------------------------------------------------
# One command, replayed exactly
# --------------------------------------------------------------------------


@needs_real_traces
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_one_command_imports_and_baseline_replays_it_exactly(framework, tmp_path, tokenizer_dir, capsys):
    from lssim.analysis.replay import SimSetup, replay
    from lssim.traces.trace import load_trace

    src, options = dump(framework, tmp_path, run_for(framework), tokenizer_dir)
    out = tmp_path / "trace.parquet"
    assert main(["import", framework, str(src), "-o", str(out), *options]) == 0
    assert f"to {out}" in capsys.readouterr().out
    trace = load_trace(out)
    res = replay(trace, [], SimSetup(n_instances=2))["baseline"]
    assert int(res.responses["response_len"].sum()) == int(trace["response_len"].sum())
    assert len(res.responses) == len(trace)
    assert float(res.responses["exact"].mean()) == 1.0


# --------------------------------------------------------------------------
# Bad dumps: one line naming file and record, exit 2, nothing written
# --------------------------------------------------------------------------


def _break(framework: str, problem: str, src: Path, options: list[str], tmp_path: Path) -> tuple[list[str], str]:
    """Spoil a good dump; return the import's options and what the error line must name."""
    if problem == "missing step":
        victim = {"slime": src / "rollout_data" / "2.pt", "verl": src / "3.jsonl", "areal": src / "rollout" / "2",
                  "trl": src / "completions" / "completions_00030.parquet"}[framework]
        shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
        return options, {"slime": "step 2 missing", "verl": "step 3 missing", "areal": "step 2 missing", "trl": "step 30 missing"}[framework]
    if problem == "no length":
        if framework == "slime":
            data = torch.load(src / "rollout_data" / "1.pt", weights_only=True)
            del data["samples"][3]["response_length"]
            torch.save(data, src / "rollout_data" / "1.pt")
            return options, "1.pt: sample 3 (index"
        if framework == "areal":
            path = src / "rollout" / "1" / sorted(p.name for p in (src / "rollout" / "1").iterdir())[0]
            lines = path.read_text().splitlines()
            rec = json.loads(lines[1])
            del rec["seqlen"]
            path.write_text("\n".join([lines[0], json.dumps(rec)] + lines[2:]) + "\n")
            return options, f"1/{path.name}: line 2: no 'seqlen'"
        if framework == "verl":
            lines = (src / "2.jsonl").read_text().splitlines()
            rec = json.loads(lines[2])
            del rec["output"]
            (src / "2.jsonl").write_text("\n".join(lines[:2] + [json.dumps(rec)] + lines[3:]) + "\n")
            return options, "2.jsonl: line 3: no 'output'"
        path = src / "completions" / "completions_00020.parquet"
        table = pd.read_parquet(path)
        table["completion"] = table["completion"].astype(object)
        table.loc[5, "completion"] = None
        table.to_parquet(path)
        return options, "completions_00020.parquet: record 5: 'completion' is not text"
    if problem == "pickle needing code":
        data = torch.load(src / "rollout_data" / "1.pt", weights_only=True)
        data["samples"][0]["metadata"]["when"] = pd.Timestamp("2026-01-01")  # unpickling it runs pandas code
        torch.save(data, src / "rollout_data" / "1.pt")
        return options, "1.pt: needs arbitrary unpickling"
    missing = str(tmp_path / "no-such-tokenizer")
    options = list(options)
    options[options.index("--tokenizer") + 1] = missing
    return options, f"{missing}: tokenizer folder does not exist"


BAD = [(fw, p) for fw in FRAMEWORKS for p in ("missing step", "no length")] + [("slime", "pickle needing code")] + \
    [(fw, "tokenizer missing") for fw in ("verl", "trl")]


@pytest.mark.parametrize("framework, problem", BAD)
def test_a_bad_dump_fails_with_one_line_naming_file_and_record(framework, problem, tmp_path, tokenizer_dir, capsys):
    src, options = dump(framework, tmp_path, run_for(framework), tokenizer_dir)
    options, needle = _break(framework, problem, src, options, tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(SystemExit) as e:
        main(["import", framework, str(src), "-o", str(out_dir / "trace.parquet"), *options])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lssim: error: ")
    assert needle in err
    assert list(out_dir.iterdir()) == []


def test_a_pickle_needing_code_loads_when_trusted(tmp_path):
    src = write_slime(tmp_path / "d", make_run())
    data = torch.load(src / "rollout_data" / "1.pt", weights_only=True)
    data["samples"][0]["metadata"]["when"] = pd.Timestamp("2026-01-01")
    torch.save(data, src / "rollout_data" / "1.pt")
    with pytest.raises(DumpError, match="--trust-pickle"):
        read_slime(src)
    assert len(read_slime(src, trust_pickle=True).frame) == sum(len(g.lengths) for s in make_run() for g in s)


def test_allow_gaps_accepts_a_run_that_skipped_steps(tmp_path):
    src = write_slime(tmp_path / "d", make_run())
    (src / "rollout_data" / "2.pt").unlink()
    assert sorted(read_slime(src, allow_gaps=True).frame["step"].unique()) == [0, 1, 3]


def test_a_response_longer_than_the_cap_names_its_record(tmp_path):
    src = write_slime(tmp_path / "d", make_run())
    with pytest.raises(DumpError, match=r"0\.pt: record \d+: response length \d+ > the cap 10"):
        read_slime(src, max_tokens=10)


def test_trl_reads_the_wandb_table_of_older_versions(tmp_path, tokenizer_dir):
    """Before parquet logging, TRL logged a wandb table `completions` with the step as text and one reward column."""
    run = make_run(sizes=(4,))
    d = tmp_path / "media" / "table"
    d.mkdir(parents=True)
    for s, groups in enumerate(run):
        data = [[str(10 * (s + 1)), g.prompt, decoded(response_ids(n, e), skip_special_tokens=True), r]
                for g in groups for n, r, e in zip(g.lengths, g.rewards, g.eos)]
        (d / f"completions_{3 * s + 7}_0123abcd.table.json").write_text(
            json.dumps({"_type": "table", "columns": ["step", "prompt", "completion", "reward"], "data": data}))
    result = imported("trl", d, ["--tokenizer", str(tokenizer_dir), "--max-tokens", str(CAP)])
    assert observed(result.frame) == {10 * (s + 1): v for s, v in expected(run).items()}


def test_verl_prompt_key_keeps_the_ids_as_written(tmp_path, tokenizer_dir):
    src = write_verl(tmp_path / "d", make_run())
    for path in src.iterdir():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("\n".join(json.dumps({**r, "index": f"gsm8k-{PROMPTS.index(r['input'])}"}) for r in rows) + "\n")
    options = ["--tokenizer", str(tokenizer_dir), "--max-tokens", str(CAP), "--prompt-key", "index"]
    frame = imported("verl", src, options).frame
    assert set(frame["prompt_id"]) <= {f"gsm8k-{k}" for k in range(len(PROMPTS))}
    assert frame.groupby("prompt_id")["prompt_len"].nunique().eq(1).all()
    if SCHEMA["reward"].max is None:  # text prompt ids: the trace schema of real traces (issue 13's `trace` branch)
        from lssim.traces.trace import load_trace

        assert main(["import", "verl", str(src), "-o", str(tmp_path / "t.parquet"), *options]) == 0
        assert set(load_trace(tmp_path / "t.parquet")["prompt_id"]) == set(frame["prompt_id"])
