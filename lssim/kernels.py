"""How lssim declares its numba kernels: `@kernel(arg types)` instead of `@njit(cache=True)`.

A kernel is compiled for its declared argument types only, once, on its first call (from Python or from another
kernel), then never again: a call with other types is converted to them (a writable array passes where a read-only one
is declared, a literal int where an int64 is) or refused with numba's TypeError naming the types. Without the
declaration numba compiled a kernel once per distinct set of argument types it met -- twice for a read-only and a
writable array, up to three times for a helper called with literal ints -- and each cold compile costs seconds.

The compiled code is cached on disk where numba caches it: the source's __pycache__, or, where that is not writable
(an install in a read-only site-packages), the user's cache directory (~/.cache/numba), or where neither is, the temp
directory's lssim-numba-UID; NUMBA_CACHE_DIR replaces them all. When a kernel is not in the cache (a fresh clone or
install, an edited kernel, another numba or CPU), one line on stderr (COMPILING) says so, so that the pause is not
mistaken for a hang; the kernels every replay runs (REPLAY_KERNELS) are then compiled side by side, one forked process
per core. `lssim warmup` (`warm_up`) compiles them all ahead, e.g. in an image build. The modules that hold kernels are
KERNEL_MODULES; each is imported only by the route that runs its kernels.

Kernel hooks into numba's dispatcher where numba's own explicit signatures do (`_search_new_conversions`,
`get_call_template`) and reads its cache index (`is_cached`); tests/test_cold_start.py checks both.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import tempfile
import threading

import numba
from numba import types
from numba.core.registry import CPUDispatcher, cpu_target

# Argument types. A kernel that only reads an array declares it read-only (_IN): numba then takes writable and
# read-only arrays (a pandas column's, a memory map's) with one compile.
I64 = types.int64
U64 = types.uint64
F64 = types.float64
I64S = types.Array(types.int64, 1, "C")
I64S_IN = types.Array(types.int64, 1, "C", readonly=True)
F64S = types.Array(types.float64, 1, "C")
F64S_IN = types.Array(types.float64, 1, "C", readonly=True)
BOOLS = types.Array(types.bool_, 1, "C")
BOOLS_IN = types.Array(types.bool_, 1, "C", readonly=True)
U64S_2D_IN = types.Array(types.uint64, 2, "C", readonly=True)

KERNEL_MODULES = ("lssim.traces.workload_index", "lssim.sim.fastsim_kernels", "lssim.sim.event_kernels", "lssim.sim.bounds",
                  "lssim.sim.assign", "lssim.cost.roofline_arrays")
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
_announced = False


class Kernel(CPUDispatcher):
    """A numba dispatcher that compiles only its declared signatures, each on first use (module docstring)."""

    def __init__(self, py_func, signatures: tuple[tuple, ...]):
        super().__init__(py_func, targetoptions={"nopython": True, "boundscheck": None})
        _enable_caching(self)
        self.declared = signatures
        self._can_compile = False  # numba compiles nothing on its own: the two hooks below compile a declared signature

    def _search_new_conversions(self, *args, **kws):  # a call from Python that no compiled signature takes as it is
        self.compile_matching(tuple(self.typeof_pyval(a) for a in args))
        return super()._search_new_conversions(*args, **kws)

    def get_call_template(self, args, kws):  # a call from another kernel being compiled
        self.compile_matching(tuple(args))
        return super().get_call_template(args, kws)

    def compile_matching(self, argtypes: tuple) -> None:
        """Compile (or load from the cache) the first declared signature `argtypes` convert to, if any and not yet."""
        for signature in self.declared:
            if len(signature) == len(argtypes) and all(
                    self.typingctx.can_convert(a, d) is not None for a, d in zip(argtypes, signature)):
                self.compile_declared(signature)
                return

    def compile_declared(self, signature: tuple) -> None:
        if signature in self.overloads:
            return
        if not self.is_cached(signature):
            _announce(self._cache.cache_path)
        self._can_compile = True
        try:
            self.compile(signature)
        finally:
            self._can_compile = False

    def is_cached(self, signature: tuple) -> bool:
        """Whether the on-disk cache holds `signature` compiled from this source, by this numba, for this CPU."""
        key = self._cache._index_key(signature, self.targetctx.codegen())
        return key in self._cache._cache_file._load_index()


def _enable_caching(dispatcher: Kernel) -> None:
    """numba's on-disk cache for `dispatcher`, where numba puts it (the source's __pycache__, else the user's cache
    directory), else in the temp directory: an install that is read-only for a user whose home is too."""
    try:
        dispatcher.enable_caching()
    except RuntimeError:  # numba found no writable place for it
        numba.config.CACHE_DIR = os.path.join(tempfile.gettempdir(), f"lssim-numba-{os.getuid()}")
        dispatcher.enable_caching()


def kernel(*argtypes, more: tuple[tuple, ...] = ()):
    """Decorate a function as a numba kernel compiled for `argtypes` (numba types), and for each signature in `more`
    (tuples of them), each only when a call needs it (see the module docstring)."""
    def declare(func) -> Kernel:
        if numba.config.DISABLE_JIT:  # NUMBA_DISABLE_JIT=1 (a debugger, coverage): the Python function, as njit does
            return func
        return Kernel(func, (tuple(argtypes), *map(tuple, more)))
    return declare


def _announce(where: str) -> None:
    global _announced
    if not _announced:
        _announced = True
        print(COMPILING.format(where=where), file=sys.stderr, flush=True)


def kernels() -> list[Kernel]:
    """Every kernel of KERNEL_MODULES (importing them)."""
    found = []
    for name in KERNEL_MODULES:
        module = importlib.import_module(name)
        found += [v for v in vars(module).values() if isinstance(v, Kernel) and v.__module__ == name]
    return found


def announce_if_cold() -> None:
    """Print COMPILING now if REPLAY_KERNELS' first group (the batch route's scheduler, whose module imports only numpy
    and numba) is not cached: the simulation commands call this before importing pandas and reading their trace, and
    load_replay_kernels then compiles it."""
    if numba.config.DISABLE_JIT:
        return
    for k, signature in [_declared(name) for name in REPLAY_KERNELS[0][1]]:
        if not k.is_cached(signature):
            _announce(k._cache.cache_path)
            return


def load_replay_kernels() -> None:
    """Load REPLAY_KERNELS' first signatures, compiling those not cached (announced, side by side): the simulation
    commands call it first, so that the announcement comes before their seconds of reading and indexing, and
    lssim.analysis.replay before it forks, so that each worker inherits the kernels instead of loading, or on a cold
    cache compiling, its own."""
    if numba.config.DISABLE_JIT:  # the kernels are plain Python functions
        return
    _load([(cost, [_declared(name) for name in names]) for cost, names in REPLAY_KERNELS])


def warm_up() -> tuple[int, int]:
    """Load every kernel's every declared signature, compiling those not cached; returns (signatures, of them
    compiled now)."""
    if numba.config.DISABLE_JIT:
        return 0, 0
    groups = [(cost, [_declared(name) for name in names]) for cost, names in REPLAY_KERNELS]
    grouped = {pair for _, pairs in groups for pair in pairs}
    groups.append((1.0, [(k, signature) for k in kernels() for signature in k.declared if (k, signature) not in grouped]))
    cold = sum(not k.is_cached(signature) for _, pairs in groups for k, signature in pairs)
    _load(groups)
    return sum(len(pairs) for _, pairs in groups), cold


def _declared(name: str) -> tuple[Kernel, tuple]:
    """'module:function' -> the kernel and its first declared signature."""
    module, _, function = name.partition(":")
    k = vars(importlib.import_module(module))[function]
    return k, k.declared[0]


def _load(groups: list[tuple[float, list[tuple[Kernel, tuple]]]]) -> None:
    """Each (kernel, signature) of the (cost, pairs) groups loaded, or compiled where not cached: the cold groups
    side by side first, where this platform forks and has the cores."""
    cold = [(cost, pairs) for cost, pairs in groups if any(not k.is_cached(signature) for k, signature in pairs)]
    if cold:
        first, _ = cold[0][1][0]
        _announce(first._cache.cache_path)
        _compile_side_by_side(cold)
    for _, pairs in groups:
        for k, signature in pairs:
            k.compile_declared(signature)  # loaded from the cache where a forked process compiled it


def _compile_side_by_side(groups: list[tuple[float, list[tuple[Kernel, tuple]]]]) -> None:
    """Compile the groups in as many processes as there are cores (at most one per group), this one among them: the
    heaviest group first, onto the least loaded process. The forked ones write numba's cache and exit; this process
    then loads what they compiled (or compiles what one of them failed to). A 2-core cold start compiles in the time
    of its longest share, not of the sum."""
    cores = len(os.sched_getaffinity(0)) if sys.platform == "linux" else (os.cpu_count() or 1)
    shares: list[list] = [[0.0, []] for _ in range(min(cores, len(groups)))]
    # a fork copies only this thread: with others running (a notebook's), one might hold a lock the child then waits on
    if len(shares) < 2 or "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return
    for cost, pairs in sorted(groups, key=lambda group: -group[0]):
        share = min(shares, key=lambda s: s[0])
        share[0] += cost
        share[1] += pairs
    cpu_target.target_context.refresh()  # numba's registries, loaded once here for every process forked below
    children = []
    for _, pairs in shares[1:]:
        pid = os.fork()
        if pid == 0:  # the child compiles its share into the cache and leaves without running anything else
            status = 1
            try:
                for k, signature in pairs:
                    k.compile_declared(signature)
                status = 0
            finally:
                os._exit(status)
        children.append(pid)
    for k, signature in shares[0][1]:
        k.compile_declared(signature)
    for pid in children:
        os.waitpid(pid, 0)
