"""`lssim validate`: record real runs (or take recorded ones), replay each in the simulator with the same
policy, seeds, data loader and a profiled cost model, and report how far the prediction is.

    lssim validate --out runs/validate                                   # the small subset (--policies ci)
    lssim validate --policies seer,breaker,hadb --reprofile --json --out runs/v   # one JSON object on stdout
    lssim validate --full --out runs/validate-full                       # every policy of the table (README)
    lssim validate --runs runs/a runs/b --out runs/validate-ab           # runs recorded by `lssim real`

Each policy runs in its own world (real_backend/validation_workloads.toml: engine instances, budget, steps,
pool, and the policy's parameters scaled to the task) beside that world's baseline, so that it acts there; a
policy that changed no response on the real engine (lssim.analysis.fidelity.acted) fails the command (exit status 1,
the policy named). Writes to --out: real/<world>/<policy>/repeat<k>/ (each recorded run, unless --runs),
steps.parquet and responses.parquet (predicted against measured, lssim.analysis.fidelity.compare), acted.parquet (per
policy and repeat, the responses it changed, by kind), summary.csv (per policy: errors, speedups, acted, the
real engine's repeat spread, the goal), fidelity.md (the README's table), counterfactual.csv (each policy
predicted from its world's baseline trace), validation.png (predicted vs measured per step), stages.csv (the
error after each modelling step), noise.parquet (the spread of the repeats) and speedups.parquet (each repeat's
real speedup over its world's baseline). Every input is checked before the engine starts. Results and how to read
them: real_backend/README.md.

The simulated twin of each run replays the run's trace completed with the responses the run left unfinished at
its end (its unfinished.parquet, or for older collocated folders its checkpoint: `load_recorded`,
lssim.analysis.fidelity.twin_trace); summary.csv splits each speedup error
into the points from groups trained and from rollout seconds (speedup_points_groups / _seconds).
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
DEFAULT_WORKLOADS = Path(__file__).with_name("validation_workloads.toml")


def sim_setup(run, profile: str, probe: bool = True):
    """The simulated twin of the run's engine: its instances and limits, the profiled cost model of one instance
    (`profile`), and for several instances sharing the host, that profile's measured layout (real_backend.layout:
    how much slower an instance runs while 1, 2, ... are busy, for the CPUs the run's instances were bound to,
    priced on a shared clock by lssim.sim.shared_host); for an engine started with speculation, the layout measured on
    such an engine (drafting off); ValueError naming the command that measures it when there is none.
    With `probe`, the cost model is scaled by the run's speed level (speed_level): the machine's speed during the
    run over its speed while that cost model was measured, both from the speed probe."""
    from lssim.analysis.replay import SimSetup

    real = run.meta.get("setup", {})
    max_num_seqs, max_model_len = int(real.get("max_num_seqs", 256)), int(real.get("max_model_len", 1024))
    n_instances = _instances(run)
    model, slowdown, _ = _twin_cost(run, profile)
    factor = speed_level(run, profile) if probe else None
    if factor is not None:
        from lssim.cost import ProfiledCostModel

        from .layout import scaled_model

        base = ProfiledCostModel.from_json(model)
        model = scaled_model(base, factor, name=f"{base.name} x {factor:.3f} (speed probe)")
    # The CPU engine's KV cache holds far more than max_num_seqs full contexts of the tiny model: never preempts.
    return SimSetup(model="tiny-ref", n_instances=n_instances, max_num_seqs=max_num_seqs,
                    kv_capacity_tokens=max_num_seqs * max_model_len, profile=model, host_slowdown=slowdown)


def speed_level(run, profile: str) -> float | None:
    """The run's speed probes (meta.json) over the reference probe of the cost model its twin is calibrated on (the
    profile, or the layout of its engine: real_backend.layout.layout_profile); None when either has none."""
    from .layout import layout_profile
    from .speed_probe import speed_factor

    started_with = run.meta.get("engine", {}).get("speculation")
    calibrated_on = layout_profile(profile, _instances(run), run.meta.get("setup", {}).get("cpus"), speculating=bool(started_with))
    return speed_factor(run.meta, calibrated_on)


def _instances(run) -> int:
    real = run.meta.get("setup", {})
    return int(run.meta.get("engine", {}).get("n_instances") or real.get("n_instances") or 1)


def _twin_cost(run, profile: str) -> tuple:
    """real_backend.layout.twin_cost for the run's engine: (cost model JSON, host slow-down or None, description).
    Whether the engine was started with speculation is in meta.json's "engine" (runs recorded before it was: plain)."""
    from .layout import twin_cost

    started_with = run.meta.get("engine", {}).get("speculation")
    return twin_cost(profile, _instances(run), run.meta.get("setup", {}).get("cpus"), speculating=bool(started_with))


