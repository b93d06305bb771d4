"""Real runs in pairs on one engine, for the lab scripts that compare two variants of the real side (what each
variant changes is the script's): the validation's default world, the trainer in its own process, a warm-up run,
then for each pair and mode each variant once, in alternating order, so the machine's drift falls on both alike.

    for run in paired_runs({"as_is": nullcontext, "held": hold_controller}, pairs=5, modes=("hybrid",)):
        run.steps, run.folder          # the run's steps frame and its recorded folder (gone once the loop ends)

Used by measure_driver_hold, measure_recorder_tax and measure_switch_interval; alone on the machine, ~20 s a run.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Iterator

if TYPE_CHECKING:
    import pandas as pd


@dataclasses.dataclass(frozen=True)
class PairedRun:
    pair: int
    mode: str
    variant: str
    folder: Path
    steps: pd.DataFrame  # the run's steps (as its steps.parquet holds them)


def paired_runs(variants: dict[str, Callable[[], ContextManager]], pairs: int,
                modes: tuple[str, ...] = ("hybrid",)) -> Iterator[PairedRun]:
    """Each run as it ends: `variants` maps a name to what sets it up around one run (a context manager factory);
    the pair's first variant alternates. The runs' folders live until the iteration ends."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from lssim.loop.modes import ModeConfig
    from real_backend.validation_workloads import world_arg
    from real_backend.world import prepare, run_real, world_engine

    names = list(variants)
    with world_engine(world_arg("default")) as (setup, config, _, engine), tempfile.TemporaryDirectory() as scratch:
        setup = dataclasses.replace(setup, trainer_process=True)

        def run(mode: str, folder: Path, run_config) -> pd.DataFrame:
            prompts, policy = prepare(setup, "baseline", run_config)
            return run_real(setup, policy, run_config, str(folder), engine=engine, prompts=prompts, checkpoint=False,
                            mode=ModeConfig(mode=mode, rollout_devices=1, train_devices=1, staleness=1)).steps

        run(modes[0], Path(scratch) / "warm", dataclasses.replace(config, steps=2, total_groups=None))
        for k in range(pairs):
            for mode in modes:
                for name in names if k % 2 == 0 else names[::-1]:
                    folder = Path(scratch) / f"{k}-{mode}-{name}"
                    with variants[name]():
                        steps = run(mode, folder, config)
                    print(f"pair {k} {mode} {name}: steps {steps['step_seconds'].sum():.3f} s", file=sys.stderr)
                    yield PairedRun(k, mode, name, folder, steps)


TOTALS = ["step_s", "rollout_s", "update_s"]


def run_totals(run: PairedRun) -> dict:
    """A run's row for paired_ratios: its pair, mode and variant, and its steps', rollouts' and updates' seconds."""
    steps = run.steps
    return {"pair": run.pair, "mode": run.mode, "variant": run.variant, "step_s": steps["step_seconds"].sum(),
            "rollout_s": steps["rollout_seconds"].sum(), "update_s": (steps["train_end"] - steps["train_start"]).sum()}


def paired_ratios(rows, values: list[str], variant: str, baseline: str):
    """Per value, the `variant` run's over the `baseline` run's of each pair (and mode): a frame indexed like the
    pairs, one column per value. `rows`: dicts with pair, mode, variant and the values."""
    import pandas as pd

    wide = pd.DataFrame(rows).pivot_table(index=["mode", "pair"], columns="variant", values=values)
    return pd.DataFrame({v: wide[v][variant] / wide[v][baseline] for v in values})
