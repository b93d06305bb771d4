"""The ``lssim`` command line.

Subcommands::

    lssim synth --preset NAME [--seed N] [--steps N] [--prompts-per-step N]
                [--group-size N] [--max-tokens N] [--set KEY=VALUE ...] --out FILE
    lssim trace info FILE [--json]

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

COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "synth": _add_synth,
    "trace": _add_trace,
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
