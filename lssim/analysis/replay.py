"""Replay a trace under policies in the simulator, and put each against the baseline and the bound.

    from lssim.analysis.replay import SimSetup, replay, summarize
    results = replay(load_trace("traces/math7b.parquet"), ["hadb"], SimSetup())
    print(summarize(results))
"""

from __future__ import annotations

import functools
import gc
import json
import multiprocessing
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

from lssim.analysis.signal import TraceLengths, run_signal, signal_record, trace_lengths
from lssim.sim.bounds import make_lower_bound
from lssim.loop.controller import Controller, RunConfig, RunResult
from lssim.loop.core import FINISH_REASONS
from lssim.cost.catalog import HARDWARE, MODELS, SHAPES, kv_capacity_tokens
from lssim.cost.roofline import RooflineCostModel
from lssim.kernels import load_replay_kernels
from lssim.loop.modes import ModeConfig
from lssim.loop.policy import Policy, make_policy
from lssim.loop.rewards import RewardScale
from lssim.sim.trainer import SimTrainer
from lssim.sim.world import EngineConfig, SimEngine
from lssim.sim.training import AnalyticTrainCost, TrainCostModel, load_train_cost
from lssim.traces.workload import OracleLengths, Workload

if TYPE_CHECKING:  # annotations only: replay imports them where a setup names them (SimSetup.cost_model, _sim_engine)
    from lssim.cost.profiled import ProfiledCostModel
    from lssim.sim.shared_host import DriverPrice, TrainingShare


