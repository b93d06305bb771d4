"""The early-exit signals a trace carries: measured from tokens into its columns, read back by a replay.

A policy that stops responses from their tokens (policies/breaker.py) reads two window signals at each progress
checkpoint (lssim.loop.signals: repetition, entropy). On the real engine they are computed from the tokens and
log-probs as they stream. A trace keeps them in one of two ways (its `signal_source` column):

- `measured`: `signal_repetition` and `signal_entropy` hold the window signals every `signal_stride` tokens of the
  response, computed by the same function the real engine calls (lssim.loop.signals.signals_along) with the window
  and n-gram length in `signal_window` / `signal_ngram` (the engines' window for the response's budget: at most half
  of it). `measure_rows` fills them from token ids and log-probs
  (an importer with the dump's tokens, `lssim signals`, the real backend's recorder). A replay reads the value of the
  window ending at the last stride at or below the checkpoint: exact where checkpoints fall on strides (breaker
  checks every 256 tokens; the default stride is 64); past the recorded end (a resampled response the budget lets
  run longer) the last value holds.
- `synthetic`: the synthesizer's labels `loop_start` / `entropy_collapse_start` and `entropy_mean`, from which
  lssim.loop.signals.signals_from_trace models the window signals.

A trace with neither has no signals: `TraceSignals.available` is empty, and a policy that reads them is refused
(lssim.loop.contracts.Engine.set_signals) instead of running blind.
"""

from __future__ import annotations

import math
from typing import Collection, Sequence

import numpy as np

from lssim.loop.signals import (DEFAULT, SIGNAL_NAMES, WINDOW_FIELDS, SignalSpec, signals_along, signals_from_trace,
                                signals_from_trace_many)

DEFAULT_STRIDE = 64  # tokens between a trace's measured values: breaker's 256-token checks fall on them
SOURCE_CODES = {"": 0, "synthetic": 1, "measured": 2}
SIGNAL_COLUMNS = ("signal_source", "signal_window", "signal_ngram", "signal_stride", "signal_repetition", "signal_entropy")
# What a response with no measured signals has in those columns (a replay of a policy that reads them refuses it).
UNMEASURED = {"signal_source": "", "signal_window": 0, "signal_ngram": 0, "signal_stride": 0,
              "signal_repetition": np.empty(0, np.float32), "signal_entropy": np.empty(0, np.float32)}


def default_source(columns) -> str:
    """`signal_source` of a trace that does not say: `synthetic` where it has the synthesizer's labels, else none."""
    return "synthetic" if "loop_start" in columns or "entropy_collapse_start" in columns else ""


HOW_TO_MEASURE = ("measure them from the tokens: `lssim import slime` keeps the dump's tokens and log-probs, "
                  "`lssim import verl|trl|areal --tokenizer DIR` retokenizes the text, `lssim signals TRACE --tokens SOURCE` "
                  "adds them to a trace")


def measure_response(tokens: Sequence[int], logprobs: Sequence[float] | None = None, *, spec: SignalSpec = DEFAULT,
                     stride: int = DEFAULT_STRIDE, entropies: Sequence[float] | None = None,
                     max_tokens: int | None = None) -> dict:
    """One response's measured signal columns from its token ids (and the log-probs of the sampled tokens, or each
    position's entropy): values after stride, 2 * stride, ... tokens. With its token budget `max_tokens`, over the
    window the engines use for that budget (`SignalSpec.window_for`: at most half of it)."""
    if stride < 1:
        raise ValueError(f"signal stride must be >= 1, got {stride}")
    if max_tokens is not None:
        spec = SignalSpec(spec.window_for(max_tokens), spec.ngram)
    positions = range(stride, len(tokens) + 1, stride)
    repetition, entropy = signals_along(tokens, logprobs, positions, spec, entropies)
    return {"signal_source": "measured", "signal_window": spec.window, "signal_ngram": spec.ngram,
            "signal_stride": stride, "signal_repetition": np.asarray(repetition, np.float32),
            "signal_entropy": np.asarray(entropy, np.float32)}


def measure_rows(tokens: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float] | None] | None = None, *,
                 spec: SignalSpec = DEFAULT, stride: int = DEFAULT_STRIDE,
                 max_tokens: Sequence[int] | None = None) -> dict[str, list]:
    """The measured signal columns of many responses (column -> one value per response), for a trace frame;
    `max_tokens`: each response's budget (see `measure_response`)."""
    columns: dict[str, list] = {name: [] for name in SIGNAL_COLUMNS}
    for i, toks in enumerate(tokens):
        row = measure_response(toks, None if logprobs is None else logprobs[i], spec=spec, stride=stride,
                               max_tokens=None if max_tokens is None else max_tokens[i])
        for name in SIGNAL_COLUMNS:
            columns[name].append(row[name])
    return columns


class TraceSignals:
    """What a Workload knows of the early-exit signals: which it can give, where from, and a row's window signals
    after a number of tokens. `rows`: the Workload's sorted columns (lssim.traces.workload_index.sorted_rows)."""

    def __init__(self, rows: dict[str, np.ndarray], text_entropy: float):
        self.source = rows["signal_source"]  # SOURCE_CODES per row
        self._loop, self._collapse, self._entropy = rows["loop"], rows["collapse"], rows["entropy"]
        self._length = rows["length"]
        self.text_entropy = text_entropy
        measured = self.source == SOURCE_CODES["measured"]
        if measured.any():
            self._measured_index(rows, measured)
        self.available = self._available(measured)

    def _measured_index(self, rows: dict, measured: np.ndarray) -> None:
        self._window, self._stride = rows["signal_window"], rows["signal_stride"]
        sizes = np.fromiter((len(a) for a in rows["signal_repetition"]), np.int64, len(measured))
        self._start = np.r_[0, np.cumsum(sizes)]
        self._repetition = np.concatenate([np.asarray(a, np.float64) for a in rows["signal_repetition"]] or [np.empty(0)])
        self._entropy_values = np.concatenate([np.asarray(a, np.float64) for a in rows["signal_entropy"]] or [np.empty(0)])

    def _available(self, measured: np.ndarray) -> frozenset[str]:
        """The signals every row can give (every row with tokens: an empty one is never checked): repetition wherever
        there is a source; entropy where it is known too (measured with log-probs, or a synthetic trace's entropy_mean)."""
        blind = (self.source == SOURCE_CODES[""]) & (self._length > 0)  # an empty response has nothing to read
        if not len(self.source) or blind.any():
            return frozenset()
        entropy_known = True
        if measured.any():
            entropy_known &= bool(np.isfinite(self._entropy_values).any())
        if (~measured).any():
            entropy_known &= bool(np.isfinite(self._entropy[~measured]).any())
        return frozenset(SIGNAL_NAMES if entropy_known else ("repetition",))

    @property
    def source_name(self) -> str:
        """'measured', 'synthetic', a mix of both ('measured+synthetic'), or '' (none)."""
        names = {name for name, code in SOURCE_CODES.items() if (self.source == code).any()}
        return "" if "" in names else "+".join(sorted(names, reverse=True))

    def missing(self, names: frozenset[str]) -> frozenset[str]:
        """Which of `names` this trace cannot give."""
        return frozenset(names) - self.available

    def window(self, row: int, generated: int, spec: SignalSpec, max_tokens: int) -> dict | None:
        """The window signals of trace row `row` after `generated` tokens of a response with budget `max_tokens`
        (None: the row has none). Measured: over the window the row was measured with; synthetic: modelled over the
        engine's window for that budget (`spec.window_for`)."""
        code = self.source[row]
        if code == SOURCE_CODES["measured"]:
            window = int(self._window[row])
            lo, hi = self._start[row], self._start[row + 1]
            i = lo + min(generated // int(self._stride[row]), hi - lo) - 1  # the last value at or before `generated`
            repetition, entropy = (self._repetition[i], self._entropy_values[i]) if i >= lo else (0.0, math.nan)
            return {"repetition": float(repetition), "entropy": float(entropy), "tokens": min(generated, window),
                    "window": window}
        if code == SOURCE_CODES["synthetic"]:
            return signals_from_trace(generated, int(self._loop[row]), int(self._collapse[row]), float(self._entropy[row]),
                                      self.text_entropy, spec.window_for(max_tokens))
        return None

    def windows(self, rows: np.ndarray, generated: np.ndarray, spec: SignalSpec, max_tokens: np.ndarray,
                names: Collection[str] = WINDOW_FIELDS) -> tuple[dict, np.ndarray]:
        """`window` of many (row, generated, max_tokens) at once, to the last bit: the signals `names` (all of them
        unless asked for fewer: a rule computes only what it reads) as arrays and which of them have any (the
        others' values are meaningless)."""
        unknown = set(names) - set(WINDOW_FIELDS)
        if unknown:
            raise ValueError(f"TraceSignals.windows: no window field named {sorted(unknown)}; there are {list(WINDOW_FIELDS)}")
        code, n = self.source[rows], len(rows)
        synthetic = code == SOURCE_CODES["synthetic"]
        if synthetic.all():  # a synthesized trace's: modelled, every one
            return self._modelled(rows, generated, spec, max_tokens, names), synthetic
        empty = {"repetition": lambda: np.zeros(n), "entropy": lambda: np.full(n, math.nan),
                 "tokens": lambda: np.zeros(n, np.int64), "window": lambda: np.zeros(n, np.int64)}
        out = {name: empty[name]() for name in names}
        measured = code == SOURCE_CODES["measured"]
        if measured.any():
            self._read_measured(out, measured, rows[measured], generated[measured])
        if synthetic.any():
            modelled = self._modelled(rows[synthetic], generated[synthetic], spec, max_tokens[synthetic], names)
            for name, values in modelled.items():
                out[name][synthetic] = values
        return out, measured | synthetic

    def _modelled(self, rows, generated, spec: SignalSpec, max_tokens, names: Collection[str]) -> dict:
        """The synthetic rows' window signals `names`, from their labels."""
        return signals_from_trace_many(generated, self._loop[rows], self._collapse[rows], self._entropy[rows],
                                       self.text_entropy, spec.windows_for(max_tokens), names)

    def _read_measured(self, out: dict, measured: np.ndarray, r: np.ndarray, g: np.ndarray) -> None:
        """Fill `out`'s measured rows (mask `measured`; trace rows `r` at `g` tokens) from the recorded windows."""
        window = self._window[r].astype(np.int64)
        lo, hi = self._start[r], self._start[r + 1]
        i = lo + np.minimum(g // self._stride[r].astype(np.int64), hi - lo) - 1
        seen = i >= lo
        at = np.where(seen, i, 0)
        for name, values, none in (("repetition", self._repetition, 0.0), ("entropy", self._entropy_values, math.nan)):
            if name in out:
                out[name][measured] = np.where(seen, values[at] if len(values) else none, none)
        if "tokens" in out:
            out["tokens"][measured] = np.minimum(g, window)
        if "window" in out:
            out["window"][measured] = window


__all__ = ["DEFAULT_STRIDE", "SIGNAL_COLUMNS", "UNMEASURED", "default_source", "HOW_TO_MEASURE", "TraceSignals", "measure_response", "measure_rows"]
