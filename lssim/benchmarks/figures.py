"""The benchmark's figures as ratios: each measured figure against its goal and against the previous release's.

The previous release's figures are a small data file (lssim/benchmarks/data/previous_release.json) that names the
command and date that produced them; `python -m lssim.benchmarks.sim_speed --write-release FILE` writes this run's
figures in the same form, to become the next release's file.
"""

from __future__ import annotations

import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path

PREVIOUS_RELEASE = Path(__file__).resolve().parent / "data" / "previous_release.json"
RELEASE_KEYS = ("release", "date", "command", "machine", "figures")


@dataclass(frozen=True)
class Figure:
    """One measured figure: `key` names it in the release files (e.g. "sim.baseline"); `higher_is_better` says
    which way its goal points (a rate must reach it, a time or a memory must stay under it)."""

    key: str
    value: float
    unit: str
    goal: float | None = None
    higher_is_better: bool = True

    def met(self) -> bool | None:
        if self.goal is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal


def load_release(path: str | Path = PREVIOUS_RELEASE) -> dict:
    """A release file: {"release", "date", "command", "machine", "figures": {key: value}}; a missing or malformed
    one is an error naming what is wrong (the benchmark's ratios would silently vanish otherwise)."""
    path = Path(path)
    try:
        release = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such release file (--previous names one)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    missing = [k for k in RELEASE_KEYS if k not in release] if isinstance(release, dict) else list(RELEASE_KEYS)
    if missing:
        raise ValueError(f"{path}: a release file needs {', '.join(RELEASE_KEYS)}; missing {', '.join(missing)}")
    if not isinstance(release["figures"], dict):
        raise ValueError(f"{path}: figures must be an object of figure names to numbers")
    bad = {k: v for k, v in release["figures"].items() if not isinstance(v, (int, float)) or isinstance(v, bool)}
    if bad:
        raise ValueError(f"{path}: figures must be numbers; not: {', '.join(sorted(bad))}")
    return release


class Report:
    """Collects the figures of one benchmark run and prints each as it is measured, with its two ratios."""

    def __init__(self, previous: dict | None, out=sys.stdout):
        self.previous = previous
        self.figures: list[Figure] = []
        self.checks: dict[str, bool] = {}  # pass/fail checks that are no figure (a resumed sweep's table is the uncut one's)
        self.out = out

    def add(self, figure: Figure, label: str | None = None) -> Figure:
        self.figures.append(figure)
        print(f"    {label or figure.key}: {self.ratios(figure)}", file=self.out)
        return figure

    def check(self, name: str, ok: bool) -> None:
        self.checks[name] = bool(ok)
        print(f"    check {name}: {'passed' if ok else 'FAILED'}", file=self.out)

    def ratios(self, figure: Figure) -> str:
        """'measured/goal 1.23 (met); measured/previous 1.05 (previous 1.02M responses/s)'."""
        parts = []
        if figure.goal is not None:
            verdict = "met" if figure.met() else "NOT met"
            parts.append(f"measured/goal {figure.value / figure.goal:.3f} ({verdict}; goal {'>=' if figure.higher_is_better else '<='} "
                         f"{_number(figure.goal)} {figure.unit})")
        before = None if self.previous is None else self.previous["figures"].get(figure.key)
        if before:
            better = "better" if (figure.value > before) == figure.higher_is_better else "worse"
            parts.append(f"measured/previous {figure.value / before:.3f} ({better}; previous {_number(before)} {figure.unit})")
        elif self.previous is not None:
            parts.append("no previous figure")
        return f"{_number(figure.value)} {figure.unit}; " + "; ".join(parts)

    def summary(self) -> None:
        """Every figure again in one table, goals missed first named."""
        missed = [f.key for f in self.figures if f.met() is False]
        failed = [name for name, ok in self.checks.items() if not ok]
        print(f"\nfigures: {len(self.figures)}; goals met {sum(f.met() is True for f in self.figures)} of "
              f"{sum(f.met() is not None for f in self.figures)}" + (f"; NOT met: {', '.join(missed)}" if missed else "")
              + (f"; checks passed {len(self.checks) - len(failed)} of {len(self.checks)}" if self.checks else "")
              + (f"; FAILED: {', '.join(failed)}" if failed else ""), file=self.out)
        if self.previous is not None:
            print(f"previous release: {self.previous['release']} ({self.previous['date']}; {self.previous['command']})", file=self.out)

    def write_release(self, path: str | Path, release: str, command: str, machine: str) -> None:
        """This run's figures as a release file (what --previous reads)."""
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        payload = {"release": release, "date": now, "command": command, "machine": machine,
                   "figures": {f.key: f.value for f in self.figures}}
        Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {len(self.figures)} figures to {path}", file=self.out)


def _number(x: float) -> str:
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.4g}k"
    return f"{x:.4g}"
