"""`lssim validate`: record real runs (or take recorded ones), replay each in the simulator with the same
policy, seeds, data loader and a profiled cost model, and report how far the prediction is.

    lssim validate --policies baseline,hadb,april --steps 5 --out runs/validate
    lssim validate --runs runs/a runs/b --out runs/validate-ab      # runs recorded by `lssim real`

Writes to --out: real/<policy>/ (each recorded run, unless --runs), steps.parquet and responses.parquet
(predicted against measured, lssim.validate.compare), summary.csv (the printed table), counterfactual.csv
(each policy predicted from the baseline's trace instead of its own), and validation.png (predicted vs
measured per step). Every input is checked before the engine starts. See real_backend/VALIDATION.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

DEFAULT_PROFILE = Path(__file__).with_name("profile_cpu.json")
TARGET_MEDIAN_PCT, TARGET_P90_PCT, TARGET_SPEEDUP_POINTS = 3.0, 8.0, 5.0


def sim_setup(run, profile: str):
    """The simulated twin of the run's engine: one instance, its limits, the profiled cost model."""
    from lssim.replay import SimSetup

    real = run.meta.get("setup", {})
    max_num_seqs, max_model_len = int(real.get("max_num_seqs", 256)), int(real.get("max_model_len", 1024))
    # The CPU engine's KV cache holds far more than max_num_seqs full contexts of the tiny model: never preempts.
    return SimSetup(model="tiny-ref", n_instances=1, max_num_seqs=max_num_seqs,
                    kv_capacity_tokens=max_num_seqs * max_model_len, profile=profile)


def run_prompts(run):
    """A fresh copy of the data loader the run drew from (same prompts file, pool and seed)."""
    from .prompts import TaskPrompts

    real = run.meta["setup"]
    return TaskPrompts.from_files(real["prompts_path"], real["model_dir"], real.get("n_prompts"), seed=run.config.seed)


