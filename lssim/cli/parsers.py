"""The ``lssim`` command line's parsers: one function per command, ``add_NAME(subparsers, name)``, that adds its
parser and returns it (lssim.cli.handlers.COMMANDS pairs each with its handler). The real backend's commands
(`real`, `profile`, `validate`) take their options from real_backend itself, at dispatch (`add_real_backend`).
"""

from __future__ import annotations

import argparse

PROG = "lssim"
PARALLEL_REPLAY_ROWS = 100_000  # below this, forking the runs costs about what running them side by side saves

# Each command's line in `lssim --help` (the real backend's are in REAL_BACKEND): all that a command's parser is
# built for while another command runs (lssim.cli.build_parser), so that its imports wait until it runs.
HELP = {
    "synth": "generate a synthetic trace from a preset",
    "trace": "inspect trace files",
    "import": "import a verl, slime, AReaL or TRL rollout dump as a trace",
    "signals": "add measured early-exit signals to a trace from its responses' token ids",
    "replay": "replay a trace under policies, against baseline, oracle and the lower bound",
    "report": "write one HTML page (figures, tables) on what a policy does to a trace",
    "sweep": "search compositions of policies on a trace for the best one, against the lower bound",
    "plan": "rank execution modes, device splits, staleness bounds and policies for a cluster on a trace",
    "warmup": "compile the simulator's numba kernels now (cached on disk), not in the first replay",
}


