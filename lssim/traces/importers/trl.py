"""TRL: the completion tables of ``GRPOTrainer`` with ``log_completions=True``, retokenized.

Read against huggingface/trl at commit f2cd577 (2026-07-24, version 1.10.0.dev0; the 1.16 release
writes the same table), ``trl/trainer/grpo_trainer.py``:

- ``_generate_and_score_completions`` appends each generation batch's prompts (chat-templated
  text), completions (decoded with ``skip_special_tokens=True``), one reward column per reward
  function (``rewards_per_func[:, i].tolist()``: always floats, NaN where a function returned
  None), the columns reward functions logged through ``log_extra`` (any values: an int column
  there is never a reward) and the advantages to ``self._logs``, deques of ``generation_batch_size`` entries, in
  the batch's order: a prompt's ``num_generations`` completions side by side (``RepeatSampler``).
- ``log`` (every ``logging_steps``) writes them, with ``step = state.global_step``, to
  ``{output_dir}/completions/completions_{global_step:05d}.parquet`` (columns ``step``,
  ``prompt``, ``completion``, the reward functions by name, ``log_extra`` columns,
  ``advantage``; since commit 035c3ff, 2026-01-29) and, with ``report_to=wandb``, to a wandb
  table ``completions`` (``files/media/table/completions_*.table.json``, ``{"columns", "data"}``;
  older versions log ``step`` as text and a single ``reward`` column).

So a table holds the last generation batch before a logging step: with ``logging_steps`` above
``steps_per_generation`` the batches in between are not logged (pass ``--allow-gaps``), and with
it below, one batch is logged several times (repeats are dropped here). No token counts are
written: lengths are counted again with ``--tokenizer``. The decode skipped the EOS, which TRL
generated and counted (its ``completion_mask`` runs to the first EOS inclusive): a completion below
``--max-tokens`` (``max_completion_length``) stopped there and is the count plus one; one whose
count reaches the cap is ``length`` at the cap; a count above the cap is refused (the cap given is
not the run's).

Measured: steps (logging steps), rewards (the ``reward`` column, or the sum of the reward
functions' float columns as TRL sums them with its default weights 1, or ``--reward-column``).
Inferred: prompt and response lengths (the EOS counted), finish reasons, groups (runs of one
prompt, cut every ``--num-generations``), prompt ids (a hash of the prompt text), the early-exit
signals (from the retokenized completion, the skipped EOS as one more token; no log-probs in the
table, so repetition only: the entropy is NaN).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.traces.importers.common import (EOS_SKIPPED, DumpError, Imported, Response, build_trace, check_no_gaps, descend,
                                           eos_counted, load_tokenizer, prompt_hash, signal_stride, signals_said)
from lssim.traces.signal_trace import DEFAULT_STRIDE

NAME = "trl"
HELP = "TRL GRPOTrainer log_completions tables (completions/completions_{step}.parquet or wandb .table.json), retokenized"
NOT_REWARDS = ("step", "prompt", "completion", "advantage", "image")
FILE_PATTERN = r"completions_(\d+)(?:[._-].*)?\.(?:parquet|table\.json)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="the run's Hugging Face tokenizer folder (read offline)")
    p.add_argument("--max-tokens", type=int, required=True, help="the run's max_completion_length (the response-token cap)")
    p.add_argument("--num-generations", type=int, metavar="G", help="completions per prompt: cuts a run of one prompt "
                   "longer than G into groups of G (default: a run of one prompt is one group)")
    p.add_argument("--reward-column", action="append", metavar="NAME", help="reward column(s) to sum (repeatable; "
                   "default: 'reward', else every reward function's column)")


def run(args: argparse.Namespace) -> Imported:
    return read_trl(args.source, tokenizer=args.tokenizer, max_tokens=args.max_tokens, num_generations=args.num_generations,
                    reward_columns=args.reward_column, allow_gaps=args.allow_gaps, stride=signal_stride(args))


def read_trl(source: str | Path, *, tokenizer: str | Path, max_tokens: int, num_generations: int | None = None,
             reward_columns: list[str] | None = None, allow_gaps: bool = False, stride: int | None = DEFAULT_STRIDE) -> Imported:
    """The trace of TRL's completion tables; ``stride``: tokens between the measured early-exit signals (None: not measured)."""
    if num_generations is not None and num_generations < 1:
        raise DumpError(f"--num-generations must be >= 1, got {num_generations}")
    encode = load_tokenizer(tokenizer)
    root = descend(Path(source), "completions")
    tables = _tables(root)
    steps = sorted({step for step, _, _ in tables})
    diffs = np.diff(steps)
    check_no_gaps(steps, root, "completion table", allow_gaps, stride=int(np.gcd.reduce(diffs)) if len(diffs) else 1)
    kept, repeats, previous = [], 0, None
    for step, rel, table in tables:
        content = (tuple(table["prompt"]), tuple(table["completion"]))
        if content == previous:  # one generation batch logged again at a later logging step
            repeats += 1
            continue
        previous = content
        kept.append((step, rel, table))
    used: set[str] = set()
    responses = []
    for step, rel, table in kept:
        rewards, names = _rewards(table, rel, reward_columns)
        used.update(names)
        responses += _responses(step, rel, table, encode, rewards, max_tokens, num_generations)
    frame = build_trace(responses, max_tokens, stride)
    notes = [f"{repeats} table(s) repeated the previous one (one generation batch logged twice): dropped"] if repeats else []
    notes.append(f"reward = sum of {', '.join(sorted(used))}")
    inferred = ["prompt and response lengths (retokenized, the EOS of a stopped response counted)", "finish reasons (from --max-tokens)",
                "groups (runs of one prompt)", "prompt ids (hash of the prompt text)"]
    if stride is None:
        notes.append(signals_said(None, ""))
    else:
        inferred.append(signals_said(stride, "the retokenized text; no log-probs in the table: entropy NaN"))
    return Imported(frame, NAME, ["steps (logging steps)", "rewards"], inferred, notes)