@dataclass
class SimSetup:
    """The simulated cluster: a model on some hardware, N engine instances, the training-phase model, and the
    execution mode (lssim.loop.modes): where training runs and how far the rollout may run ahead of the weights.

    The rollout runs on n_instances x tp devices. In the default mode, collocated (verl's default), training takes
    turns with it on the same devices; in the others it runs on `train_devices` devices of its own."""

    model: str = "qwen2.5-7b"  # a key of lssim.cost.MODELS
    hardware: str = "H100"  # a key of lssim.cost.HARDWARE
    tp: int = 1  # GPUs per engine instance (tensor parallel)
    n_instances: int = 8
    max_num_seqs: int = 256
    kv_capacity_tokens: int | None = None  # default: what fits on the instance's GPUs after the weights
    # A profiled cost model (JSON from `lssim profile`, or the ProfiledCostModel itself); replaces the roofline.
    profile: "str | ProfiledCostModel | None" = None
    cost: str = "roofline"  # or "operators": kernel by kernel from measured GPU kernels (lssim.cost.operators)
    # The training phase (lssim.sim.training.TrainCostModel): None prices it analytically for this model and hardware
    # (AnalyticTrainCost); a str is a training-cost JSON (a trainer profile from `python -m real_backend.profile_trainer`).
    train: TrainCostModel | str | None = None
    mode: str = "collocated"  # collocated, disaggregated, async or hybrid (lssim.loop.modes)
    train_devices: int | None = None  # devices of the trainer's own (not collocated); default: as many as the rollout's
    staleness: int = 1  # async: versions the rollout may run ahead of the weights
    async_variant: str = "roll"  # async: "roll" drops groups that would train over the bound, "areal" never drops
    elastic: bool = True  # hybrid: rollout devices join the update once the rollout ends
    # Train only groups whose rewards differ (real_backend's GRPOTrainer skips the others; verl trains them all).
    train_signal_only: bool = False
    # Instances sharing one host (lssim.sim.shared_host): while b are busy each runs host_slowdown[b-1] x slower than the
    # cost model says (measured per layout: real_backend/layout.py). None: independent instances (GPUs).
    host_slowdown: tuple[float, ...] | None = None
    # Rollout and training on one host (lssim.sim.shared_host.TrainingShare: each slowed while the other runs; modes
    # that train beside the rollout), and the driver's own seconds the engine loses (DriverPrice). None: their own
    # devices, a driver that costs the engine nothing (GPUs).
    shared_training: TrainingShare | None = None
    driver: DriverPrice | None = None
    # A policy that reads early-exit signals the trace lacks is refused; True runs it without them, and its summary
    # names what was missing (`missing_signals`).
    allow_missing_signals: bool = False

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        if self.hardware not in HARDWARE:
            raise ValueError(f"unknown hardware {self.hardware!r}; known: {', '.join(HARDWARE)}")
        if self.cost not in ("roofline", "operators"):
            raise ValueError(f"SimSetup.cost must be 'roofline' or 'operators', got {self.cost!r}")
        if self.cost == "operators":
            self._check_operators()
        if any(part is not None for part in (self.host_slowdown, self.shared_training, self.driver)):
            self._check_shared_host()
        self.train_cost()  # a missing or bad file fails here, naming itself
        self.mode_config()  # an unknown mode or a bad device split fails here

    def _check_operators(self) -> None:
        from lssim.cost.operators import KERNEL_PROFILES  # the operator model's data: only where it is asked for

        if self.hardware not in KERNEL_PROFILES:
            raise ValueError(f"SimSetup.cost='operators': no measured kernel profile for {self.hardware!r}; "
                             f"have {', '.join(KERNEL_PROFILES)}")
        if self.model not in SHAPES:
            raise ValueError(f"SimSetup.cost='operators': no DecoderShape for model {self.model!r}")

    def _check_shared_host(self) -> None:
        from lssim.sim.shared_host import DriverPrice, TrainingShare, slowdown_problem  # only a shared host's setup

        if self.host_slowdown is not None and slowdown_problem(self.host_slowdown):
            raise ValueError(f"SimSetup.{slowdown_problem(self.host_slowdown)}")
        if self.shared_training is not None and not isinstance(self.shared_training, TrainingShare):
            raise ValueError(f"SimSetup.shared_training must be a TrainingShare or None, got {self.shared_training!r}")
        if self.driver is not None and not isinstance(self.driver, DriverPrice):
            raise ValueError(f"SimSetup.driver must be a DriverPrice or None, got {self.driver!r}")

    def mode_config(self) -> ModeConfig:
        rollout = self.n_instances * self.tp
        train = rollout if self.mode == "collocated" else (self.train_devices or rollout)
        return ModeConfig(mode=self.mode, rollout_devices=rollout, train_devices=train, staleness=self.staleness,
                          variant=self.async_variant, elastic=self.elastic)

    def train_cost(self) -> TrainCostModel:
        if self.train is None:
            return AnalyticTrainCost(self.model, self.hardware)
        if isinstance(self.train, str):
            return load_train_cost(self.train)
        if not isinstance(self.train, TrainCostModel):
            raise ValueError(f"SimSetup.train must be a TrainCostModel, a JSON path or None, got {self.train!r}")
        return self.train

    def cost_model(self):
        if self.profile:  # each cost model's module imported only where the setup asks for that model
            from lssim.cost.profiled import ProfiledCostModel

            return self.profile if isinstance(self.profile, ProfiledCostModel) else ProfiledCostModel.from_json(self.profile)
        if self.cost == "operators":
            from lssim.cost.operators import OperatorCostModel

            return OperatorCostModel(MODELS[self.model], self.hardware, tp=self.tp)
        return RooflineCostModel(MODELS[self.model], HARDWARE[self.hardware], tp=self.tp)

    def engine_config(self) -> EngineConfig:
        kv = self.kv_capacity_tokens or kv_capacity_tokens(MODELS[self.model], HARDWARE[self.hardware], tp=self.tp)
        return EngineConfig(self.n_instances, self.max_num_seqs, kv)


def _sim_engine(workload: Workload, setup: SimSetup, batch_route: bool) -> SimEngine:
    """The simulated engine `setup` describes: on a shared host where it says so (instances, trainer or driver)."""
    if setup.host_slowdown is None and setup.shared_training is None and setup.driver is None:
        return SimEngine(workload, setup.cost_model(), setup.engine_config(), batch_route=batch_route,
                         allow_missing_signals=setup.allow_missing_signals)
    from lssim.sim.shared_host import SharedHostEngine

    return SharedHostEngine(workload, setup.cost_model(), setup.engine_config(), slowdown=setup.host_slowdown or (1.0,),
                            training=setup.shared_training, driver=setup.driver,
                            allow_missing_signals=setup.allow_missing_signals)


def _trace_config(workload: Workload, steps: int | None, seed: int) -> RunConfig:
    """Every policy trains on the same number of groups as the trace's steps recorded (those the recorded run left
    out of training count as used); policies that batch differently take more or fewer steps to get there (up to
    twice the trace's). The baseline proposes each recorded batch whole: it replays the trace."""
    n_steps = steps or len(workload.steps)
    return RunConfig(steps=2 * n_steps, groups_per_step=workload.groups_per_step, group_size=workload.group_size,
                     max_tokens=workload.max_tokens, total_groups=workload.groups_in(n_steps), seed=seed,
                     reward_scale=workload.reward_scale)


