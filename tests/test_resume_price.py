"""The profile's resume price (r1, lssim.cost's resume_time): what resubmitting responses with tokens already generated
costs beyond their re-prefill, measured beside a rollout (real_backend.resume_probe) and charged by the simulator
when a controller resubmits them (an async weight arrival, a carry, a requeue)."""

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lssim.cost import ProfiledCostModel, RooflineCostModel
from lssim.loop.controller import Controller, RunConfig
from lssim.loop.core import Request
from lssim.loop.modes import ModeConfig
from lssim.loop.policy import make_policy
from lssim.sim.shared_host import ScaledCost
from lssim.sim.trainer import SimTrainer
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import Workload
from real_backend.resume_probe import fit_resume_seconds, resume_table
from test_modes import TRAIN
from test_sim import COST, NO_TRAIN, make_trace


def priced(r1: float) -> ProfiledCostModel:
    return ProfiledCostModel(**COST.coefficients, resume_seconds=r1)


def test_profiled_json_keeps_the_resume_price_and_reads_older_profiles_as_free_resumes(tmp_path):
    m = priced(3e-4)
    m.to_json(tmp_path / "m.json")
    back = ProfiledCostModel.from_json(tmp_path / "m.json")
    assert back.resume_time(10) == pytest.approx(3e-3) and back.resume_time(0) == 0 and back.describe()["r1"] == 3e-4
    payload = json.loads((tmp_path / "m.json").read_text())
    del payload["resume_coefficients"]  # a profile measured before resumes were
    (tmp_path / "old.json").write_text(json.dumps(payload))
    assert ProfiledCostModel.from_json(tmp_path / "old.json").resume_time(10) == 0
    assert ScaledCost(m, 1.7).resume_time(3) == pytest.approx(9e-4)  # the front end's: not the host's slow-down
    assert RooflineCostModel("qwen2.5-7b", "H100").resume_time(3) == 0.0
    with pytest.raises(ValueError, match="r1"):
        ProfiledCostModel(**COST.coefficients, resume_seconds=-1.0)


def _request(rid: int, generated: int) -> Request:
    r = Request(rid=rid, group_id=rid, step=0, prompt_id=0, sample_idx=rid, prompt_len=16, max_tokens=300)
    r.generated = generated
    return r


def test_a_resubmission_of_resumed_requests_moves_the_clock_by_their_price_and_fresh_ones_by_nothing():
    trace = make_trace(np.full((1, 1, 8), 200), max_tokens=300)
    engine = SimEngine(Workload(trace, seed=0), priced(2e-3), EngineConfig(1, 64, 10**7))
    assert not engine.batch_route  # the batch routes take carried responses in without the price: the event route
    engine.submit([_request(0, 0), _request(1, 0)])
    assert engine.now() == 0.0
    second = [_request(2, 40), _request(3, 0), _request(4, 7)]
    engine.submit(second)
    assert engine.now() == pytest.approx(2 * 2e-3)  # the two resumed ones
    assert [r.submit_time for r in second] == pytest.approx([4e-3] * 3)  # the call's requests reach the engine then
    assert SimEngine(Workload(trace, seed=0), COST, EngineConfig(1, 64, 10**7)).batch_route  # unpriced: as before


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(5, 300), min_size=16, max_size=16), r1=st.sampled_from([1e-4, 1e-3, 5e-3]))
def test_carried_responses_cost_their_next_rollout_the_resume_price(lengths, r1):
    """april carries what is unfinished at a rollout's end; the next step resubmits it first, with the fresh groups,
    in one call: that step's rollout starts every request r1 x carried seconds late, and nothing else changes."""
    trace = make_trace(np.array(lengths).reshape(2, 2, 4), max_tokens=300)

    def steps(model):
        wl = Workload(trace, seed=0)
        engine = SimEngine(wl, model, EngineConfig(1, 64, 10**7), batch_route=False)  # both on the event route
        cfg = RunConfig(steps=4, groups_per_step=2, group_size=4, max_tokens=300, total_groups=6, seed=0)
        return Controller(engine, SimTrainer(engine, NO_TRAIN), wl, make_policy("april"), cfg).run().steps

    plain, charged = steps(COST), steps(priced(r1))
    assert plain.iloc[0].equals(charged.iloc[0])  # nothing resumed in the first step
    carried = int(plain["carried_in"].iloc[1])
    assert charged["carried_in"].iloc[1] == carried and charged["finished"].iloc[1] == plain["finished"].iloc[1]
    assert charged["rollout_seconds"].iloc[1] - plain["rollout_seconds"].iloc[1] == pytest.approx(r1 * carried, abs=1e-12)


