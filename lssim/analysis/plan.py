"""Plan a cluster: which execution mode, device split, staleness bound and policy make the whole RL step fastest
on this trace, and at what cost in staleness and lost signal? The offline version of RLinf's profiling-guided
scheduler, in simulation.

    from lssim.analysis.plan import PlanSpace, plan
    table = plan(load_trace("traces/math7b.parquet"), PlanSpace(devices=16), SimSetup())
    table.iloc[0]   # the best candidate that keeps every stated bound

Every candidate trains the same groups of the trace on the same `devices` in all, and is ranked by trained
tokens per second of wall time (RLinf's metric: prompt + response tokens trained over the run's end-to-end
time). `speedup` is against the collocated baseline on all the devices (verl's default). Candidates that break
a stated bound (`max_staleness`, `max_off_policy`) stay in the table, marked, and are never "best"; `pareto`
marks the candidates no other beats on both throughput and stale-token share.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from lssim.analysis.parallel import SimJob, run_jobs
from lssim.loop.policy import make_policy
from lssim.analysis.ranking import rank
from lssim.analysis.replay import SimSetup

PLAN_COLUMNS = ["mode", "policy", "rollout_devices", "train_devices", "staleness", "step_seconds", "speedup",
                "trained_tokens_per_second", "rollout_seconds", "train_seconds", "max_staleness", "stale_token_fraction",
                "off_policy_token_fraction", "dropped_stale", "idle_device_fraction", "effective_group_fraction",
                "within_bounds", "pareto"]


@dataclass
class PlanSpace:
    """What `plan` searches: modes x rollout/train splits of `devices` x staleness bounds (async) x policies."""

    devices: int
    modes: tuple[str, ...] = ("collocated", "disaggregated", "async", "hybrid")
    rollout_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)  # of the devices that roll out (not collocated)
    staleness: tuple[int, ...] = (1, 2)  # async bounds tried
    policies: tuple[str, ...] = ("baseline", "april", "seer")
    max_staleness: int | None = None  # a bound the user states: candidates above it are never "best"
    max_off_policy: float | None = None  # the largest share of trained tokens from older weights allowed

    def __post_init__(self):
        if self.devices < 1:
            raise ValueError(f"PlanSpace.devices must be >= 1, got {self.devices}")
        if not self.policies:
            raise ValueError("PlanSpace.policies: no policy to try")
        for f in self.rollout_fractions:
            if not 0 < f < 1:
                raise ValueError(f"PlanSpace.rollout_fractions must lie in (0, 1), got {f}")

    def setups(self, base: SimSetup) -> list[SimSetup]:
        """Every cluster configuration of the space, on `base`'s model, hardware and engine limits."""
        tp, out = base.tp, []
        if self.devices % tp:
            raise ValueError(f"{self.devices} devices are not a multiple of tp={tp}")
        for mode in self.modes:
            if mode == "collocated":
                out.append(replace(base, mode=mode, n_instances=self.devices // tp, train_devices=None))
                continue
            splits = sorted({max(tp, int(round(f * self.devices / tp)) * tp) for f in self.rollout_fractions})
            for rollout in [r for r in splits if r < self.devices]:
                bounds = self.staleness if mode == "async" else (base.staleness,)
                for k in bounds:
                    out.append(replace(base, mode=mode, n_instances=rollout // tp, train_devices=self.devices - rollout,
                                       staleness=k))
        return out


def plan(trace: pd.DataFrame, space: PlanSpace, base: SimSetup | None = None, steps: int | None = None, seed: int = 0,
         workers: int | None = 1, progress: bool = False, ray: str | None = None) -> pd.DataFrame:
    """One row per (cluster configuration, policy), best first; see the module docstring."""
    base = base or SimSetup()
    for spec in space.policies:
        make_policy(spec)  # a bad name fails before minutes of simulation
    reference = replace(base, mode="collocated", n_instances=space.devices // base.tp, train_devices=None)
    candidates = [(setup, p) for setup in space.setups(base) for p in space.policies]
    if (reference, "baseline") not in candidates:  # the yardstick: verl's default on all the devices
        candidates.append((reference, "baseline"))
    jobs = [SimJob(trace, policy, setup, steps, seed) for setup, policy in candidates]
    table = run_jobs(jobs, workers=workers, ray=ray, progress=progress)
    failed = table[table["error"].notna()]
    if len(failed):
        raise ValueError(f"plan: {len(failed)} runs failed, e.g. {failed['policy'].iloc[0]}: {failed['error'].iloc[0]}")
    yardstick = table.iloc[candidates.index((reference, "baseline"))]
    if "collocated" not in space.modes or "baseline" not in space.policies:
        table = table.drop(index=len(candidates) - 1)  # the yardstick was run for the speedup alone
    table["speedup"] = yardstick["step_seconds_per_group"] / table["step_seconds_per_group"]
    table = rank(table, "trained_tokens_per_second", "stale_token_fraction", space.max_staleness, space.max_off_policy)
    return table.reset_index(drop=True)[PLAN_COLUMNS]
