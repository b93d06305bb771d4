"""`lssim learn`: does a policy reach held-out accuracy sooner? Real runs of the baseline and each policy and mode from
the same checkpoint, `--repeats` seeds each, to a training wall-clock budget (or a number of steps), compared by
held-out accuracy (real_backend.learn_report).

    lssim learn --policies baseline,april --repeats 1 --budget-seconds 600 --json --out runs/learn1

Each run is a normal `lssim real` folder, DIR/<label>/<seed> (label: the policy, or policy@mode when several modes or
another than collocated are asked: baseline@async2), evaluated every --eval-every steps (eval.parquet). The runs go
one after another on ONE vLLM engine (started once: ~20-30 s); each run's trainer loads the checkpoint afresh and
pushes its weights into the engine first (world.run_real), so every run starts from the same weights. Learning
recipe by default (docs/real_backend.md, "Learning"): lr 1e-4, 8 groups x 4 samples, one optimizer step per RL step,
clip 0.2, no KL, max_tokens 256. Interrupted: run the same command again; finished runs are skipped, a partial
run resumes from its checkpoint, in its mode.
Writes DIR/learn.json, DIR/learning_curves.png and DIR/learn.html; --json prints learn.json's result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

LEARN_LR = 1e-4  # the learning recipe (/work/scratch/s33/learn/FINDINGS.md: +10 points in 20-30 steps; 2e-5 needs ~105)
UNBOUNDED_STEPS = 100_000  # --budget-seconds alone: the budget ends the run


def parse_mode(text: str):
    """'collocated', 'disaggregated', 'hybrid', 'async' or 'async:K' -> ModeConfig (one engine, one trainer)."""
    from lssim.loop.modes import ModeConfig

    name, _, k = text.partition(":")
    if name not in ("collocated", "disaggregated", "async", "hybrid") or (k and (name != "async" or not k.isdigit())):
        raise ValueError(f"--modes: {text!r} is not collocated, disaggregated, hybrid, async or async:K")
    train = None if name == "collocated" else 1
    return ModeConfig(mode=name, rollout_devices=1, train_devices=train, staleness=int(k) if k else 1)


def plan_runs(args: argparse.Namespace) -> list[dict]:
    """Every run of the command: label, policy spec, mode text, seed, folder; the baseline first. A policy written
    `policy@mode` (baseline@async:2) runs in that mode only, beside the --modes crossing of the others."""
    entries = [p.strip() for p in args.policies.split(",") if p.strip()]
    if "baseline" not in entries:
        entries = ["baseline"] + entries
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        parse_mode(m)
    plain = modes == ["collocated"]
    pairs = []
    for mode in modes:
        pairs += [(e, mode, e if plain else f"{e}@{mode.replace(':', '')}") for e in entries if "@" not in e]
    for e in entries:
        if "@" in e:
            policy, _, mode = e.partition("@")
            parse_mode(mode)
            pairs.append((policy, mode, f"{policy}@{mode.replace(':', '')}"))
    return [{"label": label, "policy": policy, "mode": mode, "seed": seed,
             "out": str(Path(args.out) / label / str(seed))}
            for policy, mode, label in pairs for seed in range(args.seed, args.seed + args.repeats)]


def run_state(out) -> str:
    """'finished', 'partial' (a checkpoint to resume from), or 'new'."""
    from .world import old_meta

    out = Path(out)
    if old_meta(out).get("status") == "finished":
        return "finished"
    return "partial" if (out / "checkpoint.pt").exists() else "new"


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from .learn_report import jsonable, summarize, summary_table, write_outputs
    from .run import eval_settings

    check_args(args)
    evaluation = eval_settings(args)
    runs = plan_runs(args)
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731  (stdout: the result only)
    todo = [r for r in runs if run_state(r["out"]) != "finished"]
    say(f"lssim learn: {len(runs)} runs ({len(runs) - len(todo)} finished already) into {args.out}; budget "
        f"{args.budget_seconds or '-'} s, steps {args.steps or '-'}, lr {args.lr}")
    if todo:
        code = run_all(args, todo, evaluation, say, total=len(runs))
        if code:
            return code
    by_label: dict[str, dict[int, str]] = {}
    for r in runs:
        by_label.setdefault(r["label"], {})[r["seed"]] = r["out"]
    result = summarize(by_label, target=args.target, baseline="baseline" if "baseline" in by_label else None)
    paths = write_outputs(result, by_label, args.out)
    if args.json:
        print(json.dumps(jsonable(result), indent=1))
    else:
        print(summary_table(result).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    say(f"written: {', '.join(str(p) for p in paths.values())}")
    return 0


def run_all(args: argparse.Namespace, todo: list[dict], evaluation, say, total: int) -> int:
    """The runs not finished yet, one after another on one engine."""
    from .checkpoint import load_checkpoint
    from .engine import EngineError
    from .run import StepLines
    from .world import prepare, run_real, start_engine

    setup = learn_setup(args)
    engine = None
    try:
        for i, r in enumerate(todo):
            config = learn_config(args, r["seed"])
            mode = parse_mode(r["mode"])
            resume = load_checkpoint(r["out"]) if run_state(r["out"]) == "partial" else None
            prompts, policy = prepare(setup, resume.policy if resume else r["policy"], config)
            if engine is None:
                say("starting the vLLM engine ...")
                engine = start_engine(setup, prompts, seed=args.seed)
            say(f"[{total - len(todo) + i + 1}/{total}] {r['label']} seed {r['seed']} "
                f"({'resumed after step ' + str(resume.step) if resume else 'from the checkpoint'}) -> {r['out']}")
            t0 = time.monotonic()
            lines = StepLines(say)  # each step's line once its update has ended
            result = run_real(setup, policy, config, r["out"], engine=engine, prompts=prompts, mode=mode, resume=resume,
                              on_step=lines, evaluation=evaluation, say=say,
                              budget_seconds=args.budget_seconds,
                              meta={"command": " ".join(sys.argv), "policy_spec": r["policy"], "learn": r})
            lines.flush()
            say(f"  done: {len(result.steps)} steps in {time.monotonic() - t0:.0f} s")
    except EngineError as e:
        print(f"lssim: error: {e}; run the command again to resume", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lssim: interrupted; run the command again to resume", file=sys.stderr)
        return 130
    finally:
        if engine is not None:
            engine.close()
    return 0


def learn_setup(args: argparse.Namespace):
    from . import task
    from .world import RealSetup

    return RealSetup(model_dir=args.model_dir, lr=args.lr, heldout_path=str(task.HELDOUT_PATH), dtype=args.dtype,
                     trainer_device=args.trainer_device)


def learn_config(args: argparse.Namespace, seed: int):
    from lssim.loop.controller import RunConfig

    steps = args.steps if args.steps is not None else UNBOUNDED_STEPS
    return RunConfig(steps=steps, groups_per_step=args.groups_per_step, group_size=args.group_size,
                     max_tokens=args.max_tokens, seed=seed)


def check_args(args: argparse.Namespace) -> None:
    if not args.out:
        raise ValueError("--out DIR is required")
    if args.steps is None and args.budget_seconds is None:
        raise ValueError("give --budget-seconds S (training wall-clock per run) or --steps N, or both")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.eval_every < 1:
        raise ValueError("--eval-every must be >= 1: lssim learn compares held-out accuracy")
    if args.target is not None and not 0 < args.target <= 1:
        raise ValueError(f"--target is a pass@1 in (0, 1], got {args.target}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from . import task

    p.add_argument("--policies", default="baseline", help="policies, comma-separated (the baseline is always run; "
                   "policy@mode runs that policy in that mode only, e.g. baseline@async:2; default: baseline)")
    p.add_argument("--modes", default="collocated", help="execution modes, comma-separated: collocated, disaggregated, "
                   "hybrid, async or async:K (default: collocated)")
    p.add_argument("--repeats", type=int, default=1, metavar="R", help="seeds per policy and mode (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="the first seed (default: 0)")
    p.add_argument("--budget-seconds", type=float, metavar="S", help="training wall-clock per run (evaluations excluded)")
    p.add_argument("--steps", type=int, metavar="N", help="RL steps per run (at most, with --budget-seconds)")
    p.add_argument("--target", type=float, metavar="P", help="target pass@1 (default: the initial pass@1 + 0.10)")
    p.add_argument("--out", metavar="DIR", help="where the runs (DIR/<label>/<seed>) and the report go")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.add_argument("--lr", type=float, default=LEARN_LR, help=f"AdamW learning rate (default: {LEARN_LR:g}, the recipe)")
    p.add_argument("--groups-per-step", type=int, default=8, help="prompts per step (default: 8)")
    p.add_argument("--group-size", type=int, default=4, help="samples per prompt (default: 4)")
    p.add_argument("--max-tokens", type=int, default=256, help="response-token budget (default: 256)")
    p.add_argument("--model-dir", default=str(task.MODEL_DIR), metavar="DIR", help="the checkpoint every run starts from")
    p.add_argument("--dtype", default="float32", help="engine and trainer dtype (default: float32)")
    p.add_argument("--trainer-device", default="cpu", help="torch device of the trainer (default: cpu)")
    p.add_argument("--eval-every", type=int, default=10, metavar="K", help="evaluate every K steps (default: 10)")
    p.add_argument("--eval-samples", type=int, default=4, metavar="N", help="samples per held-out prompt (default: 4)")
    p.add_argument("--eval-prompts", type=int, metavar="N", help="only the first N held-out prompts (default: all 97)")


__all__ = ["run", "add_arguments", "plan_runs", "parse_mode", "run_state", "LEARN_LR"]
