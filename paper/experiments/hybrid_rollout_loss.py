"""Issue 37: what hybrid's streamed pieces cost the real rollout, read from recorded modes folders, no engine.

    python -m paper.experiments.hybrid_rollout_loss paper/experiments/validation/modes41 [FOLDER ...] [--twin]

Hybrid and collocated are both on-policy with the same seeds, so their runs generate the same tokens; hybrid's
rollout less collocated's, the same repeat and step, is what the pieces beside it cost the rollout. Beside it: what the
folder's streamed factor prices at most (the profile's loss per piece-second times the pieces' wall seconds up to the
rollout's end; an upper bound, since not every piece ran beside the rollout), and the update's seconds past the
rollout's end.

Measured 2026-11-28 (means per step over 3 repeats x 5 steps; `... modes42 modes41 modes40 modes38 --twin`, the twin
as of 09:00 UTC). Every step's tokens are the same in both modes (60 of 60):

| folder | tokens hybrid / collocated | rollout loss s | priced at most s | update past the rollout s |
|---|---|---|---|---|
| modes42 | 2569 / 2569 | 0.103 | 0.157 | 0.105 |
| modes41 | 2569 / 2569 | 0.097 | 0.154 | 0.100 |
| modes40 | 2569 / 2569 | 0.108 | 0.135 | 0.100 |
| modes38 | 2569 / 2569 | 0.245 | 0.513 | 0.310 |

The update past the rollout is mostly the last group's piece: in most steps the last group with signal ends with the
rollout, and its piece then runs at about the trainer profile's price, where the twin prices a piece alone at the
run's probed trainer level; modes42's runs recorded every piece (`trainer_pieces`), beside the rollout and after it:

| folder | steps whose last group with signal ended with the rollout | update past it, s | its level over the profile's price | the probed trainer level |
|---|---|---|---|---|
| modes42 | 12 | 0.115 | 1.03 | 0.66 |
| modes41 | 11 | 0.109 | 0.98 | 0.63 |
| modes40 | 12 | 0.109 | 0.98 | 0.60 |
| modes38 | 12 | 0.336 | 3.02 | (no trainer probe) |

| folder | pieces recorded, beside the rollout / after it | their seconds over the profile's price, beside / after |
|---|---|---|
| modes42 | 59 / 13 | 0.92 / 0.89 |

The twin's step less the run's, s a step:

| folder | twin less run | the shared rollout | the streamed part (twin / run) | the rest |
|---|---|---|---|---|
| modes42 | -0.068 (-6.0%) | -0.014 | -0.051 (0.157 / 0.208) | -0.003 |
| modes41 | -0.066 (-5.8%) | -0.024 | -0.038 (0.158 / 0.196) | -0.004 |
| modes40 | -0.128 (-11.0%) | -0.069 | -0.056 (0.152 / 0.208) | -0.003 |
| modes38 | -0.230 (-9.7%) | +0.022 | -0.200 (0.355 / 0.555) | -0.051 |
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd


def _hybrid_runs(folder: Path) -> list[Path]:
    return sorted((folder / "real" / "hybrid" / "baseline").glob("repeat*"))


def _signal_groups(members: pd.DataFrame) -> pd.DataFrame:
    """The members of the groups whose rewards differ (the only ones the trainer trains)."""
    return members.groupby("group_id").filter(lambda g: g.reward.nunique() > 1)


def _piece_price(cost, members: pd.DataFrame) -> float:
    """The trainer profile's price of one group's streamed piece."""
    return cost.streamed_update([(members.prompt_len + members.response_len).to_numpy(int)]).pieces[0]


def _table(header: str, rows, first: bool = False) -> None:
    """A markdown table: `header`'s cells, then one line per row's cells (a blank line before all but the first)."""
    print(("" if first else "\n") + f"| {header} |")
    print("|" + "---|" * (header.count("|") + 1))
    for row in rows:
        print(f"| {row} |")


def paired_steps(folder: Path) -> pd.DataFrame:
    """One row per hybrid step beside the collocated run's same repeat and step."""
    streamed = json.loads((folder / "profile.json").read_text())["measured_by"]["shared_host"]["streamed"]
    loss_per_second = streamed.get("lost_per_piece_second", 1 - 1 / streamed["engine_slowdown"])
    rows = []
    for hybrid_run in _hybrid_runs(folder):
        hybrid = pd.read_parquet(hybrid_run / "steps.parquet")
        collocated = pd.read_parquet(folder / "real" / "collocated" / "baseline" / hybrid_run.name / "steps.parquet")
        for (_, h), (_, c) in zip(hybrid.iterrows(), collocated.iterrows()):
            beside = min(h.trainer_update_seconds, max(0.0, h.rollout_end - h.train_start))
            rows.append({"repeat": hybrid_run.name, "step": int(h.step), "tokens_hybrid": int(h.tokens),
                         "tokens_collocated": int(c.tokens), "rollout_loss": h.rollout_seconds - c.rollout_seconds,
                         "priced_at_most": loss_per_second * beside, "past_rollout": h.train_end - h.rollout_end})
    return pd.DataFrame(rows)