def run_prompts(run):
    """A fresh copy of the data loader the run drew from (same prompts file, pool and seed)."""
    from .prompts import TaskPrompts

    real = run.meta["setup"]
    return TaskPrompts.from_files(real["prompts_path"], real["model_dir"], real.get("n_prompts"), seed=run.config.seed)


def load_recorded(folder):
    """lssim.analysis.fidelity.load_run, with the responses the run left unfinished at its end (RecordedRun.unfinished): the
    simulated twin needs them (fidelity.twin_trace). From the folder's unfinished.parquet (real_backend.recorder
    writes it after every step, in every mode) where it is of the run's last recorded step; else, for folders
    recorded before it was written (or one a kill left a step ahead of steps.parquet), from the checkpoint
    (collocated runs only; others then go without, and their twin fills the holes from the groups' members)."""
    from lssim.analysis.fidelity import UNFINISHED_COLUMNS, UNFINISHED_FILE, load_run

    run = load_run(folder)
    last = int(run.steps["step"].iloc[-1])
    if (Path(folder) / UNFINISHED_FILE).is_file():
        after = run.unfinished.attrs.get("after_step")
        if after is None or int(after) == last:  # None: written by another recorder, taken as it is
            return run
        print(f"warning: {folder}: its {UNFINISHED_FILE} is of step {after}, its last recorded step {last} (killed "
              f"between two files' renames): not used", file=sys.stderr)
        run.unfinished = pd.DataFrame(columns=UNFINISHED_COLUMNS)
    carried = int(run.steps["carried_out"].iloc[-1]) if "carried_out" in run.steps else 0
    if carried:
        run.unfinished = unfinished_from_checkpoint(folder, last)
        if len(run.unfinished) != carried:
            print(f"warning: {folder}: its last step carried out {carried} responses, its checkpoint holds "
                  f"{len(run.unfinished)}: the simulated twin fills the others in from their groups", file=sys.stderr)
    return run


def unfinished_from_checkpoint(folder, last_step: int) -> pd.DataFrame:
    """The responses carried out of the run's step `last_step`, from the checkpoint `lssim real` writes after every
    step (real_backend.checkpoint: the controller's carried responses); empty when there is none, it cannot be read,
    or it was written after another step."""
    from lssim.analysis.fidelity import UNFINISHED_COLUMNS

    from .checkpoint import CHECKPOINT, load_checkpoint

    empty = pd.DataFrame(columns=UNFINISHED_COLUMNS)
    if not (Path(folder) / CHECKPOINT).is_file():
        return empty
    try:
        ckpt = load_checkpoint(folder)
    except ValueError as e:  # written by another version of the code: the twin goes without
        print(f"warning: {e}", file=sys.stderr)
        return empty
    if ckpt.step != last_step:
        print(f"warning: {folder}: its checkpoint is of step {ckpt.step}, its last recorded step {last_step}", file=sys.stderr)
        return empty
    carried = ckpt.carried
    return pd.DataFrame([(r.step, r.prompt_id, r.sample_idx, r.group_id, r.prompt_len, r.generated,
                          r.tokens_before_resume, r.max_tokens) for r in carried], columns=UNFINISHED_COLUMNS)


