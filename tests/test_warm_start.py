"""A warm replay's fixed cost (docs/performance.md, Cold start and fixed cost): what a simulation command's process
starts of numba, what it imports of lssim, and what it leaves to its exit. Each check runs in a fresh interpreter, as
a user's command does; none times anything (the figures are measured by the commands in docs/performance.md)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# 160 responses x 3 runs, on the compiled kernels (PYTHON_ROUTE_RESPONSES 0): numba starts as in a big replay
COMPILED_REPLAY = ("import lssim.kernels; lssim.kernels.PYTHON_ROUTE_RESPONSES = 0\n"
                   "from lssim.cli import main\n"
                   "main(['replay', 'traces/real_cpu_baseline.parquet', '--policy', 'hadb'])\n")
# numba code of a user's, compiled in the same process afterwards: BLAS (np.dot), LAPACK (np.linalg) and np.convolve
USER_NUMBA = """
import numba, numpy as np
@numba.njit
def user(a):
    return np.dot(a, a), np.linalg.inv(a), np.convolve(a[0], a[1])
dot, inv, convolved = user(np.array([[2.0, 1.0], [1.0, 1.0]]))
"""
REPORT = """
import numba.np.arraymath
print(json.dumps({"scipy_linalg": "scipy.linalg" in sys.modules, "blas_probe": numba.np.arraymath._HAVE_BLAS,
                  "modules": sorted(m for m in sys.modules if m.startswith("lssim")), "frozen": gc.get_freeze_count()}))
"""


def _python(code: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-c", f"import gc, json, sys\n{code}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    return out


def _report(out: subprocess.CompletedProcess) -> tuple[str, dict]:
    """(what the command printed, the REPORT line after it)."""
    *printed, last = out.stdout.splitlines()
    return "\n".join(printed), json.loads(last)


def test_a_replay_starts_numba_without_scipys_blas_probe_and_prints_what_it_prints_with_it():
    """The probe imports scipy.linalg; a replay's kernels use no BLAS: without it the replay prints the same table."""
    plain, without = _report(_python(COMPILED_REPLAY + REPORT))
    assert not without["scipy_linalg"] and not without["blas_probe"]
    probed, probe = _report(_python("import numba.np.arraymath\n" + COMPILED_REPLAY + REPORT))  # the probe ran first
    assert probe["scipy_linalg"] and probe["blas_probe"]
    assert plain == probed


def test_numba_code_of_a_users_compiles_and_runs_alike_after_a_replay_without_the_probe():
    """np.dot and np.linalg import scipy when typed, as they do anywhere; np.convolve loops instead of calling BLAS."""
    printed = "print(json.dumps([dot.tolist(), inv.tolist(), convolved.tolist()]))"
    after_replay = json.loads(_python(COMPILED_REPLAY + USER_NUMBA + printed).stdout.splitlines()[-1])
    alone = json.loads(_python(USER_NUMBA + printed).stdout.splitlines()[-1])
    expected = [[[5.0, 3.0], [3.0, 2.0]], [[1.0, -1.0], [-1.0, 2.0]], [2.0, 3.0, 1.0]]
    for got in (after_replay, alone):
        assert all(np.allclose(g, e) for g, e in zip(got, expected))


def test_a_library_process_keeps_numbas_blas_probe():
    """Only the `lssim` simulation commands declare lssim_kernels_only: a kernel called from Python code leaves numba's
    start as numba makes it."""
    _, report = _report(_python("import numpy as np\nfrom lssim.sim.assign import least_work\n"
                                "least_work(np.zeros(2, np.int64), np.array([3, 1, 1]))\n" + REPORT))
    assert report["scipy_linalg"] and report["blas_probe"]


def test_a_roofline_replay_imports_no_other_cost_model_nor_the_shared_host():
    _, report = _report(_python(COMPILED_REPLAY + REPORT))
    unused = {"lssim.cost.operators", "lssim.cost.profiled", "lssim.sim.shared_host"}
    assert "lssim.cost.roofline" in report["modules"] and unused.isdisjoint(report["modules"])


# Every name lssim.cost has re-exported, and the module that defines it.
EXPORTED = {"CostModel": "lssim.loop.cost_contracts", "ModelSpec": "lssim.cost.catalog", "Hardware": "lssim.cost.catalog",
            "MODELS": "lssim.cost.catalog", "HARDWARE": "lssim.cost.catalog", "SHAPES": "lssim.cost.catalog",
            "DecoderShape": "lssim.cost.catalog", "kv_capacity_tokens": "lssim.cost.catalog",
            "RooflineCostModel": "lssim.cost.roofline", "ProfiledCostModel": "lssim.cost.profiled",
            "batch_features": "lssim.cost.profiled", "solo_decode_time": "lssim.cost.protocol",
            "peak_tokens_per_second": "lssim.cost.protocol", "SpeculativeCost": "lssim.cost.speculative",
            "KernelProfile": "lssim.cost.operators", "OperatorCostModel": "lssim.cost.operators"}


def test_lssim_cost_exports_each_public_name_from_its_module_and_refuses_others():
    import lssim.cost

    assert sorted(lssim.cost.__all__) == sorted(EXPORTED)
    for name, module in EXPORTED.items():
        assert getattr(lssim.cost, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(ImportError, match="NoSuchModel"):
        from lssim.cost import NoSuchModel  # noqa: F401


def test_the_command_run_as_the_process_leaves_what_it_made_to_the_exit_and_a_call_from_python_does_not():
    """`lssim ...` (main() with the process's own arguments) freezes what it made, so that the interpreter's last
    collections skip it; main(argv) called from Python code leaves the collector as it was."""
    as_process = "sys.argv = ['lssim', 'trace', 'info', 'traces/real_cpu_baseline.parquet']\nfrom lssim.cli import main\nmain()\n"
    _, process = _report(_python(as_process + REPORT))
    assert process["frozen"] > 0
    _, called = _report(_python("from lssim.cli import main\nmain(['trace', 'info', 'traces/real_cpu_baseline.parquet'])\n"
                                + REPORT))
    assert called["frozen"] == 0