def simulate(workload: Workload, policy: Policy | str, setup: SimSetup, steps: int | None = None, seed: int = 0,
             progress: bool = False, *, config: RunConfig | None = None, prompts=None, batch_route: bool = True,
             response_columns: Sequence[str] | None = None) -> RunResult:
    """Run one policy over the trace's workload: by default the same number of groups the trace trained on.

    `config` replaces that run shape (a validation replays a real run with the real run's own config);
    `prompts` replaces the data loader (the Workload's recorded batches) with another PromptSource, e.g. the
    real run's own, so that a policy drawing more or other prompts than the trace's steps draws the same
    ones as it did for real; the Workload still answers every response. `batch_route=False` keeps every rollout
    on the event engine (the batch route, lssim.sim.fastsim, gives the same results; the tests compare them).
    `response_columns` keeps only those columns of the responses frame (`run_summary` needs SUMMARY_RESPONSE_COLUMNS)."""
    policy = make_policy(policy) if isinstance(policy, str) else policy
    engine_cfg, mode_cfg = setup.engine_config(), setup.mode_config()
    engine = _sim_engine(workload, setup, batch_route)
    trainer = SimTrainer(engine, setup.train_cost(), n_devices=mode_cfg.train_devices, collocated=mode_cfg.collocated,
                         signal_only=setup.train_signal_only)
    config = config or _trace_config(workload, steps, seed)
    oracle = OracleLengths(workload)
    controller = Controller(engine, trainer, prompts if prompts is not None else workload, policy, config, oracle_length=oracle,
                            mode=mode_cfg.build())
    # The bound is priced with the engine's cost model as the policy set it up (speculation makes small batches
    # cheaper: a bound from the plain model would not hold), so it is made once the controller has done that.
    controller.set_lower_bound(make_lower_bound(engine.cost, engine_cfg.n_instances, engine_cfg.max_num_seqs))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=config.total_groups, desc=policy.name, unit="group", leave=False)
        controller.add_observer(lambda row: bar.update(row["groups_trained"]))  # the progress bar observes the steps
    # The run allocates millions of small objects and frees none of them in cycles; the cyclic collector
    # would rescan them all again and again (a million-response run was 4x slower with it on).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        result = controller.run(response_columns=response_columns)
    finally:
        if gc_was_enabled:
            gc.enable()
        if bar is not None:
            bar.close()
    if prompts is None and workload.prompt_names is not None and "prompt_id" in result.responses:  # the trace's text
        # ids, as written (they ran as int codes)
        result.responses["prompt_id"] = workload.prompt_ids_as_written(result.responses["prompt_id"].to_numpy())
    result.meta.update(mode={**asdict(mode_cfg), "label": mode_cfg.label()}, reward_scale=(config.reward_scale.low, config.reward_scale.high), setup=asdict(setup),
                       cost=engine.cost.describe(), train=trainer.model.describe(), engine=asdict(engine_cfg),
                       sources=dict(engine.sources),
                       preemptions=engine.preemptions, speculated_tokens=engine.speculated_tokens)
    return result


def replay(trace: pd.DataFrame, policies: list[str], setup: SimSetup | None = None, steps: int | None = None,
           seed: int = 0, progress: bool = False, references: bool = True, workers: int = 1) -> dict[str, RunResult]:
    """Each policy, plus `baseline` and `oracle` as references, over the same trace and cluster
    (`references=False`: only the policies named; `summarize` then has no speedup unless baseline is one).

    One Workload index serves every run. `workers > 1` runs them side by side in forked processes (where the
    platform forks), each inheriting the index and the policies instead of having them sent; the results are the
    same as one after the other (each run is deterministic and owns its policy object), only sooner (and without
    progress bars)."""
    return _each_run(trace, policies, setup, steps, seed, progress, references, workers, _whole_run)


def replay_summary(trace: pd.DataFrame, policies: list[str], setup: SimSetup | None = None, steps: int | None = None,
                   seed: int = 0, progress: bool = False, references: bool = True, workers: int = 1) -> pd.DataFrame:
    """`summarize(replay(...), trace, steps)`, the same table, without keeping any run's frames: each run is summarized
    where it ran and let go (a forked worker sends back one row, not a million responses)."""
    keep = functools.partial(run_summary, lengths=trace_lengths(trace, steps))
    return summary_table(_each_run(trace, policies, setup, steps, seed, progress, references, workers, keep))


