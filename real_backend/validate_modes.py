"""`lssim validate --mode A,B,...`: the end-to-end step time per execution mode, predicted against measured.

    lssim validate --mode collocated,disaggregated,async --staleness 1 --policies baseline --steps 6 --repeats 2 --out runs/vm
    lssim validate --mode any --runs runs/a runs/b --out runs/vm-ab     # recorded runs, each in the mode it ran in

Each mode's run is recorded on vLLM (`lssim real --mode M`: the GRPO update on a thread beside the rollout outside
collocated, real_backend/train_job.py), then replayed in the simulator in the same mode, with the same policy,
seeds and data loader, the engine's profiled cost model (`--profile`) and the trainer's (`--train-profile`, from
`python -m real_backend.profile_trainer`; only groups with signal are trained, as GRPOTrainer does). Compared per
step: `step_seconds`, the time from the previous step's weights being ready to this step's (collocated: the
step's rollout and update). Per mode: the median and p90 absolute percentage error per step, seconds per trained
group measured and predicted, and whether the predicted ranking of the modes (by seconds per trained group)
equals the measured one; and the error once the predictions are scaled by the collocated runs' speed level
(`anchored_*`: the profiles' absolute speed drifts with the machine's load; what is left is the modes').

Against the noise (lssim.analysis.fidelity.modes): per mode, an exact model's per-step error on the same repeats
(`exact_step_error_median`, noise_floor) and the twin's over it (`noise_ratio`, the headline), the speedup over
collocated measured and predicted with an exact model's 95% bound on its error, the number of runs; `--json` prints
them per mode, and pooled. On this host the trainer's thread, vLLM and the driver share the cores: the twin of a
run whose trainer was on the CPU (trainer_shares_host) slows the engine and the update beside each other by the
factors measured into the profile (`lssim profile --out P --shared-host`; recording measures them on its engine
into OUT/profile.json), and charges the driver's excess over the profile's cells, fitted on the collocated runs
(lssim.analysis.fidelity.driver; where both recorded the driver's time). `unshared_*`: the twin with devices of its
own beside it. Writes OUT/modes_steps.parquet (per mode, policy and step; median over repeats),
OUT/modes_steps_by_repeat.parquet (per run and step) and OUT/modes_summary.csv (the printed table); the runs under
OUT/real/<mode>/<policy>/repeat<k>/.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .validate_twin import load_recorded, run_prompts, sim_setup, speed_level

DEFAULT_TRAIN_PROFILE = Path(__file__).parent / "data" / "profile_trainer_cpu.json"
MODE_ORDER = ("collocated", "disaggregated", "async", "hybrid")


def trainer_shares_host(run) -> bool:
    """Whether the run's trainer shared the engine's host: a trainer on the CPU beside vLLM's CPU engine (meta.json's
    setup.trainer_device; a GPU trainer has devices of its own)."""
    return run.meta.get("setup", {}).get("trainer_device", "cpu") == "cpu"


def mode_sim_setup(run, profile: str, train_profile: str, share=None, driver=None):
    """The simulated twin of the run's engine and trainer, in the mode the run was recorded in (meta.json `mode`).
    `share` (lssim.sim.shared_host.TrainingShare): the engine and the trainer slowed beside each other, where the run's
    trainer shared the host (trainer_shares_host); `driver` (DriverPrice): the driver's excess seconds."""
    from lssim.sim.training import TrainCostAtLevel, load_train_cost

    from .trainer_probe import trainer_level

    mode = run.meta.get("mode") or {"mode": "collocated"}
    collocated = mode["mode"] == "collocated"
    train = load_train_cost(train_profile)
    level = trainer_level(run.meta, train)  # the trainer's probes around the run; without them the engine's level
    level = speed_level(run, profile) if level is None else level  # (the trainer runs on the engine's cores)
    train = train if level is None else TrainCostAtLevel(train, level)
    if driver is not None and not collocated:  # a job's first step counts from its first rollout's start
        driver = dataclasses.replace(driver, first_step=0.0)  # (real_backend.train_job.fill_step_rows), not the run's
    return dataclasses.replace(sim_setup(run, profile), train=train, train_signal_only=True, mode=mode["mode"],
                               train_devices=None if collocated else int(mode.get("train_devices") or 1),
                               staleness=int(mode.get("staleness", 1)), async_variant=mode.get("variant", "roll"),
                               elastic=bool(mode.get("elastic", True)),
                               shared_training=share if trainer_shares_host(run) else None, driver=driver)


