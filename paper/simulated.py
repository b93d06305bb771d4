"""The paper's simulator numbers, from fresh runs: nothing here reads a stored result.

Every figure is a public lssim function applied to a shipped trace: `lssim.traces.summary.trace_info` (the
problem), `lssim.analysis.sweep.sweep` over every registered policy plus a few compositions (the policy tables),
`lssim.analysis.plan.plan` (execution modes and device splits), and `lssim.analysis.replay.replay` / `simulate` for the runs
the figures draw. A policy that lands in `policies/` joins the tables on the next build; one that fails to
build or run is listed in the paper with its reason, not silently left out.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, replace

import pandas as pd

from lssim.analysis.plan import PlanSpace, plan
from lssim.loop.policy import available_policies
from lssim.analysis.replay import SimSetup, replay, simulate
from lssim.analysis.sweep import sweep
from lssim.traces.trace import load_trace
from lssim.traces.summary import trace_info
from lssim.traces.workload import Workload

from .render import plain, table


@dataclass
class BuildConfig:
    """What the build simulates. `quick` keeps every code path and shrinks the runs (the test's build)."""

    traces: tuple[str, ...] = ("math7b", "longtail32k")  # files traces/NAME.parquet
    steps: int | None = None  # trace steps replayed (None: all)
    compositions: tuple[str, ...] = ("hadb+april+breaker", "vade+april+breaker", "rollpacker+spec_tail+breaker")
    train_side: tuple[str, ...] = ("hadb+g2tp", "hadb+entropy_prune")  # training-side policies beside their base
    train_base: str = "hadb"  # the rollout policy they compose with (a run of the policy table)
    figure_policy: str = "april"  # drawn beside baseline and oracle in the timeline and bound figures
    devices: int = 64  # the cluster `lssim plan` splits (qwen2.5-7b on H100, tp 1)
    plan_trace: str = "math7b"
    plan_policies: tuple[str, ...] = ("baseline", "april", "hadb+april+breaker")
    rollout_fractions: tuple[float, ...] = (0.5, 0.75)
    staleness_bounds: tuple[int, ...] = (1,)
    max_staleness: int = 1  # the bound a user states to `lssim plan`
    workers: int = 2

    def __post_init__(self):
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"BuildConfig.steps must be >= 1 or None, got {self.steps}")
        if "baseline" not in self.plan_policies:
            raise ValueError("BuildConfig.plan_policies must include baseline (each mode's split is chosen by it)")
        if any(not spec.startswith(self.train_base + "+") for spec in self.train_side):
            raise ValueError(f"BuildConfig.train_side {self.train_side} must each compose train_base {self.train_base!r}")
        if self.plan_trace not in self.traces:
            raise ValueError(f"BuildConfig.plan_trace {self.plan_trace!r} is not one of the traces {self.traces}")

    @classmethod
    def quick(cls) -> "BuildConfig":
        """The same code on a few steps and a small cluster: seconds, for the test."""
        return cls(steps=3, devices=16, rollout_fractions=(0.5,))


def policy_names() -> list[str]:
    """Every registered policy but the two references, in registry order: new ones flow in."""
    return [p for p in available_policies() if p not in ("baseline", "oracle")]


def policy_source(name: str) -> str:
    """The one-line description a policy file opens with ('april -- Active Partial Rollouts: ...')."""
    doc = (importlib.import_module(f"policies.{name}").__doc__ or name).strip()
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())  # the first paragraph, on one line
    text = paragraph.split("--", 1)[1].strip() if "--" in paragraph else paragraph
    end = re.search(r"\.\s+(?=[A-Z])", text)  # its first sentence ("et al. 2025" goes on)
    return text if end is None else text[:end.start() + 1]


