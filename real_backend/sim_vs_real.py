"""`lssim validate`: record real runs (or take recorded ones), replay each in the simulator with the same
policy, seeds, data loader and a profiled cost model, and report how far the prediction is.

    lssim validate --policies baseline,hadb,april --steps 5 --out runs/validate
    lssim validate --runs runs/a runs/b --out runs/validate-ab      # runs recorded by `lssim real`

Writes to --out: real/<policy>/ (each recorded run, unless --runs), steps.parquet and responses.parquet
(predicted against measured, lssim.fidelity.compare), summary.csv (the printed table), counterfactual.csv
(each policy predicted from the baseline's trace instead of its own), and validation.png (predicted vs
measured per step), stages.csv (the error after each modelling step) and noise.parquet (the spread of the
repeats). Every input is checked before the engine starts. Results and how to read them: real_backend/README.md.
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


def sim_setup(run, profile: str):
    """The simulated twin of the run's engine: its instances and limits, the profiled cost model."""
    from lssim.replay import SimSetup

    real = run.meta.get("setup", {})
    max_num_seqs, max_model_len = int(real.get("max_num_seqs", 256)), int(real.get("max_model_len", 1024))
    n_instances = int(run.meta.get("engine", {}).get("n_instances") or real.get("n_instances") or 1)
    # The CPU engine's KV cache holds far more than max_num_seqs full contexts of the tiny model: never preempts.
    return SimSetup(model="tiny-ref", n_instances=n_instances, max_num_seqs=max_num_seqs,
                    kv_capacity_tokens=max_num_seqs * max_model_len, profile=profile)


def run_prompts(run):
    """A fresh copy of the data loader the run drew from (same prompts file, pool and seed)."""
    from .prompts import TaskPrompts

    real = run.meta["setup"]
    return TaskPrompts.from_files(real["prompts_path"], real["model_dir"], real.get("n_prompts"), seed=run.config.seed)


def validate(runs: dict, profile: str, counterfactual: bool = True) -> dict[str, pd.DataFrame]:
    """Replay each recorded run in the simulator and compare. `runs`: policy -> its recordings (a RecordedRun or a
    list of repeats; each repeat is replayed from its own trace, and per step the medians are compared).
    Returns the frames `lssim validate` writes: steps (one row per policy and step), responses, summary,
    noise (with repeats) and counterfactual."""
    from lssim.fidelity import compare, fidelity_table, length_distance, median_over_repeats, replay_run

    runs = {name: rs if isinstance(rs, list) else [rs] for name, rs in runs.items()}
    step_frames, response_frames, groups, first_sim = [], [], {}, {}
    for name, repeats in runs.items():
        measured_groups, predicted_groups = [], []
        for k, run in enumerate(repeats):
            sim = replay_run(run, sim_setup(run, profile), run_prompts(run))
            first_sim.setdefault(name, sim)
            s, r = compare(run, sim, name)
            step_frames.append(s.assign(repeat=k))
            response_frames.append(r.assign(repeat=k))
            measured_groups.append(int(run.steps["groups_trained"].sum()))
            predicted_groups.append(int(sim.steps["groups_trained"].sum()))
        groups[name] = (float(np.mean(measured_groups)), float(np.mean(predicted_groups)))
    by_repeat = pd.concat(step_frames, ignore_index=True)
    steps, spread = median_over_repeats(by_repeat)
    responses = pd.concat(response_frames, ignore_index=True)
    out = {"steps": steps, "steps_by_repeat": by_repeat, "responses": responses, "summary": fidelity_table(steps, responses, groups)}
    if spread["repeat"].nunique() > 1:
        out["noise"] = spread

    base = runs.get("baseline", [None])[0]
    if counterfactual and base is not None and len(runs) > 1:
        rows = []
        base_pred = first_sim["baseline"].steps
        base_per_group = base_pred["rollout_seconds"].sum() / base_pred["groups_trained"].sum()
        for name, repeats in runs.items():
            if name == "baseline":
                continue
            run = repeats[0]
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