def host_pricing(runs: list, profile: str) -> tuple:
    """(TrainingShare or None, DriverPrice or None, a description) for the twins of `runs`: the trainer beside the
    engine from the profile (real_backend.host_sharing; ValueError naming the command where a run's trainer shared
    the host in a mode that trains beside the rollout and the profile has no measurement), the driver's excess
    fitted on the collocated runs (the reference) against the profile's cells (lssim.analysis.fidelity.driver)."""
    from lssim.analysis.fidelity.driver import fit_against_cells

    from .host_sharing import training_share
    from .profile import measurement_files

    share = training_share(profile)
    beside = [r for r in runs if trainer_shares_host(r) and (r.meta.get("mode") or {}).get("mode", "collocated") != "collocated"]
    if beside and share is None:
        raise ValueError(f"{profile}: no measurement of the engine beside the GRPO trainer on this host, which "
                         f"{len(beside)} run(s) shared (e.g. {beside[0].folder}); measure it with `lssim profile --out "
                         f"{profile} --shared-host` (about a minute), or record with `lssim validate --mode`, which does")
    reference = [r.steps for r in runs if (r.meta.get("mode") or {}).get("mode", "collocated") == "collocated"]
    driver, fit = fit_against_cells(reference, measurement_files(profile)["batches"])
    said = share_said(share)
    said += (f"; driver {driver.per_request * 1e3:.3f} ms/request, {driver.per_token * 1e6:.2f} us/token, "
             f"{driver.per_finish * 1e3:.3f} ms/finish beyond the cells', {driver.per_step * 1e3:.0f} ms between steps "
             f"({driver.first_step * 1e3:.0f} ms before the first)" if driver is not None else f"; driver not priced: {fit}")
    return share, driver, said


def share_said(share) -> str:
    """What the twins' TrainingShare is, in words: the whole update's factors, and hybrid's streamed pieces' (which
    ones it used: the profile's streamed measurement, or the whole update's where the profile has none)."""
    if share is None:
        return "trainer on devices of its own"
    pieces = share.for_pieces()
    which = ("measured streamed" if share.streamed is not None else
             "the whole update's: the profile has no streamed measurement (`lssim profile --shared-host` adds it)")
    return (f"engine x{share.engine_slowdown:.3f} / trainer x{share.trainer_slowdown:.3f} beside each other; hybrid's "
            f"streamed pieces engine x{pieces.engine_slowdown:.3f} / piece x{pieces.trainer_slowdown:.3f} ({which})")


def run_label(run) -> str:
    """What a run is in the tables: its mode's label (lssim.loop.modes.ModeConfig.label) and policy."""
    mode = run.meta.get("mode") or {}
    return f"{mode.get('label', 'collocated')} / {run.name}"