def trace_numbers(name: str, trace: pd.DataFrame) -> dict:
    info = trace_info(trace, source=name)
    rl = info["response_len"]
    n = {"rows": info["rows"], "steps": info["steps"], "groups_per_step": info["groups"] // max(1, info["steps"]),
         "group_size": info["group_size"], "max_tokens": info["max_tokens"], "prompts": info["prompts"],
         "len_p50": rl["p50"], "len_p90": rl["p90"], "len_p99": rl["p99"], "len_max": rl["max"], "len_mean": rl["mean"],
         "step_max_over_median": info["step_max_over_median"], "truncated_fraction": info["truncated_fraction"],
         "persistence_spearman": info["persistence_spearman"]}
    return {f"trace.{name}.{k}": plain(v) for k, v in n.items()}


POLICY_COLUMNS = {  # summary column -> (header, format)
    "policy": ("policy", ""), "rollout_seconds": ("rollout s", ",.0f"), "rollout_speedup": ("rollout x", ".3f"),
    "speedup": ("step x", ".3f"), "lower_bound_efficiency": ("bound eff", ".1%"),
    "off_policy_token_fraction": ("off-policy", ".1%"), "truncated_fraction": ("truncated", ".1%"),
    "policy_stopped_fraction": ("stopped", ".1%"), "effective_group_fraction": ("eff groups", ".1%"),
    "modelled_fraction": ("modelled", ".1%")}
KEPT = ["speedup", "rollout_speedup", "rollout_seconds", "step_seconds", "lower_bound_efficiency", "long_tail_ratio",
        "busy_fraction", "mean_running", "off_policy_token_fraction", "truncated_fraction", "policy_stopped_fraction",
        "effective_group_fraction", "exact_fraction", "modelled_fraction", "max_staleness"]


def policy_table(trace: pd.DataFrame, cfg: BuildConfig, train_side: bool = False) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """Every registered policy, the compositions and the oracle on the default cluster (8 x qwen2.5-7b, H100,
    collocated), rows in registry order; and the runs that could not be built or failed, with why. With
    `train_side`, the training-side compositions too (one sweep: their base's run is the table's own)."""
    skipped: list[tuple[str, str]] = []
    names = policy_names() + ["oracle"]
    grid = list(cfg.compositions) + (list(cfg.train_side) if train_side else [])
    runs = sweep(trace, names, max_size=1, setup=SimSetup(), steps=cfg.steps, grid=grid,
                 skipped=skipped, workers=cfg.workers)
    runs["modelled_fraction"] = 1 - runs["exact_fraction"]
    order = [p for p in ["baseline"] + names[:-1] + grid + ["oracle"] if p in runs.index]
    return runs.loc[order], skipped


def policy_numbers(name: str, runs: pd.DataFrame) -> dict:
    out = {}
    for policy, row in runs.iterrows():
        out.update({f"sim.{name}.{policy}.{k}": plain(row[k]) for k in KEPT if k in row})
    singles = runs.drop(index=[p for p in runs.index if "+" in p or p in ("baseline", "oracle")])
    best = singles["rollout_speedup"].idxmax()
    on_policy = singles[singles["off_policy_token_fraction"] < 0.01]
    best_on = on_policy["rollout_speedup"].idxmax() if len(on_policy) else None
    best_all = runs.drop(index=["oracle"])["rollout_speedup"].idxmax()
    best_eff = runs["lower_bound_efficiency"].idxmax()
    for label, policy in (("best_single", best), ("best_single_on_policy", best_on), ("best_overall", best_all),
                          ("best_bound_eff", best_eff)):
        out[f"sim.{name}.{label}"] = policy or "none"
        for k in ("rollout_speedup", "speedup", "lower_bound_efficiency", "off_policy_token_fraction", "exact_fraction"):
            out[f"sim.{name}.{label}.{k}"] = plain(runs.loc[policy, k]) if policy else None
    out[f"sim.{name}.policies_run"] = len(runs)
    return out


TRAIN_SIDE_KEPT = ("train_seconds", "step_seconds", "speedup", "rollout_seconds", "pruned_loss_fraction",
                   "computed_token_fraction", "train_seconds_saved")


