"""Several engine instances on the real backend: vLLM data parallelism (`VLLMEngine(n_instances=2)`), each
request on the rank the policy's `place` chose. The module starts its own two-instance engine (one more
engine start, about 40 s on this CPU)."""

from __future__ import annotations

import pytest

from lssim.loop.controller import RunConfig
from lssim.loop.core import Request

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def two_instances(real_model_dir):
    import real_backend.engine  # noqa: F401  (vLLM's logging set up first)

    pytest.importorskip("vllm")
    from real_backend.prompts import TaskPrompts
    from real_backend.world import RealSetup, start_engine

    setup = RealSetup(model_dir=str(real_model_dir), n_instances=2)
    prompts = TaskPrompts.from_files(setup.prompts_path, setup.model_dir, n_prompts=16)
    engine = start_engine(setup, prompts)
    yield setup, prompts, engine
    engine.close()


def _requests(rid0, instances, length=16):
    return [Request(rid=rid0 + i, group_id=rid0 + i, step=0, prompt_id=i, sample_idx=0, prompt_len=7, max_tokens=length,
                    seed=rid0 + i, instance=inst) for i, inst in enumerate(instances)]


def _drain(engine, requests):
    left = len(requests)
    while left:
        left -= sum(ev.kind == "finished" for ev in engine.next_events())


def test_requests_run_where_placed_and_unplaced_ones_on_the_least_loaded(two_instances):
    _, prompts, engine = two_instances
    assert engine.n_instances == 2
    engine.sampling_kwargs["ignore_eos"] = True
    try:
        requests = _requests(1000, [0, 0, 0, 0, 1, None])  # four on 0, one on 1; the unplaced one goes to 1
        engine.submit(requests)
        loads = engine.loads()
        assert [ld.running + ld.waiting for ld in loads] == [4, 2]
        assert [ld.pending_tokens for ld in loads] == [64, 32]
        assert [r.ran_on for r in requests] == [0, 0, 0, 0, 1, 1]  # the dispatcher's choice is recorded too
        assert requests[-1].instance is None  # ...apart from the pin (a carried response is not pinned by it)
        _drain(engine, requests)
        assert all(r.generated == 16 and r.finish_reason == "length" for r in requests)
        busy, _ = engine.utilization()
        assert busy > 0
    finally:
        engine.sampling_kwargs.pop("ignore_eos", None)


def test_weights_reach_every_instance(two_instances, real_model_dir):
    """A push goes to both engine cores: greedy text changes the same way on each rank."""
    import torch
    from transformers import AutoModelForCausalLM

    _, prompts, engine = two_instances
    saved = dict(engine.sampling_kwargs)
    engine.sampling_kwargs.update(temperature=0.0, ignore_eos=True)
    try:
        def greedy(rid0):
            requests = _requests(rid0, [0, 1], length=12)
            for r in requests:
                r.prompt_id = 3  # the same prompt on both ranks
            engine.submit(requests)
            _drain(engine, requests)
            return [r.tokens for r in requests]

        before = greedy(2000)
        assert before[0] == before[1]
        model = AutoModelForCausalLM.from_pretrained(real_model_dir, torch_dtype=torch.float32)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        engine.update_weights(model.state_dict())
        after = greedy(3000)
        assert after[0] == after[1] and after[0] != before[0]
    finally:
        engine.sampling_kwargs.clear()
        engine.sampling_kwargs.update(saved)


def test_a_placement_policy_runs_on_two_instances_and_replays(two_instances, tmp_path):
    from lssim.analysis.replay import SimSetup, simulate
    from lssim.traces.trace import load_trace
    from lssim.traces.workload import Workload
    from real_backend.world import prepare, run_real

    setup, _, engine = two_instances
    config = RunConfig(steps=2, groups_per_step=4, group_size=4, max_tokens=64, seed=0)
    prompts, policy = prepare(setup, "seer(chunk=16)", config)
    result = run_real(setup, policy, config, tmp_path / "seer", engine=engine, prompts=prompts)
    s = result.steps
    assert result.responses["instance"].dropna().nunique() == 2  # seer moved requests between the instances
    assert (s["responses_in"] == s["finished"] + s["truncated"] + s["policy_stopped"] + s["dropped"] + s["carried_out"]).all()
    assert result.meta["engine"]["n_instances"] == 2
    assert 0 < s["busy_fraction"].max() <= 1.0 + 1e-9
    # the recorded trace replays on a two-instance simulator, every response exactly
    trace = load_trace(tmp_path / "seer" / "trace.parquet")
    sim = simulate(Workload(trace, seed=0), "seer(chunk=16)", SimSetup(model="tiny-ref", n_instances=2, kv_capacity_tokens=200_000),
                   config=config, prompts=prompts)
    assert sim.steps["tokens"].sum() > 0 and len(sim.responses) == len(result.responses)


def test_a_run_records_the_rank_each_response_ran_on(two_instances, tmp_path):
    """The baseline places nothing: vLLM's ranks are the engine's least-loaded choice, and the trace says which
    (a trace that said 0 for all made replays of it run every request on one instance)."""
    from lssim.traces.trace import load_trace
    from real_backend.world import prepare, run_real

    setup, _, engine = two_instances
    config = RunConfig(steps=1, groups_per_step=2, group_size=4, max_tokens=16, seed=0)
    prompts, policy = prepare(setup, "baseline", config)
    run_real(setup, policy, config, tmp_path / "base", engine=engine, prompts=prompts)
    trace = load_trace(tmp_path / "base" / "trace.parquet")
    assert trace["instance"].value_counts().to_dict() == {0: 4, 1: 4}