def compare_modes(runs: list, profile: str, train_profile: str) -> dict[str, pd.DataFrame]:
    """Replay each recorded run in its own mode and compare step_seconds step by step; repeats of one label (same
    mode and policy) are reduced to the per-step median of measured and of predicted seconds.

    The twin may need fewer steps than the run: both stop once every group of the data has trained, and where the
    twin's steps train more groups than the run's did (an async step trains whatever has ended), it gets there
    first. A run's step the twin never reached (in no repeat) keeps its measured row, with `in_twin` False, predicted
    seconds NaN and predicted groups 0; it is left out of the per-step error and counted in the summary."""
    from lssim.analysis.fidelity.run import replay_run

    share, driver, said = host_pricing(runs, profile)
    print(f"the twin's host: {said}", file=sys.stderr)
    rows, repeats = [], {}
    for run in runs:
        sim = replay_run(run, mode_sim_setup(run, profile, train_profile, share, driver), run_prompts(run))
        predicted = sim.steps.set_index("step")
        unshared = replay_run(run, mode_sim_setup(run, profile, train_profile), run_prompts(run)).steps.set_index("step")
        repeat = repeats[run_label(run)] = repeats.get(run_label(run), -1) + 1  # the label's runs, in order
        level = speed_level(run, profile)  # the probed level the twin priced at (None: the profile alone)
        level = np.nan if level is None else float(level)
        for _, real in run.steps.iterrows():
            step = int(real["step"])
            p = predicted.loc[step] if step in predicted.index else None
            rows.append({"label": run_label(run), "mode": (run.meta.get("mode") or {}).get("mode", "collocated"),
                         "policy": run.name, "folder": run.folder, "repeat": int(run.meta.get("repeat", repeat)),
                         "probed_level": level,
                         "step": step, "in_twin": p is not None,
                         "measured_seconds": float(real["step_seconds"]),
                         "predicted_seconds": float(p["step_seconds"]) if p is not None else np.nan,
                         "predicted_unshared_seconds": float(unshared.loc[step, "step_seconds"]) if step in unshared.index else np.nan,
                         "measured_rollout_seconds": float(real["rollout_seconds"]),
                         "predicted_rollout_seconds": float(p["rollout_seconds"]) if p is not None else np.nan,
                         "measured_groups": int(real["groups_trained"]),
                         "predicted_groups": int(p["groups_trained"]) if p is not None else 0,
                         "measured_max_staleness": int(real.get("max_staleness", 0)),
                         "predicted_max_staleness": int(p.get("max_staleness", 0)) if p is not None else -1})
    by_repeat = pd.DataFrame(rows)
    steps = (by_repeat.groupby(["label", "mode", "policy", "step"], sort=False)
             .agg({"in_twin": "any", **{c: "median" for c in by_repeat.columns if c.startswith(("measured_", "predicted_"))}})
             .reset_index())
    steps["ape_pct"] = (steps["predicted_seconds"] - steps["measured_seconds"]).abs() / steps["measured_seconds"] * 100
    steps["signed_pct"] = (steps["predicted_seconds"] / steps["measured_seconds"] - 1) * 100
    steps["unshared_ape_pct"] = (steps["predicted_unshared_seconds"] - steps["measured_seconds"]).abs() / steps["measured_seconds"] * 100
    from lssim.analysis.fidelity.modes import mode_noise

    return {"steps": steps, "steps_by_repeat": by_repeat, "summary": mode_noise(by_repeat, summarize(steps)), "host": said}


