"""The ``lssim`` command line's handlers, one per command (``handler(args) -> int | None``), and COMMANDS, the one
table from a command's name to the function that adds its parser (lssim.cli.parsers) and its handler.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import fields
from typing import Callable, Sequence

from lssim.cli.parsers import (PARALLEL_REPLAY_ROWS, REAL_BACKEND, add_import, add_signals, add_plan, add_real_backend, add_replay,
                               add_report, add_sweep, add_synth, add_trace, add_warmup, real_backend_parser)


def _parse_set(items: Sequence[str]) -> dict[str, object]:
    """``KEY=VALUE`` overrides of SynthConfig fields, typed by the field."""
    from lssim.traces.synth import SynthConfig

    types = {f.name: f.type for f in fields(SynthConfig)}
    out: dict[str, object] = {}
    for item in items:
        key, sep, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        if key not in types:
            raise ValueError(f"--set: unknown SynthConfig key {key!r}; valid keys: {', '.join(types)}")
        try:
            out[key] = int(val) if types[key] in ("int", int) else float(val)
        except ValueError:
            kind = "an integer" if types[key] in ("int", int) else "a number"
            raise ValueError(f"--set {key}: expected {kind}, got {val!r}") from None
    return out


def _run_synth(args: argparse.Namespace) -> int:
    from lssim.traces.synth import get_preset, synthesize
    from lssim.traces.trace import write_trace

    cfg = get_preset(args.preset)
    overrides = _parse_set(args.set or [])
    for opt, key in (
        ("seed", "seed"),
        ("steps", "steps"),
        ("prompts_per_step", "prompts_per_step"),
        ("group_size", "group_size"),
        ("max_tokens", "max_tokens"),
        ("n_prompts", "n_prompts"),
    ):
        v = getattr(args, opt)
        if v is not None:
            overrides[key] = v
    cfg = cfg.replace(**overrides)
    df = synthesize(cfg)
    write_trace(df, args.out)
    n_trunc = int((df["finish_reason"] == "length").sum())
    print(
        f"wrote {len(df):,} responses ({cfg.steps} steps x {cfg.prompts_per_step} prompts x "
        f"{cfg.group_size}; {100 * n_trunc / len(df):.2f}% truncated) to {args.out}"
    )
    return 0


def _run_trace_info(args: argparse.Namespace) -> int:
    from lssim.traces.trace import load_trace
    from lssim.traces.summary import format_trace_info, trace_info

    df = load_trace(args.file)
    info = trace_info(df, validate=False)
    if args.json:
        print(json.dumps({"file": str(args.file), **info}, indent=2))
    else:
        print(format_trace_info(info, title=f"trace {args.file}"))
    return 0


def _run_import(args: argparse.Namespace) -> int:
    from lssim.traces.importers import FRAMEWORKS, write_imported

    imported = FRAMEWORKS[args.framework].run(args)
    write_imported(imported, args.out)
    print(imported.summary(args.out))
    return 0


def _run_signals(args: argparse.Namespace) -> int:
    from lssim.loop.signals import SignalSpec
    from lssim.traces.signal_import import LOOP_REPETITION, loops, measure_trace, read_token_rows
    from lssim.traces.trace import load_trace, write_trace

    spec = SignalSpec(args.window, args.ngram)
    if args.stride < 1:
        raise ValueError(f"--stride must be >= 1, got {args.stride}")
    trace = load_trace(args.trace)
    rows = read_token_rows(args.tokens, args.tokenizer)
    frame, measured = measure_trace(trace, rows, spec=spec, stride=args.stride, partial=args.partial, name=args.trace)
    write_trace(frame, args.out)
    with_logprobs = sum(r.logprobs is not None for r in rows)
    print(f"measured the early-exit signals of {len(measured):,} of {len(frame):,} responses (window {spec.window}, "
          f"{spec.ngram}-grams, stride {args.stride}; log-probs for {with_logprobs:,}): {loops(frame, measured):,} loop(s) "
          f"(repetition >= {LOOP_REPETITION}); wrote {args.out}")
    return 0


def _start_simulation() -> None:
    """What a simulation command does first: declare that this process runs no numba code but lssim's kernels (numba
    then starts without its BLAS probe), and on a cold numba cache say so before the imports (lssim.kernels)."""
    from lssim.kernels import announce_if_cold, lssim_kernels_only

    lssim_kernels_only()
    announce_if_cold()


def _trace_to_simulate(path: str):
    """The trace (a bad one fails here), once the kernels a replay runs are loaded, or compiled on a cold cache
    (lssim.kernels.load_replay_kernels)."""
    from lssim.kernels import load_replay_kernels
    from lssim.traces.trace import load_trace

    trace = load_trace(path)
    load_replay_kernels()
    return trace


def _parquet_rows(path: str) -> int | None:
    """The rows a parquet trace's footer declares, read before pandas is imported; None for a file that is not parquet
    (a text format, a bad file: load_trace then reads it or names what is wrong)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError):
        return None


