# %% [markdown]
# # Write a policy in one cell and compare it with the published ones
#
# A policy is a class with a few hooks (lssim/loop/policy.py); every hook's default is "no opinion". This one ends the
# rollout once 90% of the groups are done and carries the rest over to the next step (a milder APRIL without
# over-provisioning). `check_policy` runs it against the contract (the books balance, it is deterministic) before
# it is compared with the policies in `policies/`.

# %%
import os

import pandas as pd

from lssim.analysis import plots
from lssim.loop.checks import check_policy
from lssim.loop.policy import CARRY, Policy, make_policy
from lssim.analysis.replay import SimSetup, simulate, summarize
from lssim.traces.trace import load_trace
from lssim.traces.workload import Workload

FAST = bool(os.environ.get("LSSIM_NOTEBOOK_FAST"))
ROOT = next(p for p in [os.getcwd(), os.path.dirname(os.getcwd())] if os.path.isdir(os.path.join(p, "traces")))


# %%
class NinetyPercent(Policy):
    """End the rollout when 90% of the submitted groups are done; carry the unfinished ones over."""

    name = "ninety"

    def __init__(self, fraction: float = 0.9):
        if not 0 < fraction <= 1:
            raise ValueError(f"ninety: fraction must lie in (0, 1], got {fraction}")
        self.fraction = fraction

    def end_rollout(self, state):
        return state.groups_submitted > 0 and state.groups_done >= self.fraction * state.groups_submitted

    def on_unfinished(self, request):
        return CARRY


check_policy(NinetyPercent())

# %% [markdown]
# ## Against the published policies, on the same trace and cluster

# %%
trace = load_trace(os.path.join(ROOT, "traces", "longtail32k.parquet"))
steps = 3 if FAST else 15
setup = SimSetup(n_instances=8)
workload = Workload(trace, seed=0)
published = ["baseline", "april", "seer"] if FAST else ["baseline", "april", "seer", "hadb", "rollpacker", "breaker"]
runs = {name: simulate(workload, make_policy(name), setup, steps=steps) for name in published}
runs["ninety (mine)"] = simulate(workload, NinetyPercent(), setup, steps=steps)
table = summarize(runs)
table[["speedup", "rollout_speedup", "lower_bound_efficiency", "off_policy_token_fraction", "truncated_fraction", "exact_fraction"]]

# %% [markdown]
# Speed bought with off-policy tokens is not free: the Pareto front shows which runs no other beats on both.

# %%
fig = plots.pareto_front(table, x="off_policy_token_fraction", y="speedup")

# %%
fig = plots.compare_timelines(runs, 1, ["baseline", "ninety (mine)"])
