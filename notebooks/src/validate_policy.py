# %% [markdown]
# # Validate a policy against the real engine, and read the error
#
# `lssim validate` runs each policy on the real vLLM backend, replays the recorded run in the simulator with the same
# policy, seeds and a profiled cost model, and compares step by step. Running vLLM takes minutes, so this notebook
# reads the frames that command shipped in `paper/experiments/validation/full1` (CPU, the project's tiny reference model).
# To redo them: `lssim validate --policies all --repeats 5 --out paper/experiments/validation/full1 --overwrite`.

# %%
import os

import pandas as pd

from lssim.analysis import plots
from lssim.analysis.fidelity.noise import TARGET_MEDIAN_PCT, TARGET_P90_PCT, TARGET_SPEEDUP_POINTS

ROOT = next(p for p in [os.getcwd(), os.path.dirname(os.getcwd())] if os.path.isdir(os.path.join(p, "real_backend")))
VAL = os.path.join(ROOT, "paper", "experiments", "validation", "full1")
steps = pd.read_parquet(os.path.join(VAL, "steps.parquet"))          # per policy and step: medians over repeats
noise = pd.read_parquet(os.path.join(VAL, "noise.parquet"))          # each repeat against its step's median
summary = pd.read_csv(os.path.join(VAL, "summary.csv"), index_col="policy")
counterfactual = pd.read_csv(os.path.join(VAL, "counterfactual.csv"), index_col="policy")

# %% [markdown]
# ## Per policy: makespan error (median, p90) and the speedup's error, against the targets

# %%
table = summary[["makespan_median_ape_pct", "makespan_p90_ape_pct", "finish_order_spearman", "speedup_measured",
                 "speedup_predicted", "speedup_error_points"]].copy()
table["meets_targets"] = ((table["makespan_median_ape_pct"] <= TARGET_MEDIAN_PCT) & (table["makespan_p90_ape_pct"] <= TARGET_P90_PCT)
                          & (table["speedup_error_points"].abs() <= TARGET_SPEEDUP_POINTS))
table.sort_values("makespan_p90_ape_pct", ascending=False)

# %% [markdown]
# ## Every step: predicted against measured, with the ±8% band

# %%
fig = plots.sim_vs_real(steps)

# %% [markdown]
# ## How much of the error is the machine's own noise?
#
# The same step recorded several times varies by itself (a shared 2-core VM). A policy whose simulated error is
# within this spread is as well predicted as the machine allows.

# %%
spread = noise.groupby("policy")["ape_pct"].median().rename("run_to_run_median_ape_pct")
error = steps.groupby("policy")["ape_pct"].median().rename("sim_median_ape_pct")
both = pd.concat([error, spread], axis=1)
both["error_over_noise"] = both["sim_median_ape_pct"] / both["run_to_run_median_ape_pct"]
both.sort_values("error_over_noise", ascending=False)

# %% [markdown]
# ## Predicting a policy from the baseline's trace alone (a counterfactual)
#
# The real question before a run: replay the *baseline's* trace under a new policy. `modelled_fraction` is how much
# of it the Workload had to model; the speedup's error says what that costs.

# %%
counterfactual[["modelled_fraction", "length_ks", "speedup_measured", "speedup_predicted_from_baseline_trace", "speedup_error_points"]]

# %%
worst = table["makespan_p90_ape_pct"].idxmax()
print(f"worst policy: {worst}: p90 makespan error {table.loc[worst, 'makespan_p90_ape_pct']:.1f}% "
      f"(target {TARGET_P90_PCT}%), speedup error {table.loc[worst, 'speedup_error_points']:+.1f} points")
