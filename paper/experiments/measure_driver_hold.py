"""Issue 37: does the driver's own work at a rollout's end (recording the step, planning the next) slow hybrid's update
past the rollout on this shared host? Real hybrid runs in pairs on one engine, in alternating order: as they are, and
with the controller held in Hybrid.train until the update has ended (its work then runs after the update, not beside).

    python -m paper.experiments.measure_driver_hold [--pairs 5]          # ~3 minutes, alone on the machine

Each streamed piece with signal (steps.parquet `trainer_pieces`) over the trainer profile's price of its group's piece,
by where it ran: beside the rollout, the first after the rollout's end, or a later one; and the runs' step totals.

Measured 2026-11-29, twice (`--pairs 5`, the trainer in its own process, ~00:50 and ~01:15 UTC): the first piece
after the rollout at 0.968 / 0.948 of its price as the runs are, and 0.655 / 0.657 held (15-16 pieces each); later ones
0.63-0.64 in both; beside the rollout 0.88-0.89 in both. The first piece after the rollout is ~33 ms longer with the
driver's work beside it: the driver's fitted seconds between steps (DriverPrice.per_step, 32-35 ms in modes50p-55p).
Held, it runs at the trainer's alone level (0.66 in paper.experiments.piece_price). The step totals moved within the
noise (median as / held: 5.769 / 5.675 s, then 5.711 / 5.776). So the twin holds a train job on a shared host by the
driver's seconds between steps (lssim.sim.shared_host.SharedHostEngine.driver_hold).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path


def piece_levels(run: Path, cost) -> list[dict]:
    """Each recorded piece with signal of a hybrid run's folder: where it ran and its seconds over its price."""
    import pandas as pd

    steps, responses = pd.read_parquet(run / "steps.parquet"), pd.read_parquet(run / "responses.parquet")
    rows = []
    for _, step in steps.iterrows():
        pieces = [p for p in json.loads(step.trainer_pieces) if p[2] > 0]
        members = responses[responses.train_step == step.step].groupby("group_id").filter(lambda g: g.reward.nunique() > 1)
        ends = members.groupby("group_id").finish_time.max().sort_values(kind="stable")  # the order pieces were fed
        after = 0
        for (start, end, _), group in zip(pieces, ends.index):
            g = members[members.group_id == group]
            price = cost.streamed_update([(g.prompt_len + g.response_len).to_numpy(int)]).pieces[0]
            where = "beside" if start < step.rollout_end - 1e-3 else ("first after" if after == 0 else "later after")
            after += where != "beside"
            rows.append({"where": where, "level": (end - start) / price})
    return rows


@contextlib.contextmanager
def controller_held():
    """Hybrid.train waits for a real update to end before the controller goes on (records the step, plans the next)."""
    from lssim.loop import modes

    train = modes.Hybrid.train

    def held(self, metrics, step, groups, rollout_start, rollout_end, job=None, last=False):
        if job is not None:
            job.wait(self._engine)
        return train(self, metrics, step, groups, rollout_start, rollout_end, job=job, last=last)

    modes.Hybrid.train = held
    try:
        yield
    finally:
        modes.Hybrid.train = train


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.experiments.measure_driver_hold", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=5, help="pairs of runs (default 5)")
    args = p.parse_args(argv)
    if args.pairs < 1:
        print("error: --pairs must be >= 1", file=sys.stderr)
        return 2
    import pandas as pd

    from lssim.sim.training import load_train_cost
    from paper.experiments.paired_runs import paired_runs
    from real_backend.validate_modes import DEFAULT_TRAIN_PROFILE

    cost, pieces, totals = load_train_cost(DEFAULT_TRAIN_PROFILE), [], []
    for run in paired_runs({"as_is": contextlib.nullcontext, "held": controller_held}, args.pairs):
        pieces += [{"variant": run.variant, **row} for row in piece_levels(run.folder, cost)]
        totals.append({"variant": run.variant, "steps_s": run.steps["step_seconds"].sum()})
    levels = pd.DataFrame(pieces).pivot_table(index="variant", columns="where", values="level", aggfunc=["median", "size"])
    print("pieces' seconds over their price (median) and how many:\n" + levels.round(3).to_string())
    print("step totals, median s:\n" + pd.DataFrame(totals).groupby("variant")["steps_s"].median().round(3).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
