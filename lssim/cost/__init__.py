"""Execution-time (cost) models for one engine instance.

The simulator asks a cost model how long the next ``k`` decode iterations of ``n`` running sequences
take (and how many fit in a given time), what a prefill and a departure cost. The contract and the
conventions every model follows are in :mod:`lssim.cost.protocol`; the pieces:

    protocol.py     CostModel (the contract), the closed-form span helpers, solo_decode_time and
                    peak_tokens_per_second (the lower bound's two ingredients)
    catalog.py      ModelSpec, Hardware, the MODELS / HARDWARE presets, kv_capacity_tokens
    roofline.py     RooflineCostModel: analytic, from model and GPU datasheet numbers
    profiled.py     ProfiledCostModel: fitted to measurements of a real engine; batch_features
    fitting.py      reading and checking measurement tables, the relative-error NNLS, APE summaries
    speculative.py  SpeculativeCost: any model with speculative decoding / layer skip at small batch
    operators.py    OperatorCostModel: a GPU iteration as the sum of its kernels, from measured kernel times
                    (KernelProfile); operator_fit.py fits a profile and reports its held-out error;
                    data/ holds the measurements and the fitted H100 profile
                    (made by python -m lssim.benchmarks.gpu_cost_model --write)

Every public name is re-exported here, so ``from lssim.cost import X`` works for all of them; each is imported from
its module when first asked for (PEP 562's module ``__getattr__``), so that a replay on the roofline imports neither
the profiled, operator nor speculative models, nor the fitting code.
"""

from __future__ import annotations

import importlib

_EXPORTS = {  # public name -> the module that defines it
    **dict.fromkeys(("HARDWARE", "MODELS", "SHAPES", "DecoderShape", "Hardware", "ModelSpec", "kv_capacity_tokens"),
                    "lssim.cost.catalog"),
    **dict.fromkeys(("KernelProfile", "OperatorCostModel"), "lssim.cost.operators"),
    **dict.fromkeys(("ProfiledCostModel", "batch_features"), "lssim.cost.profiled"),
    **dict.fromkeys(("peak_tokens_per_second", "solo_decode_time"), "lssim.cost.protocol"),
    "CostModel": "lssim.loop.cost_contracts",
    "RooflineCostModel": "lssim.cost.roofline",
    "SpeculativeCost": "lssim.cost.speculative",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lssim.cost' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # asked once: later lookups find it in the module's namespace
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
