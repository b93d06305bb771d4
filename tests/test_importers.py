"""`lssim import`: dumps written here in each framework's own format (see each importer's docstring for
the writer it follows) import with one command, match what was dumped, and replay exactly; bad dumps
fail with one line naming the file and the record, exit 2, and leave no file behind."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lssim.cli import main
from lssim.traces.importers import FRAMEWORKS, DumpError
from lssim.traces.importers.common import prompt_hash
from lssim.traces.importers.slime import read_slime
from lssim.traces.trace import SCHEMA

torch = pytest.importorskip("torch")

CAP = 24
REFERENCE_TOKENIZER = Path(__file__).resolve().parents[1] / "real_backend" / "reference_model"
PROMPTS = [f"question {k} : what is {k} + {k + 3} ? answer with one number" for k in range(7)]
needs_real_traces = pytest.mark.skipif(
    SCHEMA["reward"].max is not None,
    reason="rewards of +5/-5 need the trace schema of real traces (the `trace` branch of issue 13)")


# --------------------------------------------------------------------------
# What the run did: the ground truth every dump is written from
# --------------------------------------------------------------------------


@dataclass
class Group:
    prompt: str
    lengths: list[int]
    rewards: list[float]

    @property
    def prompt_len(self) -> int:
        return len(self.prompt.split())  # one word, one token, with the word-level reference tokenizer


def make_run(seed: int = 0, groups_per_step=(3, 5, 2, 4), sizes=(4, 4, 3, 4)) -> list[list[Group]]:
    """Steps of variable size, long-tailed lengths with truncations at the cap, rewards of +5/-5, one prompt
    seen in several steps, and one prompt sampled as two groups in one step."""
    rng = np.random.default_rng(seed)
    steps = []
    for s, n in enumerate(groups_per_step):
        groups = []
        for g in range(n):
            size = sizes[(s + g) % len(sizes)]
            lengths = np.minimum(CAP, np.ceil(rng.lognormal(2.0, 0.8, size))).astype(int).tolist()
            prompt = PROMPTS[(s + g) % len(PROMPTS)] if not (s == 1 and g == 4) else groups[3].prompt
            groups.append(Group(prompt, lengths, [5.0 if rng.random() < 0.5 else -5.0 for _ in range(size)]))
        steps.append(groups)
    steps[0][0].lengths[1] = CAP  # at least one truncation
    return steps


def expected(run: list[list[Group]], first_step: int = 0) -> dict[int, list[tuple]]:
    """Per step, the sorted (prompt_id, prompt_len, response_len, reward, finish_reason) of every response."""
    out = {}
    for s, groups in enumerate(run):
        out[first_step + s] = sorted((prompt_hash(g.prompt), g.prompt_len, n, r, "length" if n == CAP else "stop")
                                     for g in groups for n, r in zip(g.lengths, g.rewards))
    return out


def observed(frame: pd.DataFrame) -> dict[int, list[tuple]]:
    cols = ["prompt_id", "prompt_len", "response_len", "reward", "finish_reason"]
    return {int(s): sorted(tuple(x.item() if hasattr(x, "item") else x for x in row) for row in part[cols].to_numpy(object))
            for s, part in frame.groupby("step")}


def words(n: int) -> str:
    return " ".join(["t", "h"] * (n // 2) + ["t"] * (n % 2))


# --------------------------------------------------------------------------
# Dumps, each in its framework's own format
# --------------------------------------------------------------------------


def write_slime(root: Path, run, split_step: int | None = 1, drop_group: tuple[int, int] | None = (2, 1)) -> Path:
    """`--dump-details root`: root/rollout_data/{rollout_id}.pt, one step split over two rank files, an eval file."""
    d = root / "rollout_data"
    d.mkdir(parents=True)
    group_index = index = 0
    for step, groups in enumerate(run):
        files: list[list[dict]] = [[], []]
        for g, group in enumerate(groups):
            for n, r in zip(group.lengths, group.rewards):
                files[g % 2 if step == split_step else 0].append({
                    "group_index": group_index, "index": index, "rollout_id": None, "prompt": group.prompt,
                    "tokens": list(range(group.prompt_len + n)), "response": words(n), "response_length": n,
                    "label": "7", "reward": r, "loss_mask": None, "status": "truncated" if n == CAP else "completed",
                    "weight_versions": [str(max(0, step - 1)), str(step)] if g == 0 else [str(step)],
                    "metadata": {"source": "gsm8k"}, "remove_sample": (step, g) == drop_group,
                    "spec_info": {"spec_accept_token_num": 0}, "prefix_cache_info": {"cached_tokens": 0}})
                index += 1
            group_index += 1
        torch.save({"rollout_id": step, "samples": files[0]}, d / f"{step}.pt")
        if files[1]:
            torch.save({"rollout_id": step, "samples": files[1]}, d / f"{step}_rank1.pt")
    torch.save({"rollout_id": 0, "samples": [{"index": 0}]}, d / "eval_0.pt")  # evaluation: not a training step
    return root


def write_verl(root: Path, run, split_step: int = 2) -> Path:
    """trainer.rollout_data_dir=root: {global_steps}.jsonl from step 1, rows in balanced (shuffled) order."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for s, groups in enumerate(run):
        step = s + 1
        rows = [{"input": g.prompt, "output": words(n), "gts": "7", "score": r, "step": step, "acc": r > 0}
                for g in groups for n, r in zip(g.lengths, g.rewards)]
        rows = [rows[i] for i in rng.permutation(len(rows))]
        parts = [rows[: len(rows) // 2], rows[len(rows) // 2:]] if step == split_step else [rows]
        for k, part in enumerate(parts):
            name = f"{step}.jsonl" if k == 0 else f"{step}_rank{k}.jsonl"
            (root / name).write_text("\n".join(json.dumps(row) for row in part) + "\n")
    return root


def write_areal(root: Path, run) -> Path:
    """dump_to_file: root/rollout/{tail_version}/{task_id}.jsonl, tasks of two executors interleaved."""
    task_id = 0
    for version, groups in enumerate(run):
        folder = root / "rollout" / str(version)
        folder.mkdir(parents=True)
        for g in groups:
            lines = [json.dumps({"task_id": task_id, "sample_idx": i, "seqlen": g.prompt_len + n, "prompt_len": g.prompt_len,
                                 "head_version": -1, "tail_version": version, "reward": r, "prompt": g.prompt,
                                 "completion": words(n)}) for i, (n, r) in enumerate(zip(g.lengths, g.rewards))]
            (folder / f"{task_id}.jsonl").write_text("\n".join(lines) + "\n")
            task_id += 2 if task_id % 2 == 0 else 1  # executor 0 takes even ids, executor 1 the odd ones after
    return root


def write_trl(root: Path, run, logging_steps: int = 10) -> Path:
    """log_completions=True: root/completions/completions_{global_step:05d}.parquet, one generation batch each,
    the last one logged twice (two logging steps inside one generation batch)."""
    d = root / "completions"
    d.mkdir(parents=True)
    tables = []
    for s, groups in enumerate(run):
        rows = [{"prompt": g.prompt, "completion": words(n), "accuracy_reward": r - 1.0, "format_reward": 1.0, "advantage": 0.0}
                for g in groups for n, r in zip(g.lengths, g.rewards)]
        tables.append(pd.DataFrame(rows))
    tables.append(tables[-1])
    for s, table in enumerate(tables):
        step = (s + 1) * logging_steps
        table = table.copy()
        table.insert(0, "step", step)
        table.to_parquet(d / f"completions_{step:05d}.parquet")
    return root


@pytest.fixture
def tokenizer_dir(tmp_path) -> Path:
    d = tmp_path / "tokenizer"
    d.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(REFERENCE_TOKENIZER / name, d / name)
    return d


def dump(framework: str, tmp_path: Path, run, tokenizer_dir: Path) -> tuple[Path, list[str]]:
    """Write `run` as `framework` dumps it; return the folder and the import's options."""
    src = tmp_path / f"{framework}-dump"
    if framework == "slime":
        return write_slime(src, run), []
    if framework == "verl":
        return write_verl(src, run), ["--tokenizer", str(tokenizer_dir), "--max-tokens", str(CAP)]
    if framework == "areal":
        return write_areal(src, run), ["--max-tokens", str(CAP)]
    return write_trl(src, run), ["--tokenizer", str(tokenizer_dir), "--max-tokens", str(CAP), "--num-generations", "4"]


def imported(framework: str, src: Path, options: list[str]):
    parser_args = {"slime": dict(max_tokens=None, prompt_key=None, reward_key=None, trust_pickle=False),
                   "verl": dict(tokenizer=None, max_tokens=None, prompt_key=None, reward_key="score"),
                   "areal": dict(max_tokens=None),
                   "trl": dict(tokenizer=None, max_tokens=None, num_generations=None, reward_column=None)}[framework]
    for flag, value in zip(options[::2], options[1::2]):
        key = flag.lstrip("-").replace("-", "_")
        parser_args[key] = int(value) if key in ("max_tokens", "num_generations") else value
    return FRAMEWORKS[framework].run(SimpleNamespace(source=str(src), allow_gaps=False, **parser_args))


# --------------------------------------------------------------------------
# Good dumps: what was dumped is what was imported
# --------------------------------------------------------------------------

@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_import_gives_back_every_response_as_dumped(framework, tmp_path, tokenizer_dir):
    sizes = (4,) if framework == "trl" else (4, 4, 3, 4)
    run = make_run(sizes=sizes)
    src, options = dump(framework, tmp_path, run, tokenizer_dir)
    result = imported(framework, src, options)
    frame = result.frame
    want = expected(run, {"verl": 1}.get(framework, 0))
    if framework == "trl":  # logging steps 10, 20, ...; the reward is the sum of two reward functions: (r - 1) + 1
        want = {10 * (s + 1): v for s, v in want.items()}
    assert observed(frame) == want
    assert (frame.loc[frame["finish_reason"] == "length", "response_len"] == CAP).all()
    assert (frame["max_tokens"] == CAP).all()
    assert set(frame["length_source"]) == {"retokenized" if framework in ("verl", "trl") else "measured"}
    assert set(frame["finish_source"]) == {"measured" if framework == "slime" else "inferred"}
    groups = frame.groupby(["step", "group_id"]).size()
    if framework != "verl":  # verl cannot tell two groups of one prompt in one step apart: they are one group
        assert sorted(groups.tolist()) == sorted(len(g.lengths) for step in run for g in step)
    assert not frame.duplicated(["step", "prompt_id", "sample_idx"]).any()


def test_slime_keeps_weight_versions_and_filtered_groups(tmp_path):
    run = make_run()
    frame = read_slime(write_slime(tmp_path / "d", run)).frame
    carried = frame[(frame["group_id"] == 0) & (frame["step"] > 0)]
    assert (carried["policy_version_first"] == carried["step"] - 1).all() and (carried["policy_version_last"] == carried["step"]).all()
    untrained = frame[~frame["trained"]]
    assert set(zip(untrained["step"], untrained["group_id"])) == {(2, 1)}
    assert len(untrained) == len(run[2][1].lengths)


def test_areal_versions_and_inferred_first_version(tmp_path):
    result = imported("areal", write_areal(tmp_path / "d", make_run()), ["--max-tokens", str(CAP)])
    f = result.frame
    assert (f["policy_version_last"] == f["step"]).all() and (f["policy_version_first"] == f["step"]).all()
    assert any("head_version -1" in n for n in result.notes)


def test_trl_drops_a_batch_logged_twice_and_cuts_runs_of_one_prompt(tmp_path, tokenizer_dir):
    run = make_run(sizes=(4,))
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


# --------------------------------------------------------------------------
# One command, replayed exactly
# --------------------------------------------------------------------------


@needs_real_traces
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_one_command_imports_and_baseline_replays_it_exactly(framework, tmp_path, tokenizer_dir, capsys):
    from lssim.analysis.replay import SimSetup, replay
    from lssim.traces.trace import load_trace

    src, options = dump(framework, tmp_path, make_run(sizes=(4,) if framework == "trl" else (4, 4, 3, 4)), tokenizer_dir)
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
    src, options = dump(framework, tmp_path, make_run(sizes=(4,) if framework == "trl" else (4, 4, 3, 4)), tokenizer_dir)
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
        data = [[str(10 * (s + 1)), g.prompt, words(n), r] for g in groups for n, r in zip(g.lengths, g.rewards)]
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