def _whole_run(res: RunResult) -> RunResult:
    return res


def _each_run(trace, policies, setup, steps, seed, progress, references, workers, keep) -> dict:
    """{name: keep(simulate(...))} over the policies and references, one after the other or forked."""
    setup = setup or SimSetup()
    if references:
        names = ["baseline"] + [p for p in policies if p != "baseline" and p != "oracle"] + ["oracle"]
    else:
        names = list(dict.fromkeys(policies))
        if not names:
            raise ValueError("replay without references: name at least one policy")
    workload = Workload(trace, seed=seed)
    # Build every policy before the first run, so a bad spec fails before minutes of simulation.
    built = {name: make_policy(name) for name in names}
    columns = None if keep is _whole_run else SUMMARY_RESPONSE_COLUMNS  # a summary reads a few response columns
    if workers > 1 and len(names) > 1 and "fork" in multiprocessing.get_all_start_methods():
        return _forked(workload, built, setup, steps, seed, min(workers, len(names)), keep, columns)
    return {name: keep(simulate(workload, built[name], setup, steps, seed, progress, response_columns=columns))
            for name in names}


_INHERITED: tuple | None = None  # what forked replay workers run: set just before they fork, never pickled


def _run_inherited(name: str):
    workload, built, setup, steps, seed, keep, columns = _INHERITED
    return keep(simulate(workload, built[name], setup, steps, seed, response_columns=columns))


def _forked(workload: Workload, built: dict, setup: SimSetup, steps: int | None, seed: int, workers: int, keep,
            columns: Sequence[str] | None) -> dict:
    """The runs on `workers` forked processes, the baseline started last (it is usually the cheapest: two workers
    and three runs then end closest together); what each sends back is `keep` of its result, in the order named."""
    global _INHERITED
    from concurrent.futures import ProcessPoolExecutor  # its process machinery: only a replay that forks imports it

    load_replay_kernels()  # once here rather than once in each worker
    _INHERITED = (workload, built, setup, steps, seed, keep, columns)
    gc.freeze()  # what exists now is shared with the workers: the collector leaves it be, so its pages stay shared
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {name: pool.submit(_run_inherited, name) for name in sorted(built, key=lambda n: n == "baseline")}
            return {name: futures[name].result() for name in built}
    finally:
        _INHERITED = None
        gc.unfreeze()


SUMMARY_COLUMNS = ["rollout_seconds", "speedup", "tokens_per_second", "lower_bound_efficiency", "long_tail_ratio",
                   "busy_fraction", "truncated_fraction", "policy_stopped_fraction", "tokens_saved_fraction",
                   "stopped_correct_fraction", "off_policy_token_fraction", "effective_group_fraction",
                   "effective_groups_per_step", "exact_fraction", "mean_reward", "steps", "groups_trained", "responses"]
# tokens_saved_fraction: tokens policy stops saved (natural_len - response_len of the stopped responses) over
#   the tokens generated plus those saved. stopped_correct_fraction: stopped responses that would have ended
#   correct (natural_reward in the upper half of the run's reward range, lssim.loop.rewards: 1 of 0/1), the stops'
#   false-positive rate; NaN when nothing was stopped or nobody can tell.
# off_policy_token_fraction: of the tokens trained on, those generated under weights older than the step that
#   trained them (lssim.loop.core.off_policy_tokens).


def summarize(results: dict[str, RunResult], trace: pd.DataFrame | None = None, steps: int | None = None) -> pd.DataFrame:
    """One row per policy: totals over the run, and the speedup in rollout time per trained group over baseline.
    `trace` (and `steps`, as replayed): the trace the runs replayed, which the length biases compare with
    (lssim.analysis.signal; without it the table has no length_bias columns)."""
    lengths = None if trace is None else trace_lengths(trace, steps)
    return summary_table({name: run_summary(res, lengths) for name, res in results.items()})


def summary_table(rows: dict[str, dict]) -> pd.DataFrame:
    """The `summarize` table from each run's `run_summary`: the speedups, and the trained tokens' ratio, are against
    the baseline's row; `signal` is each row's lssim.analysis.signal.signal_record, as JSON text."""
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "policy"
    base = table.loc["baseline"] if "baseline" in table.index else None
    if base is not None:
        table.insert(1, "speedup", base["step_seconds_per_group"] / table["step_seconds_per_group"])
        table.insert(2, "rollout_speedup", base["rollout_seconds_per_group"] / table["rollout_seconds_per_group"])
        table["trained_tokens_vs_baseline"] = table["trained_response_tokens"] / base["trained_response_tokens"]
    baseline_row = None if base is None else rows["baseline"]
    table["signal"] = [json.dumps(signal_record(rows[name], baseline_row)) for name in table.index]
    return table


