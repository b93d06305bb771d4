"""A recorded run's simulated twin, for `lssim validate`: the run read back with the responses it left unfinished
(`load_recorded`), the twin's world (`sim_setup`: its instances, the profiled cost model or the layout measured for
its engine, scaled by the run's probed speed level) and a fresh copy of its data loader (`run_prompts`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from .layout import layout_profile, scaled_model, twin_cost
from .speed_probe import speed_factor



def sim_setup(run, profile: str, probe: bool = True, driver=None):
    """The simulated twin of the run's engine: its instances and limits, the profiled cost model of one instance
    (`profile`), and for several instances sharing the host, that profile's measured layout (real_backend.layout:
    how much slower an instance runs while 1, 2, ... are busy, for the CPUs the run's instances were bound to,
    priced on a shared clock by lssim.sim.shared_host); for an engine started with speculation, the layout measured on
    such an engine (drafting off); ValueError naming the command that measures it when there is none.
    With `probe`, the cost model is scaled by the run's speed level (speed_level): the machine's speed during the
    run over its speed while that cost model was measured, both from the speed probe. `driver` (DriverPrice, from
    `world_driver`): the driver's seconds beyond the profile's cells, charged to the instances (lssim.sim.shared_host)."""
    from lssim.analysis.replay import SimSetup

    real = run.meta.get("setup", {})
    max_num_seqs, max_model_len = int(real.get("max_num_seqs", 256)), int(real.get("max_model_len", 1024))
    n_instances = _instances(run)
    model, slowdown, _ = run_twin_cost(run, profile)
    factor = speed_level(run, profile) if probe else None
    if factor is not None:
        from lssim.cost import ProfiledCostModel

        base = ProfiledCostModel.from_json(model)
        model = scaled_model(base, factor, name=f"{base.name} x {factor:.3f} (speed probe)")
    # The CPU engine's KV cache holds far more than max_num_seqs full contexts of the tiny model: never preempts.
    return SimSetup(model="tiny-ref", n_instances=n_instances, max_num_seqs=max_num_seqs,
                    kv_capacity_tokens=max_num_seqs * max_model_len, profile=model, host_slowdown=slowdown,
                    driver=driver)


def world_driver(runs: dict[str, list], profile: str) -> tuple:
    """The driver's price for one world's twins (`runs`: policy -> its repeats): (DriverPrice or None, its row of
    driver.csv). Fitted on the world's baseline runs (the reference: their steps.parquet driver_seconds) against the
    profile's cells (their own driver_seconds; lssim.analysis.fidelity.driver.fit_driver_price); the row: priced, why
    not (empty when priced), the price per request / token / finish, the steps fitted and the excess's median share
    of the runs' driver seconds. None where the baseline or the cells did not record the driver's seconds, and for an
    engine started with speculation: the priced twin runs on lssim.sim.shared_host's engine, which does not model
    speculation (the world's policies draft), so that world's twins run without it, the price fitted and reported."""
    from lssim.analysis.fidelity.driver import fit_against_cells

    from .profile import measurement_files

    reference = [run.steps for run in runs.get("baseline", [])]
    price, fit = (fit_against_cells(reference, measurement_files(profile)["batches"]) if reference
                  else (None, "the world has no baseline runs (the reference)"))
    row = {"driver_priced": price is not None, "driver_why": "" if price is not None else fit}
    if price is not None:
        row.update(driver_per_request=price.per_request, driver_per_token=price.per_token, driver_per_finish=price.per_finish,
                   driver_per_step=price.per_step, driver_first_step=price.first_step,
                   driver_steps=fit["steps"], driver_excess_share=fit["excess_share_median"],
                   driver_cells_per_request=fit["cells_per_request"], driver_cells_per_token=fit["cells_per_token"])
    speculating = any(r.meta.get("engine", {}).get("speculation") for repeats in runs.values() for r in repeats)
    if price is not None and speculating:
        row.update(driver_priced=False, driver_why="the engine was started with speculation, which the shared host's "
                   "engine the driver is priced on does not model (lssim.sim.shared_host): fitted, not charged")
        price = None
    return price, row


def speed_level(run, profile: str) -> float | None:
    """The run's speed probes (meta.json) over the reference probe of the cost model its twin is calibrated on (the
    profile, or the layout of its engine: real_backend.layout.layout_profile); None when either has none."""
    started_with = run.meta.get("engine", {}).get("speculation")
    calibrated_on = layout_profile(profile, _instances(run), run.meta.get("setup", {}).get("cpus"), speculating=bool(started_with))
    return speed_factor(run.meta, calibrated_on)


def _instances(run) -> int:
    real = run.meta.get("setup", {})
    return int(run.meta.get("engine", {}).get("n_instances") or real.get("n_instances") or 1)


def run_twin_cost(run, profile: str) -> tuple:
    """real_backend.layout.twin_cost for the run's engine: (cost model JSON, host slow-down or None, description).
    Whether the engine was started with speculation is in meta.json's "engine" (runs recorded before it was: plain)."""
    started_with = run.meta.get("engine", {}).get("speculation")
    return twin_cost(profile, _instances(run), run.meta.get("setup", {}).get("cpus"), speculating=bool(started_with))


