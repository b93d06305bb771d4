"""The ``lssim`` command line.

Subcommands (``lssim COMMAND --help`` lists every option)::

    lssim synth --preset NAME [--seed N] [--steps N] [--prompts-per-step N] [--group-size N]
                [--max-tokens N] [--n-prompts N] [--set KEY=VALUE ...] --out FILE
        generate a synthetic trace from a preset (lssim.traces.synth)
    lssim trace info FILE [--json]
        validate a trace and summarize it (lssim.traces.trace)
    lssim replay TRACE [--policy SPEC ...] [cluster options] [--no-reference] [--workers N] [--out DIR] [--json]
        replay a trace under policies, beside baseline, oracle and the per-step lower bound (lssim.analysis.replay)
    lssim sweep TRACE [--policies A,B,C] [--grid 'name(key=v1,v2,...)' ...] [--max-size 3]
                [--by speedup|lower_bound_efficiency] [--top N] [cluster options] [--workers N] [--ray [ADDRESS]]
                [--out DIR [--resume]] [--json]
        search compositions of policies for the best one (lssim.analysis.sweep)
    lssim real [--policy SPEC] [--steps N] [--groups-per-step N] [--group-size N] [--max-tokens N]
               [--model-dir DIR] [--instances N] [--profile JSON]
               [--mode collocated|disaggregated|async|hybrid] [--staleness K] [--async-variant roll|areal]
               ... --out DIR [--overwrite]
    lssim real --resume DIR [--steps N]            (collocated runs only)
        run the RL loop on a real vLLM engine and a torch trainer under a policy, recording its trace
        (real_backend/run.py)
    lssim profile --out JSON [--batch-sizes N,N,...] [--prompt-lens P,P,...] [--length N] ...
        time the real engine and fit the simulator's profiled cost model (real_backend/profile.py)
    lssim validate [--policies A,B,...|ci|all | --full] [--runs DIR ...] [--profile JSON | --reprofile]
                   [--repeats K] [--json] [--mode A,B,... [--staleness K]] ... --out DIR [--overwrite]
        record real runs, each policy in a world where it acts (real_backend/validation_workloads.toml), or take
        recorded ones; replay each in the simulator, report the error and how much each policy acted
        (with --mode: end-to-end step time per execution mode, real_backend/validate_modes.py)
        (real_backend/sim_vs_real.py, lssim.analysis.fidelity)
    lssim import {verl,slime,areal,trl} SOURCE -o FILE [framework options]
        turn a framework's rollout dump into an lssim trace (lssim.traces.importers)
    lssim plan TRACE --devices N [cluster options]
        rank execution modes x device splits x staleness bounds x policies for a cluster (lssim.analysis.plan)

Cluster options, shared by ``replay`` and ``sweep``: ``--steps N --model NAME --hardware NAME --tp N
--instances N --max-num-seqs N --kv-tokens N --profile JSON --train-cost JSON --seed N``, and the execution
mode: ``--mode collocated|disaggregated|async|hybrid --rollout-devices N --train-devices N --staleness K
--async-variant roll|areal --no-elastic`` (lssim.loop.modes). ``real``, ``profile`` and
``validate`` need vLLM (real_backend/), imported only when one of them runs.

Adding a subcommand: write one function ``_add_NAME(subparsers)`` that adds
its parser and sets ``func=<handler(args) -> int | None>`` with
``set_defaults``, and list it in :data:`COMMANDS`.

Errors caused by the user's input (:class:`~lssim.traces.trace.TraceError`, any
``ValueError``, a file that cannot be read or written) print ``lssim: error:
<message>`` to stderr and exit with status 2, like argparse's own usage
errors; no traceback, and no half-written output file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from typing import Callable, Sequence

from lssim.analysis.tables import TABLE_COLUMNS, format_summary  # noqa: F401  (the tables both worlds print)

PROG = "lssim"


# --------------------------------------------------------------------------
# synth
# --------------------------------------------------------------------------


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


def _add_synth(sub: argparse._SubParsersAction) -> None:
    from lssim.traces.synth import PRESETS

    p = sub.add_parser(
        "synth",
        help="generate a synthetic trace from a preset",
        description="Generate a synthetic rollout-length trace from a preset configuration "
        "(see lssim.traces.synth.SynthConfig for every knob) and write it as parquet.",
    )
    p.add_argument("--preset", required=True, metavar="NAME", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("--seed", type=int, help="random seed (default: the preset's)")
    p.add_argument("--steps", type=int, help="number of RL steps")
    p.add_argument("--prompts-per-step", type=int, help="prompts per step (batch size)")
    p.add_argument("--group-size", type=int, help="responses per prompt (G)")
    p.add_argument("--max-tokens", type=int, help="response-token cap")
    p.add_argument("--n-prompts", type=int, help="prompt pool size")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override any SynthConfig field (repeatable)"
    )
    p.add_argument("--out", required=True, metavar="FILE", help="output parquet file (written atomically)")
    p.set_defaults(func=_run_synth)


# --------------------------------------------------------------------------
# trace
# --------------------------------------------------------------------------


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


def _add_trace(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="inspect trace files", description="Inspect trace files.")
    tsub = p.add_subparsers(dest="trace_command", metavar="COMMAND", required=True)
    info = tsub.add_parser(
        "info",
        help="validate a trace and summarize it",
        description="Validate a parquet trace and print its summary (lengths, tail, truncation, "
        "rewards, cross-step persistence).",
    )
    info.add_argument("file", metavar="FILE", help="trace: parquet, or CSV/JSON lines with its columns")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_run_trace_info)



# --------------------------------------------------------------------------
# import
# --------------------------------------------------------------------------


def _run_import(args: argparse.Namespace) -> int:
    from lssim.traces.importers import FRAMEWORKS, write_imported

    imported = FRAMEWORKS[args.framework].run(args)
    write_imported(imported, args.out)
    print(imported.summary(args.out))
    return 0


def _add_import(sub: argparse._SubParsersAction) -> None:
    from lssim.traces.importers import FRAMEWORKS

    p = sub.add_parser(
        "import",
        help="import a verl, slime, AReaL or TRL rollout dump as a trace",
        description="Read a training framework's rollout dump and write it as an lssim trace (atomically; nothing "
        "is written on error), with columns saying which values the dump measured and which were inferred.",
    )
    fsub = p.add_subparsers(dest="framework", metavar="FRAMEWORK", required=True)
    for name, module in FRAMEWORKS.items():
        fp = fsub.add_parser(name, help=module.HELP, description=(module.__doc__ or "").split("\n\n")[0])
        fp.add_argument("source", metavar="SOURCE", help="the dump's folder")
        fp.add_argument("-o", "--out", required=True, metavar="FILE", help="output parquet trace")
        fp.add_argument("--allow-gaps", action="store_true", help="accept holes in the step numbering")
        module.add_arguments(fp)
        fp.set_defaults(func=_run_import)


# --------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------

def _add_cluster_args(p: argparse.ArgumentParser, modes: bool = True) -> None:
    """The simulated cluster and run length, shared by `replay`, `sweep`, `report` and `plan` (which searches the
    execution modes itself: `modes=False`)."""
    p.add_argument("--steps", type=int, help="train on as many groups as this many of the trace's steps (default: all)")
    p.add_argument("--model", default="qwen2.5-7b", help="model preset for the roofline cost model")
    p.add_argument("--hardware", default="H100", help="hardware preset: H100, H200, A100")
    p.add_argument("--tp", type=int, default=1, help="GPUs per engine instance")
    p.add_argument("--instances", type=int, default=8, help="engine instances")
    p.add_argument("--max-num-seqs", type=int, default=256, help="running sequences per instance")
    p.add_argument("--kv-tokens", type=int, help="KV-cache capacity per instance in tokens (default: from the GPU memory)")
    p.add_argument("--profile", metavar="JSON", help="use a profiled cost model instead of the roofline")
    p.add_argument("--train-cost", metavar="JSON", help="a training-phase cost model (default: analytic for --model on "
                   "--hardware; a trainer profile from `python -m real_backend.profile_trainer`)")
    p.add_argument("--seed", type=int, default=0)
    if not modes:
        return
    modes = p.add_argument_group("execution mode (lssim/loop/modes.py)")
    modes.add_argument("--mode", choices=["collocated", "disaggregated", "async", "hybrid"], default="collocated",
                       help="where training runs and how far the rollout may run ahead of the weights (default collocated)")
    modes.add_argument("--rollout-devices", type=int, help="devices that roll out (instances x tp; sets --instances)")
    modes.add_argument("--train-devices", type=int, help="devices of the trainer's own (not collocated; default: as many "
                       "as the rollout's)")
    modes.add_argument("--staleness", type=int, default=1, help="async: versions the rollout may run ahead (default 1)")
    modes.add_argument("--async-variant", choices=["roll", "areal"], default="roll",
                       help="async: roll drops groups that would train over the bound (ROLL); areal never drops (AReaL "
                       "bounds admission only)")
    modes.add_argument("--no-elastic", action="store_true", help="hybrid: rollout devices do not join the update")


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
                    async_variant=args.async_variant, elastic=not args.no_elastic)


def _run_replay(args: argparse.Namespace) -> int:
    from lssim.analysis.replay import replay, replay_summary, summarize
    from lssim.results import write_results
    from lssim.traces.trace import load_trace

    if args.no_reference and not args.policy:
        raise ValueError("--no-reference: name at least one --policy (baseline and oracle are not run)")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    trace = load_trace(args.trace)
    setup = _setup_from_args(args)
    run = dict(steps=args.steps, seed=args.seed, progress=not args.json and sys.stderr.isatty(),
               references=not args.no_reference, workers=_replay_workers(args.workers, len(trace)))
    if args.out or args.plot:  # the runs' frames are written or drawn: keep them
        results = replay(trace, args.policy, setup, **run)
        table = summarize(results)
    else:  # only the table is printed: each run summarized and let go (forked, it sends back a row)
        results, table = None, replay_summary(trace, args.policy, setup, **run)
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
        print(f"trace {args.trace}: {int(table['responses'].iloc[0]):,} responses; {args.instances} x {args.model} on {args.hardware}"
              f" (tp={args.tp}){'; profiled cost ' + args.profile if args.profile else ''}; mode {table['mode'].iloc[0]}")
        print(format_summary(table))
        if args.no_reference:
            print("--no-reference: baseline and oracle not run; speedup is NaN ('-')"
                  f"{' except against the baseline you named' if 'baseline' in table.index else ''}")
        if args.out:
            print(f"results written to {args.out}/")
    return 0


PARALLEL_REPLAY_ROWS = 100_000  # below this, forking the runs costs about what running them side by side saves


def _replay_workers(asked: int | None, rows: int) -> int:
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
    """The summary table as {policy: {field: value}}; the staleness histogram as an object, not its JSON text."""
    out = {}
    for name, row in table.to_dict("index").items():
        out[name] = {k: json.loads(v) if k == "staleness_histogram" else _jsonable(v) for k, v in row.items()}
    return out


def _add_replay(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace under policies, against baseline, oracle and the lower bound",
        description="Replay a trace in the simulator under each --policy (composed with +, e.g. hadb+oracle), "
        "always with baseline and oracle as references, and print each against the per-step lower bound.",
    )
    p.add_argument("trace", metavar="TRACE", help="trace: parquet, or CSV/JSON lines with its columns (see traces/README.md)")
    p.add_argument("--policy", action="append", default=[], metavar="SPEC",
                   help="policy to replay (repeatable): a module of policies/, parameters as name(key=value)")
    _add_cluster_args(p)
    p.add_argument("--out", metavar="DIR", help="write per-response and per-step parquet and the summary here")
    p.add_argument("--no-reference", action="store_true", help="run only the --policy runs, not baseline and oracle "
                   "(faster; speedup is then NaN unless baseline is one of them)")
    p.add_argument("--json", action="store_true", help="print one JSON object: per policy, the summary")
    p.add_argument("--workers", type=int, default=None, help="run the policies and references side by side in this many "
                   f"forked processes, at most one per run (default: two per core for a trace of {PARALLEL_REPLAY_ROWS:,} "
                   "responses or more, else 1); the results are the same")
    p.add_argument("--plot", metavar="PNG", help="draw one step's timeline (baseline beside each --policy) into this PNG")
    p.add_argument("--plot-step", type=int, default=0, metavar="N", help="the step --plot draws (default 0)")
    p.set_defaults(func=_run_replay)


def _plot_replay_step(results: dict, step: int, path: str) -> None:
    """`replay --plot`: the timeline of `step`, baseline beside each policy replayed (not oracle), PNG written atomically."""
    from lssim.analysis.plots import compare_timelines
    from lssim.results import atomic_write

    names = [n for n in results if n != "oracle"] or list(results)
    fig = compare_timelines(results, step, names)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    print(f"step {step} timeline written to {path}")


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------


def _run_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lssim.analysis.report import PAGE, build_report, write_report
    from lssim.traces.trace import load_trace

    tty = sys.stderr.isatty()
    say = (lambda msg: print(f"report: {msg}", file=sys.stderr)) if tty else (lambda msg: None)
    trace = load_trace(args.trace)
    setup = _setup_from_args(args)
    report = build_report(trace, args.policy, setup, trace_name=Path(args.trace).stem, steps=args.steps, seed=args.seed,
                          timeline_step=args.timeline_step, say=say, progress=tty)
    out = write_report(report, args.out)
    print(f"report written to {out / PAGE} ({len(report.figures())} figures, {len(report.tables())} tables)")
    return 0


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write one HTML page (figures, tables) on what a policy does to a trace",
        description="Replay TRACE under --policy beside baseline and oracle and write DIR/report.html, one self-contained "
        "page (figures inline): what the trace is, what the policy did, how far each step is from its lower bound, one "
        "step's timeline, what was modelled rather than replayed, and the execution mode's end-to-end figures; the same "
        "figures as DIR/figures/*.png and tables as DIR/tables/*.csv. Written atomically. See docs/reports.md.",
    )
    p.add_argument("trace", metavar="TRACE", help="trace: parquet, or CSV/JSON lines with its columns (see traces/README.md)")
    p.add_argument("--policy", required=True, metavar="SPEC", help="the policy to report on (compose with +)")
    p.add_argument("--timeline-step", type=int, metavar="N", help="the step drawn as a timeline (default: the step where "
                   "baseline is furthest from its bound)")
    _add_cluster_args(p)
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="the report folder (replaced if it holds a report)")
    p.set_defaults(func=_run_report)

# --------------------------------------------------------------------------
# real
# --------------------------------------------------------------------------


def _add_real(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "real",
        help="run the RL loop on a real vLLM engine under a policy, and record its trace",
        description="Run synchronous GRPO steps with rollouts on vLLM (CPU here, GPU with `pip install vllm`) and a "
        "torch trainer, under the same policy objects the simulator runs; write DIR/trace.parquet (lssim trace "
        "schema, replayable with `lssim replay`), steps.parquet, responses.parquet and meta.json, rewritten after "
        "every step. See real_backend/README.md.",
    )

    def run(args: argparse.Namespace) -> int:
        from real_backend.run import run as run_real

        return run_real(args)

    from real_backend.run import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


def _add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure the real engine's iteration time and fit the simulator's profiled cost model",
        description="Start the vLLM engine, time decode iterations over a grid of running batch sizes and contexts "
        "and the time to first token of each batch, fit lssim.cost.ProfiledCostModel, and write it as JSON "
        "(use it with `lssim replay --profile FILE`); the measurements go beside it as parquet.",
    )

    def run(args: argparse.Namespace) -> int:
        from real_backend.profile import run as run_profile

        return run_profile(args)

    from real_backend.profile import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


def _add_validate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="record real runs (or take recorded ones), replay each in the simulator, report the error",
        description="For each policy, run it on the real vLLM backend (or take a run recorded by `lssim real`), "
        "replay its trace in the simulator with the same policy, seeds and a profiled cost model, and compare "
        "step by step: rollout makespan, finish order and times, tokens, and the speedup over baseline. "
        "See real_backend/README.md.",
    )

    def run(args: argparse.Namespace) -> int:
        from real_backend.sim_vs_real import run as run_validate

        return run_validate(args)

    from real_backend.sim_vs_real import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


# --------------------------------------------------------------------------
# sweep
# --------------------------------------------------------------------------


def _run_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lssim.loop.policy import available_policies
    from lssim.analysis.sweep import sweep, sweep_specs
    from lssim.traces.trace import load_trace

    grid = args.grid or []
    names = [n.strip() for n in args.policies.split(",") if n.strip()] if args.policies else \
        [] if grid else [n for n in available_policies() if n not in ("baseline", "oracle")]
    if not names and not grid:
        raise ValueError("--policies: no policy named")
    if args.resume and not args.out:
        raise ValueError("--resume continues the sweep written to --out DIR: name it")
    trace = load_trace(args.trace)
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


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="search compositions of policies on a trace for the best one, against the lower bound",
        description="Replay the trace under every composition of 1..--max-size of the --policies (a+b in the order "
        "listed) and every point of each --grid, beside baseline, and report them best first with their efficiency "
        "against the per-step lower bound. Runs go in parallel on every local core (or on Ray with --ray); with "
        "--out, each finished run is appended to DIR/runs.jsonl, and --resume skips the runs already there.",
    )
    p.add_argument("trace", metavar="TRACE", help="trace: parquet, or CSV/JSON lines with its columns (see traces/README.md)")
    p.add_argument("--policies", metavar="A,B,C", help="comma-separated policies to compose (default: every policy "
                   "but baseline and oracle, or none when --grid is given); parameters as name(key=value)")
    p.add_argument("--grid", action="append", metavar="SPEC", help="a parameter grid, one run per point (repeatable): "
                   "'hadb(short_batch_factor=1,2,4)' is 3 runs; several parameters (and members a+b) multiply")
    p.add_argument("--max-size", type=int, default=3, help="most policies in one composition (default 3)")
    p.add_argument("--by", choices=["speedup", "lower_bound_efficiency"], default="speedup",
                   help="what 'best' means: step time per trained group against baseline, end to end (default), or bound efficiency")
    p.add_argument("--max-staleness", type=int, help="a bound you state: no best composition trains tokens staler")
    p.add_argument("--max-off-policy", type=float, help="a bound you state: the largest share of off-policy trained tokens")
    p.add_argument("--top", type=int, default=10, help="rows of the table to print (default 10)")
    _add_cluster_args(p)
    p.add_argument("--workers", type=int, default=None, help="processes, or Ray CPUs of a local instance (default: every core)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray: join the cluster at ADDRESS, or start a local instance when none is given")
    p.add_argument("--out", metavar="DIR", help="write runs.jsonl (as runs finish), sweep.csv and sweep.json here")
    p.add_argument("--resume", action="store_true", help="continue the sweep in --out DIR: skip the runs already done")
    p.add_argument("--json", action="store_true", help="print one JSON object: the best run, every run, what was skipped")
    p.set_defaults(func=_run_sweep)


# --------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------

PLAN_TABLE = {  # plan column -> (header, format)
    "mode": ("mode", "{}"), "policy": ("policy", "{}"), "step_seconds": ("step s", "{:,.0f}"),
    "speedup": ("speedup", "{:.3f}x"), "trained_tokens_per_second": ("trained tok/s", "{:,.0f}"),
    "max_staleness": ("max stale", "{:.0f}"), "off_policy_token_fraction": ("off-policy", "{:.1%}"),
    "dropped_stale": ("dropped", "{:,.0f}"), "idle_device_fraction": ("idle", "{:.1%}"),
    "within_bounds": ("ok", "{}"), "pareto": ("pareto", "{}"),
}


def _run_plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from lssim.analysis.plan import PlanSpace, plan
    from lssim.traces.trace import load_trace

    space = PlanSpace(devices=args.devices, modes=tuple(_names(args.modes)), policies=tuple(_names(args.policies)),
                      rollout_fractions=tuple(float(f) for f in _names(args.rollout_fractions)),
                      staleness=tuple(int(k) for k in _names(args.staleness_bounds)), max_staleness=args.max_staleness,
                      max_off_policy=args.max_off_policy)
    for mode in space.modes:
        if mode not in ("collocated", "disaggregated", "async", "hybrid"):
            raise ValueError(f"--modes: unknown mode {mode!r}")
    trace = load_trace(args.trace)
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


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="rank execution modes, device splits, staleness bounds and policies for a cluster on a trace",
        description="Simulate the trace under every execution mode x rollout/train split of --devices x async "
        "staleness bound x policy, and rank them by trained tokens per second of the whole run (end to end), "
        "with the staleness and lost signal each pays. Candidates that break --max-staleness or --max-off-policy "
        "are listed but never best. See lssim/analysis/plan.py.",
    )
    p.add_argument("trace", metavar="TRACE", help="trace: parquet, or CSV/JSON lines with its columns (see traces/README.md)")
    p.add_argument("--devices", type=int, required=True, help="devices in the cluster (rollout and training together)")
    p.add_argument("--modes", default="collocated,disaggregated,async,hybrid", metavar="A,B", help="modes to try")
    p.add_argument("--policies", default="baseline,april,seer", metavar="A,B", help="policies to try (compositions as a+b)")
    p.add_argument("--rollout-fractions", default="0.25,0.5,0.75", metavar="F,F",
                   help="shares of the devices that roll out, for the modes with a trainer of its own")
    p.add_argument("--staleness-bounds", default="1,2", metavar="K,K", help="async staleness bounds to try")
    p.add_argument("--max-staleness", type=int, help="a bound you state: no best candidate trains tokens staler")
    p.add_argument("--max-off-policy", type=float, help="a bound you state: the largest share of off-policy trained tokens")
    p.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray (a local instance, or the cluster at ADDRESS): lssim/analysis/parallel.py")
    p.add_argument("--top", type=int, default=15, help="rows to print (default 15)")
    _add_cluster_args(p, modes=False)
    p.add_argument("--out", metavar="CSV", help="write every candidate's row here")
    p.add_argument("--json", action="store_true", help="print one JSON object: every candidate, best first")
    p.set_defaults(func=_run_plan)


# --------------------------------------------------------------------------

COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "synth": _add_synth,
    "trace": _add_trace,
    "replay": _add_replay,
    "real": _add_real,
    "profile": _add_profile,
    "validate": _add_validate,
    "sweep": _add_sweep,
    "plan": _add_plan,
    "report": _add_report,
    "import": _add_import,
}
"""Subcommand name -> function that adds its parser (and sets ``func``)."""


class _Parser(argparse.ArgumentParser):
    """No option is reachable by an abbreviation (`--mode` must never be taken for `--model`); subcommands'
    parsers are of this class too (argparse makes them of the parent's)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Replay rollout-length traces of RL post-training under scheduling policies.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns 0 on success, exits with status 2 on bad input."""
    from lssim.traces.trace import TraceError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except BrokenPipeError:  # e.g. `lssim trace info FILE --json | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None
    except (TraceError, ValueError, OSError) as e:
        msg = str(e)
        if isinstance(e, OSError) and e.filename and str(e.filename) not in msg:
            msg = f"{e.filename}: {msg}"
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        raise SystemExit(2) from None
    return 0 if rc is None else int(rc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