def stages(runs: dict, profile: str, workdir: Path, profiled: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The error after each modelling step: the cost models refitted from the measurements `lssim profile` wrote
    beside `profile` (per-iteration decode only, + time to first token), each saved to `workdir` and replayed;
    then the profile itself (`profiled`: the frames `validate` already made with it), and the profile with the
    speed level taken from the baseline's runs. Without the measurements, the profile's stages alone."""
    from .profile import fit, measurement_files

    files = measurement_files(profile)
    refitted = {}
    if all(f.is_file() for f in files.values()):
        decode, prefill = pd.read_parquet(files["decode"]), pd.read_parquet(files["prefill"])
        refitted["decode iterations only (lockstep windows)"] = fit(decode, None)
        refitted["+ time to first token (prefill)"] = fit(decode, prefill)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for label, model in refitted.items():
        path = workdir / f"stage{len(rows) + 1}.json"
        model.to_json(path, meta={"stage": label, "from": str(profile)})
        frames = validate(runs, str(path), counterfactual=False)
        rows.append(_stage_row(label, frames["steps"], frames["summary"], str(path)))
    rows.append(_stage_row("fitted to batch makespans (+ departures)", profiled["steps"], profiled["summary"], str(profile)))
    if "baseline" in runs and len(runs) > 1:  # the profile again, its level set by the baseline's recorded runs
        from lssim.fidelity import anchor_on_baseline, median_over_repeats

        anchored, _ = median_over_repeats(anchor_on_baseline(profiled["steps_by_repeat"]))
        per_policy = anchored.groupby("policy")["ape_pct"]
        table = profiled["summary"].drop(index="baseline").assign(
            makespan_median_ape_pct=per_policy.median(), makespan_p90_ape_pct=per_policy.quantile(0.9))
        rows.append(_stage_row("+ speed level from the baseline's runs (baseline excluded)", anchored, table, str(profile)))
    return pd.DataFrame(rows).set_index("stage")


def _stage_row(label: str, steps: pd.DataFrame, summary: pd.DataFrame, model: str) -> dict:
    ape = steps["ape_pct"]
    signed = (steps["predicted_seconds"] / steps["measured_seconds"] - 1) * 100
    return {"stage": label, "median_ape_pct": float(ape.median()), "p90_ape_pct": float(np.percentile(ape, 90)),
            "median_signed_pct": float(signed.median()),
            "worst_policy_median_ape_pct": float(summary["makespan_median_ape_pct"].max()),
            "worst_policy_p90_ape_pct": float(summary["makespan_p90_ape_pct"].max()),
            "largest_speedup_error_points": float(summary["speedup_error_points"].abs().max()) if "speedup_error_points" in summary else np.nan,
            "model": model}


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from lssim.controller import RunConfig
    from lssim.cost import ProfiledCostModel
    from lssim.results import policy_dirname
    from lssim.policy import available_policies, make_policy
    from lssim.fidelity import load_run, plot
    from lssim.tables import format_fidelity

    from .world import RealSetup, out_dir_problem, prepare

    out = Path(args.out)
    if args.reprofile and args.runs:
        raise ValueError("--reprofile measures the engine the runs are recorded on; with --runs there is none (use --profile)")
    profile = str(out / "profile.json") if args.reprofile else args.profile
    if not args.reprofile:
        ProfiledCostModel.from_json(profile)  # a missing or bad file fails here, before anything runs
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise ValueError(f"--out {args.out} is not empty (pass --overwrite to replace what is there)")

    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.mode is None and (args.staleness != 1 or args.async_variant != "roll"):
        raise ValueError("--staleness and --async-variant are for --mode (the modes' validation)")
    if args.runs:
        recorded = [load_run(folder) for folder in args.runs]
        config = setup = specs = None
    else:
        config = RunConfig(steps=args.steps, groups_per_step=args.groups_per_step, group_size=args.group_size,
                           max_tokens=args.max_tokens, seed=args.seed)
        setup = RealSetup(n_prompts=args.n_prompts)
        policies = args.policies or ("baseline" if args.mode else "baseline,hadb")  # per mode: the baseline alone
        specs = _policy_specs(policies, available_policies, make_policy)
        for spec in specs:  # every policy checked before the engine starts
            prepare(setup, spec, config)
            problem = out_dir_problem(out / "real" / policy_dirname(spec), args.overwrite)
            if problem:
                raise ValueError(problem)
    if args.mode is not None:  # per execution mode, end to end (validate_modes.py)
        from .validate_modes import run as run_modes

        if args.reprofile:
            raise ValueError("--reprofile is not offered with --mode; profile first (`lssim profile`) and pass --profile")
        return run_modes(args, specs, setup, config)
    if not args.runs:
        recorded = _record(specs, setup, config, out, args.repeats, profile if args.reprofile else None)
    runs: dict[str, list] = {}
    for r in recorded:  # several recordings of one policy are repeats
        runs.setdefault(r.name, []).append(r)

    print(f"replaying {len(recorded)} runs in the simulator (profile {profile}) ...", file=sys.stderr)
    frames = validate(runs, profile, counterfactual=not args.no_counterfactual)
    frames["stages"] = stages(runs, profile, out / "models", frames)
    from lssim.results import atomic_write

    for name in ("steps", "steps_by_repeat", "responses", "noise"):
        if name in frames:
            atomic_write(out / f"{name}.parquet", lambda p, f=frames[name]: f.to_parquet(p, index=False))
    for name in ("summary", "counterfactual", "stages"):
        if name in frames:
            atomic_write(out / f"{name}.csv", lambda p, f=frames[name]: f.to_csv(p))
    atomic_write(out / "validation.png", lambda p: plot(frames["steps"], p))
    print(format_fidelity(frames))
    print(f"written to {out}/ (summary.csv, steps.parquet, responses.parquet, stages.csv, validation.png, ...)")
    return 0


def _record(specs, setup, config, out: Path, repeats: int = 1, profile_to: str | None = None) -> list:
    """Run each policy `repeats` times on one engine, recorded under out/real/<policy>/repeat<k>/. Repeat-major
    order (every policy once, then every policy again): the machine's speed drifts over minutes, and drift must
    reach every policy alike instead of passing for one policy's speedup. With `profile_to`, the engine is
    profiled first (real_backend.profile.profile_engine), minutes before the runs it is to predict."""
    import tempfile
    from dataclasses import asdict

    from lssim.controller import RunConfig
    from lssim.results import policy_dirname
    from lssim.fidelity import load_run
    from lssim.tables import format_step

    from .world import prepare, run_real, start_engine

    prompts, _ = prepare(setup, specs[0], config)
    t0 = time.monotonic()
    print("starting the vLLM engine ...", file=sys.stderr)
    engine = start_engine(setup, prompts, seed=config.seed)
    print(f"engine up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    runs = []
    try:
        # A throwaway run first: the engine's and the trainer's first steps in a process are slower (kernels for new
        # batch shapes, allocator), and the first recorded run would pay for it.
        with tempfile.TemporaryDirectory() as scratch:
            prompts, policy = prepare(setup, "baseline", config)
            warm = RunConfig(**{**asdict(config), "steps": 2, "total_groups": None})
            run_real(setup, policy, warm, scratch, engine=engine, prompts=prompts)
        if profile_to:
            from .profile import profile_engine

            print(f"profiling the engine into {profile_to} ...", file=sys.stderr)
            out.mkdir(parents=True, exist_ok=True)
            profile_engine(engine, profile_to, meta={"command": " ".join(sys.argv), "model": setup.model_dir})
        for k in range(repeats):
            for spec in specs:
                prompts, policy = prepare(setup, spec, config)  # fresh data loader and policy for every run
                folder = out / "real" / policy_dirname(spec) / f"repeat{k}"
                print(f"-- {spec} (repeat {k + 1} of {repeats}): {config.steps} steps on vLLM", file=sys.stderr)
                run_real(setup, policy, config, folder, engine=engine, prompts=prompts,
                         on_step=lambda row: print("   " + format_step(row), file=sys.stderr),
                         meta={"command": " ".join(sys.argv), "policy_spec": spec, "repeat": k})
                runs.append(load_run(folder))
    finally:
        engine.close()
    return runs


def _policy_specs(text: str, available, make_policy) -> list[str]:
    """The --policies list; "all" is every policy the real backend runs (not the oracle's, not speculation's)."""
    if text.strip() == "all":
        specs = []
        for name in available():
            p = make_policy(name)
            if not p.needs().oracle and p.needs().speculation is None:
                specs.append(name)
    else:
        specs = [s.strip() for s in text.split(",") if s.strip()]
    if not specs:
        raise ValueError("--policies: no policy given")
    if "baseline" not in specs:
        specs.insert(0, "baseline")  # the speedups are over it
    return list(dict.fromkeys(specs))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default=None, metavar="A,B,...",
                   help="policies to run on vLLM and replay (comma-separated specs, or 'all'); baseline is always added "
                        "(default: baseline,hadb; with --mode: baseline)")
    p.add_argument("--runs", nargs="+", metavar="DIR", help="take runs recorded by `lssim real --out DIR` instead of running "
                        "(several runs of one policy are repeats: their per-step median is compared)")
    p.add_argument("--profile", default=str(DEFAULT_PROFILE), metavar="JSON",
                   help=f"profiled cost model (`lssim profile`; default: {DEFAULT_PROFILE.relative_to(Path.cwd()) if DEFAULT_PROFILE.is_relative_to(Path.cwd()) else DEFAULT_PROFILE})")
    p.add_argument("--reprofile", action="store_true",
                   help="profile the engine first, on the engine the runs are then recorded on, into OUT/profile.json "
                        "(recalibration and validation in one command; about 3 minutes more on this CPU)")
    p.add_argument("--steps", type=int, default=5, help="RL steps per run (default: 5)")
    p.add_argument("--groups-per-step", type=int, default=8, help="prompts per step (default: 8)")
    p.add_argument("--group-size", type=int, default=4, help="samples per prompt (default: 4)")
    p.add_argument("--max-tokens", type=int, default=256, help="response-token budget (default: 256)")
    p.add_argument("--n-prompts", type=int, metavar="N", help="use only the first N prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-counterfactual", action="store_true", help="skip predicting each policy from the baseline's trace")
    p.add_argument("--repeats", type=int, default=5, metavar="K",
                   help="record each policy K times (same seeds) and compare per-step medians; the spread of the K runs is "
                        "the machine's timing noise (default: 5; with 3, this 2-core VM's noise alone put some policies "
                        "past the targets)")
    p.add_argument("--mode", metavar="A,B,...", help="validate the end-to-end step time per execution mode instead: record "
                   "each policy in each mode (collocated, disaggregated, async, hybrid), replay each in its mode, report the "
                   "per-step error per mode and whether the predicted ranking of the modes is the measured one "
                   "(real_backend/validate_modes.py; policies default to baseline; with --runs, 'any' takes every run)")
    p.add_argument("--staleness", type=int, default=1, metavar="K", help="with --mode async: the staleness bound (default 1)")
    p.add_argument("--async-variant", choices=["roll", "areal"], default="roll", help="with --mode async (default: roll)")
    p.add_argument("--train-profile", default=str(Path(__file__).with_name("profile_trainer_cpu.json")), metavar="JSON",
                   help="with --mode: the trainer's profiled cost (python -m real_backend.profile_trainer; default: "
                        "real_backend/profile_trainer_cpu.json)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the runs and the comparison")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")


__all__ = ["validate", "run", "add_arguments", "sim_setup"]