def run_prompts(run):
    """A fresh copy of the data loader the run drew from (same prompts file, pool and seed)."""
    from .prompts import TaskPrompts

    real = run.meta["setup"]
    return TaskPrompts.from_files(recorded_path(real["prompts_path"]), recorded_path(real["model_dir"]),
                                  real.get("n_prompts"), seed=run.config.seed)


def recorded_path(path: str) -> Path:
    """A file a run's meta.json names by its absolute path where it was recorded: that path where it still exists, else
    the same file in this checkout (the longest tail of the path found under the repository's root: a run recorded
    in another checkout, or shipped in paper/experiments). FileNotFoundError naming the path where neither exists."""
    recorded = Path(path)
    if recorded.exists():
        return recorded
    root = Path(__file__).resolve().parent.parent
    for i in range(1, len(recorded.parts)):
        here = root.joinpath(*recorded.parts[i:])
        if here.exists():
            return here
    raise FileNotFoundError(f"{path}: recorded by the run, neither there nor under {root}")


def load_recorded(folder):
    """lssim.analysis.fidelity.load_run, with the responses the run left unfinished at its end (RecordedRun.unfinished): the
    simulated twin needs them (fidelity.twin_trace). From the folder's unfinished.parquet (real_backend.recorder
    writes it after every step, in every mode) where it is of the run's last recorded step; else, for folders
    recorded before it was written (or one a kill left a step ahead of steps.parquet), from the checkpoint
    (collocated runs only; others then go without, and their twin fills the holes from the groups' members)."""
    from lssim.analysis.fidelity.run import UNFINISHED_COLUMNS, UNFINISHED_FILE, load_run

    run = load_run(folder)
    last = int(run.steps["step"].iloc[-1])
    if (Path(folder) / UNFINISHED_FILE).is_file():
        after = run.unfinished.attrs.get("after_step")
        if after is None or int(after) == last:  # None: written by another recorder, taken as it is
            return run
        print(f"warning: {folder}: its {UNFINISHED_FILE} is of step {after}, its last recorded step {last} (killed "
              f"between two files' renames): not used", file=sys.stderr)
        run.unfinished = pd.DataFrame(columns=UNFINISHED_COLUMNS)
    carried = int(run.steps["carried_out"].iloc[-1]) if "carried_out" in run.steps else 0
    if carried:
        run.unfinished = unfinished_from_checkpoint(folder, last)
        if len(run.unfinished) != carried:
            print(f"warning: {folder}: its last step carried out {carried} responses, its checkpoint holds "
                  f"{len(run.unfinished)}: the simulated twin fills the others in from their groups", file=sys.stderr)
    return run


def unfinished_from_checkpoint(folder, last_step: int) -> pd.DataFrame:
    """The responses carried out of the run's step `last_step`, from the checkpoint `lssim real` writes after every
    step (real_backend.checkpoint: the controller's carried responses); empty when there is none, it cannot be read,
    or it was written after another step."""
    from lssim.analysis.fidelity.run import UNFINISHED_COLUMNS

    from .checkpoint import CHECKPOINT, load_checkpoint

    empty = pd.DataFrame(columns=UNFINISHED_COLUMNS)
    if not (Path(folder) / CHECKPOINT).is_file():
        return empty
    try:
        ckpt = load_checkpoint(folder)
    except ValueError as e:  # written by another version of the code: the twin goes without
        print(f"warning: {e}", file=sys.stderr)
        return empty
    if ckpt.step != last_step:
        print(f"warning: {folder}: its checkpoint is of step {ckpt.step}, its last recorded step {last_step}", file=sys.stderr)
        return empty
    carried = ckpt.carried
    return pd.DataFrame([(r.step, r.prompt_id, r.sample_idx, r.group_id, r.prompt_len, r.generated,
                          r.tokens_before_resume, r.max_tokens) for r in carried], columns=UNFINISHED_COLUMNS)