def train_side_numbers(name: str, runs: pd.DataFrame, cfg: BuildConfig) -> dict:
    """The training-side policies beside their rollout policy alone (same sweep, same trace): train time, what the
    mask took out, the seconds it saved, and that share of the base's step time."""
    if cfg.train_base not in runs.index:
        raise ValueError(f"the policy table of {name} has no {cfg.train_base!r} run for the training-side comparison")
    base = runs.loc[cfg.train_base]
    out = {"train_side.trace": name, "train_side.base": cfg.train_base,
           "train_side.base.train_seconds": plain(base["train_seconds"]),
           "train_side.base.step_seconds": plain(base["step_seconds"])}
    for spec in cfg.train_side:
        if spec not in runs.index:
            out[f"train_side.{spec}.ran"] = False
            continue
        row = runs.loc[spec]
        out.update({f"train_side.{spec}.{k}": plain(row[k]) for k in TRAIN_SIDE_KEPT if k in row})
        out[f"train_side.{spec}.ran"] = True
        out[f"train_side.{spec}.saved_of_step"] = plain((base["train_seconds"] - row["train_seconds"]) / base["step_seconds"])
    return out


def policy_display(runs: pd.DataFrame) -> dict:
    frame = runs.reset_index().rename(columns={"index": "policy"})
    frame = frame.rename(columns={k: v[0] for k, v in POLICY_COLUMNS.items()})
    return table(frame, {v[0]: v[1] for v in POLICY_COLUMNS.values()})


def catalogue() -> dict:
    """The registered policies and where each comes from (its file's first line)."""
    rows = [[name, policy_source(name)] for name in ["baseline"] + policy_names() + ["oracle"]]
    return {"columns": ["policy", "what it does (from policies/NAME.py)"], "formats": ["", ""], "rows": rows}


def plan_numbers(trace: pd.DataFrame, cfg: BuildConfig) -> tuple[dict, dict]:
    """`lssim plan` over modes x splits x policies: the figures the text names, and a table of each mode at the
    split that is best for its baseline (as the README's), every plan policy's speedup and staleness there."""
    space = PlanSpace(devices=cfg.devices, rollout_fractions=cfg.rollout_fractions, staleness=cfg.staleness_bounds,
                      policies=cfg.plan_policies, max_staleness=cfg.max_staleness)
    ranked = plan(trace, space, SimSetup(), steps=cfg.steps, workers=cfg.workers)
    ranked["kind"] = ranked["mode"].astype(str).str.split().str[0]  # "async 32+32 K=1 roll" -> "async"
    out = {"plan.candidates": len(ranked), "plan.devices": cfg.devices, "plan.max_staleness_bound": cfg.max_staleness}
    for label, row in (("best", ranked.iloc[0]), ("fastest", ranked.sort_values("trained_tokens_per_second").iloc[-1])):
        for k in ("mode", "kind", "policy", "rollout_devices", "train_devices", "speedup", "max_staleness",
                  "stale_token_fraction", "dropped_stale", "within_bounds"):
            out[f"plan.{label}.{k}"] = plain(row[k])
    columns, formats, rows = ["mode", "split"], ["", ""], []
    for p in cfg.plan_policies:
        columns += [f"{p} x", f"{p} max stale"]
        formats += [".2f", "d"]
    base = ranked[ranked["policy"] == "baseline"]
    for kind in [m for m in space.modes if m in set(ranked["kind"])]:  # the space's order, not the ranking's
        best = base[base["kind"] == kind].sort_values("speedup").iloc[-1]  # the split best for the baseline
        at = ranked[(ranked["mode"] == best["mode"])].set_index("policy")
        split = f"{best['rollout_devices']}+{best['train_devices']}" if kind != "collocated" else str(best["rollout_devices"])
        row = [kind, split]
        for p in cfg.plan_policies:
            r = at.loc[p]
            row += [plain(r["speedup"]), plain(r["max_staleness"])]
            out.update({f"plan.{kind}.{p}.{k}": plain(r[k]) for k in ("speedup", "max_staleness", "stale_token_fraction",
                                                                       "dropped_stale", "off_policy_token_fraction")})
        out[f"plan.{kind}.split"] = split
        rows.append(row)
    return out, {"columns": columns, "formats": formats, "rows": rows}


