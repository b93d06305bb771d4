"""How lssim declares its numba kernels: `@kernel(arg types)` instead of `@njit(cache=True)`.

A kernel is compiled for its declared argument types only, once, on its first call (from Python or from another
kernel), then never again: a call with other types is converted to them (a writable array passes where a read-only one
is declared, a literal int where an int64 is) or refused with numba's TypeError naming the types. Without the
declaration numba compiled a kernel once per distinct set of argument types it met -- twice for a read-only and a
writable array, up to three times for a helper called with literal ints -- and each cold compile costs seconds.

Declaring a kernel imports nothing of numba: the types are this module's names for numba's (ArgType, TupleType), and
numba is imported, its CPU target started and the kernel compiled or loaded on the kernel's first compiled call
(lssim.kernel_compiler). Inside `python_route()` a kernel runs its own Python source instead, on numpy arrays: the same
computation to the last bit, without numba's ~0.5 s of import and start, which is what a replay of a small trace
costs most (`lssim replay` takes that route below PYTHON_ROUTE_RESPONSES).

The compiled code is cached on disk where numba caches it: the source's __pycache__, or, where that is not writable
(an install in a read-only site-packages), the user's cache directory (~/.cache/numba), or where neither is, the temp
directory's lssim-numba-UID; NUMBA_CACHE_DIR replaces them all. When a kernel is not in the cache (a fresh clone or
install, an edited kernel, another numba or CPU), one line on stderr (COMPILING) says so, so that the pause is not
mistaken for a hang; the kernels every replay runs (REPLAY_KERNELS) are then compiled side by side, one forked process
per core. `lssim warmup` (`warm_up`) compiles them all ahead, e.g. in an image build. The modules that hold kernels are
KERNEL_MODULES; each is imported only by the route that runs its kernels.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass
from typing import Iterator

import numpy as np


@dataclass(frozen=True)
class ArgType:
    """A declared argument type, named without importing numba (lssim.kernel_compiler.numba_type makes it numba's): a
    scalar of `dtype` (ndim 0), or a C-contiguous array of it, read-only where the kernel only reads it."""

    dtype: str  # int64, uint64, float64 or bool
    ndim: int = 0
    readonly: bool = False


@dataclass(frozen=True)
class TupleType:
    """A declared tuple argument: numba's Tuple of its items' types (a UniTuple where they are all one type)."""

    items: tuple[ArgType, ...]


def tuple_of(*items: ArgType) -> TupleType:
    return TupleType(tuple(items))


# Argument types. A kernel that only reads an array declares it read-only (_IN): numba then takes writable and
# read-only arrays (a pandas column's, a memory map's) with one compile.
I64 = ArgType("int64")
U64 = ArgType("uint64")
F64 = ArgType("float64")
I64S = ArgType("int64", 1)
I64S_IN = ArgType("int64", 1, readonly=True)
F64S = ArgType("float64", 1)
F64S_IN = ArgType("float64", 1, readonly=True)
BOOL = ArgType("bool")
BOOLS = ArgType("bool", 1)
BOOLS_IN = ArgType("bool", 1, readonly=True)
U64S_2D_IN = ArgType("uint64", 2, readonly=True)
I64S_2D = ArgType("int64", 2)
F64S_2D = ArgType("float64", 2)

KERNEL_MODULES = ("lssim.traces.workload_index", "lssim.sim.fastsim_kernels", "lssim.sim.event_kernels", "lssim.sim.bounds",
                  "lssim.sim.assign", "lssim.cost.roofline_arrays", "lssim.sim.requeue_rules", "lssim.sim.requeue_kernels",
                  "lssim.sim.cut_abort_kernels")
# What a replay runs (the Workload's lookups, the batch route, the lower bound, the roofline's spans, the oracle's
# placement), in groups that a cold cache compiles side by side, each with the CPU seconds it took here (2-core VM,
# 2026-11): load_replay_kernels loads them before a replay reads its trace or forks its workers.
REPLAY_KERNELS = (
    (4.7, ("lssim.sim.fastsim_kernels:schedule_records",)),
    (2.3, ("lssim.traces.workload_index:probe", "lssim.traces.workload_index:answer_rows",
           "lssim.traces.workload_index:resampled_rows")),
    (2.3, ("lssim.sim.fastsim_kernels:instance_clocks", "lssim.sim.fastsim_kernels:touched_rank",
           "lssim.sim.fastsim_kernels:ended_rows", "lssim.sim.fastsim_kernels:merge_boundaries",
           "lssim.sim.bounds:bound_terms", "lssim.cost.roofline_arrays:decode_times", "lssim.sim.assign:_least_work")),
)
COMPILING = ("lssim: compiling the simulator's numba kernels, once after an install or a change to them "
             "(about 5 to 10 s; cached in {where})...")
# Below this many responses simulated (the trace's rows times the runs), `lssim replay` runs the kernels' Python source
# (python_route) and never imports numba: its import and CPU-target init (~0.5 s of CPU) cost more than the Python
# loops do there (docs/performance.md, Cold start and fixed cost).
PYTHON_ROUTE_RESPONSES = 6_000
_announced = False
_python_route = False
_blas_probe = True  # lssim_kernels_only() turns it off


class KernelFunction:
    """A kernel: its Python source (`py_func`) and its declared signatures; a call runs numba's compiled code for them
    (`compiled`, made on first use: numba is imported then), or the Python source itself inside python_route()."""

    def __init__(self, py_func, signatures: tuple[tuple, ...]):
        self.py_func = py_func
        self.signatures = signatures
        self.__name__, self.__qualname__, self.__module__ = py_func.__name__, py_func.__qualname__, py_func.__module__
        self.__doc__ = py_func.__doc__
        self._compiled = None
        # numba converts a scalar argument to its declared type; the Python source gets the same numpy scalar
        self._scalars = tuple(_NUMPY_SCALARS[a.dtype] if isinstance(a, ArgType) and a.ndim == 0 else None
                              for a in signatures[0])

    @property
    def compiled(self):
        """numba's dispatcher for this kernel (lssim.kernel_compiler.Kernel), made on first use."""
        if self._compiled is None:
            from lssim.kernel_compiler import dispatcher

            self._compiled = dispatcher(self)
        return self._compiled

    def __call__(self, *args):
        if _python_route:
            return self.run_python(*args)
        return self.compiled(*args)

    def run_python(self, *args):
        """The Python source on `args`, its scalars as numba would take them; integers wrap silently, as in numba."""
        args = [a if kind is None else kind(a) for a, kind in zip(args, self._scalars)] + list(args[len(self._scalars):])
        with np.errstate(over="ignore"):
            return self.py_func(*args)

    def __repr__(self) -> str:
        return f"<kernel {self.__module__}.{self.__qualname__}>"

    def __reduce__(self):  # pickled by name, as a function is (a forked or Ray worker imports its module)
        return _named_kernel, (self.__module__, self.__qualname__)


def _named_kernel(module: str, name: str) -> KernelFunction:
    return vars(importlib.import_module(module))[name]


_NUMPY_SCALARS = {"int64": np.int64, "uint64": np.uint64, "float64": np.float64, "bool": np.bool_}


def kernel(*argtypes, more: tuple[tuple, ...] = ()):
    """Decorate a function as a kernel compiled for `argtypes` (this module's ArgType and TupleType), and for each
    signature in `more` (tuples of them), each only when a call needs it (see the module docstring)."""
    def declare(func) -> KernelFunction:
        return KernelFunction(func, (tuple(argtypes), *map(tuple, more)))
    return declare


def unowned(array: np.ndarray) -> np.ndarray:
    """`array` as a kernel hands it to its helpers: compiled, a view that holds no reference to its memory
    (lssim.kernel_compiler); in Python, the array itself. numba counts a reference (an atomic add, then a subtract)
    for every array a helper takes, each one of a tuple included, at every call: most of what a helper-heavy loop costs
    (schedule_stops: 0.6 of its time). A view without an owner is passed for nothing; the kernel that makes it keeps
    the array itself alive for as long as the view is read."""
    return array


@contextlib.contextmanager
def python_route(on: bool = True) -> Iterator[None]:
    """Within it (where `on`), every kernel runs its Python source, computing what its compiled code computes, to the
    last bit (tests/test_python_route.py), without numba: a small replay's route (PYTHON_ROUTE_RESPONSES)."""
    global _python_route
    was, _python_route = _python_route, bool(on)
    try:
        yield
    finally:
        _python_route = was


def on_python_route() -> bool:
    return _python_route


def lssim_kernels_only() -> None:
    """Declare that this process compiles no numba code but lssim's kernels (the `lssim` simulation commands): numba's
    CPU target then starts without its probe for scipy's BLAS (~0.2 s; lssim.kernel_compiler.start_without_blas_probe).
    It takes effect where called before the first compiled kernel call."""
    global _blas_probe
    _blas_probe = False


def blas_probe_wanted() -> bool:
    return _blas_probe


def announce_compiling(where: str) -> None:
    """Print COMPILING once per process (lssim.kernel_compiler calls it before a compile that is not cached)."""
    global _announced
    if not _announced:
        _announced = True
        print(COMPILING.format(where=where), file=sys.stderr, flush=True)


def kernels() -> list[KernelFunction]:
    """Every kernel of KERNEL_MODULES (importing them)."""
    found = []
    for name in KERNEL_MODULES:
        module = importlib.import_module(name)
        found += [v for v in vars(module).values() if isinstance(v, KernelFunction) and v.__module__ == name]
    return found


def announce_if_cold() -> None:
    """Print COMPILING now if REPLAY_KERNELS' first group (the batch route's scheduler, whose module imports only numpy)
    is not cached: the simulation commands call this before importing pandas and reading their trace, and
    load_replay_kernels then compiles it."""
    if _jit_disabled():
        return
    for k, signature in [_declared(name) for name in REPLAY_KERNELS[0][1]]:
        if not k.is_cached(signature):
            announce_compiling(k._cache.cache_path)
            return


def load_replay_kernels() -> None:
    """Load REPLAY_KERNELS' first signatures, compiling those not cached (announced, side by side): the simulation
    commands call it first, so that the announcement comes before their seconds of reading and indexing, and
    lssim.analysis.replay before it forks, so that each worker inherits the kernels instead of loading, or on a cold
    cache compiling, its own. Nothing on the Python route, or where NUMBA_DISABLE_JIT=1 (the kernels are Python)."""
    if _python_route or _jit_disabled():
        return
    from lssim.kernel_compiler import load

    load([(cost, [_declared(name) for name in names]) for cost, names in REPLAY_KERNELS])


def warm_up() -> tuple[int, int]:
    """Load every kernel's every declared signature, compiling those not cached; returns (signatures, of them
    compiled now)."""
    if _jit_disabled():
        return 0, 0
    from lssim.kernel_compiler import load

    groups = [(cost, [_declared(name) for name in names]) for cost, names in REPLAY_KERNELS]
    grouped = {pair for _, pairs in groups for pair in pairs}
    everything = [(k.compiled, signature) for k in kernels() for signature in k.compiled.declared]
    groups.append((1.0, [pair for pair in everything if pair not in grouped]))
    cold = sum(not k.is_cached(signature) for _, pairs in groups for k, signature in pairs)
    load(groups)
    return sum(len(pairs) for _, pairs in groups), cold


def _jit_disabled() -> bool:
    import numba

    return bool(numba.config.DISABLE_JIT)


def _declared(name: str) -> tuple:
    """'module:function' -> its numba dispatcher and first declared signature."""
    module, _, function = name.partition(":")
    k = vars(importlib.import_module(module))[function].compiled
    return k, k.declared[0]