def validate(runs: dict, profile: str, counterfactual: bool = True, probe: bool = True) -> dict[str, pd.DataFrame]:
    """Replay each recorded run in the simulator and compare. `runs`: policy -> its recordings (a RecordedRun or a
    list of repeats; each repeat is replayed from its own trace, and per step the medians are compared).
    Returns the frames `lssim validate` writes: steps (one row per policy and step), responses, summary,
    noise (with repeats) and counterfactual. `probe`: each twin at its run's speed level (sim_setup). The
    per-repeat steps have that level either way (speed_level, NaN where a run or the profile has no probe)."""
    from lssim.analysis.fidelity import (compare, compare_phases, ends_rollouts, fidelity_table, length_distance, median_over_repeats,
                                replay_run, speedup_by_repeat, with_real_cuts)

    runs = {name: rs if isinstance(rs, list) else [rs] for name, rs in runs.items()}
    step_frames, response_frames, cut_frames, groups, first_sim, group_rows, phase_frames = [], [], [], {}, {}, [], []
    for name, repeats in runs.items():
        measured_groups, predicted_groups = [], []
        cuts = ends_rollouts(repeats[0].name)
        for k, run in enumerate(repeats):
            sim = replay_run(run, sim_setup(run, profile, probe), run_prompts(run))
            first_sim.setdefault(name, sim)
            s, r = compare(run, sim, name)
            level = speed_level(run, profile)
            step_frames.append(s.assign(repeat=k, speed_level=np.nan if level is None else level))
            response_frames.append(r.assign(repeat=k))
            # where a twin is off: the admission or the generation; on a shared host, the shared part or the tail
            phase_frames.append(compare_phases(run, sim, name).assign(repeat=k))
            if cuts:  # the same run with the real engine's cut points: what is left is the cost model's error
                cut_sim = replay_run(run, sim_setup(run, profile, probe), run_prompts(run), policy=with_real_cuts(run))
                cut_frames.append(compare(run, cut_sim, name)[0].assign(repeat=k))
            measured_groups.append(int(run.steps["groups_trained"].sum()))
            predicted_groups.append(int(sim.steps["groups_trained"].sum()))
            group_rows.append({"policy": name, "repeat": k, "measured_groups": measured_groups[-1],
                               "predicted_groups": predicted_groups[-1]})
        groups[name] = (float(np.mean(measured_groups)), float(np.mean(predicted_groups)))
    by_repeat = pd.concat(step_frames, ignore_index=True)
    steps, spread = median_over_repeats(by_repeat)
    responses = pd.concat(response_frames, ignore_index=True)
    out = {"steps": steps, "steps_by_repeat": by_repeat, "responses": responses, "summary": fidelity_table(steps, responses, groups)}
    if spread["repeat"].nunique() > 1:
        out["noise"] = spread
    if "baseline" in runs and len(runs) > 1:  # the real speedup of each repeat: its run-to-run noise
        out["speedups"] = speedup_by_repeat(by_repeat, pd.DataFrame(group_rows))
    if cut_frames:
        out["real_cuts"], _ = median_over_repeats(pd.concat(cut_frames, ignore_index=True))
    if phase_frames:
        out["phases"] = pd.concat(phase_frames, ignore_index=True)

    base = runs.get("baseline", [None])[0]
    if counterfactual and base is not None and len(runs) > 1:
        rows = []
        base_pred = first_sim["baseline"].steps
        base_per_group = base_pred["rollout_seconds"].sum() / base_pred["groups_trained"].sum()
        for name, repeats in runs.items():
            if name == "baseline":
                continue
            run = repeats[0]
            sim = replay_run(run, sim_setup(run, profile, probe), run_prompts(run), trace=base.trace)
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


