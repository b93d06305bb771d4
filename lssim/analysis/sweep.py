"""Search compositions of policies, and grids of their parameters, on a trace: which one gets closest to the limit?

    from lssim.analysis.sweep import sweep
    table = sweep(load_trace("traces/math7b.parquet"), ["seer", "segment", "spec_tail"], max_size=2)
    table.iloc[0]   # the best composition: its speedup, its efficiency against the per-step lower bound
    sweep(trace, [], grid=["hadb(short_batch_factor=1,2,4)+april(over_provision=1.5,2)"])   # 3 x 2 runs

Every composition of 1..max_size of the named policies (in the order given: `a+b`, never also `b+a`; the
composition rules make most orders equivalent, and where they are not, the order given is the one meant) runs
over the same workload and cluster, beside `baseline`, and so does every point of each `grid` (`expand_grid`).
A composition that cannot be built (two members asking the engine for different things), or that fails while
it runs, is skipped and reported. The runs go to `lssim.analysis.parallel.run_jobs`: every local core by default, a Ray
cluster with `ray=`, streamed to `out` (JSON lines) so that `resume=True` picks an interrupted sweep up where it
stopped. Each worker keeps only summary rows, so a sweep of thousands of runs holds only those.
"""

from __future__ import annotations

import ast
import itertools
import os
import re

import pandas as pd

from lssim.analysis.parallel import SimJob, run_jobs
from lssim.loop.policy import make_policy, split_policy_spec
from lssim.analysis.ranking import rank
from lssim.analysis.replay import SimSetup


def compositions(names: list[str], max_size: int) -> list[str]:
    """`a`, `b`, ..., `a+b`, ...: every combination of 1..max_size of `names`, in the order given."""
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    if len(set(names)) != len(names):
        raise ValueError(f"policies listed twice: {sorted({n for n in names if names.count(n) > 1})}")
    return ["+".join(c) for k in range(1, min(max_size, len(names)) + 1) for c in itertools.combinations(names, k)]


def expand_grid(spec: str) -> list[str]:
    """One policy spec per point of a parameter grid: a parameter followed by several values takes each in turn,
    cartesian over every parameter of every member, the first parameter varying slowest.

        expand_grid("hadb(short_batch_factor=1,2,4)")
            -> ["hadb(short_batch_factor=1)", "hadb(short_batch_factor=2)", "hadb(short_batch_factor=4)"]
        expand_grid("hadb(short_batch_factor=1,2, ema=0.5)+april(over_provision=1.5,2)")  -> 2 x 2 specs

    Values are Python literals (numbers, strings in quotes, True/False, lists in brackets)."""
    try:
        members = split_policy_spec(spec)
    except ValueError as e:
        raise ValueError(f"--grid {spec!r}: {e}; a grid lists values: name(key=v1,v2,...)") from None
    axes: list[list[str]] = []  # per member: its name, then one list of "key=value" choices per parameter
    shapes: list[tuple[str, int]] = []
    for name, args in members:
        params = _grid_params(args or "", spec)
        shapes.append((name, len(params)))
        axes.extend([f"{key}={value}" for value in values] for key, values in params)
    out = []
    for point in itertools.product(*axes):
        parts, i = [], 0
        for name, n in shapes:
            parts.append(f"{name}({','.join(point[i:i + n])})" if n else name)
            i += n
        out.append("+".join(parts))
    return out


def _grid_params(text: str, spec: str) -> list[tuple[str, list[str]]]:
    params: list[tuple[str, list[str]]] = []
    for token in _split_top_level(text):
        key, eq, value = token.partition("=")
        if eq and re.fullmatch(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*", key):
            if any(k == key.strip() for k, _ in params):
                raise ValueError(f"--grid {spec!r}: parameter {key.strip()!r} given twice")
            params.append((key.strip(), []))
        elif not params:
            raise ValueError(f"--grid {spec!r}: value {token.strip()!r} before any key=")
        else:
            value = token
        value = value.strip()
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"--grid {spec!r}: {params[-1][0]}={value!r} is not a Python literal") from None
        params[-1][1].append(value)
    return params


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets and quotes."""
    tokens, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            tokens.append(text[start:i])
            start = i + 1
    tail = text[start:]
    return tokens + [tail] if tail.strip() or tokens else tokens


def sweep_specs(names: list[str], max_size: int, grid: list[str] = ()) -> list[str]:
    """The runs of a sweep, baseline first: compositions of `names`, then the points of each grid, each once."""
    specs = ["baseline"] + compositions(names, max_size) + [s for g in grid for s in expand_grid(g)]
    return list(dict.fromkeys(specs))


def sweep(trace: pd.DataFrame | str | os.PathLike, names: list[str], max_size: int = 3, setup: SimSetup | None = None,
          steps: int | None = None, seed: int = 0, by: str = "speedup", progress=None, skipped: list | None = None, *,
          grid: list[str] = (), workers: int | None = None, out: str | os.PathLike | None = None, resume: bool = False,
          ray: str | None = None, max_staleness: int | None = None, max_off_policy: float | None = None) -> pd.DataFrame:
    """One summary row per composition and grid point (and baseline), best first by `by` ("speedup" or
    "lower_bound_efficiency"). `skipped` (a list) collects (spec, reason) for runs that cannot be built or fail.
    `progress`: a progress bar (truthy). `workers`, `out`, `resume`, `ray`: lssim.analysis.parallel.run_jobs. Rows that break a
    stated bound (`max_staleness`, `max_off_policy`) come after the others and are never best (lssim.analysis.ranking);
    `pareto` marks the front of `by` against the off-policy token share. `speedup` is end to end."""
    if by not in ("speedup", "lower_bound_efficiency"):
        raise ValueError(f"by must be 'speedup' or 'lower_bound_efficiency', got {by!r}")
    setup = setup or SimSetup()
    for name in names:
        make_policy(name)  # a bad name fails before minutes of simulation
    specs = []
    for spec in sweep_specs(names, max_size, grid):
        try:
            make_policy(spec)
            specs.append(spec)
        except ValueError as e:
            if spec == "baseline":
                raise
            if skipped is not None:
                skipped.append((spec, str(e)))
    jobs = [SimJob(trace, spec, setup, steps, seed) for spec in specs]
    runs = run_jobs(jobs, workers=workers, out=out, resume=resume, ray=ray, progress=bool(progress))
    failed = runs[runs["error"].notna()]
    for spec, error in zip(failed["policy"], failed["error"]):
        if spec == "baseline" or skipped is None:
            raise RuntimeError(f"sweep: {spec} failed: {error}")
        skipped.append((spec, f"failed: {error}"))
    table = runs[runs["error"].isna()].drop(columns=["job", "error"]).set_index("policy")
    base = table.loc["baseline"]
    table.insert(0, "speedup", base["step_seconds_per_group"] / table["step_seconds_per_group"])  # end to end
    table.insert(1, "rollout_speedup", base["rollout_seconds_per_group"] / table["rollout_seconds_per_group"])
    table["size"] = [0 if s == "baseline" else s.count("+") + 1 for s in table.index]
    return rank(table, by, "off_policy_token_fraction", max_staleness, max_off_policy)
