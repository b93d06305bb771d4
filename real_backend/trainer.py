"""GRPOTrainer: the lssim `Trainer` protocol as a real GRPO update in torch, weights pushed back into vLLM.

    trainer = GRPOTrainer(model_dir, engine, prompts, lr=2e-5)
    metrics = trainer.train(groups, step)

One RL step:
1. Advantages, per group: (reward - group mean) / (group std + eps). A group whose rewards are all
   equal has zero advantage everywhere and contributes nothing (GRPO learns nothing from it); it is not
   even run through the model. Members without a reward (NaN: dropped or stopped with no reward given)
   are left out of their group's statistics and of the loss.
2. Loss: PPO's clipped surrogate, per response token, with the ratio taken against the behaviour
   logprobs vLLM recorded while sampling (`r.signals["logprobs"]`); clip 0.2; token-level mean over
   every response token of the batch (DAPO's token-level normalization). No KL term.
3. `mini_batches` optimizer steps (AdamW, gradient clipping), each on a slice of the samples; with one
   the update is on-policy and the ratio is 1 up to the numeric gap between vLLM and torch
   (`logprob_gap` in the metrics shows it).
4. The new weights go into the running engine (`engine.update_weights`); the engine is never restarted.

`recompute_logprobs=True` first recomputes the old policy's log-probs with a forward pass over the batch (verl's
`compute_log_prob`) and takes the ratio against those instead of vLLM's. The metrics time each phase:
`logprob_seconds` (that recompute; 0 without it), `update_seconds` (building the samples, forward, backward and
optimizer steps) and `sync_seconds` (the push into the engine); lssim.sim.training models the same phases.
`logprob_cpu_seconds` / `update_cpu_seconds` are this process's CPU time in the same spans: on a shared machine
wall time includes waiting for a core, CPU time does not (real_backend/profile_trainer.py fits on it).

`mask_resumed=True` leaves out of the loss each response's leading tokens generated under weights older
than the step that trains it (`lssim.loop.core.off_policy_tokens`: the tokens before its last resume, or all of
them for a member that finished steps before its group did): slime's `--mask-offpolicy-in-partial-rollout`,
asked for by `april(mask_stale_tokens=True)`.

`set_train_mask(policy.train_mask)` (the controller does it for a policy with a `train_mask` hook, e.g. `g2tp`,
`entropy_prune`): each step the samples are shown to the policy as an lssim.loop.policy.TrainBatch (advantages, vLLM's
behaviour log-probs, the loss mask so far) before the log-prob recompute; the tokens it prunes leave the loss, and
a sequence it keeps nothing of is dropped and each is cut after its last kept token where the mask says so
(compaction: the same update, fewer tokens computed; real_backend/token_pruning.py says what that saves). The
metrics then carry what was pruned (`pruned_loss_fraction`, `computed_token_fraction`, tokens before and after).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from lssim.loop.contracts import Trainer
from lssim.loop.core import Group, Request, off_policy_tokens, token_lags
from lssim.loop.decisions import TrainBatch
from lssim.sim.train_batches import pack_padded

from .train_job import ThreadTrainJob, TrainLane


class GRPOTrainer(Trainer):
    def __init__(self, model_dir: str, engine=None, prompts=None, *, lr: float = 2e-5, clip: float = 0.2, eps: float = 1e-6,
                 mini_batches: int = 1, max_grad_norm: float = 1.0, weight_decay: float = 0.0, micro_batch_tokens: int = 16384,
                 mask_resumed: bool = False, recompute_logprobs: bool = False, device: str = "cpu", dtype: str = "float32",
                 seed: int = 0, threads: int | None = None, sync_on_start: bool = True, job_cpus: tuple[int, ...] | None = None):
        """
        engine: where new weights go after each step (anything with update_weights(state_dict)); None: nowhere.
        prompts: gives each prompt's token ids (prompt_tokens(prompt_id)).
        micro_batch_tokens: padded tokens per forward/backward pass (gradients accumulate over them).
        sync_on_start: push the checkpoint's weights into the engine now, so a reused engine starts from
            the checkpoint whatever ran on it before.
        job_cpus: the CPUs the thread of the jobs beside the rollout is pinned to (`start`; None: not pinned).
        """
        if mini_batches < 1:
            raise ValueError(f"mini_batches must be >= 1, got {mini_batches}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.engine, self.prompts = engine, prompts
        self.clip, self.eps, self.mini_batches = clip, eps, mini_batches
        self.max_grad_norm, self.micro_batch_tokens, self.mask_resumed = max_grad_norm, micro_batch_tokens, mask_resumed
        self.recompute_logprobs = recompute_logprobs
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=self.dtype).to(self.device)
        self.model.train()
        self.pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.rng = np.random.default_rng(seed)
        self.version = 0
        self.last_sync_seconds = 0.0
        self.train_mask = None  # a policy's train_mask hook (set_train_mask); None: every token trained
        self.last_pruning: dict = {}  # what the hook pruned at the last step (in its metrics too)
        self.lane = TrainLane(job_cpus)  # where `start`'s jobs run
        if sync_on_start and engine is not None:
            self.last_sync_seconds = engine.update_weights(self.model.state_dict(), version=0)

    # -- Trainer protocol --------------------------------------------------------------------------
    def set_train_mask(self, hook) -> bool:
        """Ask `hook` (lssim.loop.policy.Policy.train_mask) each step which tokens are trained."""
        self.train_mask = hook
        return True

    def train(self, groups: list[Group], step: int) -> dict:
        """One RL step, blocking: the update, then the new weights into the engine (the collocated step)."""
        metrics = self.update(groups, step)
        sync = 0.0
        if metrics["optimizer_steps"] and self.engine is not None:
            sync = self.engine.update_weights(self.model.state_dict(), version=step + 1)
        self.last_sync_seconds = sync
        metrics["sync_seconds"] = sync
        return metrics

    def start(self, groups: list[Group], step: int) -> ThreadTrainJob:
        """One RL step as a job beside the rollout (the execution modes that train beside it, lssim.loop.modes): the
        update runs on the trainer's thread; its weights reach the engine when the mode pushes them
        (real_backend.train_job.ThreadTrainJob.push). Jobs run one after another, in the order started."""
        return self.lane.start(self, groups, step)

    def started_jobs(self) -> list[ThreadTrainJob]:
        return self.lane.jobs

    def finish_jobs(self) -> None:
        self.lane.shutdown()

    def update(self, groups: list[Group], step: int) -> dict:
        """The step's update alone (no weight push): its metrics, `sync_seconds` 0."""
        t0, cpu0 = time.monotonic(), time.process_time()
        samples = self._samples(groups, step)
        metrics = {**learning_metrics(groups, step), "samples": len(samples), "groups_with_signal": len({s.group for s in samples}),
                   "tokens": int(sum(s.n_loss for s in samples)), "loss": math.nan, "grad_norm": math.nan,
                   "clip_fraction": math.nan, "logprob_gap": math.nan, "optimizer_steps": 0}
        logprob = logprob_cpu = 0.0
        if samples and metrics["tokens"] > 0 and self.recompute_logprobs:
            t1, cpu1 = time.monotonic(), time.process_time()
            self._recompute_logprobs(samples)
            logprob, logprob_cpu = time.monotonic() - t1, time.process_time() - cpu1
        if samples and metrics["tokens"] > 0:
            order = self.rng.permutation(len(samples))
            slices = [s for s in np.array_split(order, min(self.mini_batches, len(samples))) if len(s)]
            losses, norms, clipped, gaps = [], [], [], []
            for k, idx in enumerate(slices):
                loss, norm, clip_frac, gap = self._update([samples[i] for i in idx])
                losses.append(loss), norms.append(norm), clipped.append(clip_frac)
                if k == 0:
                    gaps.append(gap)  # before any update this step: the vLLM/torch numeric gap alone
            metrics.update(loss=float(np.mean(losses)), grad_norm=float(np.mean(norms)), clip_fraction=float(np.mean(clipped)),
                           logprob_gap=float(gaps[0]), optimizer_steps=len(slices))
        # (process_time is the process's CPU time: for a job beside the rollout it counts the controller's thread too.)
        compute, compute_cpu = time.monotonic() - t0, time.process_time() - cpu0
        self.version = step + 1 if metrics["optimizer_steps"] else self.version
        # Keys become `train_<key>` in the step's row; none may be "seconds" (the controller's own train_seconds).
        metrics.update(compute_seconds=compute, logprob_seconds=logprob, update_seconds=compute - logprob, sync_seconds=0.0,
                       logprob_cpu_seconds=logprob_cpu, update_cpu_seconds=compute_cpu - logprob_cpu, **self.last_pruning)
        return metrics

    # -- internals ---------------------------------------------------------------------------------
    def _samples(self, groups: list[Group], step: int) -> list["Sample"]:
        out = []
        for gi, g in enumerate(groups):
            members = [r for r in g.requests if math.isfinite(r.reward) and r.tokens is not None and r.generated > 0]
            if len(members) < 2:
                continue
            rewards = np.array([r.reward for r in members], dtype=float)
            std = rewards.std()
            if std == 0.0:
                continue  # no signal: every advantage is zero
            adv = (rewards - rewards.mean()) / (std + self.eps)
            for r, a in zip(members, adv):
                out.append(self._sample(r, float(a), gi, step))
        return self._pruned(out, step) if self.train_mask is not None else out

    def _pruned(self, samples: list["Sample"], step: int) -> list["Sample"]:
        """The samples as the policy's train_mask leaves them: pruned tokens out of the loss, each sample cut to the
        tokens still computed (none: dropped)."""
        batch = TrainBatch(step, np.array([len(s.prompt) for s in samples], np.int64),
                           np.array([len(s.response) for s in samples], np.int64),
                           np.array([s.advantage for s in samples], float), np.array([s.group for s in samples], np.int64),
                           logprobs=tuple(np.asarray(s.behaviour, float) for s in samples),
                           in_loss=tuple(np.asarray(s.mask, float) > 0 for s in samples),
                           rid=np.array([s.rid for s in samples], np.int64))
        mask = self.train_mask(batch)
        if mask is None:
            self.last_pruning = {}
            return samples
        mask.check(batch)
        self.last_pruning = mask.summary(batch)
        if mask.keep is None:
            raise ValueError("train_mask: given the tokens, a policy must say which it keeps (TrainMask.from_keep), not counts")
        out = []
        for s, keep, end in zip(samples, mask.keep, mask.computed.tolist()):
            if end:
                out.append(Sample(s.prompt, s.response[:end], s.behaviour[:end], keep[:end].astype(float).tolist(),
                                   s.advantage, s.group, s.rid))
        return out

    def _sample(self, r: Request, advantage: float, group: int, step: int) -> "Sample":
        prompt = list(self.prompts.prompt_tokens(r.prompt_id))
        response = list(r.tokens[:r.generated])
        behaviour = list(r.signals["logprobs"][:r.generated])
        if len(behaviour) != len(response):
            raise ValueError(f"request {r.rid}: {len(response)} tokens but {len(behaviour)} behaviour logprobs")
        mask = [1.0] * len(response)
        if self.mask_resumed:
            for i in range(min(off_policy_tokens(r, step), len(mask))):
                mask[i] = 0.0
        return Sample(prompt, response, behaviour, mask, advantage, group, r.rid)

    def _update(self, samples: list["Sample"]) -> tuple[float, float, float, float]:
        """One optimizer step on `samples`; returns (loss, grad norm, clip fraction, mean |logp - behaviour|)."""
        n_tokens = sum(s.n_loss for s in samples)
        if n_tokens == 0:
            return math.nan, math.nan, math.nan, math.nan
        self.optimizer.zero_grad(set_to_none=True)
        total_loss, total_clipped, total_gap = 0.0, 0.0, 0.0
        for batch in self._micro_batches(samples):
            ids, attn, targets, behaviour, adv, mask = batch
            logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, 1:].unsqueeze(-1)).squeeze(-1)
            m = mask[:, 1:]
            old = behaviour[:, 1:]
            ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))  # no inf * 0 on masked positions
            a = adv.unsqueeze(1)
            surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * a)
            loss = -(surrogate * m).sum() / n_tokens
            loss.backward()
            with torch.no_grad():
                total_loss += float(loss)
                total_clipped += float((((ratio - 1).abs() > self.clip).float() * m).sum())
                total_gap += float(((logp - old).abs() * m).sum())
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return total_loss, float(norm), total_clipped / n_tokens, total_gap / n_tokens

    @torch.no_grad()
    def _recompute_logprobs(self, samples: list["Sample"]) -> None:
        """The current weights' log-prob of each response token becomes the sample's old log-prob (verl's
        compute_log_prob): one forward pass over the whole batch, packed as the update packs it."""
        for idx in pack_padded([s.length for s in samples], self.micro_batch_tokens):
            batch = [samples[i] for i in idx]
            ids, attn, targets, *_ = self._collate(batch)
            logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, 1:].unsqueeze(-1)).squeeze(-1).cpu()
            for row, s in enumerate(batch):
                P, R = len(s.prompt), len(s.response)
                s.behaviour = logp[row, P - 1:P + R - 1].tolist()  # position j predicts token j + 1

    def _micro_batches(self, samples: list["Sample"]):
        """Padded batches of similar length, at most `micro_batch_tokens` padded tokens each (lssim.sim.training.pack_padded,
        the rule its ProfiledTrainCost prices)."""
        for idx in pack_padded([s.length for s in samples], self.micro_batch_tokens):
            yield self._collate([samples[i] for i in idx])

    def _collate(self, batch: list["Sample"]):
        T = max(s.length for s in batch)
        B = len(batch)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, T), dtype=torch.long)
        behaviour = torch.zeros((B, T), dtype=torch.float32)
        mask = torch.zeros((B, T), dtype=torch.float32)
        adv = torch.tensor([s.advantage for s in batch], dtype=torch.float32)
        for i, s in enumerate(batch):
            P, R = len(s.prompt), len(s.response)
            ids[i, :P + R] = torch.tensor(s.prompt + s.response)
            attn[i, :P + R] = 1
            behaviour[i, P:P + R] = torch.tensor(s.behaviour)
            mask[i, P:P + R] = torch.tensor(s.mask)
        d = self.device
        return ids.to(d), attn.to(d), ids.to(d), behaviour.to(d), adv.to(d), mask.to(d)


