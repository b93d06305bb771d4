"""What the fidelity tests share (tests/test_fidelity.py, test_profile_layout.py, test_validate.py): a profiled
cost model and its file (the `profile` fixture), the simulated twin's setup, runs recorded from the simulator, and
repeats with timing noise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lssim.loop.controller import RunConfig
from lssim.cost import ProfiledCostModel
from lssim.analysis.replay import SimSetup, simulate
from lssim.traces.trace import load_trace
from lssim.analysis.fidelity.run import RecordedRun, replay_run
from lssim.traces.workload import Workload


REAL_TRACE = "traces/real_cpu_baseline.parquet"


MODEL = ProfiledCostModel(c0=3e-3, c1=1.2e-4, c2=1e-7, c3=0.0, p0=4e-3, p1=3e-5)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    MODEL.to_json(path, meta={"command": "test"})
    return str(path)


def twin_setup(profile):
    return SimSetup(model="tiny-ref", n_instances=1, max_num_seqs=256, kv_capacity_tokens=262_144, profile=profile)


def noisy_repeats(rng, sigma: float, steps: int, repeats: int, policy: str = "p") -> pd.DataFrame:
    """Measured step times of `repeats` runs: each step's truth times lognormal noise of `sigma`."""
    truth = rng.uniform(1.0, 3.0, size=steps)
    seconds = truth[:, None] * np.exp(rng.normal(0.0, sigma, size=(steps, repeats)))
    return pd.DataFrame([{"policy": policy, "step": s, "repeat": k, "measured_seconds": seconds[s, k], "truth": truth[s]}
                         for s in range(steps) for k in range(repeats)])


def speedup_repeats(rng, sigma: float, steps: int, k: int, speedup: float, world: str = "w") -> pd.DataFrame:
    """A world's baseline and a policy `speedup` x faster in every step, each recorded k times with noise `sigma`."""
    base = noisy_repeats(rng, sigma, steps, k, f"baseline@{world}")
    pol = noisy_repeats(rng, sigma, steps, k, f"p@{world}")
    pol["truth"] = base["truth"].to_numpy() / speedup
    pol["measured_seconds"] = pol["truth"] * np.exp(rng.normal(0.0, sigma, size=len(pol)))
    return pd.concat([base, pol], ignore_index=True)


def two_instance_run(policy: str, profile: str, cpus: str | None = "0|1", seed: int = 5) -> RecordedRun:
    """A two-instance 'real' run recorded from the simulator on `profile`, with the meta the recorder writes."""
    from real_backend.recorder import to_trace

    source = load_trace(REAL_TRACE)
    config = RunConfig(steps=3, groups_per_step=8, group_size=4, max_tokens=256, seed=seed)
    setup = SimSetup(model="tiny-ref", n_instances=2, max_num_seqs=256, kv_capacity_tokens=262_144, profile=profile)
    result = simulate(Workload(source, seed=seed), policy, setup, config=config, prompts=Workload(source, seed=seed))
    meta = {"setup": {"n_instances": 2, "cpus": cpus, "max_num_seqs": 256, "max_model_len": 1024},
            "engine": {"n_instances": 2}}
    return RecordedRun(name=policy, trace=to_trace(result.responses, result.steps), steps=result.steps,
                       responses=result.responses, config=config, meta=meta)


def shared_cells(model, slowdown, seed: int = 0) -> pd.DataFrame:
    """Layout cells of two instances timed as processor sharing: while b are busy each runs slowdown[b-1] x slower."""
    from real_backend.profile import longtail_lengths

    rng = np.random.default_rng(seed)
    rows, cell = [], 0
    for rep in range(2):
        for p in (8, 64):
            for n in (4, 8, 16, 32):
                lengths = [longtail_lengths(rng, n, 256) for _ in range(2)]
                m = [model.makespan(l, p) for l in lengths]
                lo = int(np.argmin(m))
                done = {lo: slowdown[1] * m[lo], 1 - lo: slowdown[1] * m[lo] + slowdown[0] * (m[1 - lo] - m[lo])}
                rows += [{"n_seqs": n, "prompt_len": p, "spread": "longtail", "cut": 1.0, "lengths": lengths[i],
                          "seconds": done[i], "repeat": rep, "instance": i, "busy": 2, "cell": cell} for i in (0, 1)]
                cell += 1
        for i in (0, 1):
            lengths = longtail_lengths(rng, 8, 256)
            rows.append({"n_seqs": 8, "prompt_len": 8, "spread": "longtail", "cut": 1.0, "lengths": lengths,
                         "seconds": slowdown[0] * model.makespan(lengths, 8), "repeat": rep, "instance": i, "busy": 1,
                         "cell": cell})
            cell += 1
    return pd.DataFrame(rows)


def replay_twin(run, setup):
    return replay_run(run, setup, Workload(load_trace(REAL_TRACE), seed=run.config.seed))
