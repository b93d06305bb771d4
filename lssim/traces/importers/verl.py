"""verl: the generations dumped by ``trainer.rollout_data_dir``.

Read against volcengine/verl at commit b178a3c (2026-01-29, version 0.8.0.dev) and the 0.9 line's
TransferQueue trainer (``verl/experimental/transfer_queue/ray_trainer.py``), whose
``_log_rollout_data`` adds ``batch.non_tensor_batch["uid"]`` to the dumped fields:
``verl/trainer/ppo/ray_trainer.py::RayPPOTrainer._dump_generations`` (called by
``_log_rollout_data`` after the update of each step; the fully-async, one-step-off and
TransferQueue trainers call the same writer) writes ``{rollout_data_dir}/{global_steps}.jsonl``,
one JSON object a line with

- ``input``: the prompt, ``tokenizer.batch_decode(prompts, skip_special_tokens=True)``;
- ``output``: the response, decoded the same way;
- ``gts``: the ground truth, ``score``: ``token_level_scores.sum(-1)``, ``step``: ``global_steps``
  (from 1);
- every ``reward_extra_infos_dict`` entry with one value per sample (``acc``, ``pred``, ...), and
  ``uid`` (0.9: the uuid ``fit`` gave each prompt before repeating it ``rollout.n`` times, so one
  group's responses share it).

The rows are the step's trained batch (after any group filtering), in the batch's order after
sequence balancing. A group is the step's responses sharing a ``uid``; in dumps without one, the
step's responses sharing a prompt. No token counts are written: lengths are counted again from the
decoded text with ``--tokenizer`` (the run's tokenizer folder). The decode skipped special tokens
(chat template markers in the prompt, so prompt lengths are a few tokens short; the EOS at the end
of the response): a response below ``--max-tokens`` (``actor_rollout_ref.rollout.response_length``)
stopped at an EOS, which verl generated and counted in its ``response_mask``, so its length is the
count plus one; a response whose count reaches the cap is ``length`` there; a count above the cap
is refused (the cap given is not the run's).

Measured: steps, rewards (``score``, or ``--reward-key``), groups (``uid``, or the prompt).
Inferred: prompt and response lengths (retokenized, the EOS counted), finish reasons (from the
cap), prompt ids (a hash of the prompt text, unless ``--prompt-key`` names a field), the early-exit
signals (from the retokenized response, the skipped EOS as one more token; no log-probs in the dump, so
repetition only: the entropy is NaN).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lssim.traces.importers.common import (EOS_SKIPPED, DumpError, Imported, Response, as_reward, build_trace, check_no_gaps, descend,
                                           eos_counted, json_lines, load_tokenizer, prompt_hash, signal_stride, signals_said,
                                           step_files)
from lssim.traces.signal_trace import DEFAULT_STRIDE

NAME = "verl"
HELP = "verl trainer.rollout_data_dir files ({global_steps}.jsonl), retokenized"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="the run's Hugging Face tokenizer folder (read offline)")
    p.add_argument("--max-tokens", type=int, required=True, help="the run's rollout.response_length (the response-token cap)")
    p.add_argument("--prompt-key", metavar="FIELD", help="field to use as prompt id (default: a hash of the prompt text)")
    p.add_argument("--reward-key", default="score", metavar="FIELD", help="field holding the reward (default: score)")


def run(args: argparse.Namespace) -> Imported:
    return read_verl(args.source, tokenizer=args.tokenizer, max_tokens=args.max_tokens, prompt_key=args.prompt_key,
                     reward_key=args.reward_key, allow_gaps=args.allow_gaps, stride=signal_stride(args))


def read_verl(source: str | Path, *, tokenizer: str | Path, max_tokens: int, prompt_key: str | None = None,
              reward_key: str = "score", allow_gaps: bool = False, stride: int | None = DEFAULT_STRIDE) -> Imported:
    """The trace of a verl dump; ``stride``: tokens between the measured early-exit signals (None: not measured)."""
    encode = load_tokenizer(tokenizer)  # first: a missing tokenizer is reported before the dump is read
    root = descend(Path(source), "rollout_data")
    files = step_files(root, r"(\d+)(?:[._-].*)?\.jsonl", "step files ({global_steps}.jsonl)")
    check_no_gaps(files, root, "step file", allow_gaps)
    records = [rec for step, paths in files.items() for path in paths for rec in _records(path, step)]
    for rel, line, rec in records:
        for key in ("input", "output"):
            if not isinstance(rec.get(key), str):
                raise DumpError(f"{rel}: line {line}: no {key!r} text (the {'prompt' if key == 'input' else 'response'})")
    prompts = sorted({rec["input"] for _, _, rec in records})
    prompt_len = dict(zip(prompts, map(len, encode(prompts))))
    outputs = encode([rec["output"] for _, _, rec in records])
    by_uid = _check_uids(records)
    responses = []
    for i, ((rel, line, rec), ids) in enumerate(zip(records, outputs)):
        where = f"{rel}: line {line}"
        pid = _prompt_id(rec, where, prompt_key)
        response_len, finish = eos_counted(len(ids), max_tokens, f"{where}: 'output'")
        responses.append(Response(
            step=rec["_step"], prompt_id=pid, group_key=("uid", str(rec["uid"])) if by_uid else pid, order=i,
            prompt_len=prompt_len[rec["input"]], response_len=response_len,
            reward=as_reward(_field(rec, reward_key, where), where), source_file=rel, source_record=line,
            length_source="retokenized", finish_reason=finish, finish_source="inferred",
            tokens=ids + [EOS_SKIPPED] * (response_len - len(ids))))
    frame = build_trace(responses, max_tokens, stride)
    inferred = ["prompt and response lengths (retokenized, the EOS of a stopped response counted)",
                "finish reasons (from --max-tokens)"]
    inferred += [] if prompt_key else ["prompt ids (hash of the prompt text)"]
    notes = [f"tokenizer {tokenizer}: prompt lengths leave out the special tokens verl's decode skipped"]
    if stride is None:
        notes.append(signals_said(None, ""))
    else:
        inferred.append(signals_said(stride, "the retokenized text; no log-probs in the dump: entropy NaN"))
    groups = "groups (uid)" if by_uid else "groups (samples sharing a prompt)"
    return Imported(frame, NAME, ["steps", groups, f"rewards ({reward_key})"], inferred, notes)


def _records(path: Path, step: int) -> list[tuple[str, int, dict]]:
    rel = str(path)  # as reached from SOURCE, so an error names a file the user can open
    out = []
    for line_no, rec in json_lines(path, rel):
        if rec.get("step") is not None and int(rec["step"]) != step:
            raise DumpError(f"{rel}: line {line_no}: step {rec['step']}, but the file name says {step}")
        rec["_step"] = step
        out.append((rel, line_no, rec))
    if not out:
        raise DumpError(f"{rel}: no records")
    return out


def _check_uids(records: list[tuple[str, int, dict]]) -> bool:
    """Whether the dump groups by ``uid``: every record has one, and one uid is one prompt (else refused)."""
    missing = [(rel, line) for rel, line, rec in records if "uid" not in rec]
    if len(missing) == len(records):
        return False
    if missing:
        raise DumpError(f"{missing[0][0]}: line {missing[0][1]}: no 'uid', but other records have one")
    prompt_of: dict[str, str] = {}
    for rel, line, rec in records:
        uid = str(rec["uid"])
        if prompt_of.setdefault(uid, rec["input"]) != rec["input"]:
            raise DumpError(f"{rel}: line {line}: 'uid' {uid} is shared by two prompts, so it does not name a group")
    return True


def _field(rec: dict, key: str, where: str):
    if key not in rec:
        raise DumpError(f"{where}: no field {key!r} (fields: {', '.join(k for k in rec if k != '_step')})")
    return rec[key]


def _prompt_id(rec: dict, where: str, prompt_key: str | None) -> int | str:
    if prompt_key is None:
        return prompt_hash(rec["input"])
    value = _field(rec, prompt_key, where)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else str(value)
