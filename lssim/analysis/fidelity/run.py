"""A run recorded by the real backend, read back (`load_run`), and its simulated twin: the trace the twin replays
(`twin_trace`, with the run's unfinished responses) and the replay itself (`replay_run`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
import json
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.loop.controller import RunConfig, RunResult
from lssim.traces.trace import load_trace


RUN_FILES = ("trace.parquet", "steps.parquet", "responses.parquet", "meta.json")
KEY = ["step", "prompt_id", "sample_idx"]
# A response the run left unfinished at its end: its key, group, prompt, its tokens so far (`generated`, of which
# `tokens_before_resume` came in earlier steps) and its budget.
UNFINISHED_COLUMNS = [*KEY, "group_id", "prompt_len", "generated", "tokens_before_resume", "max_tokens"]
UNFINISHED_FILE = "unfinished.parquet"  # where a run folder may keep them (load_run reads it if present)
UNFINISHED_AT_END = "unfinished at run end"  # the stop_reason of their rows in the twin's trace


@dataclass
class RecordedRun:
    """A run recorded by the real backend (real_backend.recorder): its trace, step and response rows, and meta."""

    name: str  # the policy spec it ran, e.g. "hadb" or "april(ratio=0.5)"
    trace: pd.DataFrame
    steps: pd.DataFrame
    responses: pd.DataFrame
    config: RunConfig
    meta: dict = field(default_factory=dict)
    folder: str = ""
    # Responses still generating when the run ended (carried out of its last step): UNFINISHED_COLUMNS, one row each.
    # Neither the trace nor the response table has a row for them (they never ended); the simulated twin needs
    # them (`twin_trace`). Empty when the run left nothing unfinished or its recorder could not say.
    unfinished: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=UNFINISHED_COLUMNS))


def load_run(folder) -> RecordedRun:
    """Read a run folder; ValueError naming the folder and what is missing or wrong."""
    folder = Path(folder)
    missing = [f for f in RUN_FILES if not (folder / f).is_file()]
    if missing:
        raise ValueError(f"{folder}: not a recorded run (missing {', '.join(missing)}; `lssim real --out {folder}` writes them)")
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{folder / 'meta.json'}: not valid JSON ({e})") from None
    for key in ("config", "policy"):
        if key not in meta:
            raise ValueError(f"{folder / 'meta.json'}: no {key!r} (was it written by `lssim real`?)")
    names = {f.name for f in fields(RunConfig)}
    config = RunConfig(**{k: v for k, v in meta["config"].items() if k in names})
    steps = pd.read_parquet(folder / "steps.parquet")
    if steps.empty:
        raise ValueError(f"{folder}: the run recorded no finished step")
    run = RecordedRun(name=meta.get("policy_spec") or meta["policy"], trace=load_trace(folder / "trace.parquet"),
                      steps=steps, responses=pd.read_parquet(folder / "responses.parquet"), config=config, meta=meta,
                      folder=str(folder))
    if (folder / UNFINISHED_FILE).is_file():  # optional: real_backend.recorder writes it; older folders lack it
        run.unfinished = pd.read_parquet(folder / UNFINISHED_FILE)
    return run


def replay_run(run: RecordedRun, setup, prompts, trace: pd.DataFrame | None = None, policy=None,
               steps: int | None = None) -> RunResult:
    """Simulate `run` again: the same policy (a fresh object from its spec), config, seeds and data loader
    (`prompts`, a fresh PromptSource equal to the one the run drew from), on `setup` (lssim.analysis.replay.SimSetup).
    `trace` (default: the run's own) is where the Workload takes responses from: another run's trace makes
    it a counterfactual prediction, as when a baseline trace is replayed under a new policy. `steps`: run this many
    steps instead of the run's own."""
    from lssim.loop.policy import Policy, make_policy
    from lssim.analysis.replay import simulate
    from lssim.traces.workload import Workload

    workload = Workload(twin_trace(run) if trace is None else trace, seed=run.config.seed)
    config = RunConfig(**{f.name: getattr(run.config, f.name) for f in fields(RunConfig)})
    config.steps = steps or len(run.steps)  # by default what the real run got through (it may have been cut short)
    built = policy if isinstance(policy, Policy) else make_policy(policy or run.name)
    return simulate(workload, built, setup, config=config, prompts=prompts)


def twin_trace(run: RecordedRun) -> pd.DataFrame:
    """The trace the simulated twin of `run` replays: the run's own, plus one row for each response the run left
    unfinished at its end (`run.unfinished`), censored where the run stopped watching it: recorded up to its
    `generated` tokens with that as its budget (finish_reason length), which the Workload reads as "natural length
    beyond this" -- asked with the real budget, it runs on past where the real run left it (a longer response of
    its prompt, else to the budget), so the twin's last step carries it out too.

    Without these rows the trace has holes where the long responses were, and the twin fills them from the
    members that did end: short ones, so it finished groups the real run left open (segment in the tail world:
    40 groups trained in the twin against 35 on vLLM, the speedup +45 points off, issue 16). The Workload also
    numbers a (step, prompt)'s samples by position, so a hole shifted the later samples' lengths by one."""
    u = run.unfinished
    if u is None or u.empty:
        return run.trace
    missing = [c for c in UNFINISHED_COLUMNS if c not in u]
    if missing:
        raise ValueError(f"{run.folder or run.name}: unfinished responses lack column(s) {', '.join(missing)}")
    ended = run.trace[KEY].merge(u[KEY], on=KEY)
    if len(ended):
        raise ValueError(f"{run.folder or run.name}: {len(ended)} response(s) both ended in the trace and left unfinished, "
                         f"first {tuple(ended.iloc[0])}")
    low = float(np.nanmin(run.trace["reward"])) if run.trace["reward"].notna().any() else 0.0
    n = len(u)
    rows = pd.DataFrame({**{c: u[c].to_numpy(np.int64) for c in [*KEY, "group_id", "prompt_len", "tokens_before_resume"]},
                         "response_len": u["generated"].to_numpy(np.int64), "max_tokens": u["generated"].to_numpy(np.int64),
                         "reward": np.full(n, low), "finish_reason": ["length"] * n, "stop_reason": [UNFINISHED_AT_END] * n,
                         "trained": np.zeros(n, bool)})
    for col in ("loop_start", "entropy_collapse_start", "instance", "policy_version_first", "policy_version_last",
                "end_step", "train_step"):
        if col in run.trace:
            rows[col] = -1 if col != "end_step" else int(run.steps["step"].max())
    for col, value in _unfinished_signals(run.trace).items():
        rows[col] = [value] * n
    out = pd.concat([run.trace, rows[[c for c in rows if c in run.trace]]], ignore_index=True)  # the trace's columns
    for col in run.trace.columns:  # the trace's dtypes (the rows' NaNs where it has a column they do not)
        if out[col].dtype != run.trace[col].dtype and not out[col].isna().any():
            out[col] = out[col].astype(run.trace[col].dtype)
    return out


def _unfinished_signals(trace: pd.DataFrame) -> dict:
    """The signal columns of an unfinished response's row where the trace measured its responses' signals: measured,
    at the trace's window, n-gram and stride, with no value yet (the run never stopped it, so its twin reads no loop
    in it); none for a trace that measured none (its rows' columns as before)."""
    from lssim.traces.signal_trace import UNMEASURED

    if "signal_source" not in trace or not (trace["signal_source"] == "measured").any():
        return {}
    first = trace[trace["signal_source"] == "measured"].iloc[0]
    return {**UNMEASURED, "signal_source": "measured", **{c: first[c] for c in ("signal_window", "signal_ngram", "signal_stride")}}


def ends_rollouts(spec: str) -> bool:
    """Whether the policy decides when a rollout ends (april, rollpacker, ...): where the real engine cuts is
    then a wall-clock event the simulator predicts, not replays."""
    from lssim.loop.policy import make_policy

    return make_policy(spec).overrides("end_rollout")


def with_real_cuts(run: RecordedRun):
    """The run's policy (a fresh object from its spec) with one change: each step's rollout ends when every
    response the real run ended in that step has ended in the simulation, instead of when the policy says; the
    policy's other decisions are its own. Replayed (`replay_run(run, setup, prompts, policy=with_real_cuts(run))`),
    it prices the work the real engine did before its cut: the error left is the cost model's, and the rest of
    the policy's per-step error is where the simulated clock put the cut (the abort time and what was carried)."""
    from lssim.loop.policy import Compose, make_policy

    ended: dict[int, set] = {}
    for key in run.responses[["end_step", *KEY]].itertuples(index=False):
        ended.setdefault(int(key[0]), set()).add(tuple(int(v) for v in key[1:]))

    class RealCuts(Compose):
        def __init__(self):
            super().__init__([make_policy(run.name)])
            self.name, self._done = run.name, set()  # every response ended so far (some end a step early here)

        def overrides(self, hook):
            return hook in ("end_rollout", "on_finish") or super().overrides(hook)

        def on_finish(self, request, state):
            self._done.add((request.step, request.prompt_id, request.sample_idx))
            super().on_finish(request, state)

        def end_rollout(self, state):
            # The real cut: once the responses it ended have ended here, or as many (after an earlier step's cut
            # fell elsewhere, the same set may never end in one step here).
            want = ended.get(state.step)
            return bool(want) and (want <= self._done or state.responses_done >= len(want))

    return RealCuts()
