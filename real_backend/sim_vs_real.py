"""`lssim validate`'s comparison: each recorded run replayed in its simulated twin (real_backend.validate_twin) and
compared with what it measured (lssim.analysis.fidelity), world by world (`validate_worlds`); the error after each
modelling step (`stages`). The command itself (options, recording, outputs) is real_backend/validate_command.py.

The simulated twin of each run replays the run's trace completed with the responses the run left unfinished at
its end (its unfinished.parquet, or for older collocated folders its checkpoint: validate_twin.load_recorded,
lssim.analysis.fidelity.run.twin_trace); summary.csv splits each speedup error
into the points from groups trained and from rollout seconds (speedup_points_groups / _seconds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lssim.analysis.fidelity.compare import (acted, anchor_on_baseline, compare, compare_phases, fidelity_table, length_distance,
                                           median_over_repeats, speedup_by_repeat)
from lssim.analysis.fidelity.run import ends_rollouts, replay_run, with_real_cuts
from lssim.analysis.fidelity.summary import policy_summary, with_driver

from .layout import measured_layouts, write_layout
from .profile import fit, measurement_files
from .validate_twin import run_prompts, run_twin_cost, sim_setup, speed_level, world_driver


def validate(runs: dict, profile: str, counterfactual: bool = True, probe: bool = True,
             driver=None) -> dict[str, pd.DataFrame]:
    """Replay each recorded run in the simulator and compare. `runs`: policy -> its recordings (a RecordedRun or a
    list of repeats; each repeat is replayed from its own trace, and per step the medians are compared).
    Returns the frames `lssim validate` writes: steps (one row per policy and step), responses, summary,
    noise (with repeats) and counterfactual. `probe`: each twin at its run's speed level (sim_setup). The
    per-repeat steps have that level either way (speed_level, NaN where a run or the profile has no probe).
    `driver` (DriverPrice or None): every twin charges the driver's seconds beyond the profile's cells."""
    runs = {name: rs if isinstance(rs, list) else [rs] for name, rs in runs.items()}
    step_frames, response_frames, cut_frames, groups, first_sim, group_rows, phase_frames = [], [], [], {}, {}, [], []
    for name, repeats in runs.items():
        measured_groups, predicted_groups = [], []
        cuts = ends_rollouts(repeats[0].name)
        for k, run in enumerate(repeats):
            sim = replay_run(run, sim_setup(run, profile, probe, driver), run_prompts(run))
            first_sim.setdefault(name, sim)
            s, r = compare(run, sim, name)
            level = speed_level(run, profile)
            step_frames.append(s.assign(repeat=k, speed_level=np.nan if level is None else level))
            response_frames.append(r.assign(repeat=k))
            # where a twin is off: the admission or the generation; on a shared host, the shared part or the tail
            phase_frames.append(compare_phases(run, sim, name).assign(repeat=k))
            if cuts:  # the same run with the real engine's cut points: what is left is the cost model's error
                cut_sim = replay_run(run, sim_setup(run, profile, probe, driver), run_prompts(run), policy=with_real_cuts(run))
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
        out["counterfactual"] = _counterfactual(runs, base, first_sim["baseline"], out["summary"], profile, probe, driver)
    return out


def _counterfactual(runs: dict, base, base_sim, summary: pd.DataFrame, profile: str, probe: bool,
                    driver=None) -> pd.DataFrame:
    """Each policy's first run predicted from its world's baseline trace (`base`; `base_sim` its twin) instead of its
    own: the lengths the Workload modelled against the measured ones, and the speedup so predicted."""
    rows = []
    base_pred = base_sim.steps
    base_per_group = base_pred["rollout_seconds"].sum() / base_pred["groups_trained"].sum()
    for name, repeats in runs.items():
        if name == "baseline":
            continue
        run = repeats[0]
        sim = replay_run(run, sim_setup(run, profile, probe, driver), run_prompts(run), trace=base.trace)
        per_group = sim.steps["rollout_seconds"].sum() / max(1, sim.steps["groups_trained"].sum())
        both = run.responses[["step", "prompt_id", "sample_idx", "response_len", "finish_reason"]].merge(
            sim.responses[["step", "prompt_id", "sample_idx", "response_len", "exact"]], on=["step", "prompt_id", "sample_idx"],
            suffixes=("_measured", "_modelled"))
        modelled = both[~both["exact"]]  # responses the baseline trace did not hold: the Workload modelled them
        dist = length_distance(modelled["response_len_measured"], modelled["response_len_modelled"])
        rows.append({"policy": name, "responses": len(both), "modelled_fraction": len(modelled) / max(1, len(both)),
                     **{f"length_{k}": v for k, v in dist.items()},
                     "speedup_measured": summary.loc[name, "speedup_measured"],
                     "speedup_predicted_from_baseline_trace": base_per_group / per_group})
    cf = pd.DataFrame(rows).set_index("policy")
    cf["speedup_error_points"] = (cf["speedup_predicted_from_baseline_trace"] - cf["speedup_measured"]) * 100
    return cf


def stages(runs: dict, profile: str, workdir: Path, profiled: dict[str, pd.DataFrame],
           probed: dict[str, pd.DataFrame] | None = None, driver=None) -> pd.DataFrame:
    """The error after each modelling step: the cost models refitted from the measurements `lssim profile` wrote
    beside `profile` (per-iteration decode only, + time to first token), each saved to `workdir` and replayed;
    then the profile itself (`profiled`: the frames `validate` already made with it), the profile at each run's
    probed speed level (`probed`, where the runs were probed), and the profile with the speed level taken from
    the baseline's runs. Without the measurements, the profile's stages alone. Every stage's twin charges the
    world's `driver` (the rows differ by their cost model alone)."""
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
        frames = validate(runs, str(path), counterfactual=False, probe=False, driver=driver)
        rows.append(_stage_row(label, frames["steps"], frames["summary"], str(path)))
    rows.append(_stage_row("fitted to batch makespans (+ departures)", profiled["steps"], profiled["summary"], str(profile)))
    if probed is not None:
        rows.append(_stage_row("+ speed level from probes around each run", probed["steps"], probed["summary"], str(profile)))
    if "baseline" in runs and len(runs) > 1:  # the profile again, its level set by the baseline's recorded runs
        anchored, _ = median_over_repeats(anchor_on_baseline(profiled["steps_by_repeat"]))
        per_policy = anchored.groupby("policy")["ape_pct"]
        table = profiled["summary"].drop(index="baseline").assign(
            makespan_median_ape_pct=per_policy.median(), makespan_p90_ape_pct=per_policy.quantile(0.9))
        rows.append(_stage_row("+ speed level from the baseline's runs (baseline excluded)", anchored, table, str(profile)))
    return pd.DataFrame(rows).set_index("stage")


