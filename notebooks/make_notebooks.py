"""Writes the exploration notebooks from plain Python, so their source reviews as code.

    python notebooks/make_notebooks.py     # then open notebooks/*.ipynb in Jupyter

Each workflow notebook is a text file `notebooks/src/NAME.py` in jupytext's py:percent format (`# %%` starts a code
cell, `# %% [markdown]` a markdown cell whose lines are `# `-commented), so `jupytext --to ipynb` reads it too; this
script needs no jupytext. The .ipynb files are written without outputs (the tests execute them).
"""

import re
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent
SOURCES = HERE / "src"

POLICY_SWEEP = [
    new_markdown_cell("# Policy sweep: what HADB's knobs buy on a trace\n\n"
                      "Replays a reference trace under HADB with different short-step batch factors and cluster sizes, "
                      "against baseline, oracle and the per-step lower bound. Set `LSSIM_NOTEBOOK_FAST=1` for a quick run "
                      "(the tests do)."),
    new_code_cell("import os\n"
                  "import matplotlib.pyplot as plt\n"
                  "import pandas as pd\n"
                  "from lssim.analysis.replay import SimSetup, replay, summarize\n"
                  "from lssim.traces.trace import load_trace\n\n"
                  "FAST = bool(os.environ.get('LSSIM_NOTEBOOK_FAST'))\n"
                  "ROOT = next(p for p in [os.getcwd(), os.path.dirname(os.getcwd())] if os.path.isdir(os.path.join(p, 'traces')))\n"
                  "trace = load_trace(os.path.join(ROOT, 'traces', 'math7b.parquet'))\n"
                  "steps = 10 if FAST else None\n"
                  "factors = [1.0, 2.0] if FAST else [1.0, 1.5, 2.0, 3.0, 4.0]\n"
                  "instances = [8] if FAST else [4, 8, 16]"),
    new_markdown_cell("## Speedup over baseline as the short-step batch grows"),
    new_code_cell("rows = []\n"
                  "for n in instances:\n"
                  "    specs = [f'hadb(short_batch_factor={f})' for f in factors]\n"
                  "    table = summarize(replay(trace, specs, SimSetup(n_instances=n), steps=steps))\n"
                  "    for f, spec in zip(factors, specs):\n"
                  "        rows.append({'instances': n, 'short_batch_factor': f, 'speedup': table.loc[spec, 'speedup'],\n"
                  "                     'bound_eff': table.loc[spec, 'lower_bound_efficiency'],\n"
                  "                     'oracle_speedup': table.loc['oracle', 'speedup']})\n"
                  "sweep = pd.DataFrame(rows)\n"
                  "sweep"),
    new_code_cell("fig, ax = plt.subplots(figsize=(6, 3.5))\n"
                  "for n, g in sweep.groupby('instances'):\n"
                  "    ax.plot(g['short_batch_factor'], g['speedup'], marker='o', label=f'hadb, {n} instances')\n"
                  "    ax.axhline(g['oracle_speedup'].iloc[0], ls=':', lw=1, color=ax.lines[-1].get_color())\n"
                  "ax.axhline(1.0, color='k', lw=0.8)\n"
                  "ax.set_xlabel('short-step batch factor'); ax.set_ylabel('speedup per trained group'); ax.legend()\n"
                  "fig.tight_layout()"),
    new_markdown_cell("## Per step: makespan against the lower bound"),
    new_code_cell("results = replay(trace, ['hadb'], SimSetup(), steps=steps)\n"
                  "fig, ax = plt.subplots(figsize=(7, 3.5))\n"
                  "for name, res in results.items():\n"
                  "    ax.plot(res.steps['step'], res.steps['rollout_seconds'], label=name)\n"
                  "ax.plot(results['baseline'].steps['step'], results['baseline'].steps['lower_bound_seconds'], 'k--', label='lower bound (baseline)')\n"
                  "ax.set_xlabel('step'); ax.set_ylabel('rollout seconds'); ax.legend()\n"
                  "fig.tight_layout()\n"
                  "summarize(results)[['rollout_seconds', 'speedup', 'lower_bound_efficiency', 'long_tail_ratio', 'mean_running', 'exact_fraction']]"),
]


def percent_cells(text: str) -> list:
    """The cells of a py:percent file: `# %%` code, `# %% [markdown]` markdown (its `# ` prefixes removed)."""
    cells = []
    for chunk in re.split(r"^# %%", text, flags=re.M)[1:]:
        header, _, body = chunk.partition("\n")
        body = body.strip("\n")
        if header.strip() == "[markdown]":
            cells.append(new_markdown_cell("\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())))
        elif header.strip():
            raise ValueError(f"unknown cell header '# %%{header}'")
        else:
            cells.append(new_code_cell(body))
    return cells


def notebooks() -> dict[str, list]:
    """Every notebook this script writes: name -> cells."""
    out = {"policy_sweep": POLICY_SWEEP}
    for src in sorted(SOURCES.glob("*.py")):
        out[src.stem] = percent_cells(src.read_text())
    return out


def write(name: str, cells) -> Path:
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    path = HERE / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    for name, cells in notebooks().items():
        print(write(name, cells))
