"""AReaL: the trajectories dumped by ``InferenceEngineConfig.dump_to_file``.

Read against inclusionAI/AReaL at commit 4aef98d (2026-05-21, version 1.0.4):
``areal/infra/workflow_executor.py::WorkflowExecutor._dump_trajectory`` appends, for each finished
rollout task, accepted or rejected alike (it runs before ``should_accept_fn`` is acted on), to
``{fileroot}/logs/{user}/{experiment}/{trial}/rollout/{tail_version}/{task_id}.jsonl``
(``eval-rollout/`` for evaluation, not read here) one JSON object per sample of the task's batch:
``task_id``, ``sample_idx``, ``seqlen`` (prompt + response tokens, from the attention mask),
``prompt_len`` (tokens before the first loss-masked token), ``head_version`` / ``tail_version``
(min / max of the per-token weight versions of the whole task: every sample and the prompt tokens,
which carry -1 in ``areal/workflow/rlvr.py``), ``reward``, ``prompt`` and ``completion`` (decoded
with ``skip_special_tokens=False``: a response that stopped ends in its EOS token's text). A task
is one prompt's group (``GroupedRolloutWorkflow`` runs ``group_size`` episodes and concatenates
them). Samples with an empty completion are not dumped.

What the folders are not: a version folder is the weight version the task's last token was
generated with, not the training step that consumed it. ``TaskIdGenerator`` numbers tasks in
submission order and ``wait_results`` hands out the oldest finished ones first, so a step is the
next ``--batch-size`` (``train_dataset.batch_size``) accepted tasks in task-id order; tasks the
run submitted ahead and never consumed (finished after the last update) are left out. The dump
does not say which tasks ``should_accept_fn`` rejected: name them with ``--rejected`` (imported
untrained, not counted in a step's batch). A task that finished at a weight version later than
the step this order gives it proves the order wrong (a rejection not named, or a task consumed
out of order): refused, naming its file. Per-response weight versions are not in the dump (only
the task's extremes), so the trace leaves them to its default.

Measured: groups (tasks), prompt and response lengths in tokens (the EOS included), rewards.
The dump has no token ids and no log-probs: with ``--tokenizer`` the early-exit signals are measured
from the retokenized completion (repetition only: the entropy is NaN), its ids fitted to the dump's
length where retokenizing the decoded text gives a few more or fewer (cut, or padded with a token
no text has, at the end; the import's notes count them); without it, none are measured.
Inferred: steps (task-id order, ``--batch-size`` per step), finish reasons (a response reaching
``--max-tokens``, AReaL's ``gconfig.max_new_tokens``, is ``length`` unless its completion ends in an
EOS text: ``--eos-token``, or ``--tokenizer``'s), prompt ids (a hash of the prompt text).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from lssim.traces.importers.common import (EOS_SKIPPED, DumpError, Imported, Response, as_reward, build_trace, check_no_gaps, eos_texts,
                                           json_lines, load_tokenizer, prompt_hash, signal_stride, signals_said)
from lssim.traces.signal_trace import DEFAULT_STRIDE

NAME = "areal"
HELP = "AReaL dump_to_file trajectories (rollout/{version}/{task_id}.jsonl)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, required=True, help="the run's gconfig.max_new_tokens (the response-token cap)")
    p.add_argument("--batch-size", type=int, required=True, metavar="N",
                   help="the run's train_dataset.batch_size: accepted tasks (groups) each training step consumed")
    p.add_argument("--eos-token", action="append", metavar="TEXT",
                   help="text of an EOS token (repeatable); needed, or --tokenizer, where a response reaches the cap")
    p.add_argument("--tokenizer", metavar="DIR", help="the run's tokenizer folder, read for its EOS tokens' texts and to "
                   "retokenize the completions for the early-exit signals (none measured without it)")
    p.add_argument("--rejected", type=int, nargs="+", default=[], metavar="TASK_ID",
                   help="task ids the run's should_accept_fn rejected (the dump does not say)")


def run(args: argparse.Namespace) -> Imported:
    return read_areal(args.source, max_tokens=args.max_tokens, batch_size=args.batch_size, eos_tokens=args.eos_token,
                      tokenizer=args.tokenizer, rejected=args.rejected, allow_gaps=args.allow_gaps, stride=signal_stride(args))


def read_areal(source: str | Path, *, max_tokens: int, batch_size: int, eos_tokens: list[str] | None = None,
               tokenizer: str | Path | None = None, rejected: list[int] | tuple[int, ...] = (), allow_gaps: bool = False,
               stride: int | None = DEFAULT_STRIDE) -> Imported:
    """The trace of an AReaL dump; ``stride``: tokens between the early-exit signals measured from the completions
    retokenized with ``tokenizer`` (None, or no tokenizer: not measured)."""
    if batch_size < 1:
        raise DumpError(f"--batch-size must be >= 1, got {batch_size}")
    eos = set(eos_tokens or []) | (eos_texts(tokenizer) if tokenizer is not None else set())
    encode = load_tokenizer(tokenizer) if tokenizer is not None and stride is not None else None
    root = _rollout_folder(Path(source))
    folders = {int(d.name): d for d in root.iterdir() if d.is_dir() and re.fullmatch(r"\d+", d.name)}
    check_no_gaps(folders, root, "version folder", allow_gaps)  # a lost folder loses tasks, and shifts every step after them
    tasks: dict[int, tuple[int, list[Response]]] = {}  # task id -> (the version it finished under, its responses)
    fitted: list[str] = []  # records whose retokenized completion was fitted to the dump's length
    for version, folder in sorted(folders.items()):
        for path in sorted(folder.glob("*.jsonl")):
            task_id, responses = _task(path, version, max_tokens, eos, encode, fitted)
            if task_id in tasks:
                raise DumpError(f"{path}: task {task_id} also in {tasks[task_id][1][0].source_file}")
            tasks[task_id] = (version, responses)
    unknown = sorted(set(rejected) - set(tasks))
    if unknown:
        raise DumpError(f"{root}: --rejected task {unknown[0]} is not in the dump")
    responses, left_out = _steps(tasks, batch_size, set(rejected))
    frame = build_trace(responses, max_tokens, stride if encode is not None else None)
    inferred = [f"steps (task-id order, {batch_size} accepted tasks each)",
                "finish reasons (from --max-tokens and the completion's EOS)", "prompt ids (hash of the prompt text)"]
    notes = [f"{len(rejected)} task(s) marked rejected by --rejected: imported untrained" if rejected else
             "the dump does not say which tasks the run rejected: all imported as trained (name them with --rejected)",
             "weight versions: the dump records each task's extremes only, so the trace leaves them to its default"]
    notes += _signal_notes(stride, encode is not None, fitted, inferred)
    if left_out:
        notes.append(f"{len(left_out)} task(s) after the last full step of {batch_size} (ids {left_out[0]}..{left_out[-1]}) "
                     "were submitted ahead and never trained: left out")
    return Imported(frame, NAME, ["groups (tasks)", "prompt and response lengths", "rewards"], inferred, notes)


def _signal_notes(stride: int | None, retokenized: bool, fitted: list[str], inferred: list[str]) -> list[str]:
    """What the import says of the early-exit signals (adding to ``inferred`` where it measured them)."""
    if stride is None:
        return [signals_said(None, "")]
    if not retokenized:
        return ["early-exit signals not measured: the dump has no token ids; pass --tokenizer DIR to retokenize the completions"]
    inferred.append(signals_said(stride, "the retokenized completions; no log-probs in the dump: entropy NaN"))
    if not fitted:
        return []
    return [f"{len(fitted)} retokenized completion(s) differ in length from the dump's count (first: "
            f"{fitted[0]}): their token ids were cut or padded at the end to fit"]


def _rollout_folder(source: Path) -> Path:
    """SOURCE itself, or its rollout/ folder; pointed higher (AReaL's fileroot), name the rollout folders below it."""
    if not source.is_dir():
        raise DumpError(f"{source}: " + ("not a directory (expected the dump's folder)" if source.exists() else "no such file or directory"))
    for root in (source, source / "rollout"):
        if root.is_dir() and any(d.is_dir() and re.fullmatch(r"\d+", d.name) for d in root.iterdir()):
            return root
    found = sorted(str(p) for p in source.rglob("rollout") if p.is_dir())
    where = f"; give the trial's folder or its rollout folder: {', '.join(found[:5])}" if found else \
        " (expected {fileroot}/logs/{user}/{experiment}/{trial}/rollout/{tail_version}/{task_id}.jsonl)"
    raise DumpError(f"{source}: no version folders (rollout/{{tail_version}}/{{task_id}}.jsonl) here{where}")


def _steps(tasks: dict[int, tuple[int, list[Response]]], batch_size: int, rejected: set[int]) -> tuple[list[Response], list[int]]:
    """Number the steps in task-id order, ``batch_size`` accepted tasks each; return the responses and the ids left out."""
    out: list[Response] = []
    step, accepted, pending = 0, 0, []
    for task_id in sorted(tasks):
        pending.append(task_id)
        accepted += task_id not in rejected
        if accepted < batch_size:
            continue
        for tid in pending:
            version, responses = tasks[tid]
            if version > step:  # step k trains on tasks finished under weights 0..k
                raise DumpError(f"{responses[0].source_file}: task {tid} finished at weight version {version}, "
                                f"but the order of task ids puts it in step {step}: the run rejected a task not named by "
                                "--rejected, or consumed tasks out of order, and the dump cannot tell which")
            for r in responses:
                r.step, r.trained = step, tid not in rejected
                out.append(r)
        step, accepted, pending = step + 1, 0, []
    if not out:
        raise DumpError(f"{len(tasks)} task(s) in the dump, fewer than one step of --batch-size {batch_size} accepted tasks")
    return out, pending


def _task(path: Path, version: int, max_tokens: int, eos: set[str], encode, fitted: list[str]) -> tuple[int, list[Response]]:
    """One task file's responses; with ``encode``, their token ids from the retokenized completions (``fitted`` gets
    the records whose ids had to be cut or padded to the dump's length)."""
    rel = str(path)  # as reached from SOURCE, so an error names a file the user can open
    out: list[Response] = []
    texts: list = []  # the completions, for the early-exit signals
    seen: set[int] = set()
    task_id = None
    for line_no, rec in json_lines(path, rel):
        where = f"{rel}: line {line_no}"
        for key in ("task_id", "seqlen", "prompt_len", "tail_version", "sample_idx"):
            if not isinstance(rec.get(key), int):
                raise DumpError(f"{where}: no {key!r}" + (" (no length)" if "len" in key else ""))
        if rec["tail_version"] != version:
            raise DumpError(f"{where}: tail_version {rec['tail_version']}, but it is in folder {version}")
        if task_id is not None and rec["task_id"] != task_id:
            raise DumpError(f"{where}: task_id {rec['task_id']} in the file of task {task_id}")
        task_id = rec["task_id"]
        if rec["sample_idx"] in seen:
            raise DumpError(f"{where}: sample_idx {rec['sample_idx']} twice in one task (a restarted run "
                            "appending to the same folder?)")
        seen.add(rec["sample_idx"])
        response_len = rec["seqlen"] - rec["prompt_len"]
        if rec["prompt_len"] < 1 or response_len < 1:
            raise DumpError(f"{where}: seqlen {rec['seqlen']} and prompt_len {rec['prompt_len']} leave no prompt or response")
        out.append(Response(
            step=version, prompt_id=prompt_hash(rec.get("prompt", "")), group_key=("task", task_id),
            order=rec["sample_idx"], prompt_len=rec["prompt_len"], response_len=response_len,
            reward=as_reward(rec.get("reward"), where), source_file=rel, source_record=line_no,
            finish_reason=_finish(rec, response_len, max_tokens, eos, where), finish_source="inferred"))
        texts.append(rec.get("completion"))
    if task_id is None:
        raise DumpError(f"{rel}: no records")
    if encode is not None:
        _retokenize(out, texts, encode, fitted)
    return task_id, out


def _retokenize(responses: list[Response], texts: list, encode, fitted: list[str]) -> None:
    """Each response's token ids: its completion retokenized, cut or padded at the end to the dump's length."""
    missing = [r for r, t in zip(responses, texts) if not isinstance(t, str)]
    if missing:
        raise DumpError(f"{missing[0].source_file}: line {missing[0].source_record}: no 'completion' text to measure the "
                        "early-exit signals from; pass --no-signals")
    for r, ids in zip(responses, encode(texts)):
        if len(ids) != r.response_len:
            fitted.append(f"{r.source_file}: line {r.source_record}, {len(ids)} tokens for {r.response_len}")
        r.tokens = ids[:r.response_len] + [EOS_SKIPPED] * (r.response_len - len(ids))


def _finish(rec: dict, response_len: int, max_tokens: int, eos: set[str], where: str) -> str:
    """``stop`` below the cap; at it, ``stop`` where the completion ends in an EOS text (the last allowed token), else ``length``."""
    if response_len > max_tokens:
        raise DumpError(f"{where}: response length {response_len} > the cap {max_tokens}; is --max-tokens the run's cap?")
    if response_len < max_tokens:
        return "stop"
    completion = rec.get("completion")
    if not isinstance(completion, str):
        raise DumpError(f"{where}: no 'completion' text to tell whether the response at the cap ended in its EOS")
    if not eos:
        raise DumpError(f"{where}: the response reaches --max-tokens {max_tokens}; whether its last token was the EOS "
                        f"(completion ends {completion[-24:]!r}) needs --eos-token TEXT or --tokenizer DIR")
    return "stop" if any(completion.endswith(t) for t in eos) else "length"
