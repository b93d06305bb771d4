"""Held-out evaluation of a real run, on the run's own vLLM engine (the weights the trainer just pushed).

    figures = evaluate(engine, prompts, prompt_ids, samples=4, max_tokens=256)   # pass1, greedy_accuracy, ...

The held-out prompts are real_backend/data/heldout.json's (task.heldout_split; TaskPrompts.heldout_ids): training
never draws them. Each evaluation samples `samples` responses per prompt at temperature 1.0 (pass@1: their mean
reward) and one greedy response (greedy accuracy), max_tokens as the run's; the sampler seeds are fixed, so two
evaluations of the same weights draw the same responses and evaluations along a run are paired.

`Evaluator` is a step observer of the run's controller (lssim.loop.contracts.StepObserver, added by
real_backend.world.run_real after the recorder and the caller's on_step): every `every` steps, and before the first
step and after the last, it evaluates and rewrites `eval.parquet` beside steps.parquet (atomically). Its time is
not in any step's seconds: the controller times a step from the end of the one before, so `discount` (an observer
told before the recorder) takes the evaluations since then out of the next step's `step_seconds` and says how long
they took in the row's `evaluation_seconds`. Columns (EVAL_COLUMNS):

    step             RL steps done when evaluated (0: before training)
    version          the engine's weights version
    train_seconds    the run's wall-clock so far without evaluations (the sum of its steps' step_seconds)
    wall_seconds     the run's wall-clock so far with them (this process's time since the run started, plus a
                     resumed run's earlier wall_seconds)
    pass1, greedy_accuracy, mean_length (sampled responses, tokens), truncation_rate (sampled responses cut at
    max_tokens), samples (sampled responses), prompts (held-out prompts), eval_seconds

In modes that keep responses generating across the step boundary (async), an evaluation between steps would share
the engine with them: it is skipped there (said on stderr) and done after the last step, once the engine is idle.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.loop.contracts import StepObserver
from lssim.loop.core import FINISHED, Request
from lssim.results import atomic_write

from .recorder import EVAL as EVAL_FILE

EVAL_COLUMNS = ("step", "version", "train_seconds", "wall_seconds", "pass1", "greedy_accuracy", "mean_length",
                "truncation_rate", "samples", "prompts", "eval_seconds")
EVAL_SEED = 1234  # the sampler seeds of every evaluation (paired evaluations)
_EVAL_RID = -(1 << 40)  # evaluation requests' ids: far below any run's (the controller counts from 0 up)


@dataclass(frozen=True)
class EvalSettings:
    """How a run evaluates: every `every` steps (0: never, not even before and after), `samples` responses per
    held-out prompt at temperature 1.0, the first `prompts` held-out prompts (None: all)."""

    every: int = 10
    samples: int = 4
    prompts: int | None = None
    seed: int = EVAL_SEED

    def check(self) -> None:
        if self.every < 0:
            raise ValueError(f"--eval-every must be >= 0 (0: no evaluation), got {self.every}")
        if self.samples < 1:
            raise ValueError(f"--eval-samples must be >= 1, got {self.samples}")
        if self.prompts is not None and self.prompts < 1:
            raise ValueError(f"--eval-prompts must be >= 1, got {self.prompts}")


@contextlib.contextmanager
def _sampling_at(engine, temperature: float):
    """The engine sampling at `temperature` (its own sampling settings put back after; the copy it keeps for that)."""
    saved = dict(engine.sampling_kwargs)
    engine.sampling_kwargs["temperature"] = temperature
    try:
        yield
    finally:
        engine.sampling_kwargs.clear()
        engine.sampling_kwargs.update(saved)


@contextlib.contextmanager
def _unobserved(engine):
    """The engine with no response observers (a run's recorder must not record evaluation responses)."""
    saved = list(engine.observers)
    engine.observers.clear()
    try:
        yield
    finally:
        engine.observers.extend(saved)


def evaluate(engine, prompts, prompt_ids: list[int], samples: int = 4, max_tokens: int = 256,
             seed: int = EVAL_SEED) -> dict:
    """Evaluate the engine's weights on `prompt_ids` (served and scored by `prompts`: the engine must serve them,
    run_real makes it): pass@1 over `samples` samples at temperature 1.0, greedy accuracy, mean sampled length,
    truncation rate of the sampled responses, and the seconds it took. Nothing else may be in flight."""
    t0 = time.monotonic()
    rid = iter(range(_EVAL_RID, 0))

    def request(pid: int, k: int) -> Request:
        return Request(rid=next(rid), group_id=-1, step=-1, prompt_id=pid, sample_idx=k,
                       prompt_len=prompts.prompt_len(pid), max_tokens=max_tokens, seed=seed + 7919 * pid + k)

    sampled = [request(pid, k) for pid in prompt_ids for k in range(samples)]
    greedy = [request(pid, 0) for pid in prompt_ids]
    with _unobserved(engine):
        with _sampling_at(engine, 1.0):
            engine.submit(sampled)
        with _sampling_at(engine, 0.0):
            engine.submit(greedy)
        try:
            ended = 0
            while ended < len(sampled) + len(greedy):
                events = engine.next_events()
                if not events:
                    raise RuntimeError("evaluation: the engine went idle before every evaluation response ended")
                ended += sum(ev.kind == FINISHED for ev in events)
        except BaseException:
            engine.abort_all()  # nothing of the evaluation left in flight on an engine that may serve on
            raise
    lengths = np.array([r.generated for r in sampled], dtype=float)
    return {"pass1": float(np.mean([r.reward for r in sampled])),
            "greedy_accuracy": float(np.mean([r.reward for r in greedy])),
            "mean_length": float(lengths.mean()),
            "truncation_rate": float(np.mean([r.finish_reason == "length" for r in sampled])),
            "samples": len(sampled), "prompts": len(prompt_ids), "eval_seconds": time.monotonic() - t0}


class Evaluator(StepObserver):
    """A run's held-out evaluations (module docstring): `start` before the first step, itself as a step observer,
    `finish` after the last step."""

    def __init__(self, settings: EvalSettings, out_dir, engine, prompts, controller, max_tokens: int, say=None):
        self.settings = settings
        self.path = Path(out_dir) / EVAL_FILE
        self.engine, self.prompts, self.controller, self.max_tokens = engine, prompts, controller, max_tokens
        ids = list(prompts.heldout_ids)
        self.prompt_ids = ids if settings.prompts is None else ids[:settings.prompts]
        if settings.every and not self.prompt_ids:
            raise ValueError("evaluation asked for (--eval-every > 0) but the run holds out no prompts (--no-heldout, "
                             "or a held-out file that names none of the prompts): pass --eval-every 0")
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self.rows: list[dict] = []
        self._t0 = time.monotonic()
        self._wall_before = 0.0  # a resumed run's wall-clock before this process
        self._unbilled = 0.0  # seconds of evaluation since the last step ended, which the next step's clock holds

    @property
    def on(self) -> bool:
        return self.settings.every > 0

    def start(self, first_step: int) -> None:
        """Before the run's first step: a resumed run keeps its evaluations up to `first_step` steps done; a new one
        evaluates its starting weights (step 0)."""
        if not self.on:
            return
        if first_step > 0 and self.path.exists():
            old = pd.read_parquet(self.path)
            self.rows = old[old["step"] <= first_step].to_dict("records")
            self._wall_before = max((r["wall_seconds"] for r in self.rows), default=0.0)
        if not any(r["step"] == first_step for r in self.rows):
            self._evaluate(first_step)

    def discount(self, row: dict) -> None:
        """A step observer told before the recorder: the evaluations since the step before are taken out of the step's
        `step_seconds` (the controller times a step from the end of the one before, so they would be in it)."""
        if self._unbilled:
            row["step_seconds"] -= self._unbilled
            row["evaluation_seconds"] = self._unbilled
            self._unbilled = 0.0

    def __call__(self, row: dict) -> None:
        done = int(row["step"]) + 1
        if self.on and done % self.settings.every == 0:
            self._evaluate(done)

    def finish(self) -> None:
        """After the last step: evaluate the final weights unless that was just done."""
        done = len(self.controller.step_rows)
        if self.on and not any(r["step"] == done for r in self.rows):
            self._evaluate(done, final=True)

    def latest(self) -> dict | None:
        return self.rows[-1] if self.rows else None

    def _evaluate(self, done: int, final: bool = False) -> None:
        if self.controller.kept and not final:
            self.say(f"evaluation after step {done} skipped: {len(self.controller.kept)} responses are generating "
                     f"across the step boundary")
            return
        figures = evaluate(self.engine, self.prompts, self.prompt_ids, self.settings.samples, self.max_tokens,
                           self.settings.seed)
        train = train_seconds(self.controller.step_rows)
        wall = self._wall_before + time.monotonic() - self._t0
        self._unbilled += figures["eval_seconds"]
        self.rows = [r for r in self.rows if r["step"] != done]
        self.rows.append({"step": done, "version": int(self.engine.weight_version), "train_seconds": train,
                          "wall_seconds": wall, **figures})
        frame = pd.DataFrame(self.rows, columns=list(EVAL_COLUMNS))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda p: frame.to_parquet(p, index=False))
        self.say(format_eval(self.rows[-1]))


def train_seconds(step_rows: list[dict]) -> float:
    """A run's wall-clock so far without evaluations: its steps' step_seconds summed."""
    return float(np.nansum([r.get("step_seconds", math.nan) for r in step_rows]))


def format_eval(row: dict) -> str:
    """One evaluation as a line beside the step lines."""
    return (f"  eval after {row['step']:>4} steps (weights v{row['version']}, train {row['train_seconds']:.0f} s): "
            f"pass@1 {row['pass1']:.3f}, greedy {row['greedy_accuracy']:.3f}, mean len {row['mean_length']:.0f}, "
            f"truncated {row['truncation_rate']:.1%} ({row['prompts']} prompts x {row['samples'] // max(row['prompts'], 1)}, "
            f"{row['eval_seconds']:.1f} s)")


def load_eval(run_dir) -> pd.DataFrame:
    """A run's eval.parquet (an empty frame with its columns if there is none)."""
    path = Path(run_dir) / EVAL_FILE
    return pd.read_parquet(path) if path.exists() else pd.DataFrame(columns=list(EVAL_COLUMNS))


__all__ = ["EvalSettings", "Evaluator", "evaluate", "format_eval", "load_eval", "train_seconds", "EVAL_FILE", "EVAL_COLUMNS"]