def _replay_runs(args: argparse.Namespace) -> int:
    """How many runs `lssim replay` makes: each policy named once, and baseline and oracle unless --no-reference."""
    named = set(args.policy)
    return len(named) if args.no_reference else len(named | {"baseline", "oracle"})


def _python_route(responses: int | None) -> bool:
    """Whether a replay simulating `responses` (rows times runs; None: not known yet) runs the kernels' Python source
    (lssim.kernels.python_route): below PYTHON_ROUTE_RESPONSES numba's start costs more than the Python loops."""
    from lssim.kernels import PYTHON_ROUTE_RESPONSES

    return responses is not None and responses < PYTHON_ROUTE_RESPONSES


def _setup_from_args(args: argparse.Namespace):
    from lssim.analysis.replay import SimSetup

    instances = args.instances
    if args.rollout_devices is not None:
        if args.rollout_devices % args.tp:
            raise ValueError(f"--rollout-devices {args.rollout_devices} is not a multiple of --tp {args.tp}")
        instances = args.rollout_devices // args.tp
    if args.mode == "collocated" and args.train_devices is not None:
        raise ValueError("--train-devices: collocated training uses the rollout's devices; pick another --mode")
    return SimSetup(model=args.model, hardware=args.hardware, tp=args.tp, n_instances=instances,
                    max_num_seqs=args.max_num_seqs, kv_capacity_tokens=args.kv_tokens, profile=args.profile,
                    train=args.train_cost, mode=args.mode, train_devices=args.train_devices, staleness=args.staleness,
                    async_variant=args.async_variant, elastic=not args.no_elastic,
                    allow_missing_signals=args.allow_missing_signals)


