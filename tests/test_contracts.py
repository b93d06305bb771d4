"""The contracts in lssim.loop.core / lssim.loop.policy: what an engine answers when it lacks an ability, what a policy
declares it needs and how compositions merge those needs, the event kinds engines report."""

import math

import pytest

from lssim.loop.checks import PolicyCheckError, check_policy
from lssim.loop.controller import Controller, RunConfig
from lssim.loop.contracts import Engine
from lssim.loop.core import EVENT_KINDS, FINISHED, PROGRESS, Speculation
from lssim.loop.policy import Compose, Policy, PolicyNeeds, make_policy
from lssim.sim.trainer import SimTrainer
from lssim.sim.world import EngineConfig, SimEngine
from lssim.traces.workload import Workload
from test_sim import COST, NO_TRAIN, make_trace


class _Bare(Engine):
    """An engine that declares nothing beyond what every engine must do."""

    n_instances = 1

    def set_progress_interval(self, tokens):
        pass


def test_an_engine_without_the_optional_abilities_answers_unknown_or_refuses():
    engine = _Bare()
    assert engine.counterfactual(None) is None
    assert all(math.isnan(x) for x in engine.utilization())
    engine.set_speculation(None)  # nothing asked: fine
    with pytest.raises(ValueError, match="_Bare cannot do"):
        engine.set_speculation(Speculation())


class _Unknowing(SimEngine):
    """The simulator, answering "unknown" as an engine without those abilities does."""

    counterfactual = Engine.counterfactual
    utilization = Engine.utilization
    set_batch_rollout = Engine.set_batch_rollout  # streams events, as such an engine does (no run_batch)


def test_the_controller_records_unknown_as_minus_one_and_nan():
    wl = Workload(make_trace([[[30, 10], [20, 40]]]))
    cfg = RunConfig(steps=1, groups_per_step=2, group_size=2, max_tokens=wl.max_tokens)
    results = {}
    for cls in (SimEngine, _Unknowing):
        engine = cls(wl, COST, EngineConfig(1, 8, 10**6))
        results[cls] = Controller(engine, SimTrainer(engine, NO_TRAIN), wl, make_policy("baseline"), cfg).run()
    known, unknown = results[SimEngine], results[_Unknowing]
    assert known.responses["natural_len"].tolist() == [10, 20, 30, 40]
    assert (unknown.responses["natural_len"] == -1).all() and unknown.responses["natural_reward"].isna().all()
    assert known.steps["busy_fraction"].iloc[0] == pytest.approx(1.0)
    assert unknown.steps["busy_fraction"].isna().all() and unknown.steps["mean_running"].isna().all()
    # Everything else is the same run.
    same = [c for c in known.responses.columns if not c.startswith("natural_")]
    assert known.responses[same].equals(unknown.responses[same])


def test_the_simulator_reports_only_the_declared_event_kinds():
    wl = Workload(make_trace([[[30, 10, 25]]]))
    engine = SimEngine(wl, COST, EngineConfig(1, 8, 10**6))
    engine.set_progress_interval(8)
    from lssim.loop.core import Request

    engine.submit([Request(rid=i, group_id=0, step=0, prompt_id=0, sample_idx=i, prompt_len=16, max_tokens=30)
                   for i in range(3)])
    kinds = []
    while events := engine.next_events():
        kinds += [e.kind for e in events]
    assert set(kinds) <= set(EVENT_KINDS) and kinds.count(FINISHED) == 3
    assert kinds.count(PROGRESS) == 3 + 1 + 3  # checkpoints at 8, 16, 24 before each length (30: 3, 10: 1, 25: 3)


# -- policy needs --------------------------------------------------------------------------------

def test_each_policy_declares_what_it_needs():
    assert make_policy("baseline").needs() == PolicyNeeds()
    assert make_policy("oracle").needs() == PolicyNeeds(oracle=True)
    assert make_policy("spec_tail(alpha=0.7)").needs() == PolicyNeeds(speculation=Speculation(alpha=0.7))
    assert make_policy("april(mask_stale_tokens=True)").needs() == PolicyNeeds(mask_stale_tokens=True)
    assert make_policy("april").needs() == PolicyNeeds()


def test_compose_merges_needs_by_its_documented_rule():
    merged = make_policy("april(mask_stale_tokens=True)+oracle+spec_tail(gamma=3)+spec_tail(gamma=3)").needs()
    assert merged == PolicyNeeds(oracle=True, speculation=Speculation(gamma=3), mask_stale_tokens=True)
    assert make_policy("seer+lpt").needs() == PolicyNeeds()
    with pytest.raises(ValueError, match="different speculation"):
        Compose([make_policy("spec_tail(gamma=3)"), make_policy("spec_tail(gamma=4)")])


@pytest.mark.parametrize("kwargs, words", [({"oracle": 1}, "oracle must be a bool"),
                                           ({"mask_stale_tokens": "yes"}, "mask_stale_tokens must be a bool"),
                                           ({"speculation": "ngram"}, "Speculation or None")])
