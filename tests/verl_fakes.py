"""Fixtures of verl's interfaces for tests/test_verl_plugin.py, written from verl 0.9.1's source (that file's
docstring says which): a world of fixed lengths and rewards, TransferQueue's kv API, an agent loop and a v1 trainer."""

from __future__ import annotations

import itertools
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace

from lssim.integrations.verl.agent_loop import budget_for, lssim_extra
from lssim.integrations.verl.dataset import planned_row
from lssim.integrations.verl.driver import end_run
from lssim.integrations.verl.records import BUDGET_FIELD, ROLLOUT_N_FIELD
from lssim.integrations.verl.sampler import LssimSampler

EOS = 2
M = 256  # rollout.response_length


# ---- the world the fake engine generates: lengths and rewards fixed by prompt and session -----------------------
def natural_length(pid: int, session: int) -> int:
    return 40 + (pid * 53) % 400 + (session * 17) % 60


def reward_of(pid: int, session: int) -> float:
    return (1.0, 0.0, float(session % 2))[pid % 3]  # easy, hopeless, mixed


def prompt_len_of(pid: int) -> int:
    return 5 + pid % 7


# ---- fixtures of verl's interfaces ------------------------------------------------------------------------
class FakeTQ:
    """TransferQueue's kv calls (transfer_queue 0.1.11), in memory."""

    def __init__(self):
        self.parts: dict[str, dict[str, dict]] = defaultdict(dict)

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for i, key in enumerate(keys):
            entry = self.parts[partition_id].setdefault(key, {"tag": {}, "fields": {}})
            entry["tag"].update(tags[i] if tags else {})
            entry["fields"].update(fields[i] if fields else {})

    def kv_list(self, partition_id=None):
        parts = [partition_id] if partition_id else list(self.parts)
        return {p: {k: dict(e["tag"]) for k, e in self.parts.get(p, {}).items()} for p in parts}

    def kv_batch_get(self, keys, partition_id, select_fields):
        out = {f: [] for f in select_fields}
        for key in keys:
            stored = self.parts[partition_id][key]["fields"]
            for f in select_fields:
                if f not in stored:
                    raise ValueError(f"field {f} not in {key}")
                out[f].append(stored[f])
        return out

    def kv_clear(self, keys, partition_id):
        if not keys:
            raise ValueError("Received an empty list as keys.")  # as transfer_queue's client does
        for key in keys:
            self.parts[partition_id].pop(key, None)


@dataclass
class FakeKVBatchMeta:
    partition_id: str
    keys: list
    tags: list
    extra_info: dict = field(default_factory=dict)


def fixture_writer(tq, key, tag, output, row_fields):
    """_agent_loop_postprocess's put, with plain Python fields (AgentLoopOutput.as_dict merged with the row)."""
    fields = {"rm_scores": [0.0] * (len(output["response_ids"]) - 1) + [output["reward_score"]],
              "extra_fields": output["extra_fields"], **row_fields}
    tq.kv_batch_put([key], "train", fields=[fields], tags=[tag])


@dataclass
class Session:
    uid: str
    session: int
    prompt_id: int
    row: dict
    global_steps: int
    budget: int
    target: int
    generated: int = 0
    first: int | None = None
    last: int | None = None