def twin_shortfall(folder: Path) -> pd.DataFrame:
    """Per hybrid step, the twin's step less the run's, in three parts: the rollout both modes share (the twin's
    engine-own rollout less collocated's measured one), the streamed part (the twin's seconds from its engine-own
    rollout's end to its update's end, less the run's loss beside the pieces plus its update past the rollout), and
    the rest of the step."""
    from lssim.analysis.fidelity.run import replay_run
    from real_backend.validate_modes import DEFAULT_TRAIN_PROFILE, host_pricing, mode_sim_setup
    from real_backend.validate_twin import load_recorded, run_prompts

    def runs_of(mode):
        return [load_recorded(p) for p in sorted((folder / "real" / mode / "baseline").glob("repeat*"))]

    everyone = {m: runs_of(m) for m in ("collocated", "disaggregated", "async", "hybrid")}
    profile = str(folder / "profile.json")
    share, driver, _ = host_pricing([r for runs in everyone.values() for r in runs], profile)
    rows = []
    for run, collocated in zip(everyone["hybrid"], everyone["collocated"]):
        twin = replay_run(run, mode_sim_setup(run, profile, str(DEFAULT_TRAIN_PROFILE), share, driver),
                          run_prompts(run)).steps
        for (_, h), (_, c), (_, t) in zip(run.steps.iterrows(), collocated.steps.iterrows(), twin.iterrows()):
            real_streamed = (h.rollout_seconds - c.rollout_seconds) + (h.train_end - h.rollout_end)
            twin_streamed = t.train_end - t.rollout_end  # the twin's step row keeps its engine's own rollout
            rows.append({"short": t.step_seconds - h.step_seconds,
                         "shared_rollout": t.rollout_seconds - c.rollout_seconds,
                         "streamed": twin_streamed - real_streamed,
                         "rest": (t.step_seconds - t.rollout_seconds - twin_streamed)
                         - (h.step_seconds - h.rollout_seconds - (h.train_end - h.rollout_end)),
                         "real_streamed": real_streamed, "twin_streamed": twin_streamed, "real_step": h.step_seconds})
    return pd.DataFrame(rows)


def last_pieces(folder: Path) -> pd.DataFrame:
    """Per hybrid step whose last group with signal ended with the rollout (within 10 ms): the update past the
    rollout's end over the trainer profile's price of that group's piece, beside the run's probed trainer level (what
    the twin prices a piece alone at)."""
    from lssim.sim.training import load_train_cost
    from real_backend.trainer_probe import trainer_level
    from real_backend.validate_modes import DEFAULT_TRAIN_PROFILE

    cost = load_train_cost(DEFAULT_TRAIN_PROFILE)
    rows = []
    for run in _hybrid_runs(folder):
        steps, responses = pd.read_parquet(run / "steps.parquet"), pd.read_parquet(run / "responses.parquet")
        level = trainer_level(json.loads((run / "meta.json").read_text()), cost)
        for step, members in responses.groupby("train_step"):
            row = steps[steps.step == step].iloc[0]
            signal = _signal_groups(members)
            if signal.empty:
                continue
            last = signal[signal.group_id == signal.groupby("group_id").finish_time.max().idxmax()]
            if last.finish_time.max() < row.rollout_end - row.rollout_start - 0.01:
                continue
            price = _piece_price(cost, last)
            rows.append({"past_rollout": row.train_end - row.rollout_end, "price": price,
                         "piece_level": (row.train_end - row.rollout_end) / price, "probed_level": level})
    return pd.DataFrame(rows)


