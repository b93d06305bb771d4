"""Dumps for tests/test_importers.py: the ground truth of a run, and that run written as slime, verl, AReaL and TRL
write it (see each importer's docstring for the writer it follows)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from tokenizers import Tokenizer

from lssim.traces.importers import FRAMEWORKS
from lssim.traces.importers.common import prompt_hash
from lssim.traces.signal_trace import DEFAULT_STRIDE
from lssim.traces.trace import SCHEMA

torch = pytest.importorskip("torch")

CAP = 24
REFERENCE_TOKENIZER = Path(__file__).resolve().parents[1] / "real_backend" / "reference_model"
REFERENCE = Tokenizer.from_file(str(REFERENCE_TOKENIZER / "tokenizer.json"))
EOS_ID, PAD_ID, EOS_TEXT = 2, 0, "<eos>"
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
    """The framework's own token counts: a response that stopped counts its EOS."""
    rewards: list[float]
    eos: list[bool] | None = None
    """Whether each response ended in the EOS (default: those below the cap)."""

    def __post_init__(self):
        if self.eos is None:
            self.eos = [n < CAP for n in self.lengths]

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
    steps[0][0].lengths[2], steps[0][0].eos[1:3] = CAP, [False, True]  # and one EOS as the last allowed token: a stop
    return steps


def expected(run: list[list[Group]], first_step: int = 0) -> dict[int, list[tuple]]:
    """Per step, the sorted (prompt_id, prompt_len, response_len, reward, finish_reason) of every response."""
    out = {}
    for s, groups in enumerate(run):
        out[first_step + s] = sorted((prompt_hash(g.prompt), g.prompt_len, n, r, "stop" if e else "length")
                                     for g in groups for n, r, e in zip(g.lengths, g.rewards, g.eos))
    return out


def observed(frame: pd.DataFrame) -> dict[int, list[tuple]]:
    cols = ["prompt_id", "prompt_len", "response_len", "reward", "finish_reason"]
    return {int(s): sorted(tuple(x.item() if hasattr(x, "item") else x for x in row) for row in part[cols].to_numpy(object))
            for s, part in frame.groupby("step")}


