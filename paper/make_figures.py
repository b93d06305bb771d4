"""Regenerates every figure and table of the paper from the shipped traces and results.

    python paper/make_figures.py            # writes paper/figures/*.png and paper/tables/*.md

Each table is also printed with the command that reproduces its numbers from the shell.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lssim.policy import available_policies  # noqa: E402
from lssim.replay import SimSetup, replay, summarize  # noqa: E402
from lssim.trace import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACES = ["math7b", "longtail32k"]
COLUMNS = ["rollout_seconds", "speedup", "tokens_per_second", "lower_bound_efficiency", "long_tail_ratio", "mean_running",
           "truncated_fraction", "policy_stopped_fraction", "off_policy_token_fraction", "effective_group_fraction", "exact_fraction"]


def markdown(table) -> str:
    cols = [c for c in COLUMNS if c in table.columns]
    head = "| policy | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n"
    fmt = lambda v: f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3f}"  # noqa: E731
    return head + "".join(f"| {name} | " + " | ".join(fmt(row[c]) for c in cols) + " |\n" for name, row in table.iterrows())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="replay only this many steps of each trace (quick check)")
    args = ap.parse_args(argv)
    figures, tables = ROOT / "paper" / "figures", ROOT / "paper" / "tables"
    figures.mkdir(parents=True, exist_ok=True)
    tables.mkdir(parents=True, exist_ok=True)
    policies = [p for p in available_policies() if p not in ("baseline", "oracle")]
    for name in TRACES:
        trace = load_trace(ROOT / "traces" / f"{name}.parquet")
        results = replay(trace, policies, SimSetup(), steps=args.steps)
        table = summarize(results)
        cmd = f"lssim replay traces/{name}.parquet " + " ".join(f"--policy {p}" for p in policies)
        (tables / f"replay_{name}.md").write_text(f"Command: `{cmd}`\n\n" + markdown(table))
        print(f"## {name}\n{cmd}\n{markdown(table)}")
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for policy, res in results.items():
            ax.plot(res.steps["step"], res.steps["rollout_seconds"], label=policy, lw=1.2)
        bound = results["baseline"].steps
        ax.plot(bound["step"], bound["lower_bound_seconds"], "k--", lw=1, label="lower bound (baseline's work)")
        ax.set_xlabel("step")
        ax.set_ylabel("rollout seconds")
        ax.set_title(f"{name}: per-step rollout time")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(figures / f"steps_{name}.png", dpi=130)
        plt.close(fig)


if __name__ == "__main__":
    main()