def stages(runs: dict, profile: str, workdir: Path, profiled: dict[str, pd.DataFrame],
           probed: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """The error after each modelling step: the cost models refitted from the measurements `lssim profile` wrote
    beside `profile` (per-iteration decode only, + time to first token), each saved to `workdir` and replayed;
    then the profile itself (`profiled`: the frames `validate` already made with it), the profile at each run's
    probed speed level (`probed`, where the runs were probed), and the profile with the speed level taken from
    the baseline's runs. Without the measurements, the profile's stages alone."""
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
        _layouts_for(path, profile)
        frames = validate(runs, str(path), counterfactual=False, probe=False)
        rows.append(_stage_row(label, frames["steps"], frames["summary"], str(path)))
    rows.append(_stage_row("fitted to batch makespans (+ departures)", profiled["steps"], profiled["summary"], str(profile)))
    if probed is not None:
        rows.append(_stage_row("+ speed level from probes around each run", probed["steps"], probed["summary"], str(profile)))
    if "baseline" in runs and len(runs) > 1:  # the profile again, its level set by the baseline's recorded runs
        from lssim.analysis.fidelity import anchor_on_baseline, median_over_repeats

        anchored, _ = median_over_repeats(anchor_on_baseline(profiled["steps_by_repeat"]))
        per_policy = anchored.groupby("policy")["ape_pct"]
        table = profiled["summary"].drop(index="baseline").assign(
            makespan_median_ape_pct=per_policy.median(), makespan_p90_ape_pct=per_policy.quantile(0.9))
        rows.append(_stage_row("+ speed level from the baseline's runs (baseline excluded)", anchored, table, str(profile)))
    return pd.DataFrame(rows).set_index("stage")


def _layouts_for(stage, profile) -> None:
    """Beside a stage's model, the layouts measured beside `profile` refitted against it (the same cells), so that
    worlds of several instances are replayed with each stage too (real_backend.layout)."""
    from .layout import measured_layouts, write_layout

    for cells, cpus, speculating in measured_layouts(profile):
        write_layout(stage, cpus, pd.read_parquet(cells), {"stage of": str(profile)}, speculating=speculating)


def _stage_row(label: str, steps: pd.DataFrame, summary: pd.DataFrame, model: str) -> dict:
    ape = steps["ape_pct"]
    signed = (steps["predicted_seconds"] / steps["measured_seconds"] - 1) * 100
    return {"stage": label, "median_ape_pct": float(ape.median()), "p90_ape_pct": float(np.percentile(ape, 90)),
            "median_signed_pct": float(signed.median()),
            "worst_policy_median_ape_pct": float(summary["makespan_median_ape_pct"].max()),
            "worst_policy_p90_ape_pct": float(summary["makespan_p90_ape_pct"].max()),
            "largest_speedup_error_points": float(summary["speedup_error_points"].abs().max()) if "speedup_error_points" in summary else np.nan,
            "model": model}


def validate_worlds(by_world: dict[str, dict[str, list]], profile: str, counterfactual: bool = True,
                    stages_dir: Path | None = None) -> dict[str, pd.DataFrame]:
    """`validate` in each world (world -> policy -> its repeats, "baseline" among them), the frames joined. Each
    world's baseline is named baseline@WORLD; the summary gains per policy its world and spec, how much it
    acted on the real engine (lssim.analysis.fidelity.acted against its world's baseline, median over the repeats) and
    the real engine's run-to-run spread of its step times, and its errors with the world's speed level taken from
    the world's baseline (lssim.analysis.fidelity.anchor_on_baseline; the frame "anchored") (lssim.analysis.fidelity.policy_summary)."""
    from lssim.analysis.fidelity import acted, anchor_on_baseline, median_over_repeats, policy_summary

    joined: dict[str, list[pd.DataFrame]] = {}
    acted_rows = []
    for world, runs in by_world.items():
        frames = validate(runs, profile, counterfactual=counterfactual, probe=False)
        probed = None
        if frames["steps_by_repeat"]["speed_level"].notna().all():  # every run probed: the twin at each run's level
            probed = validate(runs, profile, counterfactual=False, probe=True)
            frames["probed"] = probed["steps"]
            if "phases" in probed:  # the shared part and the tail against the twin at each run's level
                frames["phases"] = probed["phases"]
        if stages_dir is not None:
            frames["stages"] = stages(runs, profile, stages_dir / world, frames, probed).assign(world=world).reset_index()
        base = runs.get("baseline", [])
        if base and len(runs) > 1:  # the world's speed level from its own baseline (engine and load of the minute)
            scaled = anchor_on_baseline(frames["steps_by_repeat"])
            frames["anchored"] = median_over_repeats(scaled)[0].assign(speed_factor=scaled.attrs["speed_factor"])
        for name, repeats in runs.items():
            if name == "baseline" or not base:
                continue
            for k, run in enumerate(repeats):  # repeat k against the baseline's repeat k (same engine minutes)
                acted_rows.append({"policy": name, "repeat": k, **acted(run, base[k % len(base)])})
        new = f"baseline@{world}"
        # the cost model the world's twin priced with: the profile, or its measured layout (several instances, or
        # an engine started with speculation)
        cost_model = _twin_cost(next(iter(runs.values()))[0], profile)[2]
        for key, frame in frames.items():
            if key in ("summary", "counterfactual"):
                frame = frame.rename(index={"baseline": new}).assign(world=world, cost_model=cost_model)
                frame["spec"] = [runs["baseline" if p == new else p][0].name for p in frame.index]
            elif "policy" in frame:
                frame = frame.assign(policy=frame["policy"].replace("baseline", new), world=world)
            joined.setdefault(key, []).append(frame)
    out = {k: pd.concat(v) if k in ("summary", "counterfactual") else pd.concat(v, ignore_index=True) for k, v in joined.items()}
    if "stages" in out:
        out["stages"] = out["stages"].set_index(["world", "stage"])
    out["acted"] = pd.DataFrame(acted_rows)
    out["summary"] = policy_summary(out["summary"], out["acted"], out.get("noise"), out.get("anchored"), out.get("real_cuts"),
                                    out.get("speedups"), out["steps_by_repeat"], out.get("probed"))
    return out


def run(args: argparse.Namespace) -> int:
    """`lssim validate`: check every input, record (or load) the runs world by world, replay, compare, write,
    print; exit status 1 when a policy did not act on the real engine."""
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from lssim.cost import ProfiledCostModel

    from .validation_workloads import load_workloads

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
        recorded = _record(plan, args, out, profile if args.reprofile else None)
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

    from .validate_modes import run as run_modes
    from .world import RealSetup, prepare

    if args.reprofile or args.full:
        raise ValueError("--mode takes neither --reprofile nor --full; profile first (`lssim profile`) and pass --profile")
    if args.runs:
        return run_modes(args, None, None, None)
    config = RunConfig(steps=args.steps or 5, groups_per_step=args.groups_per_step or 8, group_size=args.group_size or 4,
                       max_tokens=args.max_tokens or 256, seed=args.seed)
    setup = RealSetup(n_prompts=args.n_prompts)
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
        greedy = _greedy(specs)
        if greedy:
            print(f"world {world.name}: speculation on the CPU build, every policy in it runs greedy", file=sys.stderr)
        setup = _world_setup(world, args, greedy)
        config = _world_config(world, args)
        for name, spec in specs:
            prepare(setup, spec, config)
            problem = out_dir_problem(out_path(args.out, world.name, spec), args.overwrite)
            if problem:
                raise ValueError(problem)
    return list(plan.values())


def out_path(out, world: str, spec: str) -> Path:
    from lssim.results import policy_dirname

    return Path(out) / "real" / world / policy_dirname(spec)


def _world_setup(world, args, greedy: bool = False):
    setup = world.setup(args.n_prompts)
    if greedy:
        setup.temperature = 0.0
    return setup


def _speculating(specs) -> list[str]:
    """The specs whose policies ask the engine for speculation."""
    from lssim.loop.policy import make_policy

    return [spec for spec in specs if make_policy(spec).needs().speculation is not None]


def _greedy(specs: list[tuple]) -> bool:
    """vLLM's CPU build speculates correctly only greedily: in a world where a policy speculates, all run greedy
    (its baseline included, on the same engine with drafting off)."""
    from .world import vllm_on_cpu as _vllm_on_cpu

    return bool(_speculating([spec for _, spec in specs])) and _vllm_on_cpu()


def _world_config(world, args):
    return world.config(seed=args.seed, steps=args.steps, groups_per_step=args.groups_per_step,
                        group_size=args.group_size, max_tokens=args.max_tokens)


def _record(plan: list[tuple], args, out: Path, profile_to: str | None = None) -> list:
    """Every world's baseline and policies, `args.repeats` times each, recorded under out/real/<world>/<policy>/
    repeat<k>/, on one engine per instance count (worlds that share it run one after another). Repeat-major
    within an engine (every run once, then every run again): the machine's speed drifts over minutes, and drift
    must reach every policy alike instead of passing for one policy's speedup. With `profile_to`, the first
    engine started (the fewest instances, a plain one first) is profiled before its runs (real_backend.profile.
    profile_engine; on one of its instances, the others idle), and every engine of several instances has its
    layout measured against that profile before its runs (real_backend.layout.profile_layout: how much slower
    its instances run beside each other on this host, which the simulated twin prices)."""
    by_engine: dict[tuple, list[tuple]] = {}
    for world, specs in sorted(plan, key=lambda p: (p[0].n_instances, _greedy(p[1]))):
        # vLLM fixes speculation at engine start and a speculating engine is slower even with drafting off: worlds
        # with a speculating policy get an engine of their own.
        by_engine.setdefault((world.engine_key(), _greedy(specs)), []).append((world, specs))
    runs = []
    for k, worlds in enumerate(by_engine.values()):
        runs += _record_on_one_engine(worlds, args, out, profile_to, profile_first=k == 0)
    return runs


def _record_on_one_engine(worlds: list[tuple], args, out: Path, profile_to: str | None, profile_first: bool = True) -> list:
    import tempfile
    from dataclasses import asdict

    from lssim.loop.controller import RunConfig
    from lssim.analysis.tables import format_step

    from .speed_probe import measure_probe, record_run_probes
    from .world import RealSetup, prepare, run_real, start_engine

    first = worlds[0][0]
    greedy = _greedy(worlds[0][1])
    engine_setup = RealSetup(n_instances=first.n_instances, cpus=first.cpus)  # the whole pool: a world's is a subset
    if greedy:
        engine_setup.temperature = 0.0
    config = _world_config(first, args)
    # One engine for every policy: started with the speculation a speculating policy asks for (vLLM fixes it at
    # start), the others run on it with drafting switched off (VLLMEngine.allow_plain_runs).
    speculating = _speculating([spec for _, specs in worlds for _, spec in specs])
    prompts, _ = prepare(engine_setup, speculating[0] if speculating else "baseline", config)
    t0 = time.monotonic()
    print(f"starting the vLLM engine ({first.n_instances} instance(s)) ...", file=sys.stderr)
    engine = start_engine(engine_setup, prompts, seed=args.seed)
    engine.allow_plain_runs = True
    print(f"engine up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    runs = []
    try:
        # A throwaway run first: the engine's and the trainer's first steps in a process are slower (kernels for new
        # batch shapes, allocator), and the first recorded run would pay for it.
        with tempfile.TemporaryDirectory() as scratch:
            warm = RunConfig(**{**asdict(config), "steps": 2, "total_groups": None})
            prompts, policy = prepare(engine_setup, "baseline", warm)
            run_real(engine_setup, policy, warm, scratch, engine=engine, prompts=prompts)
        run_specs = {}  # spec -> what the run is given (the same, or with the speculation measured now)
        if profile_to:
            _measure_engine(engine, engine_setup, out, profile_to, profile_first, length=config.max_tokens)
            if speculating:
                fit = _measure_speculation(engine, prompts, profile_to, length=config.max_tokens)
                run_specs = {spec: with_speculation_fit(spec, fit, profile_to) for _, specs in worlds for _, spec in specs}
        probes = [measure_probe(engine)]  # the machine's speed level between every two runs (real_backend.speed_probe)
        probed: list[Path] = []
        measured = []  # every recorded step's seconds: whether the repeats so far can test the goal (enough_repeats)
        k = 0
        while not enough_repeats(pd.DataFrame(measured), k, args.repeats, args.max_repeats or args.repeats):
            for world, specs in worlds:
                setup, config = _world_setup(world, args, greedy), _world_config(world, args)
                for name, spec in specs:
                    folder = out_path(out, world.name, spec) / f"repeat{k}"
                    spec = run_specs.get(spec, spec)
                    prompts, policy = prepare(setup, spec, config)  # fresh data loader and policy for every run
                    of = f"{args.repeats}-{args.max_repeats}" if (args.max_repeats or 0) > args.repeats else args.repeats
                    print(f"-- {spec} in world {world.name} (repeat {k + 1} of {of}): {config.steps} steps", file=sys.stderr)
                    result = run_real(setup, policy, config, folder, engine=engine, prompts=prompts,
                                      on_step=lambda row: print("   " + format_step(row), file=sys.stderr),
                                      meta={"command": " ".join(sys.argv), "policy_spec": spec, "validation_name": name,
                                            "world": world.name, "repeat": k})
                    probes.append(measure_probe(engine))
                    probed.append(folder)
                    for i in range(max(0, len(probed) - 2), len(probed)):  # the one before gets its whole window now
                        record_run_probes(probed[i], probes, i, engine.n_instances)
                    runs.append(folder)
                    measured += [{"policy": f"{name}@{world.name}", "repeat": k, "step": int(step), "measured_seconds": float(t)}
                                 for step, t in zip(result.steps["step"], result.steps["rollout_seconds"])]
            k += 1
    finally:
        engine.close()
    return [load_recorded(folder) for folder in runs]


SUBSET_REPEATS_FACTOR = 3  # a subset's validation records up to this many times --repeats until its goal can be tested


def default_max_repeats(args) -> int | None:
    """--max-repeats where it is not given: for a subset of policies recorded here, SUBSET_REPEATS_FACTOR x --repeats, so
    that its verdict does not hang on the hour (at 5 repeats this VM's noise alone put an exact model at 6.5-7% median
    in one hour and within the 3% goal in the next: real_backend/validation/subset5 and until5); with --full or
    --policies all (about 100 runs a repeat), or with --runs, --repeats exactly."""
    if args.max_repeats is not None or args.runs or args.full or args.policies.strip() == "all":
        return args.max_repeats
    return SUBSET_REPEATS_FACTOR * args.repeats


def enough_repeats(measured: pd.DataFrame, done: int, minimum: int, maximum: int) -> bool:
    """Whether `lssim validate` has recorded enough repeats: at least `minimum`, and beyond it (up to `maximum`, what
    --max-repeats allows) until the goal can be tested: until, for every policy recorded (`measured`: policy@world,
    repeat, step, measured_seconds of the runs so far), an exact model would typically meet it against these repeats,
    both the per-step errors (lssim.analysis.fidelity.noise_floor) and the speedup over the world's baseline@world
    (lssim.analysis.fidelity.speedup_noise_floor, in points of the seconds' ratio). Prints the floors after each repeat beyond
    the minimum."""
    from lssim.analysis.fidelity import TARGET_SPEEDUP_POINTS, noise_floor, speedup_noise_floor, step_errors_within_goal

    if done < minimum:
        return False
    if done >= maximum or measured.empty:
        return True
    floor = noise_floor(measured, search=False)  # the floors alone: the repeats each would need are not read here
    testable = step_errors_within_goal(floor["noise_floor_median_pct"], floor["noise_floor_p90_pct"])
    speedup = speedup_noise_floor(measured, draws=500, search=False)["speedup_noise_floor_points"]
    testable &= ~(speedup.reindex(testable.index) > TARGET_SPEEDUP_POINTS)  # no baseline to compare with: steps only
    worst = floor["noise_floor_median_pct"].idxmax()
    line = (f"after {done} repeats an exact model would score {floor.loc[worst, 'noise_floor_median_pct']:.1f}% median / "
            f"{floor.loc[worst, 'noise_floor_p90_pct']:.1f}% p90 on {worst} (the noisiest)")
    if speedup.notna().any():
        line += f", and miss the speedup by {speedup.max():.1f} points typically on {speedup.idxmax()}"
    print(line + "; the goal " + ("can be tested now" if testable.all() else
                                  f"cannot be tested yet for {', '.join(floor.index[~testable])}: recording repeat "
                                  f"{done + 1} (of at most {maximum})"), file=sys.stderr)
    return bool(testable.all())


def speculation_path(profile: str | Path) -> Path:
    """Where --reprofile writes the speculation measured on the speculating engine: beside the profile."""
    profile = Path(profile)
    return profile.with_name(profile.stem + "_speculation.json")


def _measure_speculation(engine, prompts, profile_to: str, length: int = 256) -> Path:
    """--reprofile on an engine started with speculation: what drafting buys and costs on it now
    (real_backend.measure_speculation.measure_fit), for the speculating policies' runs and twins."""
    from .measure_speculation import measure_fit

    path = speculation_path(profile_to)
    print(f"measuring the engine's speculation into {path} ...", file=sys.stderr)
    return measure_fit(engine, prompts.pool.prompt_id.tolist(), path, profile_to, max_tokens=length,
                       progress=lambda line: print("   " + line, file=sys.stderr))


def with_speculation_fit(spec: str, fit: str | Path, cost_profile: str | Path) -> str:
    """``spec`` with every part that names a measured speculation profile (``profile=...``, as the validation
    world's spec_tail does: "priced with the speculation measured on this engine") given ``fit`` instead, and its
    ``cost_profile``, where it has one, ``cost_profile``; other parts unchanged. A policy left on its default profile
    keeps it: for tlt the profile is also what it decides with, and on this engine's fresh measurement it decides
    that speculation never pays (measured: it then drafts for none of 160 responses), so it would not act."""
    import inspect

    from lssim.loop.policy import format_policy_spec, make_policy, parse_policy_spec

    parts, changed = [], False
    for name, kwargs in parse_policy_spec(spec):
        part = format_policy_spec(name, kwargs)
        policy = make_policy(part) if kwargs.get("profile") is not None else None
        if policy is not None and policy.needs().speculation is not None:
            kwargs = {**kwargs, "profile": str(fit)}
            if "cost_profile" in inspect.signature(type(policy).__init__).parameters:
                kwargs["cost_profile"] = str(cost_profile)
            part, changed = format_policy_spec(name, kwargs), True
        parts.append(part)
    return "+".join(parts) if changed else spec  # unchanged: the spec as written


def _measure_engine(engine, setup, out: Path, profile_to: str, profile_first: bool, length: int = 256) -> None:
    """--reprofile on this engine: the one-instance profile (first engine only; on instance 0, the others idle), then
    for several instances, or an engine started with speculation, its layout against it (real_backend.layout; the
    speculating engine with drafting off)."""
    from .layout import drafting_off, layout_path, profile_layout, speculating
    from .speed_probe import probed_measurement, write_reference

    meta = {"command": " ".join(sys.argv), "model": setup.model_dir}
    out.mkdir(parents=True, exist_ok=True)
    probes = None  # each measurement's speed level: probes before, during and after it (real_backend.speed_probe)
    if profile_first:
        from .profile import profile_engine

        print(f"profiling the engine into {profile_to} ...", file=sys.stderr)
        with drafting_off(engine):
            probes = probed_measurement(engine, lambda **kw: profile_engine(
                engine, profile_to, meta=meta, instance=0 if engine.n_instances > 1 else None, **kw), every=12)
        write_reference(profile_to, probes, engine.n_instances)
    if engine.n_instances > 1 or speculating(engine):
        what = "instances beside each other" if engine.n_instances > 1 else "instance started with speculation"
        layout = layout_path(profile_to, engine.n_instances, speculating(engine))
        print(f"measuring {engine.n_instances} {what} (cpus {setup.cpus}) into {layout} ...", file=sys.stderr)
        probes = probed_measurement(engine, lambda **kw: profile_layout(engine, profile_to, setup.cpus, meta=meta,
                                                                        length=length, **kw),
                                    every=4, probes=probes[-2:] if probes else None)
        write_reference(layout, probes, engine.n_instances)


def _write(frames: dict, out: Path, profile: str) -> None:
    from lssim.analysis.fidelity import fidelity_markdown, phases_markdown
    from lssim.results import atomic_write

    for name in ("steps", "steps_by_repeat", "responses", "noise", "acted", "anchored", "real_cuts", "speedups", "probed", "phases"):
        if name in frames:
            atomic_write(out / f"{name}.parquet", lambda p, f=frames[name]: f.to_parquet(p, index=False))
    for name in ("summary", "counterfactual", "stages"):
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
    from lssim.analysis.fidelity import policy_results, unacted
    from lssim.analysis.tables import format_fidelity

    text = format_fidelity(frames) + "\n\nacted on the real engine (responses the policy changed, median of the repeats):\n"
    cols = ["world", "acted", "responses", "stopped", "dropped", "carried", "rebudgeted", "resubmitted", "placed",
            "reselected", "repeat_spread_median_pct", "repeat_spread_p90_pct", "speed_level", "probed_median_ape_pct",
            "probed_p90_ape_pct", "anchored_median_ape_pct",
            "anchored_p90_ape_pct", "speed_factor", "real_cuts_median_ape_pct", "real_cuts_p90_ape_pct",
            "noise_floor_median_pct", "noise_floor_p90_pct", "repeats_for_goal", "meets_goal", "meets_goal_probed",
            "meets_goal_anchored", "within_noise"]
    s = frames["summary"]
    text += s[[c for c in cols if c in s]].to_string(float_format=lambda v: f"{v:.2f}")
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
                        "speedup_error, repeat_spread, ...}} (the tables go to stderr)")
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
                   "in its mode, report the per-step error per mode and whether the predicted ranking of the modes is "
                   "the measured one (real_backend/validate_modes.py; with --runs, 'any' takes every run)")
    p.add_argument("--staleness", type=int, default=1, metavar="K", help="with --mode async: the staleness bound (default 1)")
    p.add_argument("--async-variant", choices=["roll", "areal"], default="roll", help="with --mode async (default: roll)")
    p.add_argument("--train-profile", default=str(Path(__file__).with_name("profile_trainer_cpu.json")), metavar="JSON",
                   help="with --mode: the trainer's profiled cost (python -m real_backend.profile_trainer; default: "
                        "real_backend/profile_trainer_cpu.json)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the runs and the comparison")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")


__all__ = ["validate", "validate_worlds", "run", "add_arguments", "sim_setup"]