def learning_metrics(groups: list[Group], step: int) -> dict:
    """What the step trained on, for the learning curves (steps.parquet `trainer_<key>`): `reward`, the mean reward of
    the trained responses (those with a reward); `nonzero_advantage_groups`, the share of groups whose rewards differ
    (the others teach GRPO nothing); `tokens_stale0` / `tokens_stale1` / `tokens_stale2plus`, the trained responses'
    tokens generated under weights 0, 1, 2 or more versions behind the step (lssim.loop.core.token_lags)."""
    rewards, signal, stale = [], 0, [0, 0, 0]
    for g in groups:
        members = [r for r in g.requests if math.isfinite(r.reward)]
        rewards += [r.reward for r in members]
        signal += len({r.reward for r in members}) > 1
        for r in members:
            for lag, n in token_lags(r, step):
                stale[min(max(lag, 0), 2)] += n
    return {"reward": float(np.mean(rewards)) if rewards else math.nan,
            "nonzero_advantage_groups": signal / len(groups) if groups else math.nan,
            "tokens_stale0": stale[0], "tokens_stale1": stale[1], "tokens_stale2plus": stale[2]}


class Sample:
    __slots__ = ("prompt", "response", "behaviour", "mask", "advantage", "group", "rid")

    def __init__(self, prompt, response, behaviour, mask, advantage, group, rid=-1):
        self.prompt, self.response, self.behaviour, self.mask = prompt, response, behaviour, mask
        self.advantage, self.group, self.rid = advantage, group, rid

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.response)

    @property
    def n_loss(self) -> int:
        return int(sum(self.mask))
