"""`lssim signals`: add measured early-exit signals to an existing trace from its responses' token ids.

SOURCE is a parquet or JSON-lines file with one row per response: `step`, `prompt_id`, `sample_idx` (the trace's
key), `tokens` (the response's token ids, `response_len` of them) and optionally `logprobs` (the log-prob of each
sampled token: the entropy signal; without them it is NaN) -- or `text` (the response's text) and a tokenizer folder
to turn it into ids. Each row's signals are computed by lssim.traces.signal_trace.measure_response, which calls
lssim.loop.signals.signals_along, the function the real engine calls.

Every trace row needs its tokens, and every token row its trace row; a token count other than the row's
`response_len` is refused, naming the row. With `partial`, trace rows without tokens keep signals measured before
over the same window and n-gram, and are otherwise left with none (`signal_source` empty: a replay of a policy that
reads the signals then refuses the trace, rather than mix sources silently).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lssim.loop.signals import SignalSpec
from lssim.traces.importers.common import json_lines
from lssim.traces.signal_trace import SIGNAL_COLUMNS, measure_response

KEY = ("step", "prompt_id", "sample_idx")
LOOP_REPETITION = 0.5  # a row "loops" where its repetition reaches breaker's default repetition_above


@dataclass
class TokenRow:
    """One response's tokens as SOURCE gives them; `where` names its record for errors."""

    key: tuple[int, str, int]
    where: str
    tokens: list[int]
    logprobs: list[float] | None


def key_text(key: tuple) -> str:
    return f"step {key[0]}, prompt_id {key[1]}, sample_idx {key[2]}"


def _records(source: Path) -> list[tuple[str, dict]]:
    """(where, record) of every row of a parquet or JSON-lines file."""
    if not source.is_file():
        raise ValueError(f"{source}: no such file")
    if source.suffix == ".parquet":
        frame = pd.read_parquet(source)
        return [(f"{source}: row {i}", rec) for i, rec in enumerate(frame.to_dict("records"))]
    return [(f"{source}: line {n}", rec) for n, rec in json_lines(source)]


def _key(rec: dict, where: str) -> tuple[int, str, int]:
    missing = [k for k in KEY if rec.get(k) is None]
    if missing:
        raise ValueError(f"{where}: no {', '.join(missing)} (each row needs step, prompt_id, sample_idx)")
    try:
        return int(rec["step"]), _prompt_id(rec["prompt_id"]), int(rec["sample_idx"])
    except (TypeError, ValueError):
        raise ValueError(f"{where}: step and sample_idx must be whole numbers") from None


def _prompt_id(value: Any) -> str:
    """A prompt id as text, so 5, 5.0 (a float column) and "5" match one another."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    return str(value.item() if isinstance(value, np.generic) else value)


def _numbers(value: Any, where: str, column: str, kind: type) -> list | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return [kind(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {column!r} is not a list of numbers") from None


def read_token_rows(source: str | Path, tokenizer: str | Path | None = None) -> list[TokenRow]:
    """SOURCE's rows: token ids as given, or `text` retokenized with `tokenizer` (lssim.traces.importers.common)."""
    records = _records(Path(source))
    if not records:
        raise ValueError(f"{source}: no rows")
    texts = [(where, rec) for where, rec in records if _numbers(rec.get("tokens"), where, "tokens", int) is None]
    encoded: dict[str, list[int]] = {}
    if texts:
        bad = next(((w, r) for w, r in texts if not isinstance(r.get("text"), str)), None)
        if bad is not None:
            raise ValueError(f"{bad[0]}: no 'tokens' (the response's token ids) and no 'text'")
        if tokenizer is None:
            raise ValueError(f"{texts[0][0]}: 'text' without 'tokens': pass --tokenizer DIR to turn it into token ids")
        from lssim.traces.importers.common import load_tokenizer

        encoded = dict(zip((w for w, _ in texts), load_tokenizer(tokenizer)([r["text"] for _, r in texts])))
    rows = []
    for where, rec in records:
        tokens = encoded[where] if where in encoded else _numbers(rec["tokens"], where, "tokens", int)
        logprobs = _numbers(rec.get("logprobs"), where, "logprobs", float)
        if logprobs is not None and len(logprobs) != len(tokens):
            raise ValueError(f"{where}: {len(logprobs)} logprobs for {len(tokens)} tokens")
        rows.append(TokenRow(_key(rec, where), where, tokens, logprobs))
    return rows


