"""`lssim real`: run the RL loop on vLLM under a policy and record it (the handler behind lssim.cli).

Every input is checked before the engine starts (model folder, tokenizer, prompts file, policy spec,
run shape, output folder): bad input is `lssim: error: ...`, exit status 2, nothing written. Once
running, each finished step is on disk (trace.parquet, steps.parquet, responses.parquet, meta.json);
an engine that dies mid-step is `lssim: error: ...` with exit status 1, and the files keep every step
that finished (so does a run killed with SIGKILL: every file is renamed into place whole).

After every step the folder also holds checkpoint.pt (real_backend/checkpoint.py): `lssim real --resume DIR`
starts a new engine, restores the run's state from it and goes on from the next step, writing into DIR.
With --resume the run's shape (policy, groups, samples, budget, seed, model, trainer settings) is the
checkpoint's: an option given with another value than the recorded one and than its default is an error;
`--steps N` is the run's total (default: the recorded run's), so re-running a killed command with
`--resume DIR` added finishes it.

`--mode {collocated,disaggregated,async,hybrid}` (lssim.loop.modes; with `--staleness K` and `--async-variant` for
async): outside collocated the GRPO update runs on a thread beside the rollout (real_backend/train_job.py; hybrid
streams each group into it as the group ends) and the mode pushes its weights into the engine. Every mode is
checkpointed and resumed (real_backend/checkpoint.py says how the updates still running and an async run's
responses in flight come back); a resumed run keeps its recorded mode. A step's line is printed once its train
time is known: at once in collocated, once its update has ended in the others (at the latest at the run's end).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

EXIT_ENGINE = 1
EXIT_INTERRUPTED = 130


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # before vLLM is imported: only its errors reach the terminal
    from lssim.loop.controller import RunConfig

    from .world import out_dir_problem, prepare

    if args.resume:
        config, setup, policy_arg, ckpt = resumed_run(args)
        mode, out = _recorded_mode(args, ckpt), args.resume
    else:
        config = RunConfig(steps=5 if args.steps is None else args.steps, groups_per_step=args.groups_per_step,
                           group_size=args.group_size, max_tokens=args.max_tokens, seed=args.seed)
        setup = _setup(args)
        if args.group_size < 2:
            raise ValueError("--group-size must be >= 2 (GRPO normalizes rewards within a group)")
        if not args.out:
            raise ValueError("--out DIR is required (or --resume DIR, to go on with the run recorded there)")
        problem = out_dir_problem(args.out, args.overwrite)
        if problem:
            raise ValueError(problem)
        policy_arg, ckpt, out, mode = args.policy, None, args.out, _mode(args)
    prompts, policy = prepare(setup, policy_arg, config)

    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.quiet else (lambda *a: print(*a, flush=True))
    if ckpt is not None:
        say(f"lssim real: resuming {out} after step {ckpt.step} ({len(ckpt.carried)} carried responses)")
    say(f"lssim real: mode {mode.label()}, policy {policy.name}, {config.steps} steps x {config.groups_per_step} groups x {config.group_size} samples, "
        f"max_tokens {config.max_tokens}, {len(prompts.pool)} prompts, model {setup.model_dir}")
    say("starting the vLLM engine ...")
    from .engine import EngineError
    from .world import run_real, start_engine

    t0 = time.monotonic()
    lines = StepLines()
    try:
        engine = start_engine(setup, prompts, seed=args.seed)
    except Exception as e:
        print(f"lssim: error: the vLLM engine did not start: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ENGINE
    say(f"engine up in {time.monotonic() - t0:.0f} s")
    try:
        result = run_real(setup, policy, config, out, engine=engine, prompts=prompts, mode=mode, resume=ckpt,
                          on_step=lines, evaluation=eval_settings(args, setup),
                          say=lambda text: print(text, flush=True), budget_seconds=args.budget_seconds,
                          meta={"command": " ".join(sys.argv), "policy_spec": _policy_spec(policy_arg, ckpt)})
    except EngineError as e:
        print(f"lssim: error: {e}; {out} keeps every step that finished (resume with --resume {out})", file=sys.stderr)
        return EXIT_ENGINE
    except KeyboardInterrupt:
        print(f"lssim: interrupted; {out} keeps every step that finished (resume with --resume {out})", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        engine.close()
        lines.flush()  # a run that failed: its last lines as far as they are known
    _say_done(say, result, policy, out)
    return 0


def _say_done(say, result, policy, out) -> None:
    """The run's last lines: its totals, and what the policy's rule could not see (PolicyHooks.ran_blind)."""
    s = result.steps
    say(f"{len(s)} steps: mean reward {s['mean_reward'].mean():.3f}, rollout {s['rollout_seconds'].sum():.1f} s, "
        f"train {s['train_seconds'].sum():.1f} s, {int(s['tokens'].sum()):,} tokens; written to {out}/")
    if result.meta.get("ran_blind"):
        say(f"note: {policy.name} ran blind: {result.meta['ran_blind']}")


def _mode(args: argparse.Namespace):
    """The run's execution mode (lssim.loop.modes) from --mode/--staleness/--async-variant; one rollout engine and one
    trainer here (--instances engines roll out; the trainer is one device)."""
    from lssim.loop.modes import ModeConfig

    if args.mode != "async" and (args.staleness != 1 or args.async_variant != "roll"):
        raise ValueError("--staleness and --async-variant are for --mode async")
    train = None if args.mode == "collocated" else 1
    return ModeConfig(mode=args.mode, rollout_devices=args.instances, train_devices=train, staleness=args.staleness,
                      variant=args.async_variant)


def _recorded_mode(args: argparse.Namespace, ckpt):
    """A resumed run's mode: the one it was recorded with (--mode, --staleness, --async-variant may only repeat it)."""
    from lssim.loop.modes import ModeConfig

    recorded = ckpt.run.get("mode") or {"mode": "collocated", "rollout_devices": ckpt.run["setup"]["n_instances"]}
    defaults = _defaults()
    for option, key in (("mode", "mode"), ("staleness", "staleness"), ("async_variant", "variant")):
        given = getattr(args, option)
        if given != defaults[option] and given != recorded.get(key, defaults[option]):
            raise ValueError(f"--{option.replace('_', '-')} {given}: the run in {args.resume} was recorded with "
                             f"{recorded.get(key)!r}; a resumed run keeps its mode (leave the option out)")
    return ModeConfig(**recorded)


