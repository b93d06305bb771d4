"""The paper's numbers that rest on measurements: read from the committed outputs of the real-engine runs (which
take many minutes) and refitted from the committed GPU kernel measurements (which take a second).

- vLLM on this CPU against the simulator: real_backend/validation/ (summary.csv, stages.csv, counterfactual.csv,
  steps.parquet, steps_by_repeat.parquet, noise.parquet), written by
  `lssim validate --policies all --repeats 5 --reprofile --out runs/validate` (about 11 minutes). The speed level
  taken from the baseline's runs is recomputed here from steps_by_repeat.parquet with the library's
  `lssim.fidelity.anchor_on_baseline` and `median_over_repeats`, as `lssim validate` computes it.
- The GRPO trainer's cost fit: real_backend/profile_trainer_cpu.json (`python -m real_backend.profile_trainer`).
- The GPU cost model: `lssim.cost.operator_fit.heldout_table()` fits the kernel curves afresh on the H100
  profiles in lssim/profiles/ (measured on a lent H100 in an earlier round) and scores the held-out points and
  Microsoft Vidur's public H100 kernel times (`python -m lssim.benchmarks.gpu_cost_model` prints the same table).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from lssim.cost.operator_fit import VIDUR_HELD_OUT, heldout_table
from lssim.fidelity import TARGET_MEDIAN_PCT, TARGET_P90_PCT, TARGET_SPEEDUP_POINTS, anchor_on_baseline, median_over_repeats

from .render import plain, table

VALIDATION = Path("real_backend") / "validation"
TRAINER_PROFILE = Path("real_backend") / "profile_trainer_cpu.json"


def _read(root: Path, name: str) -> pd.DataFrame:
    path = root / VALIDATION / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; `lssim validate --policies all --repeats 5 --reprofile` writes it")
    return pd.read_parquet(path) if name.endswith(".parquet") else pd.read_csv(path)


def anchored(by_repeat: pd.DataFrame) -> pd.DataFrame:
    """Per-step medians with every prediction scaled by the baseline's measured/predicted speed (baseline dropped)."""
    steps, _ = median_over_repeats(anchor_on_baseline(by_repeat))
    return steps


def fidelity_numbers(root: Path) -> tuple[dict, dict, pd.DataFrame]:
    """Scalars and tables of the sim-vs-real validation, and its per-step frame (for the scatter figure)."""
    summary = _read(root, "summary.csv").set_index("policy")
    steps, noise, by_repeat = (_read(root, f) for f in ("steps.parquet", "noise.parquet", "steps_by_repeat.parquet"))
    level = anchored(by_repeat)
    per_policy = level.groupby("policy")["ape_pct"]
    summary["anchored_median"], summary["anchored_p90"] = per_policy.median(), per_policy.quantile(0.9)
    signed = (steps["predicted_seconds"] / steps["measured_seconds"] - 1) * 100
    others = summary.drop(index="baseline")
    meets = (others["anchored_median"] <= TARGET_MEDIAN_PCT) & (others["anchored_p90"] <= TARGET_P90_PCT)
    out = {"real.policies": len(summary), "real.steps": len(steps), "real.repeats": int(steps["repeats"].max()),
           "real.steps_per_run": int(summary["steps"].max()),
           "real.median_ape": float(steps["ape_pct"].median()), "real.p90_ape": float(np.percentile(steps["ape_pct"], 90)),
           "real.median_signed": float(signed.median()),
           "real.anchored_median_ape": float(level["ape_pct"].median()),
           "real.anchored_p90_ape": float(np.percentile(level["ape_pct"], 90)),
           "real.anchored_policies": len(others), "real.anchored_meeting_targets": int(meets.sum()),
           "real.anchored_missing": ", ".join(others.index[~meets]) or "none",
           "real.speedup_error_max": float(summary["speedup_error_points"].abs().max()),
           "real.speedup_error_worst": str(summary["speedup_error_points"].abs().idxmax()),
           "real.speedup_within_target": int((summary["speedup_error_points"].abs() <= TARGET_SPEEDUP_POINTS).sum()),
           "real.noise_median": float(noise["ape_pct"].median()), "real.noise_p90": float(np.percentile(noise["ape_pct"], 90)),
           "real.spearman_min": float(summary["finish_order_spearman"].min()),
           "target.median": TARGET_MEDIAN_PCT, "target.p90": TARGET_P90_PCT, "target.speedup_points": TARGET_SPEEDUP_POINTS}
    for policy, row in summary.iterrows():
        out.update({f"real.{policy}.speedup_measured": plain(row["speedup_measured"]),
                    f"real.{policy}.speedup_predicted": plain(row["speedup_predicted"]),
                    f"real.{policy}.median_ape": plain(row["makespan_median_ape_pct"])})
    frame = summary.reset_index().assign(anchored_median=lambda d: d["anchored_median"] / 100,
                                         anchored_p90=lambda d: d["anchored_p90"] / 100,
                                         median=lambda d: d["makespan_median_ape_pct"] / 100,
                                         p90=lambda d: d["makespan_p90_ape_pct"] / 100)
    frame = frame.rename(columns={"median": "median APE", "p90": "p90 APE", "anchored_median": "level-set median",
                                  "anchored_p90": "level-set p90", "finish_order_spearman": "finish order rho",
                                  "speedup_measured": "speedup measured", "speedup_predicted": "speedup predicted",
                                  "speedup_error_points": "error (points)"})
    tables = {"fidelity": table(frame, {"policy": "", "median APE": ".1%", "p90 APE": ".1%", "level-set median": ".1%",
                                        "level-set p90": ".1%", "finish order rho": ".2f", "speedup measured": ".2f",
                                        "speedup predicted": ".2f", "error (points)": "+.1f"}),
              "stages": stages_table(root), "counterfactual": counterfactual_table(root)}
    return out, tables, steps


