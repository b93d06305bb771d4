"""numba's side of lssim.kernels, imported only when a kernel first runs compiled (a Python-route replay never imports
numba): the dispatcher that compiles a kernel's declared signatures only (`Kernel`), the on-disk cache, and the
compiles side by side on a cold cache.

Kernel hooks into numba's dispatcher where numba's own explicit signatures do (`_search_new_conversions`,
`get_call_template`) and reads its cache index (`is_cached`); tests/test_cold_start.py checks both. A kernel's Python
source calls other kernels through their lssim.kernels.KernelFunction, which numba types as that kernel's dispatcher
(`typeof_impl` below), so the compiled caller calls the compiled callee.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import threading

import numba
from numba import types
from numba.core.registry import CPUDispatcher, cpu_target
from numba.core import cgutils
from numba.extending import intrinsic, overload, typeof_impl

from lssim.kernels import ArgType, KernelFunction, TupleType, announce_compiling, blas_probe_wanted, unowned

BLAS_PROBE = "scipy.linalg.cython_blas"  # what numba.np.arraymath imports to find out whether a BLAS is there


def start_target() -> None:
    """What comes before numba's CPU target starts (its first compile or cache load): in a process that runs lssim's
    kernels only (lssim.kernels.lssim_kernels_only), numba.np.arraymath imported without the BLAS probe. Not on
    import, so that a cold cache's line (lssim.kernels.announce_if_cold) comes before these imports."""
    if not blas_probe_wanted():
        start_without_blas_probe()


def start_without_blas_probe() -> None:
    """Import numba.np.arraymath, which numba's CPU target loads when it starts, without its probe for a BLAS: the
    probe imports scipy.linalg (~0.2 s of a warm replay's CPU, most of it scipy's array-API layer) and its one use is
    np.correlate and np.convolve choosing np.dot over a loop (numba.np.arraymath._HAVE_BLAS, then False). lssim's
    kernels call neither nor any BLAS. The import is refused for the probe alone (a None in sys.modules is the import
    system's documented way to make an import fail) and allowed again at once: np.dot and np.linalg, which import
    scipy when a kernel using them is typed, compile as before. Nothing where numba.np.arraymath or scipy.linalg is
    already imported."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return
    sys.modules[BLAS_PROBE] = None
    try:
        import numba.np.arraymath  # noqa: F401  (its _HAVE_BLAS is settled on import)
    finally:
        del sys.modules[BLAS_PROBE]


_SCALARS = {"int64": types.int64, "uint64": types.uint64, "float64": types.float64, "bool": types.bool_}


def numba_type(spec: ArgType | TupleType) -> types.Type:
    """The numba type a declared argument type names (lssim.kernels.ArgType, TupleType)."""
    if isinstance(spec, TupleType):
        return types.Tuple(tuple(numba_type(item) for item in spec.items))
    scalar = _SCALARS[spec.dtype]
    return scalar if spec.ndim == 0 else types.Array(scalar, spec.ndim, "C", readonly=spec.readonly)


@typeof_impl.register(KernelFunction)
def _typeof_kernel_function(function: KernelFunction, c) -> types.Dispatcher:
    return types.Dispatcher(function.compiled)


@intrinsic
def _view_without_owner(typingctx, array):
    """The array's view with no meminfo (and no parent object): numba's reference counting skips it."""
    def codegen(context, builder, signature, args):
        view = context.make_array(array)(context, builder, value=args[0])
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()
    return array(array), codegen


@overload(unowned)
def _unowned(array):
    return lambda array: _view_without_owner(array)


class Kernel(CPUDispatcher):
    """A numba dispatcher that compiles only its declared signatures, each on first use (lssim.kernels' docstring)."""

    def __init__(self, py_func, signatures: tuple[tuple, ...]):
        super().__init__(py_func, targetoptions={"nopython": True, "boundscheck": None})
        _enable_caching(self)
        self.declared = tuple(tuple(numba_type(a) for a in signature) for signature in signatures)
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
            announce_compiling(self._cache.cache_path)
        start_target()
        self._can_compile = True
        try:
            self.compile(signature)
        finally:
            self._can_compile = False

    def is_cached(self, signature: tuple) -> bool:
        """Whether the on-disk cache holds `signature` compiled from this source, by this numba, for this CPU."""
        key = self._cache._index_key(signature, self.targetctx.codegen())
        return key in self._cache._cache_file._load_index()


def dispatcher(function: KernelFunction) -> "Kernel | object":
    """`function`'s numba dispatcher (its Python function where NUMBA_DISABLE_JIT=1: a debugger, coverage)."""
    if numba.config.DISABLE_JIT:
        return function.py_func
    return Kernel(function.py_func, function.signatures)


def _enable_caching(kernel: Kernel) -> None:
    """numba's on-disk cache for `kernel`, where numba puts it (the source's __pycache__, else the user's cache
    directory), else in the temp directory: an install that is read-only for a user whose home is too."""
    try:
        kernel.enable_caching()
    except RuntimeError:  # numba found no writable place for it
        numba.config.CACHE_DIR = os.path.join(tempfile.gettempdir(), f"lssim-numba-{os.getuid()}")
        kernel.enable_caching()


def load(groups: list[tuple[float, list[tuple[Kernel, tuple]]]]) -> None:
    """Each (kernel, signature) of the (cost, pairs) groups loaded, or compiled where not cached: the cold groups
    side by side first, where this platform forks and has the cores."""
    cold = [(cost, pairs) for cost, pairs in groups if any(not k.is_cached(signature) for k, signature in pairs)]
    if cold:
        first, _ = cold[0][1][0]
        announce_compiling(first._cache.cache_path)
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
    start_target()
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
