"""Fidelity: how far the simulator's prediction of a real run is from what the run measured.

    run = load_run("runs/validate/real/hadb")                 # a folder written by `lssim real`
    sim = replay_run(run, setup, prompts)                     # same policy, seeds, config, data loader
    steps, responses = compare(run, sim)                      # per step and per response, predicted vs measured
    steps, noise = median_over_repeats(steps.assign(repeat=0))  # with repeats: per-step medians and their spread
    table = fidelity_table(steps, responses)                  # per policy: APE of makespan, finish order, tokens

The comparisons are plain frames; `real_backend/sim_vs_real.py` (`lssim validate`) records the runs,
replays them and prints these tables. Nothing here needs vLLM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
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
# What `lssim validate` is judged against (lssim.analysis.tables.format_fidelity prints each beside its measure): the
# per-step makespan's median and p90 absolute percentage error, and the speedup over baseline, in points.
TARGET_MEDIAN_PCT, TARGET_P90_PCT, TARGET_SPEEDUP_POINTS = 3.0, 8.0, 5.0


def step_errors_within_goal(median_pct, p90_pct):
    """Whether per-step errors (a median and a p90, in %; numbers or columns) are within the goal."""
    return (median_pct <= TARGET_MEDIAN_PCT) & (p90_pct <= TARGET_P90_PCT)


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


def replay_run(run: RecordedRun, setup, prompts, trace: pd.DataFrame | None = None, policy=None) -> RunResult:
    """Simulate `run` again: the same policy (a fresh object from its spec), config, seeds and data loader
    (`prompts`, a fresh PromptSource equal to the one the run drew from), on `setup` (lssim.analysis.replay.SimSetup).
    `trace` (default: the run's own) is where the Workload takes responses from: another run's trace makes
    it a counterfactual prediction, as when a baseline trace is replayed under a new policy."""
    from lssim.loop.policy import Policy, make_policy
    from lssim.analysis.replay import simulate
    from lssim.traces.workload import Workload

    workload = Workload(twin_trace(run) if trace is None else trace, seed=run.config.seed)
    config = RunConfig(**{f.name: getattr(run.config, f.name) for f in fields(RunConfig)})
    config.steps = len(run.steps)  # what the real run got through (it may have been cut short)
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
    out = pd.concat([run.trace, rows[[c for c in rows if c in run.trace]]], ignore_index=True)  # the trace's columns
    for col in run.trace.columns:  # the trace's dtypes (the rows' NaNs where it has a column they do not)
        if out[col].dtype != run.trace[col].dtype and not out[col].isna().any():
            out[col] = out[col].astype(run.trace[col].dtype)
    return out


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



def compare(run: RecordedRun, sim: RunResult, policy: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Step by step and response by response, measured (the run) against predicted (the simulation).

    Steps: measured/predicted rollout seconds, their absolute percentage error, tokens, and the step's
    finish-order agreement (Spearman rank correlation of finish times over the responses both ended
    in that step). Responses: each one both worlds ended, with its measured and predicted finish time
    and length."""
    name = policy or run.name
    real_s, sim_s = run.steps, sim.steps
    steps = pd.DataFrame({"step": real_s["step"].to_numpy()})
    steps["measured_seconds"] = real_s["rollout_seconds"].to_numpy(float)
    predicted = sim_s.set_index("step")["rollout_seconds"]
    steps["predicted_seconds"] = steps["step"].map(predicted).to_numpy(float)
    steps["ape_pct"] = _ape_pct(steps["predicted_seconds"], steps["measured_seconds"])
    steps["measured_tokens"] = real_s["tokens"].to_numpy()
    steps["predicted_tokens"] = steps["step"].map(sim_s.set_index("step")["tokens"]).to_numpy()
    steps["exact_fraction"] = steps["step"].map(sim_s.set_index("step")["exact_fraction"]).to_numpy(float)
    # the driver's own part of each real rollout (real_backend.recorder; NaN where the run did not record it)
    steps["measured_driver_seconds"] = (real_s["driver_seconds"].to_numpy(float) if "driver_seconds" in real_s
                                        else np.full(len(steps), np.nan))

    cols = KEY + ["end_step", "response_len", "finish_time", "finish_reason"]
    responses = run.responses[cols].merge(sim.responses[cols], on=KEY, suffixes=("_measured", "_predicted"))
    responses.insert(0, "policy", name)
    same_step = responses["end_step_measured"] == responses["end_step_predicted"]
    rho = {}
    for step, g in responses[same_step].groupby("end_step_measured"):
        if len(g) >= 3 and g["finish_time_measured"].nunique() > 1 and g["finish_time_predicted"].nunique() > 1:
            rho[step] = float(g["finish_time_measured"].rank().corr(g["finish_time_predicted"].rank()))
    steps["finish_order_spearman"] = steps["step"].map(rho).astype(float)
    steps.insert(0, "policy", name)
    return steps, responses


def instance_last_finish(responses: pd.DataFrame) -> pd.Series:
    """Each instance's last finish in each step, indexed by (step, instance): by the step each response ended in;
    unfinished ones, and ones that never ran on an instance (-1), have no say."""
    ended = responses[responses["finish_time"].notna() & (responses["instance"] >= 0)]  # -1: never on an engine
    if "end_step" in ended:
        ended = ended.assign(step=ended["end_step"])
    return ended.groupby(["step", "instance"])["finish_time"].max()


def admission_seconds(responses: pd.DataFrame) -> pd.Series:
    """Per step (the step each response ended in): seconds from the step's first submission until every request
    submitted before its first token had its own first token. The serving front end takes a step's opening requests
    one by one (real_backend/README.md, "Fidelity"), so this phase grows with how many a step submits at once, which
    a policy sets (april over-provisions, segment resumes the carried ones) and the twin prices as one prefill.
    Only responses that ended in the step have a say (one aborted there and resumed later is counted where it ends)."""
    if not {"submit_time", "first_token_time"} <= set(responses.columns):  # a trace without timings: nothing to say
        return pd.Series(dtype=float, name="admission_seconds")
    ended = responses[responses["first_token_time"].notna() & responses["submit_time"].notna()]
    if "end_step" in ended:
        ended = ended.assign(step=ended["end_step"])
    opening = ended[ended["submit_time"] <= ended.groupby("step")["first_token_time"].transform("min")]
    by_step = opening.groupby("step")
    return (by_step["first_token_time"].max() - by_step["submit_time"].min()).rename("admission_seconds")


def instance_phases(responses: pd.DataFrame) -> pd.DataFrame:
    """Per step of a run (a trace, or a simulation's responses): how long the step kept every instance it used busy,
    and how long one ran on alone after that. Rows: step, instances (that ran one of the responses the step ended),
    shared_seconds (to the earliest of those instances' last finish: the part of the rollout where instances that
    share a host slow each other down), tail_seconds (from there to the step's last finish: the instances that
    finished early wait; 0 with one instance), from instance_last_finish; and admission_seconds (admission_seconds:
    the opening, inside the shared part)."""
    last = instance_last_finish(responses).groupby("step")
    out = pd.DataFrame({"instances": last.size(), "shared_seconds": last.min(), "last": last.max()})
    out["tail_seconds"] = out.pop("last") - out["shared_seconds"]
    out["admission_seconds"] = admission_seconds(responses).reindex(out.index)
    return out.reset_index()


def compare_phases(run: RecordedRun, sim: RunResult, policy: str | None = None) -> pd.DataFrame:
    """instance_phases of the run and of its simulated twin, step by step: measured_/predicted_ shared and tail
    seconds, and measured_/predicted_instances. Where a twin of several instances is off: in the part where they
    share the host, or in the tail one instance runs alone (lssim.sim.shared_host prices them with s_2 and s_1)."""
    both = instance_phases(run.trace).merge(instance_phases(sim.responses), on="step", suffixes=("_measured", "_predicted"))
    both = both.rename(columns=lambda c: "_".join(reversed(c.rsplit("_", 1))) if c != "step" else c)
    both.insert(0, "policy", policy or run.name)
    # the driver's own share of each real rollout (real_backend.recorder's driver_seconds; NaN where not recorded)
    steps = run.steps.set_index("step")
    driver = steps["driver_seconds"] if "driver_seconds" in steps else pd.Series(np.nan, index=steps.index)
    both["measured_driver_share"] = both["step"].map(driver / steps["rollout_seconds"]).astype(float)
    return both


def phases_table(phases: pd.DataFrame) -> pd.DataFrame:
    """compare_phases rows (a `repeat` column: each repeat against its own twin) per policy: the median over steps
    of the shared part's measured / predicted ratio, the tail's and the admission's median measured and predicted
    seconds, the rest of the step after the admission (its generation: shared part and tail) as a measured / predicted
    ratio, and the most instances a step used."""
    per_step = phases.groupby(["policy", "step"], sort=False).median(numeric_only=True)
    per_step["shared_ratio"] = per_step["measured_shared_seconds"] / per_step["predicted_shared_seconds"]
    rest = {w: per_step[f"{w}_shared_seconds"] + per_step[f"{w}_tail_seconds"] - per_step[f"{w}_admission_seconds"]
            for w in ("measured", "predicted")}
    per_step["generation_ratio"] = rest["measured"] / rest["predicted"]
    cols = ["shared_ratio", "measured_shared_seconds", "predicted_shared_seconds", "measured_tail_seconds", "predicted_tail_seconds",
            "measured_admission_seconds", "predicted_admission_seconds", "generation_ratio"]
    if "measured_driver_share" in per_step:
        cols.append("measured_driver_share")
    table = per_step.groupby("policy", sort=False)[cols].median()
    table["instances"] = per_step.groupby("policy", sort=False)["measured_instances"].max()
    table["steps"] = per_step.groupby("policy", sort=False).size()
    return table


def phases_markdown(phases: pd.DataFrame) -> str:
    """phases_table as the markdown sections `lssim validate` adds to fidelity.md: every policy's admission against
    the rest of its steps; for worlds of several instances, the shared part and the tail."""
    t = phases_table(phases)
    level = ("measured / predicted (`lssim validate`: the twin at each run's probed speed level where every run of the "
             "world was probed; ratios are the median of the steps' ratios)")
    lines = ["", "Where each step's time went (median over steps): the admission (from the step's first submission until "
             "every request submitted before its first token had one: the front end takes them one by one, the twin as one "
             f"prefill; lssim.analysis.fidelity.admission_seconds) and the generation after it, {level}.", "",
             "The driver's share is the part of each real rollout the driver worked on its own thread instead of waiting "
             "for the engine (the controller, the policy, rewards, submit and abort calls; real_backend.recorder's "
             "driver_seconds): the twin prices none of it, and on a host whose cores the driver shares with the engine it "
             "is time the engine loses.", "",
             "| policy | admission: measured / predicted s | generation: measured / predicted | driver's share | steps |",
             "|---|---|---|---|---|"]
    for name, r in t.iterrows():
        share = r.get("measured_driver_share", np.nan)
        lines.append(f"| `{name}` | {r.measured_admission_seconds:.3f} / {r.predicted_admission_seconds:.3f} | "
                     f"{r.generation_ratio:.3f} | {'-' if share != share else f'{share:.1%}'} | {int(r.steps)} |")
    several = t[t["instances"] > 1]
    if len(several):
        lines += ["", "Worlds of several instances, where the step's time went (median over steps): the shared part (every "
                  "instance the step used still busy: lssim.sim.shared_host prices it with s_2) and the tail one instance runs "
                  f"alone (s_1), {level}.", "",
                  "| policy | shared part: measured / predicted s (ratio) | tail: measured / predicted s | steps |", "|---|---|---|---|"]
        for name, r in several.iterrows():
            lines.append(f"| `{name}` | {r.measured_shared_seconds:.3f} / {r.predicted_shared_seconds:.3f} ({r.shared_ratio:.3f}) | "
                         f"{r.measured_tail_seconds:.3f} / {r.predicted_tail_seconds:.3f} | {int(r.steps)} |")
    return "\n".join(lines) + "\n"


def _ape_pct(predicted: pd.Series, measured: pd.Series) -> pd.Series:
    """Absolute percentage error of `predicted` against `measured`."""
    return (predicted - measured).abs() / measured * 100


def median_over_repeats(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-step rows of several recordings of each policy (`compare` frames concatenated, a `repeat` column),
    each repeat predicted from its own trace, reduced to one row per policy and step: the median measured and
    the median predicted seconds. A policy whose decisions depend on wall time (april stops at a count of
    finished groups) makes other tokens in each repeat, so the two medians are taken apart, not per response.

    Also returns the spread: each repeat's measured seconds against its step's median, the run-to-run timing
    noise of the machine (for timing-dependent policies, schedule changes too) that no model can predict."""
    cols = ["measured_seconds", "predicted_seconds", "measured_tokens", "predicted_tokens", "exact_fraction",
            "finish_order_spearman"] + [c for c in ("measured_driver_seconds",) if c in steps]
    median = steps.groupby(["policy", "step"], sort=False)[cols].median().reset_index()
    median["ape_pct"] = _ape_pct(median["predicted_seconds"], median["measured_seconds"])
    median["repeats"] = steps.groupby(["policy", "step"], sort=False).size().to_numpy()
    spread = steps[["policy", "repeat", "step", "measured_seconds"]].merge(
        median[["policy", "step", "measured_seconds"]].rename(columns={"measured_seconds": "median_seconds"}), on=["policy", "step"])
    spread["ape_pct"] = _ape_pct(spread["measured_seconds"], spread["median_seconds"])
    return median, spread


MAX_REPEATS_SEARCHED = 60  # noise_floor's repeats_for_goal looks no further


def noise_floor(steps_by_repeat: pd.DataFrame, draws: int = 2000, seed: int = 0, search: bool = True) -> pd.DataFrame:
    """Per policy: the step error an EXACT model would show against these repeats, from the real engine's
    run-to-run noise alone: how well the goal can be tested at all on this machine with this many repeats.

    The per-step median of k repeats is itself a noisy measurement. The noise is taken from the differences between
    repeats of a step (in log seconds, over sqrt(2), pooled over the policy's steps: 100-200 values with 5 repeats,
    so the stalls in the tail are in the pool) and resampled k at a time per step, `draws` times; an exact model's
    error on a step is then the distance of the resampled median from the truth.

    Columns: noise_floor_median_pct / noise_floor_p90_pct (the typical median and p90 over the steps of that
    error), noise_bound_median_pct / noise_bound_p90_pct (their 95th percentiles: a model whose errors lie within
    both cannot be told from an exact one), and repeats_for_goal (the fewest repeats at which an exact model's
    typical errors meet the goal; NaN beyond MAX_REPEATS_SEARCHED, and not searched with `search=False`, as the stop rule
    that reads only the floor asks). One repeat has no spread: NaN."""
    rng = np.random.default_rng(seed)
    rows = {}
    for name, s in steps_by_repeat.groupby("policy", sort=False):
        table = _step_table(s)
        k, n_steps = table.shape[1], table.shape[0]
        residuals = _repeat_noise(table)
        if k < 2 or residuals.size == 0:
            rows[name] = {"noise_floor_median_pct": np.nan, "noise_floor_p90_pct": np.nan, "noise_bound_median_pct": np.nan,
                          "noise_bound_p90_pct": np.nan, "repeats_for_goal": np.nan}
            continue

        def exact_errors(repeats: int) -> tuple[np.ndarray, np.ndarray]:
            medians = np.median(rng.choice(residuals, size=(draws, n_steps, repeats)), axis=2)
            ape = np.abs(np.expm1(-medians)) * 100  # truth against a measured median exp(m) times the truth
            return np.median(ape, axis=1), np.percentile(ape, 90, axis=1)

        def typically_meets_goal(repeats: int) -> bool:
            med, p90 = exact_errors(repeats)
            return bool(step_errors_within_goal(np.median(med), np.median(p90)))

        med, p90 = exact_errors(k)
        needed = next((r for r in range(2, MAX_REPEATS_SEARCHED + 1) if typically_meets_goal(r)), np.nan) if search else np.nan
        rows[name] = {"noise_floor_median_pct": float(np.median(med)), "noise_floor_p90_pct": float(np.median(p90)),
                      "noise_bound_median_pct": float(np.percentile(med, 95)), "noise_bound_p90_pct": float(np.percentile(p90, 95)),
                      "repeats_for_goal": needed}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "policy"
    return out


def _step_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One policy's measured seconds, a step x repeat table."""
    return rows.pivot_table(index="step", columns="repeat", values="measured_seconds", aggfunc="first")


def _repeat_noise(table: pd.DataFrame) -> np.ndarray:
    """The real engine's run-to-run noise in a step x repeat table of seconds, as log-seconds draws pooled over its
    steps. The noise itself, not deviations from the step's own median (those are shrunk, one in k is 0, and would
    put the floor ~3x too low): every difference of two repeats of a step, over sqrt(2), has the noise's spread."""
    logs = np.log(table.to_numpy(dtype=float))
    i, j = np.triu_indices(logs.shape[1], 1)
    residuals = ((logs[:, i] - logs[:, j]) / np.sqrt(2)).ravel()
    residuals = np.concatenate([residuals, -residuals])  # either repeat could have come first
    return residuals[np.isfinite(residuals)]


def _world_of(rows: pd.DataFrame) -> pd.Series:
    """Each row's world: its world column, else what follows the last '@' of its policy (`lssim validate` names a
    world's baseline baseline@world, and the stop rule every policy name@world), else one world for all."""
    if "world" in rows:
        return rows["world"].astype(str)
    name = rows["policy"].astype(str)
    return name.where(name.str.contains("@"), "@").str.rsplit("@", n=1).str[-1]


def speedup_noise_floor(steps_by_repeat: pd.DataFrame, speedups=None, repeats: int | None = None,
                        draws: int = 2000, seed: int = 0, search: bool = True) -> pd.DataFrame:
    """Per policy (not a baseline): the speedup error, in points, an EXACT model would show against these repeats,
    from the real engine's run-to-run noise alone: whether a speedup error can be told from noise at all.

    The measured speedup is the world's baseline over the policy, each the sum of its per-step medians of k repeats;
    both sums are noisy. Each policy's noise is `noise_floor`'s (differences between repeats of a step, pooled), and
    both are resampled k at a time per step, `draws` times; an exact model's error is then the distance of the
    resampled speedup from the truth, in points of the measured speedup (`speedups`: policy -> the reported speedup,
    e.g. per trained group; default: the ratio of the per-step medians' sums). `repeats`: resample as if that many
    had been recorded (default: those recorded). The baseline of a world is its policy named baseline or
    baseline@<world> (`_world_of`); a world without one has no rows.

    Columns: speedup_noise_floor_points (the typical error: median over the draws), speedup_noise_bound_points (its
    95th percentile: a speedup error within it cannot be told from an exact model's) and repeats_for_speedup_goal
    (the fewest repeats at which the typical error is within TARGET_SPEEDUP_POINTS; NaN beyond MAX_REPEATS_SEARCHED, and
    not searched with `search=False`). Under two repeats of either policy: NaN."""
    rng = np.random.default_rng(seed)
    speedups = dict(speedups or {})
    rows = {}
    frame = steps_by_repeat.assign(_world=_world_of(steps_by_repeat))
    for _, in_world in frame.groupby("_world", sort=False):
        tables = {name: _step_table(s) for name, s in in_world.groupby("policy", sort=False)}
        references = [n for n in tables if str(n) == "baseline" or str(n).startswith("baseline@")]
        if len(references) != 1:
            continue
        base = tables[references[0]]
        for name, table in tables.items():
            if name == references[0]:
                continue
            steps = table.index.intersection(base.index)
            pol, ref = table.loc[steps], base.loc[steps]
            noise_p, noise_r = _repeat_noise(pol), _repeat_noise(ref)
            if min(pol.shape[1], ref.shape[1]) < 2 or noise_p.size == 0 or noise_r.size == 0 or len(steps) == 0:
                rows[name] = {"speedup_noise_floor_points": np.nan, "speedup_noise_bound_points": np.nan,
                              "repeats_for_speedup_goal": np.nan}
                continue
            m_pol, m_ref = pol.median(axis=1).to_numpy(float), ref.median(axis=1).to_numpy(float)
            speedup = float(speedups.get(name, m_ref.sum() / m_pol.sum()))

            def errors(k: int) -> np.ndarray:
                def resampled(medians, noise):  # the sum of k-repeat medians over the true sum
                    draw = np.median(rng.choice(noise, size=(draws, len(medians), k)), axis=2)
                    return (medians * np.exp(draw)).sum(axis=1) / medians.sum()
                return np.abs(resampled(m_ref, noise_r) / resampled(m_pol, noise_p) - 1) * speedup * 100

            err = errors(repeats or min(pol.shape[1], ref.shape[1]))
            needed = next((k for k in range(2, MAX_REPEATS_SEARCHED + 1)
                           if np.median(errors(k)) <= TARGET_SPEEDUP_POINTS), np.nan) if search else np.nan
            rows[name] = {"speedup_noise_floor_points": float(np.median(err)),
                          "speedup_noise_bound_points": float(np.percentile(err, 95)), "repeats_for_speedup_goal": needed}
    out = pd.DataFrame.from_dict(rows, orient="index", columns=["speedup_noise_floor_points", "speedup_noise_bound_points",
                                                                "repeats_for_speedup_goal"])
    out.index.name = "policy"
    return out


FINISH_QUANTILES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


def finish_profile(responses: pd.DataFrame, quantiles=FINISH_QUANTILES) -> pd.DataFrame:
    """Where in a step the twin runs fast or slow: per policy, the median of measured over predicted finish time of
    the responses whose measured finish lies in each quantile band of their step's finish times (`validate`'s
    responses frame: both worlds ended them in the same step). A flat row is a speed level; a hump is a phase of the
    step the cost model misprices (the first quarter, the bulk, the tail)."""
    r = responses[(responses["end_step_measured"] == responses["end_step_predicted"])
                  & (responses["finish_time_measured"] > 0) & (responses["finish_time_predicted"] > 0)]
    keys = ["policy", "repeat", "step"] if "repeat" in r else ["policy", "step"]
    r = r.assign(rank=r.groupby(keys)["finish_time_measured"].rank(pct=True),
                 ratio=r["finish_time_measured"] / r["finish_time_predicted"])
    bands = pd.cut(r["rank"], list(quantiles), include_lowest=True,
                   labels=[f"{a:.0%}-{b:.0%}" for a, b in zip(quantiles[:-1], quantiles[1:])])
    out = r.groupby(["policy", bands.rename("finish band")], observed=True, sort=False)["ratio"].median().unstack()
    out.columns = out.columns.astype(str)
    return out


def anchor_on_baseline(steps: pd.DataFrame, reference: str = "baseline") -> pd.DataFrame:
    """Per-repeat `compare` rows with every prediction scaled by the machine's speed during the recordings:
    the median, over the reference policy's steps (all repeats), of measured over predicted seconds. What is
    left is the model's shape; the drift in the VM's speed between profiling and recording (about 5% either way
    here) is gone. A median over many steps, not one run's sum: single steps of this VM run 20-30% slow. The
    reference is then calibrated, not predicted, so its rows are dropped."""
    ref = steps[steps["policy"] == reference]
    if ref.empty:
        raise ValueError(f"no {reference!r} runs to anchor the machine's speed on")
    factor = float((ref["measured_seconds"] / ref["predicted_seconds"]).median())
    out = steps[steps["policy"] != reference].copy()
    out["predicted_seconds"] = out["predicted_seconds"] * factor
    out["ape_pct"] = _ape_pct(out["predicted_seconds"], out["measured_seconds"])
    out.attrs["speed_factor"] = factor
    return out


def fidelity_table(steps: pd.DataFrame, responses: pd.DataFrame, groups: dict[str, tuple[int, int]] | None = None) -> pd.DataFrame:
    """Per policy: median / p90 APE of step makespan, mean finish-order Spearman, median APE of finish
    times, token error, and (with `groups`: policy -> (measured, predicted) groups trained) the speedup
    over baseline in rollout seconds per trained group, measured and predicted, and the error in points."""
    rows = {}
    for name, s in steps.groupby("policy", sort=False):
        r = responses[responses["policy"] == name]
        finished = r[(r["end_step_measured"] == r["end_step_predicted"]) & (r["finish_time_measured"] > 0)]
        finish_ape = ((finished["finish_time_predicted"] - finished["finish_time_measured"]).abs()
                      / finished["finish_time_measured"] * 100)
        rows[name] = {
            "steps": len(s),
            "makespan_median_ape_pct": float(s["ape_pct"].median()),
            "makespan_p90_ape_pct": float(np.percentile(s["ape_pct"], 90)),
            "measured_seconds": float(s["measured_seconds"].sum()),
            "predicted_seconds": float(s["predicted_seconds"].sum()),
            "finish_order_spearman": float(s["finish_order_spearman"].mean()),
            "finish_time_median_ape_pct": float(finish_ape.median()) if len(finish_ape) else float("nan"),
            "tokens_error_pct": float((s["predicted_tokens"].sum() - s["measured_tokens"].sum()) / s["measured_tokens"].sum() * 100),
            "exact_fraction": float(s["exact_fraction"].mean()),
            # NaN unless every step recorded it
            "measured_driver_seconds": float(s["measured_driver_seconds"].sum(min_count=len(s)))
            if "measured_driver_seconds" in s else float("nan"),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "policy"
    if groups and "baseline" in table.index:
        per_group = {k: (table.loc[k, "measured_seconds"] / groups[k][0], table.loc[k, "predicted_seconds"] / groups[k][1])
                     for k in table.index if k in groups}
        base = per_group["baseline"]
        table["speedup_measured"] = [base[0] / per_group[k][0] if k in per_group else np.nan for k in table.index]
        table["speedup_predicted"] = [base[1] / per_group[k][1] if k in per_group else np.nan for k in table.index]
        table["speedup_error_points"] = (table["speedup_predicted"] - table["speedup_measured"]) * 100
        _speedup_error_parts(table, groups)
    return table


def _speedup_error_parts(table: pd.DataFrame, groups: dict[str, tuple[float, float]]) -> None:
    """The speedup error in points split in two that add up to it: from groups trained (the twin trained more or
    fewer than the run, against the baseline's counts), then from rollout seconds (the policy's predicted off by
    another factor than its baseline's: the machine's speed level cancels)."""
    g = pd.DataFrame({k: groups.get(k, (np.nan, np.nan)) for k in table.index}, index=["measured", "predicted"]).T
    base = groups["baseline"]
    with_groups = table["speedup_measured"] * (g["predicted"] / base[1]) / (g["measured"] / base[0])
    table["speedup_points_groups"] = (with_groups - table["speedup_measured"]) * 100
    table["speedup_points_seconds"] = (table["speedup_predicted"] - with_groups) * 100
    # The seconds part split again where the runs recorded the driver's own time (which the twin does not price): the
    # points it makes (the measured speedup recomputed on each run's rollout seconds less the driver's, both the
    # policy's and the baseline's), and the rest, the engine's.
    engine = table["measured_seconds"] - table["measured_driver_seconds"]
    if "baseline" in engine and engine.notna().any():
        base_engine = engine["baseline"] / base[0]
        engine_speedup = base_engine / (engine / g["measured"])
        engine_with_groups = engine_speedup * (g["predicted"] / base[1]) / (g["measured"] / base[0])
        table["speedup_points_driver"] = (engine_with_groups - with_groups) * 100
        table["speedup_points_engine"] = (table["speedup_predicted"] - engine_with_groups) * 100


def speedup_by_repeat(steps_by_repeat: pd.DataFrame, groups: pd.DataFrame, reference: str = "baseline") -> pd.DataFrame:
    """Per policy and repeat: the measured speedup of repeat k over the reference's repeat k (recorded in the same
    minutes: `lssim validate` records repeat-major), in rollout seconds per trained group. `steps_by_repeat`: the
    `compare` rows with a repeat column; `groups`: rows of policy, repeat, measured_groups. Their spread is the real
    engine's run-to-run noise in the speedup itself, beside which a speedup error is read."""
    seconds = steps_by_repeat.groupby(["policy", "repeat"])["measured_seconds"].sum()
    per_group = seconds / groups.set_index(["policy", "repeat"])["measured_groups"].reindex(seconds.index)
    ref = per_group.xs(reference, level="policy").sort_index()
    rows = [(p, k, ref.iloc[k % len(ref)] / v) for (p, k), v in per_group.items() if p != reference]
    return pd.DataFrame(rows, columns=["policy", "repeat", "speedup_measured"])


ACTED_KINDS = ("stopped", "dropped", "carried", "rebudgeted", "resubmitted", "placed", "reselected", "speculated")


def acted(run: RecordedRun, baseline: RecordedRun) -> dict[str, int]:
    """How much a policy acted in a recorded run: its responses that the policy changed against the baseline
    recorded in the same world (same seed, engine and run shape), each counted once in `acted` and under every
    kind that applies:

        stopped      ended by the policy (finish_reason policy_stop)
        dropped      abandoned when the rollout ended (abort)
        carried      ran across a step boundary (end_step after the step it began in)
        rebudgeted   a token budget other than the baseline's
        resubmitted  submitted again during its step after the step's first submission (requeued to another
                     chunk or instance, or a top-up)
        placed       ran on another engine instance than the baseline's same response (the records say where
                     each ran: the policy's pin, or the engine's least-loaded choice); a placement that agrees
                     with the baseline's dispatch changed nothing and counts zero, as does a run on one instance
        reselected   a (step, prompt, sample) the baseline did not draw: other prompts, other group sizes
        speculated   generated in a step in which the engine drafted for the policy (speculative decoding
                     changes how fast tokens come, not which: greedy, the tokens are the baseline's); from the
                     run's speculation counters (meta.json), per step where the policy recorded its decisions

    From the records alone (responses.parquet), so it counts what happened on the engine, not what the policy
    asked for. A priority that changed only the order inside a batch the engine ran at once leaves no trace
    and counts nothing. The baseline against itself counts zero (its placement, draws and budgets are
    deterministic for a seed)."""
    r, b = run.responses, baseline.responses
    flags = {}
    flags["stopped"] = (r["finish_reason"] == "policy_stop").to_numpy()
    flags["dropped"] = (r["finish_reason"] == "abort").to_numpy()
    flags["carried"] = (r["end_step"] != r["step"]).to_numpy()
    flags["rebudgeted"] = (r["max_tokens"] != b["max_tokens"].max()).to_numpy()
    same_step = r["end_step"] == r["step"]
    first_submit = r[same_step].groupby("step")["submit_time"].transform("min")
    late = (r.loc[same_step, "submit_time"] - first_submit) > 1e-3
    flags["resubmitted"] = late.reindex(r.index, fill_value=False).to_numpy()
    both = r[KEY + ["instance"]].merge(b[KEY + ["instance"]], on=KEY, how="left", suffixes=("", "_baseline"), indicator=True)
    flags["reselected"] = (both["_merge"] == "left_only").to_numpy()
    several = r.loc[r["instance"] >= 0, "instance"].nunique() > 1  # on one instance a placement decides nothing
    flags["placed"] = (several & (both["_merge"] == "both") & (both["instance"] != both["instance_baseline"])).to_numpy()
    flags["speculated"] = _speculated(run, r)
    counts = {k: int(flags[k].sum()) for k in ACTED_KINDS}
    counts["acted"] = int(np.logical_or.reduce([flags[k] for k in ACTED_KINDS]).sum()) if len(r) else 0
    counts["responses"] = len(r)
    return counts


def _speculated(run: RecordedRun, responses: pd.DataFrame) -> np.ndarray:
    """Responses generated in steps in which the engine drafted (see `acted`)."""
    spec = (run.meta or {}).get("speculation") or {}
    if not spec.get("drafts"):
        return np.zeros(len(responses), dtype=bool)
    decisions = spec.get("decisions")
    if not decisions:  # a policy that speculates in every step (spec_tail): every response ran on a drafting engine
        return np.ones(len(responses), dtype=bool)
    drafting_steps = {d["step"] for d in decisions if d.get("drafts", 0) > 0}
    return responses["step"].isin(drafting_steps).to_numpy()


def policy_summary(summary: pd.DataFrame, acted_rows: pd.DataFrame, noise: pd.DataFrame | None,
                   anchored: pd.DataFrame | None = None, real_cuts: pd.DataFrame | None = None,
                   speedups: pd.DataFrame | None = None, steps_by_repeat: pd.DataFrame | None = None,
                   probed: pd.DataFrame | None = None) -> pd.DataFrame:
    """The fidelity table (`fidelity_table`, one row per policy) with, per policy, how much it acted on the real
    engine (`acted` rows, one per repeat: the median over repeats, and the fewest in one repeat), the real
    engine's run-to-run spread of its step times (`median_over_repeats`' spread: each repeat's step against the
    median of its repeats; median and p90, in %; NaN with one repeat), whether it meets the goal, and, with
    `anchored` (per-step medians of `anchor_on_baseline` rows, a speed_factor column), the same errors with the
    machine's speed level taken from its world's baseline (the speedup error does not change: a level cancels
    in a ratio). With `real_cuts` (per-step medians of replays `with_real_cuts`), the error of policies that end
    rollouts when the real engine's cut points are replayed rather than predicted. With `speedups`
    (`speedup_by_repeat`), the range of the measured speedup over the repeats and its spread in points. With
    `steps_by_repeat` holding speed_level (each run's probed speed over the cost model's, real_backend.speed_probe),
    its median over the repeats; with `probed` (per-step medians of the twin at each run's probed level), its
    errors and meets_goal_probed. With `steps_by_repeat` of several repeats, the noise floor (`noise_floor`: what an
    exact model would score against these repeats, and the repeats it needs to meet the goal) and within_noise: the
    errors, at one of the levels reported, lie within that floor's 95% bound."""
    out = summary.copy()
    if steps_by_repeat is not None and "speed_level" in steps_by_repeat:
        levels = steps_by_repeat.drop_duplicates(["policy", "repeat"]).groupby("policy")["speed_level"]
        out["speed_level"] = out.index.map(levels.median())
    if probed is not None and len(probed):
        by = probed.groupby("policy")["ape_pct"]
        out["probed_median_ape_pct"] = out.index.map(by.median())
        out["probed_p90_ape_pct"] = out.index.map(by.quantile(0.9))
    if speedups is not None and len(speedups):
        by = speedups.groupby("policy")["speedup_measured"]
        out["speedup_repeat_min"], out["speedup_repeat_max"] = out.index.map(by.min()), out.index.map(by.max())
        out["speedup_spread_points"] = (out["speedup_repeat_max"] - out["speedup_repeat_min"]) * 100
    if len(acted_rows):
        counts = acted_rows.drop(columns="repeat").groupby("policy").median()
        for col in counts:
            out[col] = out.index.map(counts[col])
        out["acted_min"] = out.index.map(acted_rows.groupby("policy")["acted"].min())
    spread = noise.groupby("policy")["ape_pct"] if noise is not None and len(noise) else None
    out["repeat_spread_median_pct"] = out.index.map(spread.median()) if spread is not None else np.nan
    out["repeat_spread_p90_pct"] = out.index.map(spread.quantile(0.9)) if spread is not None else np.nan
    speedup_ok = out["speedup_error_points"].abs() <= TARGET_SPEEDUP_POINTS if "speedup_error_points" in out else True
    out["meets_goal"] = step_errors_within_goal(out["makespan_median_ape_pct"], out["makespan_p90_ape_pct"]) & speedup_ok
    if "probed_median_ape_pct" in out:
        out["meets_goal_probed"] = step_errors_within_goal(out["probed_median_ape_pct"], out["probed_p90_ape_pct"]) & speedup_ok
    if steps_by_repeat is not None and len(steps_by_repeat) and steps_by_repeat["repeat"].nunique() > 1:
        floor = noise_floor(steps_by_repeat)
        for col in floor:
            out[col] = out.index.map(floor[col])
        if "speedup_measured" in out:
            with_speedup_noise(out, steps_by_repeat)
    if anchored is not None and len(anchored):
        by = anchored.groupby("policy")
        out["anchored_median_ape_pct"] = out.index.map(by["ape_pct"].median())
        out["anchored_p90_ape_pct"] = out.index.map(by["ape_pct"].quantile(0.9))
        out["speed_factor"] = out.index.map(by["speed_factor"].first())
        out["meets_goal_anchored"] = (step_errors_within_goal(out["anchored_median_ape_pct"], out["anchored_p90_ape_pct"])
                                      & speedup_ok)
    if "noise_bound_median_pct" in out:
        out["within_noise"] = within_noise(out)
    if real_cuts is not None and len(real_cuts):
        by = real_cuts.groupby("policy")["ape_pct"]
        out["real_cuts_median_ape_pct"] = out.index.map(by.median())
        out["real_cuts_p90_ape_pct"] = out.index.map(by.quantile(0.9))
    return out


LEVELS = ("makespan", "probed", "anchored")  # the step errors a summary reports: the profile alone, at the probed
# speed level, at the world's level (the column prefixes of <level>_median_ape_pct and <level>_p90_ape_pct)


def within_noise(summary: pd.DataFrame) -> pd.Series:
    """Per row: misses the goal, perhaps, but an exact model would have scored as badly on these repeats 1 time in
    20 or more: both step errors within noise_floor's 95% bounds, at one of the levels the summary reports (LEVELS:
    the profile alone, the probed level, the world's; the noise is the repeats', whatever sets the level), and the
    speedup error within the goal or within speedup_noise_floor's 95% bound (where the frame has it)."""
    speedup = summary["speedup_error_points"].abs() if "speedup_error_points" in summary else pd.Series(0.0, summary.index)
    speedup_in_noise = speedup <= TARGET_SPEEDUP_POINTS
    if "speedup_noise_bound_points" in summary:
        speedup_in_noise |= speedup <= summary["speedup_noise_bound_points"]
    steps_in_noise = pd.Series(False, summary.index)
    for level in LEVELS:
        if f"{level}_median_ape_pct" in summary:
            steps_in_noise |= ((summary[f"{level}_median_ape_pct"] <= summary["noise_bound_median_pct"])
                               & (summary[f"{level}_p90_ape_pct"] <= summary["noise_bound_p90_pct"]))
    return steps_in_noise & speedup_in_noise


def with_speedup_noise(summary: pd.DataFrame, steps_by_repeat: pd.DataFrame) -> pd.DataFrame:
    """`summary` (a policy_summary or fidelity_table frame with speedup_measured) with speedup_noise_floor's columns
    for its policies, in points of its measured speedups; in place, and returned."""
    floor = speedup_noise_floor(steps_by_repeat, summary["speedup_measured"].dropna().to_dict())
    for col in floor:
        summary[col] = summary.index.map(floor[col])
    return summary


def unacted(summary: pd.DataFrame) -> list[str]:
    """The policies (not baselines) whose median repeat changed no response on the real engine."""
    if "acted" not in summary:
        return [p for p in summary.index if not str(p).startswith("baseline")]
    return [p for p in summary.index if not str(p).startswith("baseline") and not summary.loc[p, "acted"] > 0]


def policy_results(summary: pd.DataFrame, out: str = "") -> dict:
    """`lssim validate --json`: one object, `policies: {name: {acted, step_error_median, step_error_p90,
    speedup_error, repeat_spread, ..., noise_floor: {floor_median, floor_p90, bound_median, bound_p90} (an exact
    model's errors against these repeats, `noise_floor`), repeats_for_goal, speedup_noise: {floor, bound} (an exact
    model's speedup error in points, `speedup_noise_floor`), repeats_for_speedup_goal, meets_goal, meets_goal_probed,
    within_noise, cost_model: the profile the world's twin priced with}}` (errors in %, the speedup error in
    points), the baselines apart, and the goal."""
    def number(v):
        return None if v is None or (isinstance(v, float) and not np.isfinite(v)) else float(v)

    policies, baselines = {}, {}
    for name, row in summary.iterrows():
        model = row.get("cost_model")
        entry = {"world": row.get("world"), "spec": row.get("spec"), "cost_model": model if isinstance(model, str) else None,
                 "acted": int(row["acted"]) if "acted" in row and pd.notna(row["acted"]) else None,
                 "acted_by": {k: int(row[k]) for k in ACTED_KINDS if k in row and pd.notna(row[k])},
                 "responses": int(row["responses"]) if "responses" in row and pd.notna(row["responses"]) else None,
                 "step_error_median": number(row["makespan_median_ape_pct"]),
                 "step_error_p90": number(row["makespan_p90_ape_pct"]),
                 "speedup_error": number(row.get("speedup_error_points")),
                 "speedup_measured": number(row.get("speedup_measured")),
                 "speedup_predicted": number(row.get("speedup_predicted")),
                 "speedup_spread": number(row.get("speedup_spread_points")),
                 "speedup_error_from": {k: number(row.get(f"speedup_points_{k}")) for k in ("groups", "seconds", "driver", "engine")},
                 "repeat_spread": number(row.get("repeat_spread_median_pct")),
                 "repeat_spread_p90": number(row.get("repeat_spread_p90_pct")),
                 "step_error_median_anchored": number(row.get("anchored_median_ape_pct")),
                 "step_error_p90_anchored": number(row.get("anchored_p90_ape_pct")),
                 "speed_factor": number(row.get("speed_factor")),
                 "speed_level": number(row.get("speed_level")),
                 "step_error_median_probed": number(row.get("probed_median_ape_pct")),
                 "step_error_p90_probed": number(row.get("probed_p90_ape_pct")),
                 "step_error_median_real_cuts": number(row.get("real_cuts_median_ape_pct")),
                 "step_error_p90_real_cuts": number(row.get("real_cuts_p90_ape_pct")),
                 "noise_floor": {k: number(row.get(f"noise_{k}_pct")) for k in ("floor_median", "floor_p90", "bound_median", "bound_p90")},
                 "repeats_for_goal": number(row.get("repeats_for_goal")),
                 "speedup_noise": {k: number(row.get(f"speedup_noise_{k}_points")) for k in ("floor", "bound")},
                 "repeats_for_speedup_goal": number(row.get("repeats_for_speedup_goal")),
                 "steps": int(row["steps"]), "meets_goal": bool(row.get("meets_goal", False)),
                 "meets_goal_probed": bool(row.get("meets_goal_probed", False)),
                 "meets_goal_anchored": bool(row.get("meets_goal_anchored", False)),
                 "within_noise": bool(row.get("within_noise", False))}
        (baselines if str(name).startswith("baseline") else policies)[str(name)] = entry
    return {"policies": policies, "baselines": baselines, "out": out,
            "goal": {"step_error_median": TARGET_MEDIAN_PCT, "step_error_p90": TARGET_P90_PCT,
                     "speedup_error": TARGET_SPEEDUP_POINTS},
            "all_acted": all((p["acted"] or 0) > 0 for p in policies.values())}


def fidelity_markdown(summary: pd.DataFrame, profile: str = "") -> str:
    """The README's fidelity table, from `policy_summary`'s frame (`lssim validate` writes it as fidelity.md)."""
    def pct(r, col):
        v = r.get(col, np.nan)
        return "" if pd.isna(v) else f"{v:.1f}"

    probed = "probed_median_ape_pct" in summary and summary["probed_median_ape_pct"].notna().any()
    floor = "noise_floor_median_pct" in summary and summary["noise_floor_median_pct"].notna().any()
    speedup_floor = "speedup_noise_bound_points" in summary and summary["speedup_noise_bound_points"].notna().any()
    lines = ["| policy | world | acted (of responses) | step error median / p90 % | "
             + ("at the probed speed level median / p90 % | " if probed else "")
             + "with the world's speed level median / p90 % | repeat spread median / p90 % | "
             + ("an exact model's error median / p90 % (repeats for the goal) | " if floor else "")
             + "speedup real (repeats) / sim | speedup error (points)"
             + (" (an exact model's 95% bound)" if speedup_floor else "") + " | goal |",
             "|" + "---|" * (9 + probed + floor)]
    for name, r in summary.iterrows():
        acted_text = f"{int(r['acted'])} of {int(r['responses'])}" if pd.notna(r.get("acted", np.nan)) else "(reference)"
        anchored = f"{pct(r, 'anchored_median_ape_pct')} / {pct(r, 'anchored_p90_ape_pct')}" if pd.notna(r.get("anchored_median_ape_pct", np.nan)) else "(reference)"
        goal = ("yes" if r.get("meets_goal") else "at the probed level" if r.get("meets_goal_probed")
                else "with the level" if r.get("meets_goal_anchored") else "within noise" if r.get("within_noise") else "no")
        cells = [f"`{name}`", str(r.get("world", "")), acted_text,
                 f"{pct(r, 'makespan_median_ape_pct')} / {pct(r, 'makespan_p90_ape_pct')}",
                 *([f"{pct(r, 'probed_median_ape_pct')} / {pct(r, 'probed_p90_ape_pct')}"] if probed else []), anchored,
                 f"{pct(r, 'repeat_spread_median_pct')} / {pct(r, 'repeat_spread_p90_pct')}",
                 *([f"{pct(r, 'noise_floor_median_pct')} / {pct(r, 'noise_floor_p90_pct')}{_repeats_for_goal(r)}"] if floor else []),
                 f"{r.get('speedup_measured', np.nan):.3f}{_repeat_range(r)} / {r.get('speedup_predicted', np.nan):.3f}",
                 f"{r.get('speedup_error_points', np.nan):+.1f}" + _speedup_bound(r), goal]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Goal: per-step makespan error median <= {TARGET_MEDIAN_PCT:.0f}%, p90 <= {TARGET_P90_PCT:.0f}%, speedup "
                  f"within {TARGET_SPEEDUP_POINTS:.0f} points. Step error: the profiled cost model's prediction against vLLM; "
                  + ("at the probed speed level: the same, scaled by each run's speed level (the median of the four "
                     "probes nearest the run, a fixed batch timed on the engine between every two runs, over the same "
                     "probe around the profile's measurement: real_backend/speed_probe.py); " if probed else "")
                  + f"with the world's speed level: every prediction scaled by the median measured/predicted ratio of the "
                  f"world's baseline steps (the machine's speed in those minutes; the baseline is then calibrated, not "
                  f"predicted). Repeat spread: each repeat's step time against the median of its repeats on the real "
                  f"engine (same policy, same seed), the noise no model can predict; (repeats): the range of the real "
                  f"speedup over the repeats, each against its world's baseline recorded in the same minutes."
                  + (" An exact model's error: what a model that predicted every step exactly would score against the "
                     "per-step medians of these repeats, from the repeats' spread alone (lssim.analysis.fidelity.noise_floor); "
                     "(repeats for the goal): how many repeats would bring that under the goal. Goal 'within noise': "
                     "missed, but within the 95% bound of that exact model's errors at one of the levels (the profile alone, "
                     "the probed level, the world's)." if floor else "")
                  + (" The speedup's bound: 95% of an exact model's speedup errors against these repeats lie within it "
                     "(lssim.analysis.fidelity.speedup_noise_floor); a speedup error within it cannot be told from noise." if speedup_floor else "")
                  + (f" Cost model: {profile}." if profile else "")]
    return "\n".join(lines) + _speedup_parts_markdown(summary) + "\n"


def _speedup_parts_markdown(summary: pd.DataFrame) -> str:
    """Where the runs recorded the driver's own time: each speedup error split into the points of groups trained, of
    the driver's time (which the twin does not price) and of the engine (_speedup_error_parts)."""
    if "speedup_points_driver" not in summary or summary["speedup_points_driver"].isna().all():
        return ""
    lines = ["", "", "Each speedup error split (points; they add up): from groups trained (the twin trained more or fewer), "
             "from the driver's own time in the real rollouts (the controller, the policy, rewards, submit and abort calls, "
             "recorded as driver_seconds: on this host it shares the engine's cores, and the twin prices none of it), and "
             "from the engine (the rest: the cost model's).", "",
             "| policy | speedup error | groups | driver | engine |", "|---|---|---|---|---|"]
    for name, r in summary.iterrows():
        if name.startswith("baseline") or pd.isna(r.get("speedup_points_driver", np.nan)):
            continue
        lines.append(f"| `{name}` | {r['speedup_error_points']:+.1f} | {r['speedup_points_groups']:+.1f} | "
                     f"{r['speedup_points_driver']:+.1f} | {r['speedup_points_engine']:+.1f} |")
    return "\n".join(lines)


def _repeats_for_goal(r) -> str:
    n = r.get("repeats_for_goal", np.nan)
    if pd.isna(r.get("noise_floor_median_pct", np.nan)):
        return ""
    return f" (>{MAX_REPEATS_SEARCHED})" if pd.isna(n) else f" ({int(n)})"


def _speedup_bound(r) -> str:
    bound = r.get("speedup_noise_bound_points", np.nan)
    return "" if pd.isna(bound) else f" ({bound:.1f})"


def _repeat_range(r) -> str:
    lo, hi = r.get("speedup_repeat_min", np.nan), r.get("speedup_repeat_max", np.nan)
    return "" if pd.isna(lo) or pd.isna(hi) or lo == hi else f" ({lo:.2f}-{hi:.2f})"


def load_summary(folder, steps_by_repeat: pd.DataFrame | None = None) -> pd.DataFrame:
    """A `lssim validate --out` folder's summary.csv. A folder written before the speedup's noise floor gets its
    columns (`with_speedup_noise`, from `steps_by_repeat`, else the folder's steps_by_repeat.parquet where it has one);
    within_noise is taken again (`within_noise`), so that folders written under an older rule read as new ones."""
    path = Path(folder) / "summary.csv"
    if not path.is_file():
        raise ValueError(f"{path}: no summary.csv (written by `lssim validate --out {folder}`)")
    summary = pd.read_csv(path, index_col="policy")
    by_repeat = Path(folder) / "steps_by_repeat.parquet"
    if "speedup_noise_bound_points" not in summary and "speedup_measured" in summary:
        if steps_by_repeat is None and by_repeat.is_file():
            steps_by_repeat = pd.read_parquet(by_repeat)
        if steps_by_repeat is not None:
            with_speedup_noise(summary, steps_by_repeat)
    if "noise_bound_median_pct" in summary:  # every folder read under today's rule
        summary["within_noise"] = within_noise(summary)
    return summary


def markdown_from(folder) -> str:
    """fidelity_markdown of a `lssim validate --out` folder's summary.csv (`load_summary`: the README's table,
    regenerated without replaying anything): `python -m lssim.analysis.fidelity paper/experiments/validation/full1`."""
    return fidelity_markdown(load_summary(folder))


def length_distance(measured: np.ndarray, modelled: np.ndarray) -> dict:
    """How far modelled response lengths are from measured ones: two-sample Kolmogorov-Smirnov statistic
    (and its p-value), Wasserstein-1 distance in tokens, and the two means."""
    from scipy import stats

    measured, modelled = np.asarray(measured, float), np.asarray(modelled, float)
    if not len(measured) or not len(modelled):
        return {"ks": np.nan, "ks_pvalue": np.nan, "wasserstein_tokens": np.nan, "measured_mean": np.nan, "modelled_mean": np.nan}
    ks = stats.ks_2samp(measured, modelled)
    return {"ks": float(ks.statistic), "ks_pvalue": float(ks.pvalue),
            "wasserstein_tokens": float(stats.wasserstein_distance(measured, modelled)),
            "measured_mean": float(measured.mean()), "modelled_mean": float(modelled.mean())}


def plot(steps: pd.DataFrame, path, title: str = "") -> None:
    """Predicted against measured rollout seconds, one point per step, one colour per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    colors, markers = plt.cm.tab20.colors, "osD^v<>p"
    for i, (name, s) in enumerate(steps.groupby("policy", sort=False)):  # a colour and a marker each: 13+ policies
        ax.scatter(s["measured_seconds"], s["predicted_seconds"], s=20, label=name, color=colors[i % 20], marker=markers[i % 8])
    lo = float(min(steps["measured_seconds"].min(), steps["predicted_seconds"].min())) * 0.9
    hi = float(max(steps["measured_seconds"].max(), steps["predicted_seconds"].max())) * 1.1
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.92, hi * 0.92], [lo * 1.08, hi * 1.08], color="grey", alpha=0.15, label="±8%")
    ax.set(xlabel="measured rollout seconds (vLLM)", ylabel="predicted rollout seconds (simulator)", xlim=(lo, hi), ylim=(lo, hi),
           title=title or "simulator vs real engine, per step")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")  # the path may be a temporary name
    plt.close(fig)


__all__ = ["step_errors_within_goal", "ends_rollouts", "with_real_cuts", "ACTED_KINDS", "acted", "policy_summary", "policy_results", "unacted", "fidelity_markdown", "markdown_from", "load_summary", "RecordedRun", "load_run", "replay_run", "compare", "median_over_repeats", "noise_floor", "speedup_noise_floor", "with_speedup_noise", "within_noise", "finish_profile", "anchor_on_baseline", "fidelity_table", "length_distance", "plot"]


if __name__ == "__main__":  # python -m lssim.analysis.fidelity FOLDER: the README's fidelity table of a validation folder
    import sys

    print(markdown_from(sys.argv[1] if len(sys.argv) > 1 else "paper/experiments/validation/full1"), end="")