def stages_table(root: Path) -> dict:
    stages = _read(root, "stages.csv")
    for col in ("median_ape_pct", "p90_ape_pct", "median_signed_pct", "worst_policy_median_ape_pct"):
        stages[col] = stages[col] / 100
    stages = stages.rename(columns={"stage": "cost model", "median_ape_pct": "median APE", "p90_ape_pct": "p90 APE",
                                    "median_signed_pct": "median signed", "worst_policy_median_ape_pct": "worst policy median",
                                    "largest_speedup_error_points": "largest speedup error (points)"})
    return table(stages, {"cost model": "", "median APE": ".1%", "p90 APE": ".1%", "median signed": "+.1%",
                          "worst policy median": ".1%", "largest speedup error (points)": ".1f"})


def counterfactual_table(root: Path) -> dict:
    cf = _read(root, "counterfactual.csv")
    cf = cf[cf["modelled_fraction"] > 0].rename(columns={
        "modelled_fraction": "modelled", "length_ks": "length KS", "length_wasserstein_tokens": "Wasserstein (tokens)",
        "length_measured_mean": "mean measured", "length_modelled_mean": "mean modelled",
        "speedup_measured": "speedup measured", "speedup_predicted_from_baseline_trace": "speedup predicted"})
    return table(cf, {"policy": "", "modelled": ".0%", "length KS": ".2f", "Wasserstein (tokens)": ".1f",
                      "mean measured": ".0f", "mean modelled": ".0f", "speedup measured": ".2f", "speedup predicted": ".2f"})


def trainer_numbers(root: Path) -> dict:
    path = root / TRAINER_PROFILE
    fit = json.loads(path.read_text())["fit_error"]["cpu"]
    both, held = fit["fit"]["logprob_plus_update"], fit["held_out"]["logprob_plus_update"]
    return {"trainer.fit_median": both["median_ape_pct"], "trainer.fit_p90": both["p90_ape_pct"],
            "trainer.fit_points": both["n_points"], "trainer.heldout_median": held["median_ape_pct"],
            "trainer.heldout_points": held["n_points"]}


def gpu_numbers() -> tuple[dict, pd.DataFrame]:
    """The kernel-level cost model against the held-out GPU measurements, fitted afresh."""
    heldout, _, sums = heldout_table()
    own = heldout["source"] == "lssim H100 torch"
    out = {"gpu.heldout_points": int(own.sum()), "gpu.within_10": int((heldout.loc[own, "ape_pct"] <= 10).sum()),
           "gpu.vidur_model": VIDUR_HELD_OUT}
    for kind, g in heldout.groupby("kind"):
        key = f"gpu.{kind.replace(' ', '_')}"  # decode, prefill (own profiles); decode_layers, prefill_layers (Vidur)
        out.update({f"{key}.median": float(g["ape_pct"].median()), f"{key}.max": float(g["ape_pct"].max()),
                    f"{key}.min": float(g["ape_pct"].min()), f"{key}.points": len(g),
                    f"{key}.tokens_min": plain(g["tokens"].min()), f"{key}.tokens_max": plain(g["tokens"].max())})
        if g["roofline_ape_pct"].notna().any():
            out.update({f"{key}.roofline_median": float(g["roofline_ape_pct"].median()),
                        f"{key}.roofline_max": float(g["roofline_ape_pct"].max())})
    tp1 = sums[sums["tp"] == 1]
    ape = (tp1["predicted_s"] / tp1["measured_s"] - 1).abs() * 100
    out.update({"gpu.vidur_all.points": len(ape), "gpu.vidur_all.median": float(ape.median()),
                "gpu.vidur_all.p90": float(np.percentile(ape, 90)), "gpu.vidur_all.max": float(ape.max())})
    return out, heldout


def measured_all(root: Path) -> tuple[dict, dict]:
    """Every measured-data number (flat keys, tables under "tables") and the frames the figures draw."""
    numbers, tables, steps = fidelity_numbers(root)
    numbers.update(trainer_numbers(root))
    gpu, heldout = gpu_numbers()
    numbers.update(gpu)
    numbers = {k: plain(v) for k, v in numbers.items()}
    numbers["tables"] = tables
    return numbers, {"fidelity_steps": steps, "gpu_heldout": heldout}


__all__ = ["measured_all", "fidelity_numbers", "gpu_numbers", "trainer_numbers"]