def summarize(steps: pd.DataFrame) -> pd.DataFrame:
    """Per label: the per-step error, seconds per trained group measured and predicted, and the ranks by them."""
    rows = {}
    for label, s in steps.groupby("label", sort=False):
        rows[label] = {"mode": s["mode"].iloc[0], "steps": len(s), "steps_not_in_twin": int((~s["in_twin"]).sum()),
                       "step_median_ape_pct": float(s["ape_pct"].median()),
                       "step_p90_ape_pct": float(np.nanpercentile(s["ape_pct"], 90)),
                       "step_median_signed_pct": float(s["signed_pct"].median()),
                       "measured_seconds": float(s["measured_seconds"].sum()),
                       "predicted_seconds": float(s["predicted_seconds"].sum()),  # NaN rows: no step, 0 s
                       "measured_s_per_group": float(s["measured_seconds"].sum() / max(1, s["measured_groups"].sum())),
                       "predicted_s_per_group": float(s["predicted_seconds"].sum() / max(1, s["predicted_groups"].sum())),
                       "measured_max_staleness": int(s["measured_max_staleness"].max()),
                       "predicted_max_staleness": int(s["predicted_max_staleness"].max())}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "run"
    if "unshared_ape_pct" in steps:  # compare_modes' twin with the trainer on devices of its own, beside
        by = steps.groupby("label", sort=False)["unshared_ape_pct"]
        table["unshared_median_ape_pct"] = by.median()
        table["unshared_p90_ape_pct"] = by.quantile(0.9)
    # The machine's speed level, set by the collocated run(s) (their median measured / predicted step time), applied
    # to the other modes' predictions: on a shared machine the profiles' absolute speed drifts (other processes), and
    # what is left is the modes' own error. NaN without a collocated run; the collocated rows themselves are not a test.
    colloc = steps[steps["mode"] == "collocated"]
    level = float((colloc["measured_seconds"] / colloc["predicted_seconds"]).median()) if len(colloc) else np.nan
    table["speed_level"] = level
    for label, s in steps.groupby("label", sort=False):
        ape = (s["predicted_seconds"] * level - s["measured_seconds"]).abs() / s["measured_seconds"] * 100
        table.loc[label, "anchored_median_ape_pct"] = float(ape.median())
        table.loc[label, "anchored_p90_ape_pct"] = float(np.nanpercentile(ape, 90))
    table["measured_rank"] = table["measured_s_per_group"].rank(method="min").astype(int)
    table["predicted_rank"] = table["predicted_s_per_group"].rank(method="min").astype(int)
    return table


def ranking_agrees(summary: pd.DataFrame) -> bool:
    return bool((summary["measured_rank"] == summary["predicted_rank"]).all())


def format_modes(summary: pd.DataFrame) -> str:
    cols = ["runs", "steps", "steps_not_in_twin", "step_median_ape_pct", "step_p90_ape_pct", "step_median_signed_pct",
            "exact_step_error_median", "noise_ratio", "unshared_median_ape_pct", "speedup_measured", "speedup_predicted",
            "speedup_error_points", "speedup_noise_bound_points", "measured_s_per_group", "predicted_s_per_group",
            "measured_rank", "predicted_rank", "measured_max_staleness", "anchored_median_ape_pct", "anchored_p90_ape_pct"]
    text = summary[[c for c in cols if c in summary]].to_string(float_format=lambda x: f"{x:.3f}")
    verdict = "equals" if ranking_agrees(summary) else "differs from"
    level = summary["speed_level"].iloc[0] if len(summary) else np.nan
    return (f"{text}\npredicted ranking of the runs by seconds per trained group {verdict} the measured one\n"
            f"exact_step_error_median: an exact model's per-step error against these repeats (noise_floor); noise_ratio: "
            f"the twin's over it; unshared_*: the twin with the trainer on devices of its own; speedups over collocated, "
            f"per trained group, with an exact model's 95% bound on the error (points)\n"
            f"anchored_*: predictions x {level:.3f}, the collocated runs' median measured/predicted step time (this "
            f"machine's speed level now against the profiles')")


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODE_ORDER and m != "any"]
    if unknown or not modes:
        raise ValueError(f"--mode {text!r}: give modes from {', '.join(MODE_ORDER)}, separated by commas")
    return modes


