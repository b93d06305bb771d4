"""What every importer shares: the error, step files, prompt ids, tokenizers, and the trace frame.

An importer reads a framework's dump into :class:`Response` records (one per generated response,
with whatever the dump measured) and hands them to :func:`build_trace`, which numbers groups and
samples, fills what the dump did not measure from the cap (``--max-tokens``), and returns the
frame with extra columns saying where each value came from:

- ``length_source``: ``measured`` (token counts written by the framework) or ``retokenized``
  (counted again from decoded text with ``--tokenizer``);
- ``finish_source``: ``measured`` (the framework recorded why generation ended) or ``inferred``
  (from the cap, and from the EOS where the dump's text shows or drops it: :func:`eos_counted`);
- ``source_file`` / ``source_record``: the dump file (as reached from SOURCE) and the record in it
  (the line of a JSON-lines file, else the position in the file's samples or rows, from 0);
- the measured early-exit signals (``signal_source`` ``measured``, ``signal_repetition``, ``signal_entropy``, ...:
  lssim.traces.signal_trace), where the importer has each response's token ids (the dump's, or its text
  retokenized) and passes a stride: computed by lssim.loop.signals.signals_along, the function the real
  engine calls, with the dump's log-probs where it has them (else the entropy is NaN).

:func:`write_imported` writes it with :func:`lssim.traces.trace.write_trace` (atomic: nothing is left
behind on error) and names the dump's file and record when the trace schema refuses a row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence

import pandas as pd

from lssim.loop.signals import DEFAULT as SIGNAL_SPEC
from lssim.traces.signal_trace import DEFAULT_STRIDE, measure_rows

__all__ = [
    "DumpError", "Response", "Imported", "json_lines", "prompt_hash", "step_files", "check_no_gaps",
    "load_tokenizer", "build_trace", "signals_said", "add_signal_arguments", "signal_stride", "write_imported", "as_reward", "descend", "eos_counted", "eos_texts",
]


class DumpError(ValueError):
    """A dump cannot be imported. The message is one line naming the file and the record."""


@dataclass
class Response:
    """One generated response as a dump recorded it, before groups and samples are numbered.

    ``finish_reason`` None means "the dump does not say": :func:`build_trace` infers it from the
    cap. ``max_tokens`` None means "the run's cap" (``--max-tokens``, or what the dump implies)."""

    step: int
    prompt_id: int | str
    group_key: Hashable
    """Identifies the response's group within its step (e.g. slime's group_index, AReaL's task id)."""
    order: int
    """Sort key of the response within its group (its sample index, or its position in the dump)."""
    prompt_len: int
    response_len: int
    reward: float
    source_file: str
    source_record: int
    length_source: str = "measured"
    finish_reason: str | None = None
    finish_source: str = "measured"
    """Whether ``finish_reason`` (when given) was written by the framework (``measured``) or worked out here."""
    max_tokens: int | None = None
    policy_version_first: int | None = None
    policy_version_last: int | None = None
    trained: bool | None = None
    tokens: Sequence[int] | None = None
    """The response's token ids (``response_len`` of them), for the measured early-exit signals; None: not known."""
    logprobs: Sequence[float] | None = None
    """The log-prob of each of ``tokens`` as sampled (the signals' entropy); None: not in the dump (entropy NaN)."""