def _run_replay(args: argparse.Namespace) -> int:
    if args.no_reference and not args.policy:
        raise ValueError("--no-reference: name at least one --policy (baseline and oracle are not run)")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    rows = _parquet_rows(args.trace)
    if not _python_route(None if rows is None else rows * _replay_runs(args)):
        _start_simulation()
    from lssim.analysis.replay import replay, replay_summary, summarize
    from lssim.analysis.tables import format_summary
    from lssim.kernels import load_replay_kernels, python_route
    from lssim.results import write_results
    from lssim.sim.world import MissingSignals
    from lssim.traces.trace import load_trace

    trace = load_trace(args.trace)
    small = _python_route(len(trace) * _replay_runs(args))
    if not small:
        load_replay_kernels()
    setup = _setup_from_args(args)
    run = dict(steps=args.steps, seed=args.seed, progress=not args.json and sys.stderr.isatty(),
               references=not args.no_reference, workers=replay_workers(args.workers, len(trace)))
    try:
        with python_route(small):
            if args.out or args.plot:  # the runs' frames are written or drawn: keep them
                results = replay(trace, args.policy, setup, **run)
                table = summarize(results, trace, args.steps)
            else:  # only the table is printed: each run summarized and let go (forked, it sends back a row)
                results, table = None, replay_summary(trace, args.policy, setup, **run)
    except MissingSignals as e:
        raise ValueError(f"{args.trace}: {e}") from None
    if "speedup" not in table:  # no baseline ran: nothing to be faster than (NaN, so every table has the columns)
        table.insert(0, "speedup", float("nan"))
        table.insert(1, "rollout_speedup", float("nan"))
    if args.out:
        write_results(args.out, results, table, meta={"trace": str(args.trace), "setup": vars(args)})
    if args.plot:
        _plot_replay_step(results, args.plot_step, args.plot)
    if args.json:
        print(json.dumps(_summary_json(table), indent=2))
    else:
        training = f"training cost {args.train_cost}" if args.train_cost else f"training analytic for {args.model}"
        print(f"trace {args.trace}: {int(table['responses'].iloc[0]):,} responses; {args.instances} x {args.model} on {args.hardware}"
              f" (tp={args.tp}){'; profiled cost ' + args.profile if args.profile else ''}; {training}; mode {table['mode'].iloc[0]}")
        print(format_summary(table))
        if args.profile and not args.train_cost:
            print(f"note: the rollout is priced by the profile, the training phase by the analytic model of {args.model} on "
                  f"{args.hardware}: step times mix the two machines (--train-cost JSON prices training with a trainer "
                  f"profile measured beside it, real_backend/data/profile_trainer_cpu.json for the reference model)")
        for name, missing in table["missing_signals"].items():
            if missing:
                print(f"warning: {name} ran without the early-exit signal(s) {missing}, which the trace lacks "
                      f"(--allow-missing-signals): what it would have stopped is not in these figures")
        for name, why in table["ran_blind"].items():
            if why:
                print(f"note: {name} ran blind on this trace: {why}")
        if args.no_reference:
            print("--no-reference: baseline and oracle not run; speedup is NaN ('-')"
                  f"{' except against the baseline you named' if 'baseline' in table.index else ''}")
        if args.out:
            print(f"results written to {args.out}/")
    return 0


def replay_workers(asked: int | None, rows: int) -> int:
    """`replay --workers`: as asked, else, for a trace big enough to gain from it, two processes per usable core
    (replay runs at most one per run). The runs differ in length, and the last one started alone on a core sets the
    wall time: a policy and its two references on 2 cores end in 5.2-5.4 s as three processes, 6.1 s as two
    (1,024,000 responses, hadb; measured 2026-11-23)."""
    if asked is not None:
        return asked
    if rows < PARALLEL_REPLAY_ROWS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 2 * cores


def _jsonable(v):
    return v.item() if hasattr(v, "item") else v


def _summary_json(table) -> dict:
    """The summary table as {policy: {field: value}}; the staleness histogram and the `signal` record
    (lssim.analysis.signal) as objects, not their JSON text."""
    out = {}
    for name, row in table.to_dict("index").items():
        out[name] = {k: json.loads(v) if k in ("staleness_histogram", "signal") else _jsonable(v) for k, v in row.items()}
    return out


def _plot_replay_step(results: dict, step: int, path: str) -> None:
    """`replay --plot`: the timeline of `step`, baseline beside each policy replayed (not oracle), PNG written atomically."""
    from lssim.analysis.plots import compare_timelines
    from lssim.results import atomic_write

    names = [n for n in results if n != "oracle"] or list(results)
    fig = compare_timelines(results, step, names)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    print(f"step {step} timeline written to {path}")


def _run_report(args: argparse.Namespace) -> int:
    _start_simulation()
    from pathlib import Path

    from lssim.analysis.report import PAGE, build_report, write_report

    tty = sys.stderr.isatty()
    say = (lambda msg: print(f"report: {msg}", file=sys.stderr)) if tty else (lambda msg: None)
    trace = _trace_to_simulate(args.trace)
    setup = _setup_from_args(args)
    report = build_report(trace, args.policy, setup, trace_name=Path(args.trace).stem, steps=args.steps, seed=args.seed,
                          timeline_step=args.timeline_step, say=say, progress=tty)
    out = write_report(report, args.out)
    print(f"report written to {out / PAGE} ({len(report.figures())} figures, {len(report.tables())} tables)")
    return 0


