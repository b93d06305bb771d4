"""Cold start and fixed cost (docs/performance.md): what a command imports, the compile announcement on a cold numba
cache, and kernels compiled once for their declared types. Each check runs in a fresh interpreter, as a user's
command does; none times anything (the figures are measured by the commands in docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lssim.kernels import COMPILING, KERNEL_MODULES, REPLAY_KERNELS, KernelFunction, kernels

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numba", "numpy", "pandas", "pyarrow", "torch", "matplotlib", "scipy", "vllm")
ANNOUNCED = COMPILING.split("{")[0]


def _python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300)


def _imported_by(argv: list[str]) -> set[str]:
    """The top-level packages a fresh interpreter has imported once `lssim ARGV` has parsed its arguments and exited."""
    out = _python(f"""
import json, sys
from lssim.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})), file=sys.stderr)
""")
    return set(json.loads(out.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], ["replay", "--help"], ["sweep", "--help"], ["no-such-command"]])
def test_help_and_usage_errors_import_no_heavy_package(argv):
    assert _imported_by(argv).isdisjoint(HEAVY)


def test_a_command_imports_what_its_options_need():
    assert "numpy" in _imported_by(["synth", "--help"])  # its --preset help lists lssim.traces.synth's presets


LEAST_WORK = """
import numpy as np
from lssim.sim.assign import least_work
print(least_work(np.zeros(3, np.int64), np.array([5, 3, 2, 7])).tolist())
"""


def test_a_cold_cache_announces_the_compile_once_and_a_warm_one_says_nothing(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    cold = _python(LEAST_WORK, env)
    assert cold.returncode == 0, cold.stderr
    assert cold.stdout.strip() == "[0, 1, 2, 2]"
    assert cold.stderr.count(ANNOUNCED) == 1
    assert str(tmp_path) in cold.stderr  # where the compiled code goes
    warm = _python(LEAST_WORK, env)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.stdout
    assert ANNOUNCED not in warm.stderr


def test_one_compile_serves_writable_and_read_only_arrays():
    from lssim.sim.assign import _least_work

    sizes = np.array([4, 1, 3], np.int64)
    read_only = sizes.copy()
    read_only.setflags(write=False)
    assert _least_work(np.zeros(2, np.int64), sizes).tolist() == _least_work(np.zeros(2, np.int64), read_only).tolist()
    assert set(_least_work.compiled.signatures) <= set(_least_work.compiled.declared)  # no specialization of numba's own


def test_a_kernel_compiles_each_declared_signature_it_is_called_with():
    from lssim.sim.assign import _least_work

    assert _least_work(np.zeros(2), np.array([1.5, 2.0, 0.5])).tolist() == [0, 1, 0]  # float work: `more`'s signature
    assert _least_work(np.zeros(2, np.int64), np.array([1, 2, 1])).tolist() == [0, 1, 0]
    assert set(_least_work.compiled.signatures) == set(_least_work.compiled.declared)


def test_a_call_no_declared_signature_takes_is_refused_naming_the_types():
    from lssim.sim.assign import _least_work

    with pytest.raises(TypeError, match="array\\(int64, 1d, A\\)"):
        _least_work(np.zeros(4, np.int64)[::2], np.array([1], np.int64))  # strided: not the declared C layout


def test_every_replay_kernel_is_declared_and_every_kernel_module_holds_kernels():
    found = {(k.__module__, k.__name__) for k in kernels()}
    assert {tuple(name.split(":")) for _, names in REPLAY_KERNELS for name in names} <= found
    assert {module for module, _ in found} == set(KERNEL_MODULES)
    assert all(isinstance(k, KernelFunction) and k.signatures for k in kernels())


def test_no_kernel_is_left_to_plain_numba():
    """Every numba kernel of lssim is declared with lssim.kernels.kernel (a plain @njit compiles once per type it meets,
    and is not in KERNEL_MODULES for `lssim warmup`)."""
    plain = [f"{p.relative_to(ROOT)}: {line.strip()}" for p in sorted((ROOT / "lssim").rglob("*.py"))
             for line in p.read_text().splitlines() if line.lstrip().startswith(("@njit", "@jit", "@numba."))]
    assert plain == []


SMALL_REPLAY = ["replay", "traces/real_cpu_baseline.parquet", "--policy", "hadb"]  # 160 responses, 3 runs


def _replay(env: dict, compiled: bool) -> subprocess.CompletedProcess:
    """SMALL_REPLAY in a fresh interpreter: on the compiled kernels (PYTHON_ROUTE_RESPONSES 0), or as `lssim` runs it."""
    forced = "import lssim.kernels; lssim.kernels.PYTHON_ROUTE_RESPONSES = 0; " if compiled else ""
    return _python(f"{forced}from lssim.cli import main; main({SMALL_REPLAY!r})", env)


def test_a_cold_replay_compiles_its_kernels_side_by_side_announced_once_and_replays_as_a_warm_one(tmp_path):
    """The first compiled replay on an empty cache compiles REPLAY_KERNELS (in forked processes where there are cores),
    says so once, and prints what any later replay prints, on either route; the later one compiles nothing."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    cold = _replay(env, compiled=True)
    assert cold.returncode == 0, cold.stderr
    assert cold.stderr.count(ANNOUNCED) == 1
    cached = {p.name.split("-")[0] for p in tmp_path.rglob("*.nbi")}  # numba's index files: MODULE.FUNCTION-LINE...
    replayed = [name.split(":") for _, names in REPLAY_KERNELS for name in names]
    assert {f"{module.rsplit('.', 1)[-1]}.{function}" for module, function in replayed} <= cached
    warm = _replay(env, compiled=True)
    assert warm.returncode == 0, warm.stderr
    assert ANNOUNCED not in warm.stderr
    assert warm.stdout == cold.stdout
    python = _replay(env, compiled=False)
    assert python.returncode == 0, python.stderr
    assert python.stdout == cold.stdout


def test_a_small_replay_runs_the_python_route_without_numba(tmp_path):
    """Below PYTHON_ROUTE_RESPONSES a replay never imports numba (nor the scipy and llvmlite its start loads), so an
    empty cache compiles nothing and says nothing."""
    imported = _imported_by(SMALL_REPLAY)
    assert {"numpy", "pandas"} <= imported
    assert imported.isdisjoint({"numba", "llvmlite", "scipy"})
    cold = _replay({"NUMBA_CACHE_DIR": str(tmp_path)}, compiled=False)
    assert cold.returncode == 0, cold.stderr
    assert ANNOUNCED not in cold.stderr and not list(tmp_path.rglob("*.nbi"))