class Parser(argparse.ArgumentParser):
    """No option is reachable by an abbreviation (`--mode` must never be taken for `--model`); subcommands'
    parsers are of this class too (argparse makes them of the parent's)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def add_synth(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    from lssim.traces.synth import PRESETS

    p = sub.add_parser(
        name,
        help=HELP[name],
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
    return p


def add_trace(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=HELP[name], description="Inspect trace files.")
    tsub = p.add_subparsers(dest="trace_command", metavar="COMMAND", required=True)
    info = tsub.add_parser(
        "info",
        help="validate a trace and summarize it",
        description="Validate a parquet trace and print its summary (lengths, tail, truncation, "
        "rewards, cross-step persistence).",
    )
    info.add_argument("file", metavar="FILE", help="trace: parquet, or CSV/JSON lines with its columns")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def add_import(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    from lssim.traces.importers import FRAMEWORKS
    from lssim.traces.importers.common import add_signal_arguments

    p = sub.add_parser(
        name,
        help=HELP[name],
        description="Read a training framework's rollout dump and write it as an lssim trace (atomically; nothing "
        "is written on error), with columns saying which values the dump measured and which were inferred.",
    )
    fsub = p.add_subparsers(dest="framework", metavar="FRAMEWORK", required=True)
    for framework, module in FRAMEWORKS.items():
        fp = fsub.add_parser(framework, help=module.HELP, description=(module.__doc__ or "").split("\n\n")[0])
        fp.add_argument("source", metavar="SOURCE", help="the dump's folder")
        fp.add_argument("-o", "--out", required=True, metavar="FILE", help="output parquet trace")
        fp.add_argument("--allow-gaps", action="store_true", help="accept holes in the step numbering")
        module.add_arguments(fp)
        add_signal_arguments(fp)
    return p


def add_signals(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    from lssim.loop.signals import DEFAULT
    from lssim.traces.signal_trace import DEFAULT_STRIDE

    p = sub.add_parser(
        name,
        help=HELP[name],
        description="Measure each response's early-exit signals (window repetition and entropy, every --stride tokens: "
        "lssim.loop.signals.signals_along, as the real engine computes them) from its token ids and write the trace "
        "with them (atomically), so a replay of a policy that reads them (breaker) can run. Every trace row needs its "
        "tokens, every token row its trace row, and the token count must equal the row's response_len.",
    )
    add_trace_arg(p)
    p.add_argument("--tokens", required=True, metavar="SOURCE", help="parquet or JSON-lines file, one row per response: "
                   "step, prompt_id, sample_idx (the trace's key), tokens (the response's token ids) and optionally "
                   "logprobs (of each sampled token: the entropy signal, NaN without them); or text with --tokenizer")
    p.add_argument("--tokenizer", metavar="DIR", help="Hugging Face tokenizer folder (read offline) for rows with text "
                   "instead of tokens")
    p.add_argument("--out", required=True, metavar="FILE", help="output parquet trace (may be TRACE itself)")
    p.add_argument("--window", type=int, default=DEFAULT.window, help=f"tokens in the window (default {DEFAULT.window})")
    p.add_argument("--ngram", type=int, default=DEFAULT.ngram, help=f"n-gram length of the repetition measure "
                   f"(default {DEFAULT.ngram})")
    p.add_argument("--stride", type=int, default=DEFAULT_STRIDE, help=f"tokens between the values kept per response "
                   f"(default {DEFAULT_STRIDE})")
    p.add_argument("--partial", action="store_true", help="accept trace rows without tokens: they keep signals measured "
                   "before over the same window and n-gram, else are left with none (signal_source empty), so a replay "
                   "of a policy that reads the signals refuses the trace until every row has them")
    return p


def add_trace_arg(p: argparse.ArgumentParser) -> None:
    """The TRACE positional of replay, report, sweep and plan."""
    p.add_argument("trace", metavar="TRACE", help="trace: parquet, or CSV/JSON lines with its columns (see traces/README.md)")


def add_cluster_args(p: argparse.ArgumentParser, modes: bool = True) -> None:
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
    p.add_argument("--allow-missing-signals", action="store_true", help="run a policy that reads early-exit signals "
                   "(breaker) on a trace without them, with a warning, instead of refusing (docs/traces.md, Signals)")
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


def add_replay(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=HELP[name],
        description="Replay a trace in the simulator under each --policy (composed with +, e.g. hadb+oracle), "
        "always with baseline and oracle as references, and print each against the per-step lower bound.",
    )
    add_trace_arg(p)
    p.add_argument("--policy", action="append", default=[], metavar="SPEC",
                   help="policy to replay (repeatable): a module of policies/, parameters as name(key=value)")
    add_cluster_args(p)
    p.add_argument("--out", metavar="DIR", help="write per-response and per-step parquet and the summary here")
    p.add_argument("--no-reference", action="store_true", help="run only the --policy runs, not baseline and oracle "
                   "(faster; speedup is then NaN unless baseline is one of them)")
    p.add_argument("--json", action="store_true", help="print one JSON object: per policy, the summary")
    p.add_argument("--workers", type=int, default=None, help="run the policies and references side by side in this many "
                   f"forked processes, at most one per run (default: two per core for a trace of {PARALLEL_REPLAY_ROWS:,} "
                   "responses or more, else 1); the results are the same")
    p.add_argument("--plot", metavar="PNG", help="draw one step's timeline (baseline beside each --policy) into this PNG")
    p.add_argument("--plot-step", type=int, default=0, metavar="N", help="the step --plot draws (default 0)")
    return p


def add_report(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=HELP[name],
        description="Replay TRACE under --policy beside baseline and oracle and write DIR/report.html, one self-contained "
        "page (figures inline): what the trace is, what the policy did, how far each step is from its lower bound, one "
        "step's timeline, what was modelled rather than replayed, and the execution mode's end-to-end figures; the same "
        "figures as DIR/figures/*.png and tables as DIR/tables/*.csv. Written atomically. See docs/reports.md.",
    )
    add_trace_arg(p)
    p.add_argument("--policy", required=True, metavar="SPEC", help="the policy to report on (compose with +)")
    p.add_argument("--timeline-step", type=int, metavar="N", help="the step drawn as a timeline (default: the step where "
                   "baseline is furthest from its bound)")
    add_cluster_args(p)
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="the report folder (replaced if it holds a report)")
    return p


def add_sweep(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=HELP[name],
        description="Replay the trace under every composition of 1..--max-size of the --policies (a+b in the order "
        "listed) and every point of each --grid, beside baseline, and report them best first with their efficiency "
        "against the per-step lower bound. Runs go in parallel on every local core (or on Ray with --ray); with "
        "--out, each finished run is appended to DIR/runs.jsonl, and --resume skips the runs already there.",
    )
    add_trace_arg(p)
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
    add_cluster_args(p)
    p.add_argument("--workers", type=int, default=None, help="processes, or Ray CPUs of a local instance (default: every core)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray: join the cluster at ADDRESS, or start a local instance when none is given")
    p.add_argument("--out", metavar="DIR", help="write runs.jsonl (as runs finish), sweep.csv and sweep.json here")
    p.add_argument("--resume", action="store_true", help="continue the sweep in --out DIR: skip the runs already done")
    p.add_argument("--json", action="store_true", help="print one JSON object: the best run, every run, what was skipped")
    return p


def add_plan(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=HELP[name],
        description="Simulate the trace under every execution mode x rollout/train split of --devices x async "
        "staleness bound x policy, and rank them by trained tokens per second of the whole run (end to end), "
        "with the staleness and lost signal each pays. Candidates that break --max-staleness or --max-off-policy "
        "are listed but never best. See lssim/analysis/plan.py.",
    )
    add_trace_arg(p)
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
    add_cluster_args(p, modes=False)
    p.add_argument("--out", metavar="CSV", help="write every candidate's row here")
    p.add_argument("--json", action="store_true", help="print one JSON object: every candidate, best first")
    return p


def add_warmup(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=HELP[name], description="Compile every numba kernel of the simulator (lssim.kernels) "
                          "that is not in numba's on-disk cache yet, and load the others: the first replay after an "
                          "install or a change to a kernel otherwise pays for it (docs/performance.md).")


# The real backend's commands: the real_backend module that adds their options (add_arguments) and runs them (run),
# their help and description.
REAL_BACKEND = {
    "real": ("real_backend.run", "run the RL loop on a real vLLM engine under a policy, and record its trace",
             "Run synchronous GRPO steps with rollouts on vLLM (CPU here, GPU with `pip install vllm`) and a "
             "torch trainer, under the same policy objects the simulator runs; write DIR/trace.parquet (lssim trace "
             "schema, replayable with `lssim replay`), steps.parquet, responses.parquet and meta.json, rewritten after "
             "every step. See real_backend/README.md."),
    "learn": ("real_backend.learn", "real runs of the baseline and policies from one checkpoint, compared by held-out accuracy",
              "Run the baseline and each policy (and mode) with the learning recipe on one vLLM engine, R seeds each, to "
              "a training wall-clock budget or a number of steps, evaluating the held-out prompts as they go; report "
              "accuracy at equal wall-clock and time to a target accuracy, with learning curves (DIR/learn.html). "
              "See docs/real_backend.md, Learning."),
    "learn-model": ("real_backend.learn_model", "fit the learning-progress model on lssim learn's runs and check it on "
                    "policies left out", "Fit held-out accuracy against the useful signal trained (groups with a "
                    "non-zero advantage, stale tokens discounted) on a lssim learn folder's real runs; for each label, "
                    "refit without it, replay its runs in the simulator on the baseline's traces and predict its time to "
                    "the target accuracy; report predicted against measured (ratio, Kendall tau). See "
                    "docs/real_backend.md, Learning."),
    "profile": ("real_backend.profile", "measure the real engine's iteration time and fit the simulator's profiled cost model",
                "Start the vLLM engine, time decode iterations over a grid of running batch sizes and contexts "
                "and the time to first token of each batch, fit lssim.cost.ProfiledCostModel, and write it as JSON "
                "(use it with `lssim replay --profile FILE`); the measurements go beside it as parquet."),
    "validate": ("real_backend.validate_command", "record real runs (or take recorded ones), replay each in the simulator, report the error",
                 "For each policy, run it on the real vLLM backend (or take a run recorded by `lssim real`), "
                 "replay its trace in the simulator with the same policy, seeds and a profiled cost model, and compare "
                 "step by step: rollout makespan, finish order and times, tokens, and the speedup over baseline. "
                 "See real_backend/README.md."),
}


def add_real_backend(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    """A command of the real backend: this parser only collects its arguments, which `real_backend_parser` parses
    when the command runs, so that lssim imports real_backend (and vLLM) only then."""
    _, help_line, _ = REAL_BACKEND[name]
    p = sub.add_parser(name, help=help_line, add_help=False, prefix_chars="\0")  # no prefix: every argument is kept
    p.add_argument("arguments", nargs=argparse.REMAINDER)
    return p


def add_help_line(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    """A command's place in `lssim --help` and in argparse's list of choices, without its options."""
    return sub.add_parser(name, help=HELP[name] if name in HELP else REAL_BACKEND[name][1])


def real_backend_parser(name: str, add_arguments) -> Parser:
    """The full parser of a real-backend command (`lssim NAME --help` prints it), its options added by the real
    backend's `add_arguments`."""
    _, help_line, description = REAL_BACKEND[name]
    p = Parser(prog=f"{PROG} {name}", description=description)
    add_arguments(p)
    return p
