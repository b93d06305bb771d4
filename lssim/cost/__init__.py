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

Every public name is re-exported here, so ``from lssim.cost import X`` works for all of them.
"""

from lssim.cost.catalog import HARDWARE, MODELS, SHAPES, DecoderShape, Hardware, ModelSpec, kv_capacity_tokens
from lssim.cost.operators import KernelProfile, OperatorCostModel
from lssim.cost.profiled import ProfiledCostModel, batch_features
from lssim.cost.protocol import peak_tokens_per_second, solo_decode_time
from lssim.loop.cost_contracts import CostModel
from lssim.cost.roofline import RooflineCostModel
from lssim.cost.speculative import SpeculativeCost

__all__ = [
    "CostModel",
    "ModelSpec",
    "Hardware",
    "MODELS",
    "HARDWARE",
    "RooflineCostModel",
    "ProfiledCostModel",
    "batch_features",
    "kv_capacity_tokens",
    "solo_decode_time",
    "peak_tokens_per_second",
    "SpeculativeCost",
    "DecoderShape",
    "SHAPES",
    "KernelProfile",
    "OperatorCostModel",
]