class StepLines:
    """The step lines of `lssim real`, each printed once its train time is known: a step whose update runs beside the
    rollout (modes other than collocated) gets its measured times when the update ends, so its line waits for that
    (train_job.fill_step_rows fills the live row in); lines keep step order; `flush` prints what is left. `say`: where
    a line goes (default: stdout)."""

    def __init__(self, say: Callable[[str], None] | None = None):
        self.waiting: list[dict] = []
        self.say = say or (lambda line: print(line, flush=True))

    def __call__(self, row: dict) -> None:
        self.waiting.append(row)
        while self.waiting and self.waiting[0]["train_seconds"] == self.waiting[0]["train_seconds"]:  # not NaN
            self._print(self.waiting.pop(0))

    def flush(self) -> None:
        for row in self.waiting:
            self._print(row)
        self.waiting = []

    def _print(self, row: dict) -> None:
        from lssim.analysis.tables import format_step

        self.say(format_step(row))


def _policy_spec(policy_arg, ckpt) -> str | None:
    """The policy as the command spelled it (a resumed run's: as recorded)."""
    return policy_arg if isinstance(policy_arg, str) else (ckpt.run.get("policy_spec") if ckpt else None)


def eval_settings(args: argparse.Namespace, setup=None):
    """The run's held-out evaluations (real_backend.evaluate) from --eval-every/--eval-samples/--eval-prompts; None
    where `setup` holds nothing out (--no-heldout, or a run recorded before held-out prompts)."""
    from .evaluate import EvalSettings

    settings = EvalSettings(every=args.eval_every, samples=args.eval_samples, prompts=args.eval_prompts)
    settings.check()
    if args.budget_seconds is not None and not args.budget_seconds > 0:
        raise ValueError(f"--budget-seconds must be > 0, got {args.budget_seconds}")
    return None if setup is not None and setup.heldout_path is None else settings


def _setup(args: argparse.Namespace):
    from .world import RealSetup

    return RealSetup(model_dir=args.model_dir, prompts_path=args.prompts, n_prompts=args.n_prompts, dtype=args.dtype,
                     trainer_device=args.trainer_device, max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib,
                     gpu_memory_utilization=args.gpu_memory_utilization, lr=args.lr, mini_batches=args.mini_batches,
                     clip=args.clip, mask_resumed=args.mask_resumed, exact_entropy=args.exact_entropy, profile=args.profile,
                     n_instances=args.instances, trainer_cpus=_cpus(args.trainer_cpus), trainer_process=args.trainer_process,
                     heldout_path=None if args.no_heldout else args.heldout, temperature=args.temperature)


