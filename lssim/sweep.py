"""Search compositions of policies on a trace: which one gets closest to the limit?

    from lssim.sweep import sweep
    table = sweep(load_trace("traces/math7b.parquet"), ["seer", "segment", "spec_tail"], max_size=2)
    table.iloc[0]   # the best composition: its speedup, its efficiency against the per-step lower bound

Every composition of 1..max_size of the named policies (in the order given: `a+b`, never also `b+a`; the
composition rules make most orders equivalent, and where they are not, the order given is the one meant) runs
over the same workload and cluster, beside `baseline`. A composition that cannot be built (two members asking
the engine for different things), or that fails while it runs, is skipped and reported. Runs are summarized
one at a time (`lssim.replay.summarize`) and then dropped, so a sweep of hundreds of runs holds only their
summary rows.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable

import pandas as pd

from .policy import make_policy
from .replay import SimSetup, simulate, summarize
from .workload import Workload


def compositions(names: list[str], max_size: int) -> list[str]:
    """`a`, `b`, ..., `a+b`, ...: every combination of 1..max_size of `names`, in the order given."""
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    if len(set(names)) != len(names):
        raise ValueError(f"policies listed twice: {sorted({n for n in names if names.count(n) > 1})}")
    return ["+".join(c) for k in range(1, min(max_size, len(names)) + 1) for c in itertools.combinations(names, k)]


def sweep(trace: pd.DataFrame, names: list[str], max_size: int = 3, setup: SimSetup | None = None, steps: int | None = None,
          seed: int = 0, by: str = "speedup", progress: Callable[[Iterable], Iterable] | None = None,
          skipped: list | None = None) -> pd.DataFrame:
    """One summary row per composition (and baseline), best first by `by` ("speedup" or
    "lower_bound_efficiency"). `skipped` (a list) collects (spec, reason) for compositions that cannot be built."""
    if by not in ("speedup", "lower_bound_efficiency"):
        raise ValueError(f"by must be 'speedup' or 'lower_bound_efficiency', got {by!r}")
    setup = setup or SimSetup()
    for name in names:
        make_policy(name)  # a bad name fails before minutes of simulation
    specs = ["baseline"] + [s for s in compositions(names, max_size) if s != "baseline"]
    built = {}
    for spec in specs:
        try:
            built[spec] = make_policy(spec)
        except ValueError as e:
            if skipped is not None:
                skipped.append((spec, str(e)))
    workload = Workload(trace, seed=seed)
    rows = []
    for spec in progress(list(built)) if progress else built:
        try:
            result = simulate(workload, built[spec], setup, steps, seed)
        except Exception as e:  # a composition whose members contradict each other at run time
            if spec == "baseline" or skipped is None:
                raise
            skipped.append((spec, f"failed: {type(e).__name__}: {e}"))
            continue
        row = summarize({spec: result})
        row["speculated_token_fraction"] = result.meta.get("speculated_tokens", 0) / max(1, int(result.steps["tokens"].sum()))
        rows.append(row)
        del result
    table = pd.concat(rows)
    table["speedup"] = table.loc["baseline", "rollout_seconds_per_group"] / table["rollout_seconds_per_group"]
    table["size"] = [0 if s == "baseline" else s.count("+") + 1 for s in table.index]
    return table.sort_values(by, ascending=False, kind="stable")
