"""`lssim validate`: record real runs (or take recorded ones), replay each in the simulator with the same
policy, seeds, data loader and a profiled cost model, and report how far the prediction is.

    lssim validate --out runs/validate                                   # the small subset (--policies ci)
    lssim validate --policies seer,breaker,hadb --reprofile --json --out runs/v   # one JSON object on stdout
    lssim validate --full --out runs/validate-full                       # every policy of the table (README)
    lssim validate --runs runs/a runs/b --out runs/validate-ab           # runs recorded by `lssim real`
    lssim validate --runs runs/v/real/*/*/repeat* --profile runs/v/profile.json --json --out runs/v-again  # replay again

Each policy runs in its own world (real_backend/validation_workloads.toml: engine instances, budget, steps,
pool, and the policy's parameters scaled to the task) beside that world's baseline, so that it acts there; a
policy that changed no response on the real engine (lssim.analysis.fidelity.acted) fails the command (exit status 1,
the policy named). Writes to --out: real/<world>/<policy>/repeat<k>/ (each recorded run, unless --runs),
steps.parquet and responses.parquet (predicted against measured, lssim.analysis.fidelity.compare), acted.parquet (per
policy and repeat, the responses it changed, by kind), summary.csv (per policy: errors, speedups, acted, the
real engine's repeat spread, the goal), fidelity.md (the README's table), counterfactual.csv (each policy
predicted from its world's baseline trace), validation.png (predicted vs measured per step), stages.csv (the
error after each modelling step), noise.parquet (the spread of the repeats) and speedups.parquet (each repeat's
real speedup over its world's baseline), driver.csv (per world: the driver's price every twin of the world
charges, or why none) and unpriced.parquet (the twins without it, per step). Every input is checked before the
engine starts. Results and how to read them: real_backend/README.md.

The comparison is real_backend/sim_vs_real.py, the recording real_backend/validate_record.py, a recorded run's
twin real_backend/validate_twin.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from .sim_vs_real import validate_worlds
from .validate_record import default_max_repeats, greedy_world, out_path, record_runs, world_config, world_setup
from .validate_modes import run as run_modes
from .validate_twin import load_recorded
from .validation_workloads import load_workloads


DEFAULT_PROFILE = Path(__file__).parent / "data" / "profile_cpu.json"
DEFAULT_WORKLOADS = Path(__file__).with_name("validation_workloads.toml")


def run(args: argparse.Namespace) -> int:
    """`lssim validate`: check every input, record (or load) the runs world by world, replay, compare, write,
    print; exit status 1 when a policy did not act on the real engine."""
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from lssim.cost import ProfiledCostModel

    out = Path(args.out)
    if args.reprofile and args.runs:
        raise ValueError("--reprofile measures the engine the runs are recorded on; with --runs there is none (use --profile)")
    if args.full and args.runs:
        raise ValueError("--full records every policy of the workload table; with --runs nothing is recorded")
    profile = str(out / "profile.json") if args.reprofile else args.profile
    if not args.reprofile:
        ProfiledCostModel.from_json(profile)  # a missing or bad file fails here, before anything runs
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise ValueError(f"--out {args.out} is not empty (pass --overwrite to replace what is there)")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.max_repeats is not None and (args.runs or args.mode is not None):
        raise ValueError("--max-repeats records repeats until the goal can be tested; with --runs or --mode it cannot")
    if args.max_repeats is not None and args.max_repeats < args.repeats:
        raise ValueError(f"--max-repeats ({args.max_repeats}) must be at least --repeats ({args.repeats})")
    if args.mode is not None:  # per execution mode, end to end (validate_modes.py)
        return _validate_modes(args)
    args.max_repeats = default_max_repeats(args)
    if args.staleness != 1 or args.async_variant != "roll":
        raise ValueError("--staleness and --async-variant are for --mode (the modes' validation)")
    table = load_workloads(args.workloads)
    if args.runs:
        recorded = [load_recorded(folder) for folder in args.runs]
    else:
        plan = _plan(args, table)
        recorded = record_runs(plan, args, out, profile if args.reprofile else None)
    by_world: dict[str, dict[str, list]] = {}
    for r in recorded:  # several recordings of one policy in one world are repeats
        world = r.meta.get("world", "default")
        by_world.setdefault(world, {}).setdefault(r.meta.get("validation_name") or r.name, []).append(r)
    print(f"replaying {len(recorded)} runs in the simulator (profile {profile}) ...", file=sys.stderr)
    frames = validate_worlds(by_world, profile, counterfactual=not args.no_counterfactual, stages_dir=out / "models")
    _write(frames, out, profile)
    return _report(frames, out, args.json)


def _validate_modes(args) -> int:
    """`lssim validate --mode A,B,...`: the policies (default: the baseline alone) in each mode, on the run shape
    the options give (default 5 steps x 8 groups x 4 samples, 256 tokens), checked before the engine starts."""
    from lssim.loop.controller import RunConfig

    from .world import RealSetup, prepare

    if args.full:
        raise ValueError("--mode takes no --full: name the modes (and --policies) to record")
    if args.runs:
        return run_modes(args, None, None, None)
    config = RunConfig(steps=args.steps or 5, groups_per_step=args.groups_per_step or 8, group_size=args.group_size or 4,
                       max_tokens=args.max_tokens or 256, seed=args.seed)
    setup = RealSetup(n_prompts=args.n_prompts, trainer_process=args.trainer_process)
    specs = ["baseline"] if args.policies == "ci" else [x.strip() for x in args.policies.split(",") if x.strip()]
    for spec in specs:
        prepare(setup, spec, config)
    return run_modes(args, specs, setup, config)


def _plan(args, table) -> list[tuple]:
    """(world, [(name, spec), ...] with the baseline first) for each world a selected policy runs in; every
    policy and world checked (prepare) before an engine starts."""
    from lssim.loop.policy import available_policies

    from .world import out_dir_problem, prepare

    text = "all" if args.full else args.policies.strip()
    if text in ("all", "ci"):
        names = table.select(text)
    else:
        names = [s.strip() for s in text.split(",") if s.strip()]
    names = [n for n in dict.fromkeys(names) if n != "baseline"]
    if not names:
        raise ValueError("--policies: no policy given (baseline alone has nothing to validate)")
    plan: dict[str, tuple] = {}
    for name in names:
        w = table.for_spec(name)
        if w.name not in table.policies and name.split("(")[0] not in available_policies() and "+" not in name:
            raise ValueError(f"--policies: unknown policy {name!r} (known: {', '.join(available_policies())})")
        plan.setdefault(w.world.name, (w.world, [("baseline", "baseline")]))[1].append((w.name, w.spec))
    for world, specs in plan.values():
        greedy = greedy_world(specs)
        if greedy:
            print(f"world {world.name}: speculation on the CPU build, every policy in it runs greedy", file=sys.stderr)
        setup = world_setup(world, args, greedy)
        config = world_config(world, args)
        for name, spec in specs:
            prepare(setup, spec, config)
            problem = out_dir_problem(out_path(args.out, world.name, spec), args.overwrite)
            if problem:
                raise ValueError(problem)
    return list(plan.values())


def _write(frames: dict, out: Path, profile: str) -> None:
    from lssim.analysis.fidelity.report import fidelity_markdown, phases_markdown
    from lssim.results import atomic_write

    for name in ("steps", "steps_by_repeat", "responses", "noise", "acted", "anchored", "real_cuts", "speedups", "probed", "phases",
                 "unpriced"):
        if name in frames:
            atomic_write(out / f"{name}.parquet", lambda p, f=frames[name]: f.to_parquet(p, index=False))
    for name in ("summary", "counterfactual", "stages", "driver"):
        if name in frames:
            atomic_write(out / f"{name}.csv", lambda p, f=frames[name]: f.to_csv(p))
    from lssim.analysis.plots import figure_png, sim_vs_real

    atomic_write(out / "validation.png", lambda p: Path(p).write_bytes(figure_png(sim_vs_real(frames["steps"]))))
    if "anchored" in frames:  # the same steps with each world's speed level from its baseline
        atomic_write(out / "validation_anchored.png",
                     lambda p: Path(p).write_bytes(figure_png(sim_vs_real(frames["anchored"]))))
    models = sorted(set(frames["summary"].get("cost_model", pd.Series([profile])).dropna()) - {profile})
    described = profile + (f" (worlds of several instances: {'; '.join(models)})" if models else "")
    text = fidelity_markdown(frames["summary"], described) + (phases_markdown(frames["phases"]) if "phases" in frames else "")
    atomic_write(out / "fidelity.md", lambda p: Path(p).write_text(text))


def _report(frames: dict, out: Path, as_json: bool) -> int:
    """Print the tables (to stderr with --json, which prints one JSON object on stdout); 1 if a policy did not act."""
    from lssim.analysis.fidelity.summary import policy_results, unacted
    from lssim.analysis.tables import format_fidelity

    text = format_fidelity(frames) + "\n\nacted on the real engine (responses the policy changed, median of the repeats):\n"
    cols = ["world", "acted", "responses", "stopped", "stops_predicted", "stop_precision", "stop_recall", "dropped", "carried", "rebudgeted", "resubmitted", "placed",
            "reselected", "repeat_spread_median_pct", "repeat_spread_p90_pct", "speed_level", "probed_median_ape_pct",
            "probed_p90_ape_pct", "anchored_median_ape_pct",
            "anchored_p90_ape_pct", "speed_factor", "real_cuts_median_ape_pct", "real_cuts_p90_ape_pct",
            "noise_floor_median_pct", "noise_floor_p90_pct", "repeats_for_goal", "meets_goal", "meets_goal_probed",
            "meets_goal_anchored", "within_noise", "unpriced_median_ape_pct", "driver_priced"]
    s = frames["summary"]
    text += s[[c for c in cols if c in s]].to_string(float_format=lambda v: f"{v:.2f}")
    text += "\n\nthe driver's price per world (beyond the profile's cells; unpriced_*: the twin without it):\n"
    text += frames["driver"].to_string(float_format=lambda v: f"{v:.3g}")
    text += f"\nwritten to {out}/ (summary.csv, fidelity.md, steps.parquet, acted.parquet, validation.png, ...)"
    print(text, file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(policy_results(s, str(out)), indent=2, default=float))
    idle = unacted(s)
    if idle:
        print(f"lssim validate: FAILED: {', '.join(idle)} did not act on the real engine (acted = 0): its validation "
              f"only measures the baseline; give it a world in real_backend/validation_workloads.toml where it acts",
              file=sys.stderr)
        return 1
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default="ci", metavar="A,B,...",
                   help="policies to run on vLLM and replay, each in its world from --workloads (comma-separated names or "
                        "specs; 'ci': the small subset; 'all': every policy in the table); each world's baseline is added "
                        "(default: ci)")
    p.add_argument("--full", action="store_true", help="every policy of the workload table (the README's measurement)")
    p.add_argument("--workloads", default=str(DEFAULT_WORKLOADS), metavar="TOML",
                   help="the per-policy validation worlds (default: real_backend/validation_workloads.toml)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout: policies: {name: {acted, step_error_median, step_error_p90, "
                        "exact_step_error_median, noise_ratio, speedup_error, repeat_spread, ...}}; with --mode, modes: "
                        "{mode: {step_error_median, step_error_p90, exact_step_error_median, noise_ratio, speedup_error, "
                        "runs, ...}} and pooled (the tables go to stderr)")
    p.add_argument("--runs", nargs="+", metavar="DIR", help="take runs recorded by `lssim real --out DIR` instead of running "
                        "(several runs of one policy are repeats: their per-step median is compared)")
    p.add_argument("--profile", default=str(DEFAULT_PROFILE), metavar="JSON",
                   help=f"profiled cost model (`lssim profile`; default: {DEFAULT_PROFILE.relative_to(Path.cwd()) if DEFAULT_PROFILE.is_relative_to(Path.cwd()) else DEFAULT_PROFILE})")
    p.add_argument("--reprofile", action="store_true",
                   help="profile the engine first, on the engine the runs are then recorded on, into OUT/profile.json "
                        "(recalibration and validation in one command; about 3 minutes more on this CPU)")
    p.add_argument("--steps", type=int, help="RL steps per run, in every world (default: each world's)")
    p.add_argument("--groups-per-step", type=int, help="prompts per step, in every world (default: each world's)")
    p.add_argument("--group-size", type=int, help="samples per prompt, in every world (default: each world's)")
    p.add_argument("--max-tokens", type=int, help="response-token budget, in every world (default: each world's)")
    p.add_argument("--n-prompts", type=int, metavar="N", help="use only the first N prompts (default: each world's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-counterfactual", action="store_true", help="skip predicting each policy from the baseline's trace")
    p.add_argument("--repeats", type=int, default=5, metavar="K",
                   help="record each policy K times (same seeds) and compare per-step medians; the spread of the K runs is "
                        "the machine's timing noise (default: 5; with 3, this 2-core VM's noise alone put some policies "
                        "past the targets)")
    p.add_argument("--max-repeats", type=int, metavar="N",
                   help="after --repeats, keep recording repeats, up to N, until the goal can be tested: until an exact "
                        "model would typically meet it against the repeats of every policy on the engine, per step and "
                        "in the speedup (the noise floors, lssim.analysis.fidelity.noise_floor and speedup_noise_floor; a noisy "
                        "machine, or a large speedup, needs more). Default: 3 x --repeats for a subset of policies; "
                        "exactly --repeats with --full or --policies all")
    p.add_argument("--mode", metavar="A,B,...", help="validate the end-to-end step time per execution mode instead: record "
                   "each policy (default: baseline) in each mode (collocated, disaggregated, async, hybrid), replay each "
                   "in its mode, report the per-step error per mode beside an exact model's on the same runs (their "
                   "ratio, noise_ratio), the speedup over collocated, and whether the predicted ranking of the modes is "
                   "the measured one (real_backend/validate_modes.py; with --runs, 'any' takes every run). The engine "
                   "beside the GRPO trainer is measured first into OUT/profile.json (real_backend/host_sharing.py); "
                   "with --reprofile the engine is profiled there too (recommended: the level of these minutes, and the "
                   "cells' driver time the driver's price needs)")
    p.add_argument("--staleness", type=int, default=1, metavar="K", help="with --mode async: the staleness bound (default 1)")
    p.add_argument("--async-variant", choices=["roll", "areal"], default="roll", help="with --mode async (default: roll)")
    p.add_argument("--trainer-process", action="store_true",
                   help="with --mode: the trainer's passes in a process of their own (lssim real --trainer-process)")
    p.add_argument("--train-profile", default=str(Path(__file__).parent / "data" / "profile_trainer_cpu.json"), metavar="JSON",
                   help="with --mode: the trainer's profiled cost (python -m real_backend.profile_trainer; default: "
                        "real_backend/data/profile_trainer_cpu.json)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the runs and the comparison")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")