def _responses(step: int, rel: str, table: pd.DataFrame, encode, rewards: list[float], max_tokens: int,
               num_generations: int | None) -> list[Response]:
    """One table's responses, retokenized: lengths with the skipped EOS counted, token ids ending in it."""
    ids = encode(list(table["prompt"]) + list(table["completion"]))
    n = len(table)
    out = []
    for i, group in enumerate(_groups(list(table["prompt"]), num_generations)):
        pid = prompt_hash(table["prompt"].iloc[group[0]])
        for j in group:
            tokens = ids[n + j]
            response_len, finish = eos_counted(len(tokens), max_tokens, f"{rel}: record {j}: 'completion'")
            out.append(Response(step=step, prompt_id=pid, group_key=(rel, i), order=j, prompt_len=len(ids[j]),
                                response_len=response_len, reward=rewards[j], source_file=rel, source_record=j,
                                length_source="retokenized", finish_reason=finish, finish_source="inferred",
                                tokens=tokens + [EOS_SKIPPED] * (response_len - len(tokens))))
    return out


def _tables(root: Path) -> list[tuple[int, str, pd.DataFrame]]:
    """Every completion table under ``root`` with its step, in step order (ranks' files of one step kept apart)."""
    out = []
    for path in sorted(root.iterdir()):
        m = re.fullmatch(FILE_PATTERN, path.name)
        if not (m and path.is_file()):
            continue
        rel = str(path)  # as reached from SOURCE, so an error names a file the user can open
        table = _read(path, rel)
        for col in ("prompt", "completion"):
            if col not in table:
                raise DumpError(f"{rel}: no {col!r} column (columns: {', '.join(map(str, table.columns))})")
            bad = ~table[col].map(lambda v: isinstance(v, str))
            if bad.any():
                raise DumpError(f"{rel}: record {int(np.flatnonzero(bad)[0])}: {col!r} is not text")
        step = _step(table, rel, int(m.group(1)))
        out.append((step, rel, table.reset_index(drop=True)))
    if not out:
        raise DumpError(f"{root}: no completion tables (completions_{{step}}.parquet or completions_*.table.json) found")
    return sorted(out, key=lambda t: t[0])


def _read(path: Path, rel: str) -> pd.DataFrame:
    try:
        if path.name.endswith(".parquet"):
            return pd.read_parquet(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        return pd.DataFrame(data["data"], columns=data["columns"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        text = str(e).strip().splitlines()
        raise DumpError(f"{rel}: not a completion table ({text[0] if text else type(e).__name__})") from None


def _step(table: pd.DataFrame, rel: str, from_name: int) -> int:
    if "step" not in table or table.empty:
        return from_name
    steps = pd.to_numeric(table["step"], errors="coerce")  # older TRL logs the step as text
    if steps.isna().any() or steps.nunique() != 1:
        raise DumpError(f"{rel}: 'step' column is not one whole number")
    return int(steps.iloc[0])


def _rewards(table: pd.DataFrame, rel: str, columns: list[str] | None) -> tuple[list[float], list[str]]:
    if columns is None:  # a reward function's column is floats (tolist of a float tensor); log_extra's may be anything
        columns = ["reward"] if "reward" in table else [c for c in table.columns if c not in NOT_REWARDS
                                                        and pd.api.types.is_float_dtype(table[c])]
    if not columns:
        raise DumpError(f"{rel}: no reward column (columns: {', '.join(map(str, table.columns))}); pass --reward-column")
    for c in columns:
        if c not in table:
            raise DumpError(f"{rel}: no reward column {c!r} (columns: {', '.join(map(str, table.columns))})")
    values = table[columns].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    # TRL sums the functions with nansum (a function returning None scores nothing); a row no function scored is 0.
    total = np.nansum(values, axis=1)
    if not np.isfinite(total).all():
        raise DumpError(f"{rel}: record {int(np.flatnonzero(~np.isfinite(total))[0])}: reward is not finite")
    return [float(v) for v in total], list(columns)


def _groups(prompts: list[str], size: int | None) -> list[list[int]]:
    """Runs of one prompt in table order, cut every ``size`` rows."""
    groups: list[list[int]] = []
    for i, p in enumerate(prompts):
        if groups and prompts[groups[-1][0]] == p and (size is None or len(groups[-1]) < size):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups

