"""Recorder: every real run leaves a trace in the lssim schema, rewritten as each step finishes.

    recorder = Recorder(out_dir, decode=prompts.decode, meta={...})
    engine.observers.append(recorder.observe)      # signals of each response as it ends
    recorder.attach(controller)                    # rewrite the files after every step

After every step the folder holds, each file replaced atomically (written beside, then renamed):

    trace.parquet      one row per ended response, lssim.traces.trace schema (validated by write_trace): real
                       timings relative to the step's start, step_rollout_seconds / step_train_seconds,
                       policy versions, finish and stop reasons, entropy_mean and loop_start; extra
                       columns end_step, mean_logprob, tokens_before_resume, trained
    steps.parquet      the controller's step rows (rollout seconds, tokens, books, train_* metrics), and driver_seconds:
                       the part of each rollout the driver worked instead of waiting for the engine
    responses.parquet  the controller's response rows, plus the signals and the decoded response text
    meta.json          the run's setup, and its status: running / finished / failed / interrupted
    eval.parquet       the held-out evaluations (real_backend.evaluate; written by the run's Evaluator, not here)
    unfinished.parquet one row per response the controller still held unfinished after the step (lssim.analysis.fidelity's
                       UNFINISHED_COLUMNS, plus `held`): carried to resume next step, kept generating across the
                       step boundary (async), or a member of a group still open that has not ended. The trace has
                       no row for them (they never ended); the simulated twin needs them (fidelity.twin_trace).
                       Members of open groups that did end are in the trace already (trained False), so the two
                       files together hold every response the run started, each once. Its frame's attrs say
                       which step it was taken after (`after_step`; real_backend.sim_vs_real.load_recorded checks it).

so a crashed, interrupted or killed run (SIGKILL too: a file is renamed over the old one only once it is whole,
and a kill leaves at most a `.NAME.*.tmp` beside it, which the next run on the folder deletes) leaves a valid
trace of every step that finished. The files are written in the order above, meta.json last, and
unfinished.parquet first: a kill between two renames leaves trace.parquet (and unfinished.parquet) one step ahead
of steps.parquet / meta.json at most, never behind. unfinished.parquet goes first because one step ahead of the
trace it only misses responses (those it lists have not ended in either step), while one behind it would list
responses the newer trace has ended.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.run import UNFINISHED_COLUMNS, UNFINISHED_FILE
from lssim.loop.core import Request
from lssim.loop.signals import DEFAULT as DEFAULT_SIGNALS
from lssim.loop.signals import SignalSpec
from lssim.results import atomic_write
from lssim.traces.signal_trace import UNMEASURED, measure_response
from lssim.traces.trace import write_trace

FILES = ("trace.parquet", "steps.parquet", "responses.parquet", "meta.json")
CHECKPOINT = "checkpoint.pt"  # real_backend.checkpoint: written beside the files after every step
UNFINISHED = UNFINISHED_FILE  # unfinished.parquet: the responses held unfinished after the last step (optional to readers)
EVAL = "eval.parquet"  # real_backend.evaluate: the run's held-out evaluations (its Evaluator writes it)


def with_driver_seconds(steps: pd.DataFrame, engine) -> pd.DataFrame:
    """`steps` with `driver_seconds`: the seconds of each rollout the controller's thread did not wait for the engine
    (VLLMEngine.driver_seconds), the driver's own work; unchanged for an engine that cannot tell."""
    if steps.empty:
        return steps
    own = [engine.driver_seconds(start, end) for start, end in zip(steps["rollout_start"], steps["rollout_end"])]
    return steps if None in own else steps.assign(driver_seconds=own)


SIGNAL_COLUMNS = (("entropy_mean", math.nan), ("mean_logprob", math.nan), ("loop_start", -1), ("text", ""),
                  *UNMEASURED.items())  # the recorder's columns of responses.parquet, and each one's value unobserved


class SignalColumns:
    """The recorder's signal columns of the responses frame, kept between writes: the controller's frame grows by rows
    appended in order, so a write looks up and converts the rows added since the last one only (at 1,000 steps of 32
    responses: 0.03 s a write, where every row each time took 0.13-0.24 s). Everything is done again where the frame
    does not start with the rows kept, a response already kept was observed again, or a column's new rows convert to
    another dtype than its kept ones; the columns are those of looking up every row (the same values and dtypes)."""

    def __init__(self):
        self._forget()

    def _forget(self) -> None:
        self.rows = np.zeros((3, 0), dtype=np.int64)  # the kept rows' step, prompt_id and sample_idx
        self._kept: set[tuple[int, int, int]] = set()
        self.arrays: dict[str, np.ndarray] = {}
        self.stale = False

    def observed(self, key: tuple[int, int, int]) -> None:
        """A response's signals were written: rows kept for it are stale."""
        if key in self._kept:
            self.stale = True

    def restored(self) -> None:
        """Signals were restored from a checkpoint: every row kept is stale."""
        self.stale = True

    def columns(self, rows: np.ndarray, signals: dict) -> dict[str, np.ndarray | list]:
        """Each signal column for the frame's `rows` (3 x n: step, prompt_id, sample_idx), from `signals` (keyed by
        those three): an array, or the plain list where the frame has no rows (pandas gives an empty list its own
        dtype)."""
        n = self.rows.shape[1]
        if self.stale or rows.shape[1] < n or not np.array_equal(rows[:, :n], self.rows):
            self._forget()
            n = 0
        added = list(zip(*rows[:, n:].tolist()))
        self.rows = rows.copy()
        self._kept.update(added)
        if not rows.shape[1]:
            return {col: [] for col, _ in SIGNAL_COLUMNS}
        if not added:
            return self.arrays
        for col, default in SIGNAL_COLUMNS:
            new = [signals.get(k, {}).get(col, default) for k in added]
            chunk, kept = pd.Series(new).to_numpy(), self.arrays.get(col)
            self.arrays[col] = (chunk if kept is None or not n else np.concatenate([kept, chunk]) if chunk.dtype == kept.dtype
                                else pd.Series(kept.tolist() + new).to_numpy())  # the dtype every row's values give
        return self.arrays


