"""Rebuild the paper: every number and figure from fresh simulator runs and the committed measurements.

    python -m paper.build                  # paper/paper.md, paper/numbers.json, paper/figures/*.png (~290 s CPU)
    python -m paper.build --quick --out DIR   # the same code on 3 steps of each trace and 16 devices (seconds)

paper/template.md is the text; its placeholders ({{key:format}}, {{table:name}}) are filled from the numbers the
build computes (paper.simulated: fresh runs; paper.measured: committed real-engine outputs and a fresh fit of the
GPU kernel model), and numbers.json keeps those numbers, so `paper.render.render(template, numbers)` is paper.md
(tests/test_paper.py checks it). Every figure the template shows must be one the build draws, and every one drawn
must be shown. The files are written under temporary names and renamed into place: an error leaves the last
complete build as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from .figures import make_figures
from .measured import measured_all
from .render import placeholders, render
from .simulated import BuildConfig, simulate_all

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "paper"
TEMPLATE = PAPER / "template.md"
FIGURE_REF = re.compile(r"\]\(figures/([A-Za-z0-9_]+)\.png\)")


def compute(cfg: BuildConfig, root: Path = ROOT, say=print) -> tuple[dict, dict[str, tuple[bytes, str]]]:
    """The numbers (JSON-able; tables under "tables") and the figures (name -> PNG, caption) of one build."""
    numbers, sim_runs = simulate_all(root, cfg, say)
    say("measured data: validation, trainer profile, GPU kernel fit")
    measured_numbers, measured_frames = measured_all(root)
    tables = {**numbers.pop("tables"), **measured_numbers.pop("tables")}
    clash = set(numbers) & set(measured_numbers)
    if clash:
        raise ValueError(f"the simulated and measured numbers both define {', '.join(sorted(clash))}")
    numbers.update(measured_numbers)
    numbers["tables"] = tables
    numbers["config.quick"] = cfg.steps is not None
    say("figures")
    figures = make_figures(sim_runs, measured_frames, numbers["fig.timeline_step"], cfg.plan_trace)
    numbers.update({f"caption.{name}": caption for name, (_, caption) in figures.items()})
    return numbers, figures


def check_figures(template: str, figures: dict) -> None:
    """Every figure the template shows is drawn, and every figure drawn is shown."""
    shown = set(FIGURE_REF.findall(template))
    if shown - set(figures):
        raise ValueError(f"{TEMPLATE.name} shows figures the build does not draw: {', '.join(sorted(shown - set(figures)))}")
    if set(figures) - shown:
        raise ValueError(f"the build draws figures {TEMPLATE.name} does not show: {', '.join(sorted(set(figures) - shown))}")


def write(out: Path, text: str, numbers: dict, figures: dict) -> None:
    """paper.md, numbers.json and figures/ under `out`, each written beside its place and renamed into it."""
    out.mkdir(parents=True, exist_ok=True)
    staging = out / ".figures.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name, (png, _) in figures.items():
        (staging / f"{name}.png").write_bytes(png)
    for name, content in (("numbers.json", json.dumps(numbers, indent=1, sort_keys=True, allow_nan=False) + "\n"),
                          ("paper.md", text)):
        tmp = out / f".{name}.tmp"
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, out / name)
    old = out / ".figures.old"
    shutil.rmtree(old, ignore_errors=True)
    if (out / "figures").exists():
        os.replace(out / "figures", old)
    os.replace(staging, out / "figures")
    shutil.rmtree(old, ignore_errors=True)


def build(out: Path, cfg: BuildConfig, say=print) -> dict:
    """Compute, render and write one build; returns its numbers. Nothing is written if any step fails."""
    template = TEMPLATE.read_text(encoding="utf-8")
    numbers, figures = compute(cfg, say=say)
    check_figures(template, figures)
    numbers = json.loads(json.dumps(numbers, allow_nan=False))  # what numbers.json will hold, exactly
    text = render(template, numbers)
    write(out, text, numbers, figures)
    return numbers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 steps of each trace, 16 devices: the test's build")
    ap.add_argument("--out", type=Path, default=PAPER, help="folder for paper.md, numbers.json, figures/ (default paper/)")
    ap.add_argument("--workers", type=int, default=2, help="simulation processes (default 2)")
    args = ap.parse_args(argv)
    cfg = BuildConfig.quick() if args.quick else BuildConfig()
    cfg.workers = args.workers
    start = time.perf_counter()
    try:
        numbers = build(args.out, cfg, say=lambda msg: print(f"[{time.perf_counter() - start:5.1f} s] {msg}", flush=True))
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"paper.build: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/paper.md ({len(placeholders(TEMPLATE.read_text()))} placeholders, "
          f"{len(numbers) - 1} numbers, {len(numbers['tables'])} tables) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