class FakeRollout:
    """AgentLoopWorkerTQ and lssim's agent loop over a server generating `speed` tokens per tick per request."""

    def __init__(self, tq, group_size: int, speed: int = 32, writer=fixture_writer):
        self.tq, self.group_size, self.speed, self.writer = tq, group_size, speed, writer
        self.version = 0
        self.running: list[Session] = []
        self.open: dict[str, int] = {}  # uid -> sessions not finished
        self.submitted: list[tuple[int, int, int, int]] = []  # (global_steps, prompt_id, n, budget) as verl got them
        self.written: dict[tuple[str, int], Session] = {}
        self._uids = itertools.count()

    def submit(self, rows: list[dict], global_steps: int) -> None:
        for row in rows:
            uid = f"u{next(self._uids):07d}"
            self.tq.kv_batch_put([uid], "train", tags=[{"is_prompt": True, "status": "pending", "global_steps": global_steps}])
            n = int(row.get(ROLLOUT_N_FIELD, self.group_size))
            budget = budget_for(row.get(BUDGET_FIELD), M)
            pid = int(row["index"])
            self.submitted.append((global_steps, pid, n, budget))
            self.tq.kv_batch_put([uid], "train", tags=[{"status": "running"}])
            self.open[uid] = n
            for s in range(n):
                self.running.append(Session(uid, s, pid, row, global_steps, budget, min(natural_length(pid, s), budget)))

    def advance(self) -> None:
        for s in list(self.running):
            s.first = self.version if s.first is None else s.first
            s.generated = min(s.target, s.generated + self.speed)
            s.last = self.version
            if s.generated == s.target:
                self.running.remove(s)
                self._finish(s)

    def _finish(self, s: Session) -> None:
        natural = natural_length(s.prompt_id, s.session)
        tokens = [5] * (s.target - 1) + [EOS if natural <= s.budget else 5]
        extra = {"lssim": lssim_extra(SimpleNamespace(token_ids=tokens, stop_reason="completed"), s.budget, {EOS}),
                 "min_global_steps": s.first, "max_global_steps": s.last}
        output = {"prompt_ids": [7] * prompt_len_of(s.prompt_id), "response_ids": tokens,
                  "reward_score": reward_of(s.prompt_id, s.session), "extra_fields": extra}
        plen = prompt_len_of(s.prompt_id)
        tag = {"status": "success", "prompt_len": plen, "response_len": s.target, "seq_len": plen + s.target,
               "global_steps": s.global_steps, "min_global_steps": s.first, "max_global_steps": s.last}
        row_fields = {**s.row, "uid": s.uid, "session_id": s.session, "global_steps": s.global_steps}
        self.writer(self.tq, f"{s.uid}_{s.session}_0", tag, output, row_fields)
        self.written[(s.uid, s.session)] = s
        self.open[s.uid] -= 1
        if self.open[s.uid] == 0:
            self.tq.kv_batch_put([s.uid], "train", tags=[{"status": "finished"}])


class FakeV1Trainer:
    """PPOTrainer.fit's loop as far as the sampler, the dataset and the rollout see it."""

    def __init__(self, mode: str, policy: str, *, B: int = 8, n: int = 4, pool: int = 48, trace=None, tq=None,
                 batch_meta=FakeKVBatchMeta, writer=fixture_writer, threshold=None, strategy="drop", warmup: int = 1):
        self.mode, self.B, self.warmup = mode, B, warmup
        self.tq = tq if tq is not None else FakeTQ()
        self.rollout = FakeRollout(self.tq, n, writer=writer)
        self.run = f"test-{id(self)}"
        kwargs = {"policy": policy, "groups_per_step": B, "group_size": n, "max_tokens": M, "run": self.run, "seed": 3}
        if trace is not None:
            kwargs["trace_path"] = str(trace)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sync + an end_rollout policy warns (tested apart)
            self.sampler = LssimSampler(mode, {}, threshold, strategy, kwargs, refill_fn=self.add_prompts,
                                        store=self.tq, batch_meta=batch_meta, wait=self.rollout.advance)
        self.driver = self.sampler.driver
        self.rows = [{"index": i, "data_source": "fake", "raw_prompt": f"prompt {i}"} for i in range(pool)]
        self.driver.attach_pool(pool)  # what LssimDataset.__init__ does for the train files
        self.global_steps = 0
        self.batches = []

    def add_prompts(self, n: int) -> int:  # _add_prompts_to_generate: the loader's next n rows, submitted
        rows = [planned_row(self.driver, lambda pid: self.rows[pid]) for _ in range(n)]
        self.rollout.submit(rows, self.global_steps)
        return n

    def fit(self, steps: int) -> "FakeV1Trainer":
        self.global_steps = 1
        if self.mode == "colocate_async":
            self.add_prompts(self.warmup * self.B)  # on_train_begin: _add_async_warmup_batches
        for _ in range(steps):
            self.add_prompts(self.B)  # prepare_step
            batch, metrics = self.sampler.sample(global_steps=self.global_steps, partition_id="train", batch_size=self.B)
            self.batches.append((self.global_steps, batch, metrics))
            self.tq.kv_clear(batch.keys, "train")  # fit, 7. cleanup transfer queue
            self.rollout.version = self.global_steps  # on_step_end: update_weights(global_steps)
            self.global_steps += 1
        end_run(self.run)
        return self


def spy_plans(policy) -> dict[str, list]:
    """Wrap each member's plan: what every member returned, in order."""
    seen = defaultdict(list)
    for member in policy.members:
        inner = member.plan

        def plan(ctx, proposal, inner=inner, name=member.name):
            out = inner(ctx, proposal)
            seen[name].append(list(out))
            return out
        member.plan = plan
    return seen


