"""Writing results: parquet frames and a JSON of metadata, all or nothing.

A results folder holds `summary.parquet` (one row per policy), `<policy>/responses.parquet` and
`<policy>/steps.parquet`, and `meta.json`. It is written beside its destination and renamed into
place, so an interrupted run leaves either the old folder or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd


def atomic_write(path: str | os.PathLike, write) -> None:
    """Call `write(tmp)` on a temporary file beside `path`, then move it over `path`: readers see the old
    file or the new one, and a failed write leaves nothing behind."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def policy_dirname(name: str) -> str:
    """A file-system-safe folder name for a policy spec such as `hadb(short_batch_factor=3)+april`."""
    return re.sub(r"[^A-Za-z0-9_.+=-]+", "_", name).strip("_") or "policy"


@contextmanager
def atomic_directory(out_dir: str | os.PathLike):
    """Yield a fresh temporary folder beside `out_dir` to fill; when the block ends it replaces `out_dir`
    (readers see the old folder or the new one, never half of one); on an error it is removed."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_results(out_dir: str | os.PathLike, results: dict, summary: pd.DataFrame, meta: dict | None = None) -> Path:
    with atomic_directory(out_dir) as tmp:
        summary.to_parquet(tmp / "summary.parquet")
        for name, res in results.items():
            sub = tmp / policy_dirname(name)
            sub.mkdir()
            res.responses.to_parquet(sub / "responses.parquet")
            res.steps.to_parquet(sub / "steps.parquet")
        all_meta = {"policies": {name: res.meta for name, res in results.items()}, **(meta or {})}
        (tmp / "meta.json").write_text(json.dumps(all_meta, indent=2, default=str))
    return Path(out_dir)


def read_results(out_dir: str | os.PathLike) -> tuple[pd.DataFrame, dict[str, dict[str, pd.DataFrame]]]:
    """The summary and, per policy folder, its `responses` and `steps` frames."""
    out = Path(out_dir)
    summary = pd.read_parquet(out / "summary.parquet")
    frames = {d.name: {"responses": pd.read_parquet(d / "responses.parquet"), "steps": pd.read_parquet(d / "steps.parquet")}
              for d in sorted(out.iterdir()) if d.is_dir()}
    return summary, frames