@dataclass
class Imported:
    """An imported trace and what the user should know about how it was made."""

    frame: pd.DataFrame
    framework: str
    measured: list[str]
    inferred: list[str]
    notes: list[str] = field(default_factory=list)

    def summary(self, out: str) -> str:
        f = self.frame
        steps = f["step"].nunique()
        groups = len(f.drop_duplicates(["step", "group_id"]))
        trunc = float((f["finish_reason"] == "length").mean())
        lines = [f"imported {len(f):,} responses ({steps} steps, {groups} groups, {trunc:.1%} truncated) "
                 f"from the {self.framework} dump to {out}",
                 f"measured: {', '.join(self.measured)}",
                 f"inferred: {', '.join(self.inferred) if self.inferred else 'nothing'}"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


# --------------------------------------------------------------------------
# Reading a dump
# --------------------------------------------------------------------------


def prompt_hash(prompt: Any) -> int:
    """A stable id for a prompt's text (or chat messages): 53 bits of BLAKE2b, so it stays exact as float64."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 11


def descend(source: Path, subdir: str) -> Path:
    """The folder the dump files are in: SOURCE itself, or SOURCE/subdir where the user named its parent."""
    if not source.exists():
        raise DumpError(f"{source}: no such file or directory")
    if not source.is_dir():
        raise DumpError(f"{source}: not a directory (expected the dump's folder)")
    inner = source / subdir
    return inner if inner.is_dir() else source


def step_files(root: Path, pattern: str, what: str, skip: Callable[[Path], bool] = lambda p: False) -> dict[int, list[Path]]:
    """Files under ``root`` (not recursive) whose name matches ``pattern``, by step.

    ``pattern`` is a regular expression whose first group is the step number. A step split over
    several files (one per rank or partition: ``3.jsonl`` and ``3_rank1.jsonl``) is one step."""
    steps: dict[int, list[Path]] = defaultdict(list)
    for path in sorted(root.iterdir()):
        if not path.is_file() or skip(path):
            continue
        m = re.fullmatch(pattern, path.name)
        if m:
            steps[int(m.group(1))].append(path)
    if not steps:
        raise DumpError(f"{root}: no {what} found")
    return dict(sorted(steps.items()))


def check_no_gaps(steps: Iterable[int], root: Path, what: str, allow_gaps: bool, stride: int = 1) -> None:
    """Refuse a dump whose step numbering has holes: a lost file would silently shorten the run."""
    found = sorted(set(steps))
    if allow_gaps or len(found) < 2:
        return
    present = set(found)
    missing = [s for s in range(found[0], found[-1] + 1, stride) if s not in present]
    if missing:
        shown = ", ".join(str(s) for s in missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise DumpError(f"{root}: {what} for step {shown} missing (found steps {found[0]}..{found[-1]}); "
                        "pass --allow-gaps if the run really skipped them")


def eos_counted(count: int, cap: int, where: str) -> tuple[int, str]:
    """The framework's own length and finish of a response whose text was decoded with its EOS skipped.

    ``count`` is the decoded text's token count. Below the cap the response stopped at an EOS the
    framework generated and counted (TRL's completion_mask, verl's response_mask): one token more.
    At the cap it was cut there (no EOS). Above it ``--max-tokens`` cannot be the run's cap."""
    if count > cap:
        raise DumpError(f"{where}: {count} tokens > --max-tokens {cap}; is --max-tokens the run's response-token cap?")
    return (cap, "length") if count == cap else (count + 1, "stop")


def json_lines(path: Path, where: str | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, record) of each non-blank line of a JSON-lines file; DumpError naming the line (as `where`, the
    file as the user reached it, says) where one is not JSON or not a JSON object."""
    where = str(path) if where is None else where
    with open(path, encoding="utf-8") as f:
        for line_no, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise DumpError(f"{where}: line {line_no}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise DumpError(f"{where}: line {line_no}: not a JSON object")
            yield line_no, rec


def as_reward(value: Any, where: str, key: str | None = None) -> float:
    """A finite float reward from a dump value (a dict of rewards needs ``key``)."""
    if isinstance(value, dict):
        if key is None:
            raise DumpError(f"{where}: reward is a dict (keys {', '.join(map(str, value))}); pass --reward-key to pick one")
        if key not in value:
            raise DumpError(f"{where}: reward has no key {key!r} (keys {', '.join(map(str, value))})")
        value = value[key]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if value is None or isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
        raise DumpError(f"{where}: reward {value!r} is not a number")
    if not math.isfinite(value):
        raise DumpError(f"{where}: reward {value!r} is not finite")
    return float(value)


# --------------------------------------------------------------------------
# Tokenizers (retokenizing decoded text, for dumps without token counts)
# --------------------------------------------------------------------------


def load_tokenizer(folder: str | Path) -> Callable[[list[str]], list[list[int]]]:
    """A tokenizer for a Hugging Face tokenizer folder, loaded offline (never from the hub): texts -> their token ids
    (``len`` of each is its token count; the ids are what the measured early-exit signals are computed from).

    A folder with ``tokenizer.json`` is read by the fast ``tokenizers`` library alone; any other
    folder goes through ``transformers.AutoTokenizer(local_files_only=True)``. Special tokens are
    not added: the dumps' texts already carry what the framework decoded."""
    path = Path(folder)
    if not path.is_dir():
        raise DumpError(f"{folder}: tokenizer folder does not exist")
    if (path / "tokenizer.json").is_file():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as e:  # noqa: BLE001  (any parse failure is the user's file)
            raise DumpError(f"{path / 'tokenizer.json'}: not a tokenizers file ({_first_line(e)})") from None
        return lambda texts: [list(enc.ids) for enc in tok.encode_batch(texts, add_special_tokens=False)]
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001
        raise DumpError(f"{folder}: cannot load a tokenizer from this folder ({_first_line(e)})") from None
    return lambda texts: [list(ids) for ids in hf(texts, add_special_tokens=False)["input_ids"]] if texts else []


def eos_texts(folder: str | Path) -> set[str]:
    """The texts of a tokenizer folder's end-of-sequence tokens: ``eos_token`` of tokenizer_config.json and
    the ``eos_token_id`` (one or a list) of generation_config.json, named through tokenizer.json's added tokens."""
    path = Path(folder)
    if not path.is_dir():
        raise DumpError(f"{folder}: tokenizer folder does not exist")
    texts: set[str] = set()
    config = _json_or_empty(path / "tokenizer_config.json")
    eos = config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str):
        texts.add(eos)
    ids = _json_or_empty(path / "generation_config.json").get("eos_token_id")
    added = {t["id"]: t["content"] for t in _json_or_empty(path / "tokenizer.json").get("added_tokens", [])}
    texts.update(added[i] for i in (ids if isinstance(ids, list) else [ids]) if i in added)
    if not texts:
        raise DumpError(f"{folder}: no eos_token in tokenizer_config.json or generation_config.json; pass --eos-token")
    return texts