# The response columns run_summary reads: a run that is only summarized builds just these (simulate's response_columns).
SUMMARY_RESPONSE_COLUMNS = ("trained", "finish_reason", "natural_len", "response_len", "natural_reward",
                            "off_policy_tokens", "exact", "reward", "prompt_id")


def run_summary(res: RunResult, lengths: TraceLengths | None = None) -> dict:
    """One run's row of `summarize` (all but the speedups, which need the baseline's); `lengths`: the replayed
    trace's lssim.analysis.signal.trace_lengths, for the length biases (None: no such fields)."""
    s, r = res.steps, res.responses
    rollout = float(s["rollout_seconds"].sum())
    groups = int(s["groups_trained"].sum())
    # Plain arrays, each read once: masking the frame makes a new one per use (a summary took 30 ms at 51,200 rows).
    trained = r["trained"].to_numpy(bool)
    reasons = finish_reason_masks(r["finish_reason"])
    stopped = reasons["policy_stop"]
    length, natural_len = r["response_len"].to_numpy(), r["natural_len"].to_numpy()
    # What stops saved and cost, where the world knows what the response would have been (the simulator).
    known = stopped & (natural_len >= 0)
    scale = RewardScale(*res.meta.get("reward_scale", (0.0, 1.0)))
    saved = float(np.clip(natural_len[known] - length[known], 0, None).sum())
    trained_length = int(length[trained].sum())
    return {
        "rollout_seconds": rollout,
        "rollout_seconds_per_group": rollout / groups if groups else float("nan"),
        "step_seconds": float(s["step_seconds"].sum()),
        "tokens_per_second": float(s["tokens"].sum()) / rollout if rollout > 0 else float("nan"),
        "lower_bound_seconds": float(s["lower_bound_seconds"].sum()),
        "lower_bound_efficiency": float(s["lower_bound_seconds"].sum()) / rollout if rollout > 0 else float("nan"),
        "long_tail_ratio": float(s["long_tail_ratio"].median()),
        "busy_fraction": float(np.average(s["busy_fraction"], weights=s["rollout_seconds"])) if rollout > 0 else float("nan"),
        "mean_running": float(np.average(s["mean_running"], weights=s["rollout_seconds"])) if rollout > 0 else float("nan"),
        "truncated_fraction": float(reasons["length"].mean()),
        "policy_stopped_fraction": float(stopped.mean()),
        "tokens_saved_fraction": saved / (float(length.sum()) + saved) if saved > 0 else 0.0,
        "stopped_correct_fraction": float(scale.correct(r["natural_reward"].to_numpy(float)[known]).mean()) if known.any() else float("nan"),
        "off_policy_token_fraction": float(r["off_policy_tokens"].to_numpy()[trained].sum() / max(1, trained_length)),
        "effective_group_fraction": float(s["effective_groups"].sum() / groups) if groups else float("nan"),
        "effective_groups_per_step": float(s["effective_groups"].mean()),
        "exact_fraction": float(r["exact"].to_numpy(bool).mean()),
        "mean_reward": _mean_skipping_nan(r["reward"].to_numpy(float)[trained]),
        "steps": len(s),
        "groups_trained": groups,
        "responses": len(r),
        "missing_signals": ", ".join(res.meta.get("missing_signals", ())),  # run without them (allow_missing_signals)
        "ran_blind": res.meta.get("ran_blind") or "",  # what the policy's rule could not see (PolicyHooks.ran_blind)
        **end_to_end(res),
        **run_signal(res, lengths, reasons),
    }


def _mean_skipping_nan(values: np.ndarray) -> float:
    """pandas' Series.mean to the last bit (NaN skipped: summed as 0, not counted); NaN when nothing is left."""
    missing = np.isnan(values)
    count = len(values) - int(missing.sum())
    return float(np.where(missing, 0.0, values).sum() / count) if count else float("nan")