def _layouts_for(stage, profile) -> None:
    """Beside a stage's model, the layouts measured beside `profile` refitted against it (the same cells), so that
    worlds of several instances are replayed with each stage too (real_backend.layout)."""
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
    the world's baseline (lssim.analysis.fidelity.anchor_on_baseline; the frame "anchored") (lssim.analysis.fidelity.policy_summary).

    Each world's twins price the driver's seconds beyond the profile's cells, fitted on the world's baseline runs
    (validate_twin.world_driver; the frame "driver", one row per world, and its columns in the summary); where a
    world is priced, its twins are replayed once more without it (the frame "unpriced": per-step medians, and the
    summary's unpriced_median_ape_pct / _p90; where it is not, those are its own errors)."""
    joined: dict[str, list[pd.DataFrame]] = {}
    acted_rows, driver_rows = [], []
    for world, runs in by_world.items():
        frames, driver_row = _world_frames(world, runs, profile, counterfactual, stages_dir)
        driver_rows.append(driver_row)
        base = runs.get("baseline", [])
        for name, repeats in runs.items():
            if name == "baseline" or not base:
                continue
            for k, run in enumerate(repeats):  # repeat k against the baseline's repeat k (same engine minutes)
                acted_rows.append({"policy": name, "repeat": k, **acted(run, base[k % len(base)])})
        new = f"baseline@{world}"
        # the cost model the world's twin priced with: the profile, or its measured layout (several instances, or
        # an engine started with speculation)
        cost_model = run_twin_cost(next(iter(runs.values()))[0], profile)[2]
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
    out["driver"] = pd.DataFrame(driver_rows).set_index("world")
    out["summary"] = with_driver(policy_summary(out["summary"], out["acted"], out.get("noise"), out.get("anchored"),
                                                out.get("real_cuts"), out.get("speedups"), out["steps_by_repeat"],
                                                out.get("probed")), out["driver"], out["unpriced"])
    return out


def _world_frames(world: str, runs: dict, profile: str, counterfactual: bool, stages_dir: Path | None) -> tuple[dict, dict]:
    """One world's frames (`validate` with its driver's price, the twins without it, at the probed level, the stages,
    the world's speed level) and its row of driver.csv (validate_twin.world_driver)."""
    price, driver_row = world_driver(runs, profile)
    frames = validate(runs, profile, counterfactual=counterfactual, probe=False, driver=price)
    frames["unpriced"] = (frames["steps"] if price is None else
                          validate(runs, profile, counterfactual=False, probe=False)["steps"])
    probed = None
    if frames["steps_by_repeat"]["speed_level"].notna().all():  # every run probed: the twin at each run's level
        probed = validate(runs, profile, counterfactual=False, probe=True, driver=price)
        frames["probed"] = probed["steps"]
        if "phases" in probed:  # the shared part and the tail against the twin at each run's level
            frames["phases"] = probed["phases"]
    if stages_dir is not None:
        frames["stages"] = stages(runs, profile, stages_dir / world, frames, probed, price).assign(world=world).reset_index()
    if runs.get("baseline") and len(runs) > 1:  # the world's speed level from its own baseline (engine and load of the minute)
        scaled = anchor_on_baseline(frames["steps_by_repeat"])
        frames["anchored"] = median_over_repeats(scaled)[0].assign(speed_factor=scaled.attrs["speed_factor"])
    return frames, {"world": world, **driver_row}