def _json_or_empty(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise DumpError(f"{path}: not JSON ({_first_line(e)})") from None
    return data if isinstance(data, dict) else {}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# --------------------------------------------------------------------------
# Early-exit signals (the options every importer takes)
# --------------------------------------------------------------------------

EOS_SKIPPED = -1
"""The token id standing for an EOS the dump's decoded text dropped (verl's and TRL's skip_special_tokens) but the
framework generated and counted: a retokenized response's ids end in it, so they are ``response_len`` long. Only
equality of ids enters the repetition measure, and the EOS is the response's one, so any id no text has gives what
the EOS's own id would."""


def add_signal_arguments(p: argparse.ArgumentParser) -> None:
    """``--signal-stride`` and ``--no-signals``, for every framework."""
    p.add_argument("--signal-stride", type=int, default=DEFAULT_STRIDE, metavar="N",
                   help=f"tokens between the measured early-exit signals kept per response (default {DEFAULT_STRIDE}; "
                   f"window {SIGNAL_SPEC.window} tokens, {SIGNAL_SPEC.ngram}-grams)")
    p.add_argument("--no-signals", action="store_true", help="do not measure the early-exit signals from the tokens "
                   "(a replay of a policy that reads them, such as breaker, then refuses the trace)")


def signal_stride(args: argparse.Namespace) -> int | None:
    """The stride the import measures the signals at, None where ``--no-signals``."""
    if args.no_signals:
        return None
    if args.signal_stride < 1:
        raise DumpError(f"--signal-stride must be >= 1, got {args.signal_stride}")
    return args.signal_stride


def signals_said(stride: int | None, source: str) -> str:
    """How the import's early-exit signals were measured (for Imported.measured / inferred), or why not (a note)."""
    if stride is None:
        return "early-exit signals not measured (--no-signals)"
    return (f"early-exit signals measured from {source} (window {SIGNAL_SPEC.window}, at most half a response's budget; "
            f"stride {stride})")


def _signal_columns(responses: list[Response], stride: int, budgets: list[int]) -> dict[str, list]:
    for r in responses:
        where = f"{r.source_file}: record {r.source_record}"
        if r.tokens is None:
            raise DumpError(f"{where}: no token ids to measure the early-exit signals from; pass --no-signals")
        if len(r.tokens) != r.response_len:
            raise DumpError(f"{where}: {len(r.tokens)} token ids for a response of {r.response_len} tokens")
        if r.logprobs is not None and len(r.logprobs) != len(r.tokens):
            raise DumpError(f"{where}: {len(r.logprobs)} log-probs for {len(r.tokens)} response tokens")
    return measure_rows([r.tokens for r in responses], [r.logprobs for r in responses], spec=SIGNAL_SPEC, stride=stride,
                        max_tokens=budgets)


# --------------------------------------------------------------------------
# Building the trace
# --------------------------------------------------------------------------


def build_trace(responses: list[Response], cap: int | None, signal_stride: int | None = None) -> pd.DataFrame:
    """The lssim trace frame of ``responses``.

    ``cap`` is the run's response-token cap (``--max-tokens``); a response longer than it is refused
    (never clipped). Responses without a finish reason are ``length`` where they reach it and
    ``stop`` below it. Groups are numbered ``group_id`` 0.. within
    each step in order of first appearance, and samples ``sample_idx`` in ``order`` within the
    step's prompt, continuing over a prompt's second group, so (step, prompt_id, sample_idx) stays
    unique. With ``signal_stride``, every response's ``tokens`` (and ``logprobs`` where known) become its measured
    early-exit signals, a value every ``signal_stride`` tokens (lssim.traces.signal_trace.measure_rows)."""
    if not responses:
        raise DumpError("the dump holds no responses")
    rows = [_row(r, cap) for r in responses]
    df = pd.DataFrame(rows)
    group_ids: dict[tuple[int, Hashable], int] = {}
    per_step: dict[int, int] = defaultdict(int)
    for r in responses:
        if (r.step, r.group_key) not in group_ids:
            group_ids[(r.step, r.group_key)] = per_step[r.step]
            per_step[r.step] += 1
    df["group_id"] = [group_ids[(r.step, r.group_key)] for r in responses]
    ranked = df.assign(_order=[r.order for r in responses]).sort_values(["step", "group_id", "_order"], kind="stable")
    ranked["sample_idx"] = ranked.groupby(["step", "prompt_id"], sort=False).cumcount()
    df["sample_idx"] = ranked["sample_idx"].reindex(df.index)
    if not all(isinstance(r.prompt_id, int) for r in responses):
        df["prompt_id"] = df["prompt_id"].map(str)  # ids of mixed kinds: all as written, as text
    for name in ("policy_version_first", "policy_version_last", "trained"):
        if df[name].isna().any():
            df = df.drop(columns=name)  # unknown for some: leave it to the schema's default
    if "trained" in df:
        df["trained"] = df["trained"].astype(bool)
    if signal_stride is not None:
        df = df.assign(**_signal_columns(responses, signal_stride, df["max_tokens"].tolist()))
    return df


def _row(r: Response, cap: int | None) -> dict[str, Any]:
    where = f"{r.source_file}: record {r.source_record}"
    max_tokens = r.max_tokens if r.max_tokens is not None else cap
    if max_tokens is None:
        raise DumpError(f"{where}: the dump does not say the response-token cap; pass --max-tokens")
    if r.response_len > max_tokens:  # never clipped: a cap below what the framework generated is the wrong cap
        raise DumpError(f"{where}: response length {r.response_len} > the cap {max_tokens}; is --max-tokens the run's cap?")
    finish, finish_source = r.finish_reason, r.finish_source
    if finish is None:
        finish_source = "inferred"
        finish = "length" if r.response_len == max_tokens else "stop"
    if finish == "length":
        max_tokens = r.response_len  # the cap in force for this response (a context limit can cut below the run's)
    return {
        "step": r.step, "prompt_id": r.prompt_id, "prompt_len": max(1, r.prompt_len), "response_len": r.response_len,
        "reward": r.reward, "finish_reason": finish, "max_tokens": max_tokens,
        "policy_version_first": r.policy_version_first, "policy_version_last": r.policy_version_last,
        "trained": r.trained, "length_source": r.length_source, "finish_source": finish_source,
        "source_file": r.source_file, "source_record": r.source_record,
    }


def write_imported(imported: Imported, out: str) -> pd.DataFrame:
    """Write the trace atomically; a row the schema refuses is named by its dump file and record."""
    from lssim.traces.trace import TraceError, write_trace

    frame = imported.frame
    try:
        return write_trace(frame, out)
    except TraceError as e:
        m = re.search(r": row (\d+):", str(e))
        if m and int(m.group(1)) < len(frame):
            row = frame.iloc[int(m.group(1))]
            problem = re.sub(r"row \d+: ", "", str(e).split(": ", 1)[1])
            raise DumpError(f"{row['source_file']}: record {row['source_record']}: {problem}") from None
        raise
