# %% [markdown]
# # Choose an execution mode and a device split for a cluster
#
# Collocated (verl's default), disaggregated one-step-off, async with a staleness bound (AReaL, ROLL Flash) or hybrid
# streaming (RLinf): `lssim.analysis.plan` runs every mode x rollout/train split x staleness bound x policy on a trace and ranks
# them end to end by trained tokens per second, with the staleness each pays. The same from the shell:
# `lssim plan TRACE --devices 16 --max-staleness 1`.

# %%
import os

from lssim.analysis import plots
from lssim.analysis.plan import PlanSpace, plan
from lssim.analysis.replay import SimSetup, replay
from lssim.traces.trace import load_trace

FAST = bool(os.environ.get("LSSIM_NOTEBOOK_FAST"))
ROOT = next(p for p in [os.getcwd(), os.path.dirname(os.getcwd())] if os.path.isdir(os.path.join(p, "traces")))
trace = load_trace(os.path.join(ROOT, "traces", "math7b.parquet"))
DEVICES = 16
space = PlanSpace(devices=DEVICES, policies=("baseline", "april") if FAST else ("baseline", "april", "seer"),
                  rollout_fractions=(0.5, 0.75) if FAST else (0.25, 0.5, 0.75), staleness=(1,) if FAST else (1, 2),
                  max_staleness=1)
table = plan(trace, space, SimSetup(), steps=3 if FAST else 20, workers=1)
table[["mode", "policy", "speedup", "trained_tokens_per_second", "max_staleness", "off_policy_token_fraction",
       "idle_device_fraction", "within_bounds", "pareto"]].head(12)

# %% [markdown]
# ## Throughput against staleness: the non-dominated candidates

# %%
ranked = table.assign(label=table["mode"] + " / " + table["policy"]).set_index("label")
ranked["stale"] = ranked["off_policy_token_fraction"]
fig = plots.pareto_front(ranked, x="stale", y="speedup")

# %% [markdown]
# ## Where the time goes in the best candidate of each mode

# %%
best = table[table["within_bounds"]].groupby(table["mode"].str.split().str[0]).head(1)
runs = {}
for _, row in best.iterrows():
    mode = row["mode"].split()[0]
    rollout = int(row["rollout_devices"]) if "rollout_devices" in row else DEVICES
    setup = SimSetup(mode=mode, n_instances=rollout, train_devices=None if mode == "collocated" else DEVICES - rollout)
    runs[row["mode"]] = replay(trace, [], setup, steps=3 if FAST else 20)["baseline"]
fig = plots.phase_breakdown(runs)
