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
        (real_backend/validate_command.py, lssim.analysis.fidelity)
    lssim import {verl,slime,areal,trl} SOURCE -o FILE [framework options]
        turn a framework's rollout dump into an lssim trace (lssim.traces.importers)
    lssim signals TRACE --tokens SOURCE [--tokenizer DIR] [--window N] [--ngram N] [--stride N] [--partial] --out FILE
        add measured early-exit signals to a trace from its responses' token ids (lssim.traces.signal_import)
    lssim plan TRACE --devices N [cluster options]
        rank execution modes x device splits x staleness bounds x policies for a cluster (lssim.analysis.plan)
    lssim warmup
        compile the simulator's numba kernels now, into numba's on-disk cache, rather than in the first replay
        (lssim.kernels)

Cluster options, shared by ``replay`` and ``sweep``: ``--steps N --model NAME --hardware NAME --tp N
--instances N --max-num-seqs N --kv-tokens N --profile JSON --train-cost JSON --seed N``, and the execution
mode: ``--mode collocated|disaggregated|async|hybrid --rollout-devices N --train-devices N --staleness K
--async-variant roll|areal --no-elastic`` (lssim.loop.modes). ``real``, ``profile`` and
``validate`` need vLLM (real_backend/), imported only when one of them runs.

The package: ``lssim.cli.parsers`` (one ``add_NAME(subparsers, name)`` per command, returning its parser, and
each command's help line in ``HELP``), ``lssim.cli.handlers`` (one handler per command, and
:data:`~lssim.cli.handlers.COMMANDS`, the one table from a command's name to its parser and handler). Only the
command that runs gets its own parser (``build_parser``); the others are their help line, and each handler imports
what it uses when it runs: ``lssim --help`` imports neither numpy nor pandas nor numba. Adding a subcommand: write its
``add_NAME`` and its handler ``(args) -> int | None``, its line in ``HELP``, and list the pair in ``COMMANDS``.
``real``, ``profile`` and ``validate`` share one parser and one handler: their options are real_backend's own,
parsed when the command runs.

Errors caused by the user's input (:class:`~lssim.traces.trace.TraceError`, any
``ValueError``, a file that cannot be read or written) print ``lssim: error:
<message>`` to stderr and exit with status 2, like argparse's own usage
errors; no traceback, and no half-written output file.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Sequence

from lssim.cli.handlers import COMMANDS
from lssim.cli.parsers import PROG, Parser, add_help_line


def build_parser(command: str | None = None) -> Parser:
    """The command line's parser, with `command`'s options (a name of COMMANDS; None: no command's); every other
    command is a help line (parsers.add_help_line), so that `lssim --help` or `lssim replay` imports only what the
    command that runs needs (some parsers import their choices: presets, importers)."""
    parser = Parser(
        prog=PROG,
        description="Replay rollout-length traces of RL post-training under scheduling policies.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (add_parser, handler) in COMMANDS.items():
        (add_parser if name == command else add_help_line)(sub, name).set_defaults(func=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns 0 on success, exits with status 2 on bad input. `argv` None: the command is this process's
    own (`lssim`, `python -m lssim.cli`), which ends when it returns (_leave_to_exit)."""
    if argv is None:
        try:
            return _run(sys.argv[1:])
        finally:
            _leave_to_exit()
    return _run(list(argv))


def _leave_to_exit() -> None:
    """What the command made (a replay's frames, numba's registries) is left to the process's exit: frozen, the
    interpreter's collections at exit skip it rather than free it object by object (~0.25 s of a warm replay,
    docs/performance.md); atexit handlers and buffered output are not affected."""
    gc.freeze()


def _run(argv: list[str]) -> int:
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except BrokenPipeError:  # e.g. `lssim trace info FILE --json | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None
    except (ValueError, OSError) as e:  # lssim.traces.checks.TraceError is a ValueError
        msg = str(e)
        if isinstance(e, OSError) and e.filename and str(e.filename) not in msg:
            msg = f"{e.filename}: {msg}"
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        raise SystemExit(2) from None
    return 0 if rc is None else int(rc)