def mode_runs(trace: pd.DataFrame, cfg: BuildConfig) -> dict:
    """The baseline under each execution mode on the plan's cluster (the largest rollout share of the plan's splits;
    async half and half), for the phase and staleness figures: RunResults, which `plan`'s summary rows do not keep."""
    workload = Workload(trace, seed=0)
    base = SimSetup(n_instances=cfg.devices)
    rollout = max(1, int(round(cfg.devices * max(cfg.rollout_fractions))))
    setups = {"collocated": base,
              "disaggregated": replace(base, mode="disaggregated", n_instances=rollout, train_devices=cfg.devices - rollout),
              "hybrid": replace(base, mode="hybrid", n_instances=rollout, train_devices=cfg.devices - rollout),
              f"async K={cfg.staleness_bounds[0]}": replace(base, mode="async", n_instances=cfg.devices // 2,
                                                              train_devices=cfg.devices - cfg.devices // 2,
                                                              staleness=cfg.staleness_bounds[0])}
    return {label: simulate(workload, "baseline", setup, cfg.steps) for label, setup in setups.items()}


def figure_runs(trace: pd.DataFrame, cfg: BuildConfig) -> dict:
    """baseline, the figure policy and oracle on the default cluster (the runs the timeline and bound figures draw)."""
    return replay(trace, [cfg.figure_policy], SimSetup(), steps=cfg.steps)


def worst_tail_step(results: dict) -> int:
    """The step where baseline is furthest from its bound, in seconds (as `lssim report` picks it)."""
    s = results["baseline"].steps.set_index("step")
    return int((s["rollout_seconds"] - s["lower_bound_seconds"]).idxmax())


def simulate_all(root, cfg: BuildConfig, say=print) -> tuple[dict, dict]:
    """Every simulator number of the paper (flat keys; tables under "tables") and the runs its figures draw."""
    numbers: dict = {"tables": {}}
    runs: dict = {}
    skipped: dict[str, list] = {}
    traces = {name: load_trace(root / "traces" / f"{name}.parquet") for name in cfg.traces}
    for name, trace in traces.items():
        numbers.update(trace_numbers(name, trace))
        say(f"sweep: {len(policy_names()) + 2 + len(cfg.compositions)} policies on {name}")
        table_runs, skipped[name] = policy_table(trace, cfg, train_side=name == cfg.plan_trace)
        numbers.update(policy_numbers(name, table_runs))
        if name == cfg.plan_trace:
            numbers.update(train_side_numbers(name, table_runs, cfg))
        numbers["tables"][f"policies_{name}"] = policy_display(table_runs)
        runs[f"table_{name}"] = table_runs
    numbers["tables"]["catalogue"] = catalogue()
    numbers["sim.skipped"] = "; ".join(f"{spec} on {t} ({why})" for t, rows in skipped.items() for spec, why in rows) or "none"
    numbers["sim.policies_registered"] = len(policy_names()) + 2
    numbers["sim.compositions"] = len(cfg.compositions)
    say(f"plan: {cfg.devices} devices on {cfg.plan_trace}")
    plan_scalars, numbers["tables"]["plan"] = plan_numbers(traces[cfg.plan_trace], cfg)
    numbers.update(plan_scalars)
    say("runs for the figures")
    runs["modes"] = mode_runs(traces[cfg.plan_trace], cfg)
    runs["figure"] = figure_runs(traces[cfg.plan_trace], cfg)
    runs["trace"] = traces[cfg.plan_trace]
    step = worst_tail_step(runs["figure"])
    numbers["fig.timeline_step"] = step
    base = runs["figure"]["baseline"].steps.set_index("step")
    numbers["fig.timeline_step.baseline_rollout_seconds"] = plain(base.loc[step, "rollout_seconds"])
    numbers["fig.timeline_step.baseline_bound_seconds"] = plain(base.loc[step, "lower_bound_seconds"])
    numbers["config.steps"] = cfg.steps if cfg.steps is not None else "all"
    return numbers, runs


__all__ = ["BuildConfig", "simulate_all", "policy_names", "policy_source", "worst_tail_step"]