def test_needs_are_validated(kwargs, words):
    with pytest.raises(ValueError, match=words):
        PolicyNeeds(**kwargs)


def test_check_policy_refuses_needs_that_are_not_a_policy_needs():
    class Sloppy(Policy):
        name = "sloppy"

        def needs(self):
            return {"oracle": True}

    with pytest.raises(PolicyCheckError, match="needs\\(\\) must return"):
        check_policy(Sloppy())


@pytest.mark.parametrize("policy", ["baseline", "april", "hadb"])
def test_the_controllers_own_state_pickles_as_a_checkpoint_takes_it(policy):
    """real_backend.checkpoint pickles the controller's state (Controller.state()): nothing in it may be a lambda or
    another unpicklable object (a run would lose its checkpoints; only a real run shows it)."""
    import pickle

    wl = Workload(make_trace([[[30, 10], [20, 40]], [[50, 5], [25, 35]]]))
    cfg = RunConfig(steps=2, groups_per_step=2, group_size=2, max_tokens=wl.max_tokens)
    engine = SimEngine(wl, COST, EngineConfig(1, 8, 10**6))
    controller = Controller(engine, SimTrainer(engine, NO_TRAIN), wl, make_policy(policy), cfg)
    controller.run_step(0)
    state = controller.state()
    assert pickle.loads(pickle.dumps(state)).keys() == state.keys()


# -- the contracts module: optional abilities answer "unknown", implementations subclass -------------------------

def test_the_optional_abilities_of_a_trainer_a_source_and_a_cost_model_have_their_unknown_answers():
    import numpy as np

    from lssim.loop.contracts import PromptSource, Trainer
    from lssim.loop.cost_contracts import CostModel
    from lssim.loop.core import PromptPool

    class Bare(Trainer):
        def train(self, groups, step):
            return {}

    trainer = Bare()
    assert trainer.set_train_mask(lambda batch: None) is False and trainer.start([], 0) is None
    assert trainer.started_jobs() == [] and trainer.finish_jobs() is None

    class Source(PromptSource):
        pool = PromptPool(np.arange(3), np.array([5, 6, 7]))

        def default_groups(self, step, n_groups, group_size, max_tokens):
            return []

        def prompt_len(self, prompt_id):
            return int(self.pool.prompt_len[prompt_id])

    source = Source()
    assert source.prompt_lens(np.array([2, 0])).tolist() == [7, 5] and source.loader_state() == {}
    with pytest.raises(ValueError, match="no loader state"):
        source.set_loader_state({"_cursor": 1})
    # the array forms a model leaves out are the scalar calls, to the last bit; abort_time unknown: free
    n, ctx, k = np.array([1, 3, 8]), np.array([16.0, 90.0, 400.0]), np.array([1, 7, 0])
    assert COST.decode_times(n, ctx, k).tolist() == [COST.decode_time(*a) for a in zip(n.tolist(), ctx.tolist(), k.tolist())]
    assert COST.prefill_times(np.array([0, 16, 16])).tolist() == [0.0, COST.prefill_time(16), COST.prefill_time(16)]
    assert isinstance(COST, CostModel) and CostModel.abort_time(COST, 3) == 0.0


def test_an_engine_without_timers_or_counters_refuses_or_answers_unknown():
    engine = _Bare()
    assert engine.spec_counters() is None and engine.driver_seconds(0.0, 1.0) is None
    engine.reset_spec_counters()
    with pytest.raises(NotImplementedError, match="_Bare"):
        engine.wake_when(None)


def _controller(policy="baseline", steps=2):
    wl = Workload(make_trace([[[30, 10], [20, 40]], [[50, 5], [25, 35]]]))
    cfg = RunConfig(steps=steps, groups_per_step=2, group_size=2, max_tokens=wl.max_tokens)
    engine = SimEngine(wl, COST, EngineConfig(1, 8, 10**6))
    return Controller(engine, SimTrainer(engine, NO_TRAIN), wl, make_policy(policy) if isinstance(policy, str) else policy, cfg)


def test_observers_are_told_each_steps_row_in_the_order_added():
    controller, told = _controller(), []
    controller.add_observer(lambda row: told.append(("first", row["step"])))
    controller.add_observer(lambda row: told.append(("second", row["step"])))
    result = controller.run()
    assert told == [("first", 0), ("second", 0), ("first", 1), ("second", 1)]
    assert [row["step"] for row in controller.step_rows] == result.steps["step"].tolist() == [0, 1]


def test_a_controller_restored_from_state_goes_on_as_the_uninterrupted_one():
    import pickle

    straight = _controller("april").run()
    first = _controller("april")
    first.run_step(0)
    state = pickle.loads(pickle.dumps(first.state()))
    resumed = _controller(first.policy)  # the policy object travels beside the state (a checkpoint pickles both)
    resumed.restore(state)
    result = resumed.run(first_step=1)
    same = [c for c in straight.responses.columns if c not in ("submit_time", "first_token_time", "finish_time")]
    assert result.responses[same].equals(straight.responses[same])
    assert result.steps["step"].tolist() == [0, 1]