def record_modes(modes: list[str], specs: list[str], setup, config, out: Path, repeats: int, staleness: int,
                 variant: str, base_profile: str, reprofile: bool = False) -> list:
    """Run each (mode, policy) `repeats` times on one engine, mode-major within a repeat (drift reaches every mode
    alike), after a throwaway warm-up run; returns the recorded runs. Before the runs, OUT/profile.json: the engine
    profiled now (`reprofile`) or a copy of `base_profile`, with the engine beside the GRPO trainer measured now
    (real_backend.host_sharing) where a mode trains beside the rollout: what the twins price with. A speed probe
    after every run (real_backend.speed_probe): the twin is priced at the machine's level of its minutes where the
    profile has the probe's reference (a profile from `lssim profile` or --reprofile), and a trainer probe beside it
    (real_backend.trainer_probe): the twin's trainer is priced at its own level."""
    import tempfile

    from lssim.loop.modes import ModeConfig
    from lssim.results import policy_dirname

    from .run import StepLines
    from .speed_probe import measure_probe, record_run_probes
    from .trainer_probe import TrainerProbe, record_trainer_probes
    from .world import prepare, run_real, start_engine

    prompts, _ = prepare(setup, specs[0], config)
    print("starting the vLLM engine ...", file=sys.stderr)
    t0 = time.monotonic()
    engine = start_engine(setup, prompts, seed=config.seed)
    print(f"engine up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    runs = []
    try:
        with tempfile.TemporaryDirectory() as scratch:  # the first steps in a process are slower: not recorded
            prompts, policy = prepare(setup, "baseline", config)
            warm = dataclasses.replace(config, steps=2, total_groups=None)
            run_real(setup, policy, warm, scratch, engine=engine, prompts=prompts, mode=ModeConfig(mode="async", rollout_devices=1))
        profile_host(engine, setup, out / "profile.json", base_profile, reprofile, beside=modes != ["collocated"],
                     length=config.max_tokens, group_size=config.group_size if "hybrid" in modes else None)
        trainer_probe = TrainerProbe(setup)  # the trainer's own level beside the engine's (real_backend.trainer_probe)
        probes, trained, folders = [measure_probe(engine)], [trainer_probe.measure()], []
        for k in range(repeats):
            for mode in modes:
                cfg = ModeConfig(mode=mode, rollout_devices=setup.n_instances, train_devices=None if mode == "collocated" else 1,
                                 staleness=staleness, variant=variant)
                for spec in specs:
                    prompts, policy = prepare(setup, spec, config)
                    folder = out / "real" / mode / policy_dirname(spec) / f"repeat{k}"
                    print(f"-- {cfg.label()} / {spec} (repeat {k + 1} of {repeats}): {config.steps} steps", file=sys.stderr)
                    lines = StepLines(lambda line: print("   " + line, file=sys.stderr))  # each once its update ended
                    run_real(setup, policy, config, folder, engine=engine, prompts=prompts, mode=cfg,
                             checkpoint=False,  # timing runs: the twin prices no checkpoint writes (nor threads)
                             on_step=lines, meta={"command": " ".join(sys.argv), "policy_spec": spec, "repeat": k})
                    lines.flush()
                    probes.append(measure_probe(engine))
                    trained.append(trainer_probe.measure())
                    folders.append(folder)
                    for i in range(max(0, len(folders) - 2), len(folders)):  # the one before gets its whole window now
                        record_run_probes(folders[i], probes, i, engine.n_instances)
                        record_trainer_probes(folders[i], trained, i, trainer_probe.lengths)
        runs = [load_recorded(folder) for folder in folders]
    finally:
        engine.close()
    return runs


def profile_host(engine, setup, profile: Path, base_profile: str, reprofile: bool, beside: bool, length: int,
                 group_size: int | None = None) -> None:
    """OUT/profile.json for the twins: this engine profiled now (`reprofile`: validate_record's --reprofile, with
    its speed probes) or `base_profile` copied with its measurements; then, where a mode trains `beside` the rollout,
    the engine beside the GRPO trainer measured now (real_backend.host_sharing, three rounds, ~1 minute) into its
    measured_by.shared_host, and with `group_size` (hybrid is recorded) the engine beside the update streamed in
    groups of that size (its `streamed` factors, ~1 minute more)."""
    import shutil

    from .host_sharing import fit_sharing, measure_sharing, write_sharing
    from .profile import measurement_files
    from .profile_trainer import _Prompts
    from .trainer import GRPOTrainer
    from .validate_record import _measure_engine

    profile.parent.mkdir(parents=True, exist_ok=True)
    if reprofile:
        _measure_engine(engine, setup, profile.parent, str(profile), True, length=length)
    else:
        shutil.copyfile(base_profile, profile)
        for kind, path in measurement_files(base_profile).items():
            if path.is_file():
                shutil.copyfile(path, measurement_files(profile)[kind])
    if not beside:
        return
    trainer = GRPOTrainer(setup.model_dir, None, _Prompts(), lr=1e-6, threads=setup.trainer_threads, seed=0,
                          process=setup.trainer_process)
    t0 = time.monotonic()
    try:
        fit = fit_sharing(measure_sharing(engine, trainer, int(trainer.model.config.vocab_size), rounds=3,
                                          group_size=group_size))
    finally:
        trainer.close()
    write_sharing(profile, fit, {"command": " ".join(sys.argv), "seconds": round(time.monotonic() - t0, 1),
                                 "trainer_process": setup.trainer_process})
    print(f"shared host: engine x{fit['engine_slowdown']:.3f} beside a GRPO update, the update x{fit['trainer_slowdown']:.3f} "
          f"beside the engine -> {profile}", file=sys.stderr)


def _recording_order(run) -> tuple:
    """The order `record_modes` writes runs in (by repeat, then mode, then folder), whatever order --runs named them:
    an exact model's draws follow the labels' order, so a shell glob gives the figures of the recording."""
    mode = (run.meta.get("mode") or {}).get("mode", "collocated")
    return int(run.meta.get("repeat", 0)), MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), str(run.folder)