def finish_reason_masks(reasons: pd.Series) -> dict[str, np.ndarray]:
    """{reason: bool mask} for each of FINISH_REASONS, from one pass of Arrow over the column (its strings are Arrow's
    already: turning a million of them into Python objects, or comparing once per reason, costs several times more)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    codes = pc.index_in(pa.array(reasons), value_set=pa.array(FINISH_REASONS)).fill_null(-1).to_numpy()
    return {reason: codes == i for i, reason in enumerate(FINISH_REASONS)}


def end_to_end(res: RunResult) -> dict:
    """A run's whole-step figures under its execution mode: wall time, phases, idle devices, staleness, throughput.
    `step_seconds` is the run's wall time (each step's runs from the end of the last one's training)."""
    s, mode = res.steps, res.meta.get("mode", {})
    wall = float(s["step_seconds"].sum())
    groups = int(s["groups_trained"].sum())
    rollout_devices, train_devices = mode.get("rollout_devices", 1), mode.get("train_devices", 1)
    collocated = mode.get("mode", "collocated") == "collocated"
    devices = rollout_devices if collocated else rollout_devices + train_devices
    rollout_busy, train_busy = float(s["rollout_busy_device_seconds"].sum()), float(s["train_busy_device_seconds"].sum())
    histogram: dict[int, int] = {}
    for text in s["staleness_histogram"]:
        for lag, tokens in json.loads(text).items():
            histogram[int(lag)] = histogram.get(int(lag), 0) + tokens
    trained_tokens = float(s["trained_tokens"].sum())
    return {
        "mode": mode.get("label", "collocated"),
        "step_seconds_per_group": wall / groups if groups else float("nan"),
        "train_seconds": float(s["train_seconds"].sum()),
        **{f"{phase}_seconds": float(s[f"{phase}_seconds"].sum()) for phase in ("logprob", "reference", "update", "sync", "switch")},
        "wait_seconds": float(s["wait_seconds"].sum()),
        "devices": devices,
        "idle_device_seconds": max(0.0, devices * wall - rollout_busy - train_busy),
        "rollout_idle_device_seconds": float("nan") if collocated else max(0.0, rollout_devices * wall - rollout_busy),
        "train_idle_device_seconds": float("nan") if collocated else max(0.0, train_devices * wall - train_busy),
        "max_staleness": int(s["max_staleness"].max()) if len(s) else 0,
        "staleness_histogram": json.dumps({str(k): histogram[k] for k in sorted(histogram)}),  # versions behind: tokens
        "stale_token_fraction": sum(v for k, v in histogram.items() if k > 0) / max(1, sum(histogram.values())),
        "dropped_stale": int(s["dropped_stale"].sum()),
        "trained_tokens_per_second": trained_tokens / wall if wall > 0 else float("nan"),
        **pruning_summary(s),
    }


def pruning_summary(s: pd.DataFrame) -> dict:
    """What training-side policies (Policy.train_mask, Policy.bridge) did over the run, from the trainer's step
    metrics: the share of loss tokens taken out and the share of forward tokens still computed (both of the batch
    the trainer was given, bridged copies included), the train seconds that saved (the simulator prices both
    batches; NaN on a real run, which trains only one: paper/experiments/measure_pruning.py measures the saving), and
    the share of trained response tokens that value bridging trained before their response ended (with bridging the
    other three are NaN). Empty for a run without such a policy."""
    if "trainer_loss_tokens_before" not in s:
        return {}
    total = {k: float(s[f"trainer_{k}"].sum()) for k in ("loss_tokens_before", "loss_tokens_after", "forward_tokens_before",
                                                         "forward_tokens_after")}
    saved = s["trainer_pruning_saved_seconds"].sum() if "trainer_pruning_saved_seconds" in s else float("nan")
    out = {"pruned_loss_fraction": 1 - total["loss_tokens_after"] / total["loss_tokens_before"] if total["loss_tokens_before"] else 0.0,
           "computed_token_fraction": total["forward_tokens_after"] / total["forward_tokens_before"] if total["forward_tokens_before"] else 1.0,
           "train_seconds_saved": float(saved)}
    if "trainer_bridged_tokens" in s:
        # Bridging hands the trainer copies of open groups whose ended members only give the baseline: measured
        # against that batch, "pruned" and "saved" would mean nothing. Compare the run with one without bridging.
        bridged = float(s["trainer_bridged_tokens"].sum())
        out = dict.fromkeys(out, float("nan"))
        out.update(bridged_tokens=int(bridged),
                   bridged_token_fraction=bridged / total["loss_tokens_after"] if total["loss_tokens_after"] else 0.0)
    return out