def _match(trace: pd.DataFrame, rows: Sequence[TokenRow], name: str) -> dict[int, TokenRow]:
    """Trace row position -> its TokenRow; a token row with no trace row, twice, or of another length is refused."""
    index = {(int(s), _prompt_id(p), int(k)): i for i, (s, p, k) in
             enumerate(zip(trace["step"].to_numpy(), trace["prompt_id"].to_numpy(), trace["sample_idx"].to_numpy()))}
    lengths = trace["response_len"].to_numpy()
    out: dict[int, TokenRow] = {}
    for row in rows:
        i = index.get(row.key)
        if i is None:
            raise ValueError(f"{row.where}: ({key_text(row.key)}) is not a row of the trace {name}")
        if i in out:
            raise ValueError(f"{row.where}: ({key_text(row.key)}) again (first at {out[i].where})")
        if len(row.tokens) != lengths[i]:
            raise ValueError(f"{row.where}: ({key_text(row.key)}) has {len(row.tokens)} tokens, but its trace row's "
                             f"response_len is {lengths[i]}")
        out[i] = row
    return out


def measure_trace(trace: pd.DataFrame, rows: Sequence[TokenRow], *, spec: SignalSpec, stride: int, partial: bool = False,
                  name: str = "TRACE") -> tuple[pd.DataFrame, list[int]]:
    """`trace` with the measured signals of `rows` (see the module docstring); also the positions measured."""
    matched = _match(trace, rows, name)
    if len(matched) < len(trace) and not partial:
        i = next(i for i in range(len(trace)) if i not in matched)
        key = (trace["step"].iat[i], trace["prompt_id"].iat[i], trace["sample_idx"].iat[i])
        raise ValueError(f"{name}: row {i} ({key_text(key)}) has no tokens ({len(trace) - len(matched)} of {len(trace)} rows "
                         "have none); pass --partial to leave such rows without signals")
    has = {c: c in trace for c in SIGNAL_COLUMNS}
    columns: dict[str, list] = {c: [] for c in SIGNAL_COLUMNS}
    for i in range(len(trace)):
        if i in matched:
            values = measure_response(matched[i].tokens, matched[i].logprobs, spec=spec, stride=stride,
                                      max_tokens=int(trace["max_tokens"].iat[i]))
        elif all(has.values()) and trace["signal_source"].iat[i] == "measured" and \
                (trace["signal_window"].iat[i], trace["signal_ngram"].iat[i]) == (spec.window, spec.ngram):
            values = {c: trace[c].iat[i] for c in SIGNAL_COLUMNS}  # measured before, over the same window: kept
        else:
            values = {"signal_source": "", "signal_window": 0, "signal_ngram": 0, "signal_stride": 0,
                      "signal_repetition": np.empty(0, np.float32), "signal_entropy": np.empty(0, np.float32)}
        for c in SIGNAL_COLUMNS:
            columns[c].append(values[c])
    return trace.assign(**columns), sorted(matched)


def loops(frame: pd.DataFrame, positions: Sequence[int]) -> int:
    """How many of the rows at `positions` reach a repetition of LOOP_REPETITION at some measured point."""
    reps = frame["signal_repetition"].to_numpy()
    return sum(bool(len(reps[i])) and float(np.max(reps[i])) >= LOOP_REPETITION for i in positions)


__all__ = ["TokenRow", "read_token_rows", "measure_trace", "loops", "LOOP_REPETITION"]