def run(args, specs: list[str], setup, config) -> int:
    """The `lssim validate --mode ...` handler (sim_vs_real.run checked the common options)."""
    from lssim.results import atomic_write


    out = Path(args.out)
    train_profile, profile = args.train_profile, args.profile
    from lssim.sim.training import load_train_cost

    load_train_cost(train_profile)  # a missing or bad file fails here, before anything runs
    modes = parse_modes(args.mode)
    if args.runs:
        runs = sorted((load_recorded(folder) for folder in args.runs), key=_recording_order)
        if modes != ["any"]:
            runs = [r for r in runs if (r.meta.get("mode") or {}).get("mode", "collocated") in modes]
            if not runs:
                raise ValueError(f"--runs: none of the runs is in a mode of --mode {args.mode}")
    else:
        if "any" in modes:
            raise ValueError("--mode any is for --runs (each run in its recorded mode); name the modes to record")
        profile = str(out / "profile.json")  # --profile with this engine's trainer beside it (record_modes)
        runs = record_modes(modes, specs, setup, config, out, args.repeats, args.staleness, args.async_variant,
                            base_profile=args.profile, reprofile=args.reprofile)
    print(f"replaying {len(runs)} runs in the simulator, each in its mode ...", file=sys.stderr)
    frames = compare_modes(runs, profile, train_profile)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("steps", "steps_by_repeat"):
        atomic_write(out / f"modes_{name}.parquet", lambda p, f=frames[name]: f.to_parquet(p, index=False))
    atomic_write(out / "modes_summary.csv", lambda p: frames["summary"].to_csv(p))
    text = (f"{format_modes(frames['summary'])}\nthe twin's host: {frames['host']}\n"
            f"written to {out}/ (modes_summary.csv, modes_steps.parquet, modes_steps_by_repeat.parquet, real/)")
    print(text, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        import json

        from lssim.analysis.fidelity.modes import modes_results

        result = modes_results(frames["summary"], frames["steps_by_repeat"], str(out))
        print(json.dumps({**result, "profile": profile, "train_profile": train_profile, "host": frames["host"]}, indent=2))
    return 0


__all__ = ["compare_modes", "summarize", "ranking_agrees", "format_modes", "mode_sim_setup", "record_modes", "run",
           "host_pricing", "share_said", "trainer_shares_host", "profile_host"]