class Recorder:
    def __init__(self, out_dir, decode: Callable[[list[int]], str] | None = None, meta: dict | None = None,
                 signal_spec: SignalSpec = DEFAULT_SIGNALS):
        self.out = Path(out_dir)
        self.decode = decode
        self.signal_spec = signal_spec  # the engine's: the trace's measured signals are what its policies read
        self.meta = {"status": "running", "steps_done": 0, **(meta or {})}
        self._signals: dict[tuple[int, int, int], dict] = {}
        self._columns = SignalColumns()
        self.controller = None
        self._started = time.time()
        self._writer = None  # a one-thread executor once write_in_background() was called
        self._pending = None  # its write under way

    # -- hooks -------------------------------------------------------------------------------------
    def observe(self, r: Request, what: str) -> None:
        """Engine observer: keep a response's signals when it ends (a carried one is overwritten later)."""
        n = r.generated
        lps = r.signals.get("logprobs", [])[:n]
        ents = r.signals.get("entropy") or []
        ents = ents[:n] if len(ents) >= n else [-x for x in lps]  # no exact entropies: -logprob estimates them
        tokens = list(r.tokens[:n]) if r.tokens is not None else []
        exact = r.signals.get("entropy") or None  # each position's exact entropy, when the engine returned them
        spec = SignalSpec(self.signal_spec.window_for(r.max_tokens), self.signal_spec.ngram)  # the engine's, for its budget
        measured = measure_response(tokens, lps, spec=spec, entropies=exact[:n] if exact else None)
        key = (r.step, r.prompt_id, r.sample_idx)
        self._columns.observed(key)
        self._signals[key] = {
            **measured,
            "entropy_mean": max(0.0, float(np.mean(ents))) if len(ents) else math.nan,
            "mean_logprob": float(np.mean(lps)) if len(lps) else math.nan,
            "loop_start": int(r.signals.get("loop_start", -1)),
            "text": self.decode(list(r.tokens[:n])) if self.decode and r.tokens is not None else "",
        }

    def attach(self, controller) -> None:
        """Record `controller`'s run: its files are rewritten at each step's row (add it as an observer: `on_step`)."""
        self.controller = controller

    def on_step(self, row: dict) -> None:
        """A step observer (lssim.loop.contracts.StepObserver): the files, rewritten with the step just recorded."""
        self.write()

    def signals(self) -> dict:
        """The per-response signals kept so far (a checkpoint keeps them)."""
        return dict(self._signals)

    def restore_signals(self, signals: dict) -> None:
        """The signals a checkpoint kept (`signals`), back in."""
        self._signals.update(signals)
        self._columns.restored()

    # -- files -------------------------------------------------------------------------------------
    def write(self) -> None:
        result = self.controller.result()
        responses, steps = self._responses(result.responses), with_driver_seconds(result.steps, self.controller.engine)
        # taken here, on the controller's thread, between steps: the requests go on changing once the next step runs
        unfinished = unfinished_frame(self.controller)
        self.meta["steps_done"] = len(steps)
        if self._writer is None:
            self._write_files(responses, steps, unfinished, json.dumps(self.meta, indent=2, default=_json_default))
            return
        self.flush()  # one write at a time, in order; an error of the last one is raised here
        text = json.dumps(self.meta, indent=2, default=_json_default)
        self._pending = self._writer.submit(self._write_files, responses, steps, unfinished, text)

    def write_in_background(self) -> None:
        """Write the files on a thread of their own from now on (the frames are taken on the caller's thread, the
        files written beside it): where training runs beside the rollout, the controller's thread must not stall on
        disk between steps, or the measured step times would hold the recorder's writes, which the simulator does not
        model. A kill while a write is under way loses that step's files only (each file is still renamed whole)."""
        from concurrent.futures import ThreadPoolExecutor

        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recorder")

    def flush(self) -> None:
        """Wait for the write under way (if any); raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _write_files(self, responses: pd.DataFrame, steps: pd.DataFrame, unfinished: pd.DataFrame, meta_text: str) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_unfinished(unfinished, self.out / UNFINISHED)  # first: see the module's docstring
        write_trace(to_trace(responses, steps), self.out / "trace.parquet")
        atomic_write(self.out / "steps.parquet", lambda p: steps.to_parquet(p, index=False))
        atomic_write(self.out / "responses.parquet", lambda p: responses.to_parquet(p, index=False))
        atomic_write(self.out / "meta.json", lambda p: Path(p).write_text(meta_text))

    def finish(self, status: str, error: str | None = None, **extra) -> None:
        """Record how the run ended (only if anything was written: a run that failed before its first
        step leaves no folder behind)."""
        try:
            self.flush()
        except Exception as e:  # a run that failed anyway keeps its own error; a finished one reports this one
            if status == "finished":
                raise
            self.meta["write_error"] = f"{type(e).__name__}: {e}"
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None
        self.meta.update(status=status, wall_seconds=time.time() - self._started, **extra)
        if error:
            self.meta["error"] = error
        if (self.out / "meta.json").exists():
            self._write_meta()

    def remove_stale(self) -> None:
        """Delete the files an older run left in the folder (its checkpoint too), so one run's files never mix
        with another's."""
        for name in (*FILES, UNFINISHED, CHECKPOINT, EVAL):
            try:
                (self.out / name).unlink()
            except FileNotFoundError:
                pass
        self.remove_partial()

    def remove_checkpoint(self) -> None:
        try:
            (self.out / CHECKPOINT).unlink()
        except FileNotFoundError:
            pass

    def remove_partial(self) -> None:
        """Delete the temporary files a killed writer left half-written (atomic_write's `.NAME.*.tmp`)."""
        if not self.out.is_dir():
            return
        for name in (*FILES, UNFINISHED, CHECKPOINT, EVAL):
            for tmp in self.out.glob(f".{name}.*.tmp"):
                try:
                    tmp.unlink()
                except FileNotFoundError:
                    pass

    def _write_meta(self) -> None:
        text = json.dumps(self.meta, indent=2, default=_json_default)
        atomic_write(self.out / "meta.json", lambda p: Path(p).write_text(text))

    def _responses(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        rows = np.vstack([df[c].to_numpy(np.int64) for c in ("step", "prompt_id", "sample_idx")]).reshape(3, len(df))
        for col, values in self._columns.columns(rows, self._signals).items():
            df[col] = values
        return df


def unfinished_frame(controller) -> pd.DataFrame:
    """The responses `controller` holds unfinished between steps, one row each (lssim.analysis.fidelity.UNFINISHED_COLUMNS
    and `held`: carried, kept or open group, where it was first found), in the order they were made (rid).

    Where the controller keeps them (lssim.loop.controller.Controller.held): carried, unfinished responses to resume
    next step (partial rollouts, collocated checkpoints hold the same list); kept, responses still generating in the
    engine across the step boundary (async); open group, every member of a group not yet complete, ended or not. A member that ended is in the response table (the trace) already and is left out here, so the trace
    and this frame never share a response. `generated` is what the controller has seen of it: for a request the
    engine still runs, the tokens of the last events it processed (what the next step would go on from).
    The frame's attrs hold `after_step`: the last step the controller finished (-1 before the first)."""
    seen: dict[int, tuple[str, Request]] = {}
    for label, held in controller.held().items():
        for r in held:
            if not r.done and r.rid not in seen:
                seen[r.rid] = (label, r)
    rows = [seen[rid] for rid in sorted(seen)]
    frame = pd.DataFrame({
        # UNFINISHED_COLUMNS are Request fields of the same names
        **{col: np.array([getattr(r, col) for _, r in rows], dtype=np.int64) for col in UNFINISHED_COLUMNS},
        "held": pd.Series([label for label, _ in rows], dtype=str),
    })
    step_rows = controller.step_rows
    frame.attrs["after_step"] = int(step_rows[-1]["step"]) if step_rows else -1
    return frame


def write_unfinished(frame: pd.DataFrame, path) -> None:
    """Write `unfinished_frame`'s frame to `path` atomically (beside, then renamed; a failed write leaves the old
    file, and no temporary one); its columns are checked first (ValueError naming the file and the column)."""
    missing = [c for c in UNFINISHED_COLUMNS if c not in frame]
    if missing:
        raise ValueError(f"{path}: unfinished responses lack column(s) {', '.join(missing)}")
    duplicated = frame.duplicated(subset=UNFINISHED_COLUMNS[:3])
    if duplicated.any():
        raise ValueError(f"{path}: response {tuple(frame.loc[duplicated.idxmax(), UNFINISHED_COLUMNS[:3]])} listed twice")
    atomic_write(path, lambda p: frame.to_parquet(p, index=False))


def to_trace(responses: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The lssim trace of a real run, from the controller's frames (plus the recorder's signal columns)."""
    rollout = dict(zip(steps["step"].tolist(), steps["rollout_seconds"].tolist()))
    train = dict(zip(steps["step"].tolist(), steps["train_seconds"].tolist()))
    step = responses["step"].astype("int64")
    trace = pd.DataFrame({
        "step": step,
        "prompt_id": responses["prompt_id"].astype("int64"),
        "sample_idx": responses["sample_idx"].astype("int64"),
        "prompt_len": responses["prompt_len"].astype("int64"),
        "response_len": responses["response_len"].astype("int64"),
        # A response that never finished (dropped, or stopped by a policy with no reward) has no reward: 0.
        "reward": responses["reward"].astype(float).fillna(0.0),
        "finish_reason": responses["finish_reason"].astype(str),
        "max_tokens": responses["max_tokens"].astype("int64"),
        "stop_reason": responses["stop_reason"].astype(str),
        "loop_start": responses.get("loop_start", pd.Series(-1, index=responses.index)).astype("int64"),
        "policy_version_first": responses["policy_version_first"].astype("int64"),
        "policy_version_last": responses["policy_version_last"].astype("int64"),
        "instance": responses["instance"].astype("int64").clip(lower=0),  # the rank it ran on (-1, an engine that does not say: 0)
        "submit_time": responses["submit_time"].astype(float),
        "first_token_time": responses["first_token_time"].astype(float),
        "finish_time": responses["finish_time"].astype(float),
        "step_rollout_seconds": step.map(rollout).astype(float),
        "step_train_seconds": step.map(train).astype(float),
        "entropy_mean": responses.get("entropy_mean", pd.Series(math.nan, index=responses.index)).astype(float),
        # the early-exit signals measured from the tokens (lssim.traces.signal_trace); a response with none recorded
        # (one the recorder did not observe) has signal_source '' and no values
        **{col: responses[col] if col in responses else [default] * len(responses) for col, default in UNMEASURED.items()},
        # extra columns (kept by lssim.traces.trace, not part of its schema)
        "end_step": responses["end_step"].astype("int64"),
        "mean_logprob": responses.get("mean_logprob", pd.Series(math.nan, index=responses.index)).astype(float),
        "tokens_before_resume": responses["tokens_before_resume"].astype("int64"),
        "trained": responses["trained"].astype(bool),
        # the training step that consumed the response (-1: never trained). `step` stays the step that admitted it
        # (the simulator's Workload answers a replay by it); in async modes the two differ, and the weight versions
        # that generated its first and last token are policy_version_first / policy_version_last.
        "train_step": responses["train_step"].astype("int64"),
        # the loader batch its group came from (-1: chosen by the policy); april submits batch k + 1's groups in step k
        "batch": responses.get("batch", pd.Series(-1, index=responses.index)).astype("int64"),
    })
    return trace




def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)