def _run_sweep(args: argparse.Namespace) -> int:
    _start_simulation()
    from pathlib import Path

    from lssim.analysis.sweep import sweep, sweep_specs
    from lssim.analysis.tables import format_summary
    from lssim.loop.policy import available_policies

    grid = args.grid or []
    names = [n.strip() for n in args.policies.split(",") if n.strip()] if args.policies else \
        [] if grid else [n for n in available_policies() if n not in ("baseline", "oracle")]
    if not names and not grid:
        raise ValueError("--policies: no policy named")
    if args.resume and not args.out:
        raise ValueError("--resume continues the sweep written to --out DIR: name it")
    trace = _trace_to_simulate(args.trace)
    setup = _setup_from_args(args)
    n_runs = len(sweep_specs(names, args.max_size, grid))
    tty = not args.json and sys.stderr.isatty()
    if tty:
        where = f"Ray {args.ray or '(local)'}" if args.ray is not None else f"{args.workers or os.cpu_count()} processes"
        print(f"sweep: {n_runs} runs ({len(names)} policies, compositions of up to {args.max_size}"
              f"{f', {len(grid)} grids' if grid else ''}) on {args.trace}, {where}", file=sys.stderr)
    skipped: list = []
    stream = Path(args.out) / "runs.jsonl" if args.out else None  # one line per finished run: what --resume reads
    table = sweep(trace, names, args.max_size, setup, steps=args.steps, seed=args.seed, by=args.by, progress=tty,
                  skipped=skipped, grid=grid, workers=args.workers, out=stream, resume=args.resume, ray=args.ray,
                  max_staleness=args.max_staleness, max_off_policy=args.max_off_policy)
    # The best is never a run that breaks a stated bound (lssim.analysis.ranking): those are ranked after the others.
    keeping = [n for n in table.index if n != "baseline" and table.loc[n, "within_bounds"]]
    best_name = keeping[0] if keeping else "baseline"
    rows = [{"policy": name, **{k: _jsonable(v) for k, v in row.items()}} for name, row in table.to_dict("index").items()]
    best = next(r for r in rows if r["policy"] == best_name)
    report = {"trace": str(args.trace), "policies": names, "grid": grid, "max_size": args.max_size, "by": args.by,
              "setup": {k: v for k, v in vars(args).items() if k != "func"}, "best": best, "results": rows,
              "skipped": [{"policy": s, "reason": r} for s, r in skipped]}
    if args.out:
        from lssim.results import atomic_write

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "sweep.csv", lambda f: table.rename_axis("policy").to_csv(f))
        atomic_write(out / "sweep.json", lambda f: Path(f).write_text(json.dumps(report, indent=2, default=str) + "\n"))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"trace {args.trace}: {n_runs} runs; {args.instances} x {args.model} on {args.hardware} (tp={args.tp}); "
          f"best {args.top} by {args.by}:")
    print(format_summary(table.head(args.top)))
    for spec, reason in skipped:
        print(f"skipped {spec}: {reason}")
    if not keeping:
        print("no composition keeps the stated bounds")
    print(f"best: {best_name}: {best['speedup']:.3f}x baseline end to end ({best['rollout_speedup']:.3f}x rollout), "
          f"{best['lower_bound_efficiency']:.1%} of the per-step lower bound"
          f" (goal 95%); off-policy tokens {best['off_policy_token_fraction']:.1%}, truncated {best['truncated_fraction']:.1%}")
    if args.out:
        print(f"results written to {args.out}/")
    return 0


PLAN_TABLE = {  # plan column -> (header, format)
    "mode": ("mode", "{}"), "policy": ("policy", "{}"), "step_seconds": ("step s", "{:,.0f}"),
    "speedup": ("speedup", "{:.3f}x"), "trained_tokens_per_second": ("trained tok/s", "{:,.0f}"),
    "max_staleness": ("max stale", "{:.0f}"), "off_policy_token_fraction": ("off-policy", "{:.1%}"),
    "dropped_stale": ("dropped", "{:,.0f}"), "idle_device_fraction": ("idle", "{:.1%}"),
    "within_bounds": ("ok", "{}"), "pareto": ("pareto", "{}"),
}


