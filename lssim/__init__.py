"""lssim: a discrete-event simulator (and a real vLLM backend) for long-tail rollout scheduling in RL post-training.

The public API, each name where it lives (also `from lssim import NAME`):

    policies       Policy, Compose, make_policy, available_policies, check_policy     lssim.loop.policy, lssim.loop.checks
    a run          Controller, RunConfig, RunResult                                   lssim.loop.controller
    the simulator  SimSetup, simulate, replay, summarize                              lssim.analysis.replay
    traces         load_trace, write_trace, Workload, synthesize, SynthConfig         lssim.traces.*
    contracts      Engine, Trainer, TrainJob, PromptSource, StepObserver,             lssim.loop.contracts
                   PolicyHooks, ModeHooks, OracleLength
    cost contracts CostModel, TrainCostModel                                          lssim.loop.cost_contracts

`import lssim` imports none of them: each is imported on first use (PEP 562), so the command line (lssim.cli) starts
without numpy and pandas.
"""

from __future__ import annotations

import importlib

# name -> the module that defines it
_HOMES = {
    **dict.fromkeys(("Policy", "Compose", "make_policy", "available_policies"), "lssim.loop.policy"),
    "check_policy": "lssim.loop.checks",
    **dict.fromkeys(("Controller", "RunConfig", "RunResult"), "lssim.loop.controller"),
    **dict.fromkeys(("SimSetup", "simulate", "replay", "summarize"), "lssim.analysis.replay"),
    **dict.fromkeys(("load_trace", "write_trace"), "lssim.traces.trace"),
    "Workload": "lssim.traces.workload",
    **dict.fromkeys(("synthesize", "SynthConfig"), "lssim.traces.synth"),
    **dict.fromkeys(("Engine", "Trainer", "TrainJob", "PromptSource", "StepObserver", "PolicyHooks", "ModeHooks",
                     "OracleLength"), "lssim.loop.contracts"),
    **dict.fromkeys(("CostModel", "TrainCostModel"), "lssim.loop.cost_contracts"),
}

__all__ = list(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'lssim' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(home), name)
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