def words(n: int) -> str:
    return " ".join(["t", "h"] * (n // 2) + ["t"] * (n % 2))


def response_ids(n: int, eos: bool, pad_to: int = 0) -> list[int]:
    """A response of n tokens of the reference vocabulary ('t' 14, 'h' 15), its last the EOS (2) where it stopped,
    right-padded (0) to pad_to as verl's batch["responses"] is."""
    ids = [14 + k % 2 for k in range(n - eos)] + [EOS_ID] * eos
    return ids + [PAD_ID] * (pad_to - len(ids))


def decoded(ids: list[int], skip_special_tokens: bool) -> str:
    """What the frameworks' writers call: tokenizer.decode of the generated ids."""
    return REFERENCE.decode(ids, skip_special_tokens=skip_special_tokens)


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
            for n, r, e in zip(group.lengths, group.rewards, group.eos):
                files[g % 2 if step == split_step else 0].append({
                    "group_index": group_index, "index": index, "rollout_id": None, "prompt": group.prompt,
                    "tokens": list(range(group.prompt_len + n)), "response": words(n), "response_length": n,
                    "label": "7", "reward": r, "loss_mask": None, "status": "completed" if e else "truncated",
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


def write_verl(root: Path, run, split_step: int = 2, uid: bool = True) -> Path:
    """trainer.rollout_data_dir=root, as RayPPOTrainer._log_rollout_data / _dump_generations write it
    (volcengine/verl verl/trainer/ppo/ray_trainer.py; with uid, the 0.9 TransferQueue trainer,
    verl/experimental/transfer_queue/ray_trainer.py): {global_steps}.jsonl from step 1, one JSON line per
    response with input, output (batch_decode of the padded response ids, skip_special_tokens=True: no EOS),
    gts, score, step, the reward extras and uid (one uuid per prompt of the batch, shared by its n responses);
    rows in balanced (shuffled) order."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for s, groups in enumerate(run):
        step = s + 1
        rows = [{"input": g.prompt, "output": decoded(response_ids(n, e, pad_to=CAP), skip_special_tokens=True), "gts": "7",
                 "score": r, "step": step, "acc": r > 0, **({"uid": f"uid-{step}-{k}"} if uid else {})}
                for k, g in enumerate(groups) for n, r, e in zip(g.lengths, g.rewards, g.eos)]
        rows = [rows[i] for i in rng.permutation(len(rows))]
        parts = [rows[: len(rows) // 2], rows[len(rows) // 2:]] if step == split_step else [rows]
        for k, part in enumerate(parts):
            name = f"{step}.jsonl" if k == 0 else f"{step}_rank{k}.jsonl"
            (root / name).write_text("\n".join(json.dumps(row, ensure_ascii=False) for row in part) + "\n")
    return root


def write_areal(root: Path, run, late: tuple[int, int] = (2, 1), ahead: int = 2, rejected: tuple[int, int] | None = None) -> Path:
    """dump_to_file, as WorkflowExecutor._dump_trajectory writes it (inclusionAI/AReaL
    areal/infra/workflow_executor.py): root/rollout/{tail_version}/{task_id}.jsonl, one line per sample with
    task_id, sample_idx, seqlen, prompt_len, head_version (-1: the prompt tokens' version), tail_version,
    reward, prompt and completion (decode with skip_special_tokens=False: a stopped response ends in "<eos>").

    Each step of `run` is one submit/wait round consuming its groups as tasks numbered in submission order;
    the weights are version k while round k generates, except the `late` (step, group) task, submitted ahead
    and finished under version k - 1; `ahead` tasks submitted after the last round finish under the final
    version and are never trained; a `rejected` (step, group) task is dumped all the same, plus one more task
    that the round waited for in its place."""
    task_id = 0

    def task(group: Group, version: int) -> None:
        nonlocal task_id
        folder = root / "rollout" / str(version)
        folder.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"task_id": task_id, "sample_idx": i, "seqlen": group.prompt_len + n, "prompt_len": group.prompt_len,
                             "head_version": -1, "tail_version": version, "reward": r, "prompt": group.prompt,
                             "completion": decoded(response_ids(n, e), skip_special_tokens=False)})
                 for i, (n, r, e) in enumerate(zip(group.lengths, group.rewards, group.eos))]
        with open(folder / f"{task_id}.jsonl", "a") as f:
            f.write("\n".join(lines) + "\n")
        task_id += 1

    for version, groups in enumerate(run):
        for g, group in enumerate(groups):
            task(group, version - 1 if (version, g) == late else version)
            if (version, g) == rejected:
                task(group, version)
    for k in range(ahead):
        task(run[-1][k % len(run[-1])], len(run))
    return root


def write_trl(root: Path, run, logging_steps: int = 10) -> Path:
    """log_completions=True, as GRPOTrainer.log writes it (huggingface/trl trl/trainer/grpo_trainer.py):
    root/completions/completions_{global_step:05d}.parquet with step, prompt, completion (batch_decode,
    skip_special_tokens=True: no EOS), one float column per reward function (rewards_per_func[:, i].tolist()),
    the reward functions' log_extra columns (here an int one) and advantage; one generation batch each, the
    last one logged twice (two logging steps inside one generation batch)."""
    d = root / "completions"
    d.mkdir(parents=True)
    tables = []
    for s, groups in enumerate(run):
        rows = [{"prompt": g.prompt, "completion": decoded(response_ids(n, e), skip_special_tokens=True),
                 "accuracy_reward": r - 1.0, "format_reward": 1.0, "answer_digits": 3, "advantage": 0.0}
                for g in groups for n, r, e in zip(g.lengths, g.rewards, g.eos)]
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


AREAL_BATCH = 4


def run_for(framework: str) -> list[list[Group]]:
    """TRL's tables are cut into groups by --num-generations (one size); AReaL's steps by --batch-size (one count)."""
    if framework == "trl":
        return make_run(sizes=(4,))
    if framework == "areal":
        return make_run(groups_per_step=(AREAL_BATCH,) * 4)
    return make_run()


def dump(framework: str, tmp_path: Path, run, tokenizer_dir: Path) -> tuple[Path, list[str]]:
    """Write `run` as `framework` dumps it; return the folder and the import's options."""
    src = tmp_path / f"{framework}-dump"
    if framework == "slime":
        return write_slime(src, run), []
    if framework == "verl":
        return write_verl(src, run), ["--tokenizer", str(tokenizer_dir), "--max-tokens", str(CAP)]
    if framework == "areal":
        return write_areal(src, run), ["--max-tokens", str(CAP), "--batch-size", str(AREAL_BATCH), "--tokenizer", str(tokenizer_dir)]
    return write_trl(src, run), ["--tokenizer", str(tokenizer_dir), "--max-tokens", str(CAP), "--num-generations", "4"]


def imported(framework: str, src: Path, options: list[str]):
    parser_args = {"slime": dict(max_tokens=None, prompt_key=None, reward_key=None, trust_pickle=False),
                   "verl": dict(tokenizer=None, max_tokens=None, prompt_key=None, reward_key="score"),
                   "areal": dict(max_tokens=None, batch_size=None, eos_token=None, tokenizer=None, rejected=[]),
                   "trl": dict(tokenizer=None, max_tokens=None, num_generations=None, reward_column=None)}[framework]
    parser_args.update(no_signals=False, signal_stride=DEFAULT_STRIDE)
    for flag, value in zip(options[::2], options[1::2]):
        key = flag.lstrip("-").replace("-", "_")
        parser_args[key] = int(value) if key in ("max_tokens", "num_generations", "batch_size", "signal_stride") else value
    return FRAMEWORKS[framework].run(SimpleNamespace(source=str(src), allow_gaps=False, **parser_args))