def _cpus(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--trainer-cpus {text!r}: give CPU numbers separated by commas, e.g. 0 or 0,1") from None


# options that shape the run: with --resume the checkpoint's values hold (argument name -> its name in the record)
_SHAPE = {"policy": ("policy_spec", None), "groups_per_step": ("config", "groups_per_step"),
          "group_size": ("config", "group_size"), "max_tokens": ("config", "max_tokens"), "seed": ("config", "seed"),
          "model_dir": ("setup", "model_dir"), "prompts": ("setup", "prompts_path"), "n_prompts": ("setup", "n_prompts"),
          "lr": ("setup", "lr"), "mini_batches": ("setup", "mini_batches"), "clip": ("setup", "clip"),
          "mask_resumed": ("setup", "mask_resumed"), "dtype": ("setup", "dtype"), "instances": ("setup", "n_instances"),
          "heldout": ("setup", "heldout_path"), "temperature": ("setup", "temperature")}


def resumed_run(args: argparse.Namespace):
    """The run recorded in --resume DIR: (config with the new total of steps, setup, its policy object, checkpoint)."""
    from lssim.loop.controller import RunConfig
    from lssim.loop.core import Speculation
    from lssim.loop.rewards import RewardScale

    from .checkpoint import load_checkpoint
    from .world import RealSetup

    if args.out and args.out != args.resume:
        raise ValueError(f"--resume {args.resume} writes into that folder; leave --out out (got --out {args.out})")
    ckpt = load_checkpoint(args.resume)
    run = ckpt.run
    defaults = _defaults()
    for name, (part, key) in _SHAPE.items():
        given, recorded = getattr(args, name), run[part] if key is None else run[part][key]
        if given != defaults[name] and given != recorded:
            raise ValueError(f"--{name.replace('_', '-')} {given}: the run in {args.resume} was recorded with {recorded!r}; "
                             f"a resumed run keeps its shape (leave the option out)")
    c = dict(run["config"])
    c["reward_scale"] = RewardScale(**c["reward_scale"])
    if c["total_groups"] == c["steps"] * c["groups_per_step"]:
        c["total_groups"] = None  # the default: follows the new number of steps
    c["steps"] = c["steps"] if args.steps is None else args.steps
    if c["steps"] <= ckpt.step + 1:
        raise ValueError(f"--steps {c['steps']}: the run in {args.resume} has finished {ckpt.step + 1} steps already; "
                         f"--steps is the run's total, ask for more")
    su = dict(run["setup"])
    su.setdefault("heldout_path", None)  # runs recorded before held-out prompts held none out
    su["speculation"] = Speculation(**su["speculation"]) if su.get("speculation") else None
    su["ngram_lookup"] = tuple(su["ngram_lookup"])
    return RunConfig(**c), RealSetup(**su), ckpt.policy, ckpt


def _defaults() -> dict:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return vars(p.parse_args([]))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from . import task

    p.add_argument("--policy", default="baseline", metavar="SPEC",
                   help="policy: a module of policies/, composed with +, parameters as name(key=value) (default: baseline)")
    p.add_argument("--steps", type=int, default=None,
                   help="RL steps of the run in all (default: 5; with --resume, the recorded run's)")
    p.add_argument("--groups-per-step", type=int, default=8, help="prompts per step (default: 8)")
    p.add_argument("--group-size", type=int, default=4, help="samples per prompt (default: 4)")
    p.add_argument("--max-tokens", type=int, default=256, help="response-token budget (default: 256)")
    p.add_argument("--model-dir", default=str(task.MODEL_DIR), metavar="DIR",
                   help="local Hugging Face model folder (default: the reference model)")
    p.add_argument("--prompts", default=str(task.PROMPTS_PATH), metavar="JSONL", help="the task's prompts (default: the task's)")
    p.add_argument("--n-prompts", type=int, metavar="N", help="use only the first N prompts (a smaller pool)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=2e-5, help="AdamW learning rate (default: 2e-5)")
    p.add_argument("--mini-batches", type=int, default=1, help="optimizer steps per RL step (default: 1)")
    p.add_argument("--clip", type=float, default=0.2, help="PPO ratio clip (default: 0.2)")
    p.add_argument("--mask-resumed", action="store_true", help="leave tokens generated before a resume out of the loss")
    p.add_argument("--exact-entropy", action="store_true",
                   help="record each token's exact entropy (vLLM returns the whole vocabulary's logprobs; slower); "
                        "default: estimated by -logprob of the sampled token")
    _host_arguments(p)
    _run_arguments(p, task)


def _host_arguments(p: argparse.ArgumentParser) -> None:
    """The engine's and the trainer's options."""
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature (default: 1.0; 0: greedy, which a speculating policy needs on the CPU build)")
    p.add_argument("--dtype", default="float32", help="engine and trainer dtype: float32, bfloat16, float16 (default: float32)")
    p.add_argument("--trainer-device", default="cpu", help="torch device of the trainer: cpu or cuda (default: cpu)")
    p.add_argument("--instances", type=int, default=1, metavar="N",
                   help="engine instances: vLLM data parallelism, one engine core (GPU) each; the policy's place() "
                        "picks a request's instance, else the least loaded (default: 1)")
    p.add_argument("--max-model-len", type=int, default=1024, help="vLLM's context limit (default: 1024)")
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU engine: KV-cache size in GiB (default: 1)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="GPU engine: share of GPU memory (default: 0.5)")
    p.add_argument("--profile", metavar="JSON", help="a profiled cost model of this engine (`lssim profile`, e.g. "
                   "real_backend/data/profile_cpu.json): each step then gets its lower bound and bound efficiency")
    p.add_argument("--trainer-cpus", metavar="I,J", help="pin the trainer's thread to these CPUs (modes other than collocated)")
    p.add_argument("--trainer-process", action="store_true",
                   help="run the trainer's forward and backward passes in a process of their own, off the driver's "
                        "interpreter lock (CPU trainer; real_backend/train_compute.py)")


def _run_arguments(p: argparse.ArgumentParser, task) -> None:
    """Where the run goes, how it goes on, its mode, evaluation and budget."""
    p.add_argument("--out", metavar="DIR", help="folder for trace.parquet, steps.parquet, responses.parquet, meta.json and "
                   "checkpoint.pt (required unless --resume)")
    p.add_argument("--resume", metavar="DIR", help="go on with the run recorded in DIR from its last checkpoint (a new "
                   "engine; the weights, optimizer, step, policy, carried responses and data cursor restored)")
    p.add_argument("--mode", choices=["collocated", "disaggregated", "async", "hybrid"], default="collocated",
                   help="execution mode (lssim.loop.modes): collocated trains between rollouts; the others train on a thread "
                        "beside the rollout, disaggregated one step off-policy, async with --staleness K, hybrid on-policy "
                        "(default: collocated)")
    p.add_argument("--staleness", type=int, default=1, metavar="K", help="async: versions the rollout may run ahead (default 1)")
    p.add_argument("--async-variant", choices=["roll", "areal"], default="roll",
                   help="async: roll drops groups that would train over the bound (ROLL); areal never drops (AReaL); both "
                        "interrupt generation when weights arrive and resume it under them (default: roll)")
    p.add_argument("--heldout", default=str(task.HELDOUT_PATH), metavar="JSON",
                   help="held-out prompt ids (python -m real_backend.task --write-heldout): never trained on, evaluated "
                        "(default: real_backend/data/heldout.json, the task's)")
    p.add_argument("--no-heldout", action="store_true", help="hold no prompt out: train on every prompt (no evaluation)")
    p.add_argument("--eval-every", type=int, default=10, metavar="K",
                   help="evaluate the held-out prompts on the run's engine every K steps, before the first and after "
                        "the last (eval.parquet; 0: never) (default: 10)")
    p.add_argument("--eval-samples", type=int, default=4, metavar="N",
                   help="samples per held-out prompt at temperature 1.0 for pass@1 (default: 4); greedy besides")
    p.add_argument("--eval-prompts", type=int, metavar="N", help="evaluate only the first N held-out prompts (default: all)")
    p.add_argument("--budget-seconds", type=float, metavar="S",
                   help="start no step once the steps took S seconds in all (evaluations not counted)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--quiet", action="store_true", help="only the per-step lines on stdout")
