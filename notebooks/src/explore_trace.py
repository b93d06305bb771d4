# %% [markdown]
# # Explore a trace
#
# What a run's lengths look like, how long its tail is, and what that tail costs a synchronous rollout.
# Bring your own trace (`lssim import verl|slime|areal|trl DUMP -o mine.parquet`, then `load_trace("mine.parquet")`);
# here one is synthesized and made to look like a real dump: text prompt ids, and steps of different sizes
# (a fifth of the groups filtered out, as DAPO's dynamic sampling does). `LSSIM_NOTEBOOK_FAST=1` keeps it small.

# %%
import os

import numpy as np

from lssim.analysis import plots
from lssim.analysis.replay import SimSetup, replay, summarize
from lssim.traces.synth import get_preset, synthesize
from lssim.traces.trace import validate_trace
from lssim.traces.summary import format_trace_info, trace_info

FAST = bool(os.environ.get("LSSIM_NOTEBOOK_FAST"))
cfg = get_preset("longtail32k").replace(steps=4 if FAST else 12, prompts_per_step=16 if FAST else 64, group_size=8,
                                        n_prompts=64 if FAST else 512, max_tokens=8192 if FAST else 32768)
raw = synthesize(cfg)
groups = raw[["step", "prompt_id"]].drop_duplicates().sample(frac=0.8, random_state=0)
mine = raw.merge(groups, on=["step", "prompt_id"])
mine["prompt_id"] = "q-" + mine["prompt_id"].astype(str)  # ids as a real dataset writes them
mine = validate_trace(mine, source="my trace")
mine.groupby("step").size().rename("responses per step")

# %% [markdown]
# ## The summary `lssim trace info` prints

# %%
info = trace_info(mine, validate=False)
print(format_trace_info(info, title="my trace"))
assert info["group_size"] == 8 and mine["prompt_id"].str.startswith("q-").all()

# %% [markdown]
# ## Lengths: one CDF per step, and the whole trace

# %%
fig = plots.length_cdf(mine, title="my trace: response lengths")

# %% [markdown]
# ## What the tail costs: the trace replayed as recorded (baseline), beside APRIL and the oracle

# %%
setup = SimSetup(n_instances=2, max_num_seqs=64)
results = replay(mine, ["april"], setup, steps=3 if FAST else None)
summarize(results)[["speedup", "rollout_speedup", "lower_bound_efficiency", "long_tail_ratio", "off_policy_token_fraction", "exact_fraction"]]

# %%
worst = int((results["baseline"].steps["rollout_seconds"] - results["baseline"].steps["lower_bound_seconds"]).idxmax())
fig = plots.compare_timelines(results, worst, ["baseline", "april"])

# %%
fig = plots.makespan_vs_bound(results)