def validate(runs: dict, profile: str, counterfactual: bool = True) -> dict[str, pd.DataFrame]:
    """Replay each recorded run (name -> RecordedRun) and compare. Returns the frames `lssim validate` writes."""
    from lssim.validate import compare, fidelity_table, length_distance, replay_run

    step_frames, response_frames, groups, sims = [], [], {}, {}
    for name, run in runs.items():
        sim = sims[name] = replay_run(run, sim_setup(run, profile), run_prompts(run))
        s, r = compare(run, sim, name)
        step_frames.append(s)
        response_frames.append(r)
        groups[name] = (int(run.steps["groups_trained"].sum()), int(sim.steps["groups_trained"].sum()))
    steps, responses = pd.concat(step_frames, ignore_index=True), pd.concat(response_frames, ignore_index=True)
    out = {"steps": steps, "responses": responses, "summary": fidelity_table(steps, responses, groups)}

    base = runs.get("baseline")
    if counterfactual and base is not None and len(runs) > 1:
        rows = []
        base_pred = sims["baseline"].steps
        base_per_group = base_pred["rollout_seconds"].sum() / base_pred["groups_trained"].sum()
        for name, run in runs.items():
            if name == "baseline":
                continue
            sim = replay_run(run, sim_setup(run, profile), run_prompts(run), trace=base.trace)
            per_group = sim.steps["rollout_seconds"].sum() / max(1, sim.steps["groups_trained"].sum())
            both = run.responses[["step", "prompt_id", "sample_idx", "response_len", "finish_reason"]].merge(
                sim.responses[["step", "prompt_id", "sample_idx", "response_len", "exact"]], on=["step", "prompt_id", "sample_idx"],
                suffixes=("_measured", "_modelled"))
            modelled = both[~both["exact"]]  # responses the baseline trace did not hold: the Workload modelled them
            dist = length_distance(modelled["response_len_measured"], modelled["response_len_modelled"])
            rows.append({"policy": name, "responses": len(both), "modelled_fraction": len(modelled) / max(1, len(both)),
                         **{f"length_{k}": v for k, v in dist.items()},
                         "speedup_measured": out["summary"].loc[name, "speedup_measured"],
                         "speedup_predicted_from_baseline_trace": base_per_group / per_group})
        cf = pd.DataFrame(rows).set_index("policy")
        cf["speedup_error_points"] = (cf["speedup_predicted_from_baseline_trace"] - cf["speedup_measured"]) * 100
        out["counterfactual"] = cf
    return out


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from lssim.controller import RunConfig
    from lssim.cost import ProfiledCostModel
    from lssim.results import policy_dirname
    from lssim.policy import available_policies, make_policy
    from lssim.validate import load_run, plot

    from .world import RealSetup, format_step, out_dir_problem, prepare

    profile = args.profile
    if not Path(profile).is_file():
        raise ValueError(f"--profile {profile} does not exist (make one with `lssim profile --out {profile}`)")
    ProfiledCostModel.from_json(profile)  # a bad file fails here, before anything runs
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise ValueError(f"--out {args.out} is not empty (pass --overwrite to replace what is there)")

    runs = {}
    if args.runs:
        for folder in args.runs:
            run_ = load_run(folder)
            runs[run_.name] = run_
    else:
        config = RunConfig(steps=args.steps, groups_per_step=args.groups_per_step, group_size=args.group_size,
                           max_tokens=args.max_tokens, seed=args.seed)
        setup = RealSetup(n_prompts=args.n_prompts)
        specs = _policy_specs(args.policies, available_policies, make_policy)
        for spec in specs:  # every policy checked before the engine starts
            prepare(setup, spec, config)
        for spec in specs:
            problem = out_dir_problem(out / "real" / policy_dirname(spec), args.overwrite)
            if problem:
                raise ValueError(problem)
        runs = _record(specs, setup, config, out, format_step, prepare)

    print(f"replaying {len(runs)} runs in the simulator (profile {profile}) ...", file=sys.stderr)
    frames = validate(runs, profile, counterfactual=not args.no_counterfactual)
    out.mkdir(parents=True, exist_ok=True)
    from lssim.results import atomic_write

    atomic_write(out / "steps.parquet", lambda p: frames["steps"].to_parquet(p, index=False))
    atomic_write(out / "responses.parquet", lambda p: frames["responses"].to_parquet(p, index=False))
    atomic_write(out / "summary.csv", lambda p: frames["summary"].to_csv(p))
    if "counterfactual" in frames:
        atomic_write(out / "counterfactual.csv", lambda p: frames["counterfactual"].to_csv(p))
    atomic_write(out / "validation.png", lambda p: plot(frames["steps"], p))
    print(format_summary(frames))
    print(f"written to {out}/ (steps.parquet, responses.parquet, summary.csv, validation.png)")
    return 0


def format_summary(frames: dict[str, pd.DataFrame]) -> str:
    s = frames["summary"]
    cols = {"steps": "steps", "makespan_median_ape_pct": "median APE %", "makespan_p90_ape_pct": "p90 APE %",
            "finish_order_spearman": "finish order rho", "finish_time_median_ape_pct": "finish time APE %",
            "tokens_error_pct": "tokens err %", "speedup_measured": "speedup real", "speedup_predicted": "speedup sim",
            "speedup_error_points": "err points"}
    table = s[[c for c in cols if c in s]].rename(columns=cols)
    lines = ["per-step rollout makespan, simulator (profiled) vs vLLM:", table.to_string(float_format=lambda v: f"{v:.2f}")]
    all_steps = frames["steps"]["ape_pct"]
    worst_speedup = float(s["speedup_error_points"].abs().max()) if "speedup_error_points" in s else float("nan")
    lines.append(f"all steps: median APE {all_steps.median():.1f}% (target {TARGET_MEDIAN_PCT:.0f}%), "
                 f"p90 {np.percentile(all_steps, 90):.1f}% (target {TARGET_P90_PCT:.0f}%); worst policy median "
                 f"{s['makespan_median_ape_pct'].max():.1f}%, p90 {s['makespan_p90_ape_pct'].max():.1f}%; "
                 f"largest speedup error {worst_speedup:.1f} points (target {TARGET_SPEEDUP_POINTS:.0f})")
    if "counterfactual" in frames:
        cf = frames["counterfactual"]
        lines += ["", "counterfactual: each policy predicted from the baseline's trace, and the lengths the Workload modelled "
                      "for responses that trace did not hold, against what vLLM generated:",
                  cf[["modelled_fraction", "length_ks", "length_wasserstein_tokens", "length_measured_mean", "length_modelled_mean",
                      "speedup_measured", "speedup_predicted_from_baseline_trace", "speedup_error_points"]]
                  .to_string(float_format=lambda v: f"{v:.2f}")]
    return "\n".join(lines)