def recorded_pieces(folder: Path) -> pd.DataFrame:
    """Each streamed piece with signal that the runs recorded (steps.parquet `trainer_pieces`, recordings from
    modes42 on), matched to its group in the order the groups ended: its seconds over the trainer profile's price of
    that group's piece, and whether it began beside the rollout or after its end."""
    from lssim.sim.training import load_train_cost
    from real_backend.validate_modes import DEFAULT_TRAIN_PROFILE

    cost = load_train_cost(DEFAULT_TRAIN_PROFILE)
    rows = []
    for run in _hybrid_runs(folder):
        steps, responses = pd.read_parquet(run / "steps.parquet"), pd.read_parquet(run / "responses.parquet")
        if "trainer_pieces" not in steps:
            continue
        for _, row in steps.iterrows():
            pieces = [p for p in json.loads(row.trainer_pieces) if p[2] > 0]
            signal = _signal_groups(responses[responses.train_step == row.step])
            ends = signal.groupby("group_id").finish_time.max().sort_values(kind="stable")
            for (start, end, _), group in zip(pieces, ends.index):
                price = _piece_price(cost, signal[signal.group_id == group])
                rows.append({"after_rollout": start >= row.rollout_end - 1e-3, "seconds": end - start,
                             "level": (end - start) / price})
    return pd.DataFrame(rows)


def _paired_row(folder: Path) -> str:
    d = paired_steps(folder)
    return (f"{folder.name} | {d.tokens_hybrid.mean():.0f} / {d.tokens_collocated.mean():.0f} | {d.rollout_loss.mean():.3f} | "
            f"{d.priced_at_most.mean():.3f} | {d.past_rollout.mean():.3f}")


def _last_piece_row(folder: Path) -> str:
    d = last_pieces(folder)
    return (f"{folder.name} | {len(d)} | {d.past_rollout.median():.3f} | {d.piece_level.median():.2f} | "
            f"{d.probed_level.median():.2f}")


def _recorded_row(folder: Path) -> str:
    d = recorded_pieces(folder)
    if d.empty:
        return f"{folder.name} | (recorded before trainer_pieces) |"
    beside, after = d[~d.after_rollout], d[d.after_rollout]
    return f"{folder.name} | {len(beside)} / {len(after)} | {beside.level.median():.2f} / {after.level.median():.2f}"


def _twin_row(folder: Path) -> str:
    t = twin_shortfall(folder).mean()
    return (f"{folder.name} | {t.short:+.3f} ({t.short / t.real_step:+.1%}) | {t.shared_rollout:+.3f} | "
            f"{t.streamed:+.3f} ({t.twin_streamed:.3f} / {t.real_streamed:.3f}) | {t.rest:+.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="recorded `lssim validate --mode` folders (profile.json, real/)")
    ap.add_argument("--twin", action="store_true", help="also replay the hybrid runs and split the twin's shortfall")
    args = ap.parse_args(argv)
    _table("folder | tokens hybrid / collocated | rollout loss s | priced at most s | update past the rollout s",
           map(_paired_row, args.folders), first=True)
    _table("folder | steps whose last group with signal ended with the rollout | update past it, s | its level over the "
           "profile's price | the probed trainer level", map(_last_piece_row, args.folders))
    _table("folder | pieces recorded, beside the rollout / after it | their seconds over the profile's price, beside / "
           "after", map(_recorded_row, args.folders))
    if args.twin:
        _table("folder | twin less run, s a step | the shared rollout | the streamed part (twin / run) | the rest",
               map(_twin_row, args.folders))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
