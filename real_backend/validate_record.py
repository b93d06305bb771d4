"""Recording `lssim validate`'s real runs: every world's baseline and policies, repeat-major on one engine per
instance count (`record_runs`), with --reprofile the engine's profile and layout measured first, a speed probe
between every two runs, and repeats recorded until the goal can be tested (`enough_repeats`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from .layout import drafting_off, layout_path, profile_layout, speculating
from .profile import profile_engine
from .speed_probe import measure_probe, probed_measurement, record_run_probes, write_reference
from .validate_twin import load_recorded


def out_path(out, world: str, spec: str) -> Path:
    from lssim.results import policy_dirname

    return Path(out) / "real" / world / policy_dirname(spec)


def world_setup(world, args, greedy: bool = False):
    setup = world.setup(args.n_prompts)
    if greedy:
        setup.temperature = 0.0
    return setup


def _speculating(specs) -> list[str]:
    """The specs whose policies ask the engine for speculation."""
    from lssim.loop.policy import make_policy

    return [spec for spec in specs if make_policy(spec).needs().speculation is not None]


def greedy_world(specs: list[tuple]) -> bool:
    """vLLM's CPU build speculates correctly only greedily: in a world where a policy speculates, all run greedy
    (its baseline included, on the same engine with drafting off)."""
    from .world import vllm_on_cpu

    return bool(_speculating([spec for _, spec in specs])) and vllm_on_cpu()


def world_config(world, args):
    return world.config(seed=args.seed, steps=args.steps, groups_per_step=args.groups_per_step,
                        group_size=args.group_size, max_tokens=args.max_tokens)


def record_runs(plan: list[tuple], args, out: Path, profile_to: str | None = None) -> list:
    """Every world's baseline and policies, `args.repeats` times each, recorded under out/real/<world>/<policy>/
    repeat<k>/, on one engine per instance count (worlds that share it run one after another). Repeat-major
    within an engine (every run once, then every run again): the machine's speed drifts over minutes, and drift
    must reach every policy alike instead of passing for one policy's speedup. With `profile_to`, the first
    engine started (the fewest instances, a plain one first) is profiled before its runs (real_backend.profile.
    profile_engine; on one of its instances, the others idle), and every engine of several instances has its
    layout measured against that profile before its runs (real_backend.layout.profile_layout: how much slower
    its instances run beside each other on this host, which the simulated twin prices)."""
    by_engine: dict[tuple, list[tuple]] = {}
    for world, specs in sorted(plan, key=lambda p: (p[0].n_instances, greedy_world(p[1]))):
        # vLLM fixes speculation at engine start and a speculating engine is slower even with drafting off: worlds
        # with a speculating policy get an engine of their own.
        by_engine.setdefault((world.engine_key(), greedy_world(specs)), []).append((world, specs))
    runs = []
    for k, worlds in enumerate(by_engine.values()):
        runs += _record_on_one_engine(worlds, args, out, profile_to, profile_first=k == 0)
    return runs


def _start_shared_engine(worlds: list[tuple], args):
    """The one engine `worlds` are recorded on, started: (engine, its setup, the first world's run config, the specs
    that speculate). Started with the speculation a speculating policy asks for (vLLM fixes it at start), the others
    run on it with drafting switched off (VLLMEngine.allow_plain_runs)."""
    from .world import RealSetup, prepare, start_engine

    first = worlds[0][0]
    engine_setup = RealSetup(n_instances=first.n_instances, cpus=first.cpus)  # the whole pool: a world's is a subset
    if greedy_world(worlds[0][1]):
        engine_setup.temperature = 0.0
    config = world_config(first, args)
    speculating_specs = _speculating([spec for _, specs in worlds for _, spec in specs])
    prompts, _ = prepare(engine_setup, speculating_specs[0] if speculating_specs else "baseline", config)
    t0 = time.monotonic()
    print(f"starting the vLLM engine ({first.n_instances} instance(s)) ...", file=sys.stderr)
    engine = start_engine(engine_setup, prompts, seed=args.seed)
    engine.allow_plain_runs = True
    print(f"engine up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return engine, engine_setup, config, speculating_specs, prompts


def _record_on_one_engine(worlds: list[tuple], args, out: Path, profile_to: str | None, profile_first: bool = True) -> list:
    import tempfile
    from dataclasses import asdict

    from lssim.analysis.tables import format_step
    from lssim.loop.controller import RunConfig

    from .world import prepare, run_real

    greedy = greedy_world(worlds[0][1])
    engine, engine_setup, config, speculating_specs, prompts = _start_shared_engine(worlds, args)
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
            if speculating_specs:
                fit = _measure_speculation(engine, prompts, profile_to, length=config.max_tokens)
                run_specs = {spec: with_speculation_fit(spec, fit, profile_to) for _, specs in worlds for _, spec in specs}
        probes = [measure_probe(engine)]  # the machine's speed level between every two runs (real_backend.speed_probe)
        probed: list[Path] = []
        measured = []  # every recorded step's seconds: whether the repeats so far can test the goal (enough_repeats)
        k = 0
        while not enough_repeats(pd.DataFrame(measured), k, args.repeats, args.max_repeats or args.repeats):
            for world, specs in worlds:
                setup, config = world_setup(world, args, greedy), world_config(world, args)
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
    in one hour and within the 3% goal in the next: paper/experiments/validation/subset5 and until5); with --full or
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
    from lssim.analysis.fidelity.noise import TARGET_SPEEDUP_POINTS, noise_floor, speedup_noise_floor, step_errors_within_goal

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
    (real_backend.speculation_fit.measure_fit), for the speculating policies' runs and twins."""
    from .speculation_fit import measure_fit

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
    meta = {"command": " ".join(sys.argv), "model": setup.model_dir}
    out.mkdir(parents=True, exist_ok=True)
    probes = None  # each measurement's speed level: probes before, during and after it (real_backend.speed_probe)
    if profile_first:
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