def _record(specs, setup, config, out: Path, format_step, prepare) -> dict:
    """Run each policy on one engine, one after another; each run recorded under out/real/<policy>/."""
    from lssim.results import policy_dirname
    from lssim.validate import load_run

    from .world import run_real, start_engine

    prompts, _ = prepare(setup, specs[0], config)
    t0 = time.monotonic()
    print("starting the vLLM engine ...", file=sys.stderr)
    engine = start_engine(setup, prompts, seed=config.seed)
    print(f"engine up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    runs = {}
    try:
        for spec in specs:
            prompts, policy = prepare(setup, spec, config)  # fresh data loader and policy for every run
            folder = out / "real" / policy_dirname(spec)
            print(f"-- {spec}: {config.steps} steps on vLLM", file=sys.stderr)
            run_real(setup, policy, config, folder, engine=engine, prompts=prompts,
                     on_step=lambda row: print("   " + format_step(row), file=sys.stderr),
                     meta={"command": " ".join(sys.argv), "policy_spec": spec})
            runs[spec] = load_run(folder)
    finally:
        engine.close()
    return runs


def _policy_specs(text: str, available, make_policy) -> list[str]:
    """The --policies list; "all" is every policy the real backend runs (not the oracle's, not speculation's)."""
    if text.strip() == "all":
        specs = []
        for name in available():
            p = make_policy(name)
            if not p.needs_oracle and getattr(p, "speculation", None) is None:
                specs.append(name)
    else:
        specs = [s.strip() for s in text.split(",") if s.strip()]
    if not specs:
        raise ValueError("--policies: no policy given")
    if "baseline" not in specs:
        specs.insert(0, "baseline")  # the speedups are over it
    return list(dict.fromkeys(specs))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default="baseline,hadb", metavar="A,B,...",
                   help="policies to run on vLLM and replay (comma-separated specs, or 'all'); baseline is always added "
                        "(default: baseline,hadb)")
    p.add_argument("--runs", nargs="+", metavar="DIR", help="take runs recorded by `lssim real --out DIR` instead of running")
    p.add_argument("--profile", default=str(DEFAULT_PROFILE), metavar="JSON",
                   help=f"profiled cost model (`lssim profile`; default: {DEFAULT_PROFILE.relative_to(Path.cwd()) if DEFAULT_PROFILE.is_relative_to(Path.cwd()) else DEFAULT_PROFILE})")
    p.add_argument("--steps", type=int, default=5, help="RL steps per run (default: 5)")
    p.add_argument("--groups-per-step", type=int, default=8, help="prompts per step (default: 8)")
    p.add_argument("--group-size", type=int, default=4, help="samples per prompt (default: 4)")
    p.add_argument("--max-tokens", type=int, default=256, help="response-token budget (default: 256)")
    p.add_argument("--n-prompts", type=int, metavar="N", help="use only the first N prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-counterfactual", action="store_true", help="skip predicting each policy from the baseline's trace")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the runs and the comparison")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")


__all__ = ["validate", "run", "add_arguments", "format_summary", "sim_setup"]