def test_an_async_run_pays_the_resume_price_at_each_weight_arrival():
    trace = make_trace(np.random.default_rng(3).integers(20, 300, size=(4, 4, 4)), max_tokens=300)
    mode = ModeConfig("async", 2, 2, staleness=1)

    def run(model):
        wl = Workload(trace, seed=0)
        engine = SimEngine(wl, model, EngineConfig(2, 8, 10**7))
        cfg = RunConfig(steps=8, groups_per_step=wl.groups_per_step, group_size=wl.group_size, max_tokens=wl.max_tokens,
                        total_groups=wl.groups_in(4), seed=0)
        ctl = Controller(engine, SimTrainer(engine, TRAIN, n_devices=2, collocated=False), wl, make_policy("baseline"),
                         cfg, mode=mode.build())
        return ctl.run()

    plain, charged = run(COST), run(priced(5e-3))
    resumed = (plain.responses["policy_version_last"] > plain.responses["policy_version_first"]).sum()
    assert resumed > 0  # weights arrived with responses in flight
    assert charged.steps["rollout_seconds"].sum() > plain.steps["rollout_seconds"].sum()


def _cells(slope: float, fixed_plain: float = 0.05, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Cells as measure_resumes writes them: a resume costs its price (a1 x n + prefill) and `slope` x n unpriced."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (16, 32, 64):
        for _ in range(3):
            price = 1e-4 * n + COST.prefill_time(n * 40)
            rows.append({"n": n, "resume": False, "seconds": fixed_plain * (1 + noise * rng.standard_normal()),
                         "calls_seconds": 0.0, "priced_seconds": 0.0})
            rows.append({"n": n, "resume": True, "seconds": fixed_plain + price + slope * n, "calls_seconds": 0.01,
                         "priced_seconds": price})
    return pd.DataFrame(rows)


def test_the_resume_fit_recovers_the_unpriced_seconds_per_request_and_is_never_negative():
    assert fit_resume_seconds(_cells(6e-4)) == pytest.approx(6e-4)
    table = resume_table(_cells(6e-4))
    assert list(table.index) == [16, 32, 64] and table["unpriced_seconds"].to_numpy() == pytest.approx([6e-4 * n for n in (16, 32, 64)])
    assert fit_resume_seconds(_cells(-2e-4)) == 0.0  # priced more than measured: no negative price
    assert fit_resume_seconds(_cells(0.0).iloc[:0]) == 0.0


@pytest.mark.real
def test_the_probe_measures_resumes_on_the_real_engine_and_leaves_it_idle(vllm_engine):
    from real_backend.resume_probe import measure_resumes

    cells = measure_resumes(vllm_engine, COST, sizes=(4, 8), rounds=1, at=8)
    assert sorted(zip(cells["n"], cells["resume"])) == [(4, False), (4, True), (8, False), (8, True)]
    resumes = cells[cells["resume"]]
    assert (resumes["calls_seconds"] > 0).all() and (resumes["priced_seconds"] > 0).all() and (cells["seconds"] > 0).all()
    assert fit_resume_seconds(cells) >= 0.0
    assert not vllm_engine._live
