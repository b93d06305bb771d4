"""The ``lssim`` command line.

Subcommands::

    lssim synth --preset NAME [--seed N] [--steps N] [--prompts-per-step N]
                [--group-size N] [--max-tokens N] [--set KEY=VALUE ...] --out FILE
    lssim trace info FILE [--json]
    lssim replay TRACE [--policy SPEC ...] [--out DIR] [--json]
    lssim sweep TRACE [--policies A,B,C] [--max-size 3] [--out DIR] [--json]
    lssim import {verl,slime,areal,trl} SOURCE -o FILE [framework options]

Adding a subcommand: write one function ``_add_NAME(subparsers)`` that adds
its parser and sets ``func=<handler(args) -> int | None>`` with
``set_defaults``, and list it in :data:`COMMANDS`.

Errors caused by the user's input (:class:`~lssim.trace.TraceError`, any
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

PROG = "lssim"


# --------------------------------------------------------------------------
# synth
# --------------------------------------------------------------------------


def _parse_set(items: Sequence[str]) -> dict[str, object]:
    """``KEY=VALUE`` overrides of SynthConfig fields, typed by the field."""
    from .synth import SynthConfig

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
    from .synth import get_preset, synthesize
    from .trace import write_trace

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
    from .synth import PRESETS

    p = sub.add_parser(
        "synth",
        help="generate a synthetic trace from a preset",
        description="Generate a synthetic rollout-length trace from a preset configuration "
        "(see lssim.synth.SynthConfig for every knob) and write it as parquet.",
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
    from .trace import format_trace_info, load_trace, trace_info

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
    info.add_argument("file", metavar="FILE", help="parquet trace")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_run_trace_info)



# --------------------------------------------------------------------------
# import
# --------------------------------------------------------------------------


def _run_import(args: argparse.Namespace) -> int:
    from .importers import FRAMEWORKS, write_imported

    imported = FRAMEWORKS[args.framework].run(args)
    write_imported(imported, args.out)
    print(imported.summary(args.out))
    return 0


def _add_import(sub: argparse._SubParsersAction) -> None:
    from .importers import FRAMEWORKS

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

TABLE_COLUMNS = {  # summary column -> (header, format)
    "rollout_seconds": ("rollout s", lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"),  # a CPU run's seconds or a cluster's days
    "speedup": ("speedup", "{:.3f}x"),
    "tokens_per_second": ("tok/s", "{:,.0f}"),
    "lower_bound_efficiency": ("bound eff", "{:.1%}"),
    "long_tail_ratio": ("tail ratio", "{:.2f}"),
    "busy_fraction": ("busy", "{:.1%}"),
    "mean_running": ("batch", "{:.0f}"),
    "truncated_fraction": ("truncated", "{:.1%}"),
    "policy_stopped_fraction": ("stopped", "{:.1%}"),
    "tokens_saved_fraction": ("saved", "{:.1%}"),
    "stopped_correct_fraction": ("stop FP", "{:.1%}"),
    "off_policy_token_fraction": ("off-policy", "{:.1%}"),
    "effective_group_fraction": ("eff groups", "{:.1%}"),
    "exact_fraction": ("exact", "{:.1%}"),
    "steps": ("steps", "{:d}"),
}


def format_summary(table) -> str:
    """The terminal table: one row per policy, the columns a researcher reads first."""
    headers = ["policy"] + [h for h, _ in TABLE_COLUMNS.values()]
    cell = lambda v, fmt: "-" if v != v else fmt(v) if callable(fmt) else fmt.format(v)  # noqa: E731  (NaN: nothing to report)
    rows = [[name] + [cell(table.loc[name, col], fmt) for col, (_, fmt) in TABLE_COLUMNS.items()] for name in table.index]
    widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    """The simulated cluster and run length, shared by `replay` and `sweep`."""
    p.add_argument("--steps", type=int, help="train on as many groups as this many of the trace's steps (default: all)")
    p.add_argument("--model", default="qwen2.5-7b", help="model preset for the roofline cost model")
    p.add_argument("--hardware", default="H100", help="hardware preset: H100, H200, A100")
    p.add_argument("--tp", type=int, default=1, help="GPUs per engine instance")
    p.add_argument("--instances", type=int, default=8, help="engine instances")
    p.add_argument("--max-num-seqs", type=int, default=256, help="running sequences per instance")
    p.add_argument("--kv-tokens", type=int, help="KV-cache capacity per instance in tokens (default: from the GPU memory)")
    p.add_argument("--profile", metavar="JSON", help="use a profiled cost model instead of the roofline")
    p.add_argument("--seed", type=int, default=0)


def _setup_from_args(args: argparse.Namespace):
    from .replay import SimSetup

    return SimSetup(model=args.model, hardware=args.hardware, tp=args.tp, n_instances=args.instances,
                    max_num_seqs=args.max_num_seqs, kv_capacity_tokens=args.kv_tokens, profile=args.profile)


def _run_replay(args: argparse.Namespace) -> int:
    from .replay import replay, summarize
    from .results import write_results
    from .trace import load_trace

    trace = load_trace(args.trace)
    setup = _setup_from_args(args)
    results = replay(trace, args.policy, setup, steps=args.steps, seed=args.seed, progress=not args.json and sys.stderr.isatty())
    table = summarize(results)
    if args.out:
        write_results(args.out, results, table, meta={"trace": str(args.trace), "setup": vars(args)})
    if args.json:
        print(json.dumps({name: {k: _jsonable(v) for k, v in row.items()} for name, row in table.to_dict("index").items()}, indent=2))
    else:
        print(f"trace {args.trace}: {int(table['responses'].iloc[0]):,} responses; {args.instances} x {args.model} on {args.hardware}"
              f" (tp={args.tp}){'; profiled cost ' + args.profile if args.profile else ''}")
        print(format_summary(table))
        if args.out:
            print(f"results written to {args.out}/")
    return 0


def _jsonable(v):
    return v.item() if hasattr(v, "item") else v


def _add_replay(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace under policies, against baseline, oracle and the lower bound",
        description="Replay a trace in the simulator under each --policy (composed with +, e.g. hadb+oracle), "
        "always with baseline and oracle as references, and print each against the per-step lower bound.",
    )
    p.add_argument("trace", metavar="TRACE", help="parquet trace (see traces/README.md)")
    p.add_argument("--policy", action="append", default=[], metavar="SPEC",
                   help="policy to replay (repeatable): a module of policies/, parameters as name(key=value)")
    _add_cluster_args(p)
    p.add_argument("--out", metavar="DIR", help="write per-response and per-step parquet and the summary here")
    p.add_argument("--json", action="store_true", help="print one JSON object: per policy, the summary")
    p.set_defaults(func=_run_replay)

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
        "See real_backend/VALIDATION.md.",
    )

    def run(args: argparse.Namespace) -> int:
        from real_backend.validate import run as run_validate

        return run_validate(args)

    from real_backend.validate import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


# --------------------------------------------------------------------------
# sweep
# --------------------------------------------------------------------------


def _run_sweep(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from .policy import available_policies
    from .sweep import compositions, sweep
    from .trace import load_trace

    names = [n.strip() for n in args.policies.split(",") if n.strip()] if args.policies else \
        [n for n in available_policies() if n not in ("baseline", "oracle")]
    if not names:
        raise ValueError("--policies: no policy named")
    trace = load_trace(args.trace)
    setup = _setup_from_args(args)
    n_runs = len(compositions(names, args.max_size)) + 1
    bar = None
    if not args.json and sys.stderr.isatty():
        from tqdm import tqdm

        bar = lambda specs: tqdm(specs, desc="sweep", unit="run", leave=False)  # noqa: E731
        print(f"sweep: {n_runs} runs ({len(names)} policies, compositions of up to {args.max_size}) on {args.trace}",
              file=sys.stderr)
    skipped: list = []
    table = sweep(trace, names, args.max_size, setup, steps=args.steps, seed=args.seed, by=args.by, progress=bar, skipped=skipped)
    best_name = next(n for n in table.index if n != "baseline") if len(table) > 1 else table.index[0]
    rows = [{"policy": name, **{k: _jsonable(v) for k, v in row.items()}} for name, row in table.to_dict("index").items()]
    best = next(r for r in rows if r["policy"] == best_name)
    report = {"trace": str(args.trace), "policies": names, "max_size": args.max_size, "by": args.by,
              "setup": {k: v for k, v in vars(args).items() if k != "func"}, "best": best, "results": rows,
              "skipped": [{"policy": s, "reason": r} for s, r in skipped]}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for fname, write in (("sweep.csv", lambda f: table.rename_axis("policy").to_csv(f)),
                             ("sweep.json", lambda f: Path(f).write_text(json.dumps(report, indent=2, default=str) + "\n"))):
            fd, tmp = tempfile.mkstemp(prefix=f".{fname}.", dir=out)
            os.close(fd)
            try:
                write(tmp)
                os.replace(tmp, out / fname)
            except BaseException:
                os.unlink(tmp)
                raise
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"trace {args.trace}: {n_runs} runs; {args.instances} x {args.model} on {args.hardware} (tp={args.tp}); "
          f"best {args.top} by {args.by}:")
    print(format_summary(table.head(args.top)))
    for spec, reason in skipped:
        print(f"skipped {spec}: {reason}")
    print(f"best: {best_name}: {best['speedup']:.3f}x baseline, {best['lower_bound_efficiency']:.1%} of the per-step lower bound"
          f" (goal 95%); off-policy tokens {best['off_policy_token_fraction']:.1%}, truncated {best['truncated_fraction']:.1%}")
    if args.out:
        print(f"results written to {args.out}/")
    return 0


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="search compositions of policies on a trace for the best one, against the lower bound",
        description="Replay the trace under every composition of 1..--max-size of the --policies (a+b in the order "
        "listed), beside baseline, and report them best first with their efficiency against the per-step lower bound.",
    )
    p.add_argument("trace", metavar="TRACE", help="parquet trace (see traces/README.md)")
    p.add_argument("--policies", metavar="A,B,C", help="comma-separated policies to compose (default: every policy "
                   "but baseline and oracle); parameters as name(key=value)")
    p.add_argument("--max-size", type=int, default=3, help="most policies in one composition (default 3)")
    p.add_argument("--by", choices=["speedup", "lower_bound_efficiency"], default="speedup",
                   help="what 'best' means: rollout time per trained group against baseline (default), or bound efficiency")
    p.add_argument("--top", type=int, default=10, help="rows of the table to print (default 10)")
    _add_cluster_args(p)
    p.add_argument("--out", metavar="DIR", help="write sweep.csv (every run's summary) and sweep.json here")
    p.add_argument("--json", action="store_true", help="print one JSON object: the best run, every run, what was skipped")
    p.set_defaults(func=_run_sweep)


# --------------------------------------------------------------------------

COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "synth": _add_synth,
    "trace": _add_trace,
    "replay": _add_replay,
    "real": _add_real,
    "profile": _add_profile,
    "validate": _add_validate,
    "sweep": _add_sweep,
    "import": _add_import,
}
"""Subcommand name -> function that adds its parser (and sets ``func``)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Replay rollout-length traces of RL post-training under scheduling policies.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns 0 on success, exits with status 2 on bad input."""
    from .trace import TraceError

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