def _run_plan(args: argparse.Namespace) -> int:
    _start_simulation()
    from dataclasses import replace

    from lssim.analysis.plan import PlanSpace, plan

    space = PlanSpace(devices=args.devices, modes=tuple(_names(args.modes)), policies=tuple(_names(args.policies)),
                      rollout_fractions=tuple(float(f) for f in _names(args.rollout_fractions)),
                      staleness=tuple(int(k) for k in _names(args.staleness_bounds)), max_staleness=args.max_staleness,
                      max_off_policy=args.max_off_policy)
    for mode in space.modes:
        if mode not in ("collocated", "disaggregated", "async", "hybrid"):
            raise ValueError(f"--modes: unknown mode {mode!r}")
    trace = _trace_to_simulate(args.trace)
    args.mode, args.rollout_devices, args.train_devices, args.staleness, args.async_variant, args.no_elastic = \
        "collocated", None, None, 1, "roll", False
    base = replace(_setup_from_args(args), n_instances=args.devices // args.tp)
    table = plan(trace, space, base, steps=args.steps, seed=args.seed, workers=args.workers,
                 progress=not args.json and sys.stderr.isatty(), ray=args.ray)
    if args.out:
        from lssim.results import atomic_write

        atomic_write(args.out, lambda tmp: table.to_csv(tmp, index=False))
    if args.json:
        print(json.dumps({"trace": str(args.trace), "devices": args.devices,
                          "candidates": [{k: _jsonable(v) for k, v in row.items()} for row in table.to_dict("records")]},
                         indent=2, default=str))
        return 0
    print(f"trace {args.trace}: {args.devices} x {args.hardware} for {args.model}; {len(table)} candidates, best first "
          f"by trained tokens/s (speedup: end to end against collocated baseline on all {args.devices})")
    from lssim.analysis.tables import format_table

    print(format_table(table.head(args.top), PLAN_TABLE))
    best = table.iloc[0]
    if not best["within_bounds"]:
        print("no candidate keeps the stated bounds")
    else:
        print(f"best: {best['mode']} with {best['policy']}: {best['speedup']:.3f}x, {best['trained_tokens_per_second']:,.0f} "
              f"trained tokens/s, max staleness {best['max_staleness']:.0f}, off-policy tokens {best['off_policy_token_fraction']:.1%}")
    return 0


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _run_warmup(args: argparse.Namespace) -> int:
    """`lssim warmup`: compile (or load) every numba kernel now, so that no later run pays for it."""
    import time

    from lssim.kernels import lssim_kernels_only, warm_up

    lssim_kernels_only()
    start = time.perf_counter()
    signatures, compiled = warm_up()
    print(f"{signatures} kernel signatures ready, {compiled} of them compiled now ({time.perf_counter() - start:.1f} s)")
    return 0


def _run_real_backend(args: argparse.Namespace) -> int:
    """`lssim real`, `learn`, `profile` and `validate`: real_backend's module for the command parses the arguments and runs it."""
    module = importlib.import_module(REAL_BACKEND[args.command][0])
    return module.run(real_backend_parser(args.command, module.add_arguments).parse_args(args.arguments))


Handler = Callable[[argparse.Namespace], "int | None"]
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction, str], argparse.ArgumentParser], Handler]] = {
    "synth": (add_synth, _run_synth),
    "trace": (add_trace, _run_trace_info),
    "replay": (add_replay, _run_replay),
    "real": (add_real_backend, _run_real_backend),
    "learn": (add_real_backend, _run_real_backend),
    "learn-model": (add_real_backend, _run_real_backend),
    "profile": (add_real_backend, _run_real_backend),
    "validate": (add_real_backend, _run_real_backend),
    "sweep": (add_sweep, _run_sweep),
    "plan": (add_plan, _run_plan),
    "report": (add_report, _run_report),
    "import": (add_import, _run_import),
    "signals": (add_signals, _run_signals),
    "warmup": (add_warmup, _run_warmup),
}
"""Command name -> (the function that adds its parser, its handler); `lssim --help` lists them in this order. The
handlers keep their names: `lssim replay --out` writes its arguments into meta.json, the handler (``func``) among them."""
