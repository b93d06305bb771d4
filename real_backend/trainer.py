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

import json
import math
import threading
import time

import numpy as np
import torch

from lssim.loop.contracts import Trainer
from lssim.loop.core import Group, Request, off_policy_tokens, token_lags
from lssim.loop.decisions import TrainBatch

from .train_compute import LocalCompute, ProcessCompute
from .train_job import ThreadTrainJob, TrainLane
from .train_stream import GradientStream, capture, group_key


class GRPOTrainer(Trainer):
    def __init__(self, model_dir: str, engine=None, prompts=None, *, lr: float = 2e-5, clip: float = 0.2, eps: float = 1e-6,
                 mini_batches: int = 1, max_grad_norm: float = 1.0, weight_decay: float = 0.0, micro_batch_tokens: int = 16384,
                 mask_resumed: bool = False, recompute_logprobs: bool = False, device: str = "cpu", dtype: str = "float32",
                 seed: int = 0, threads: int | None = None, sync_on_start: bool = True, job_cpus: tuple[int, ...] | None = None,
                 process: bool = False):
        """
        engine: where new weights go after each step (anything with update_weights(state_dict)); None: nowhere.
        prompts: gives each prompt's token ids (prompt_tokens(prompt_id)).
        micro_batch_tokens: padded tokens per forward/backward pass (gradients accumulate over them).
        sync_on_start: push the checkpoint's weights into the engine now, so a reused engine starts from
            the checkpoint whatever ran on it before.
        job_cpus: the CPUs the thread of the jobs beside the rollout is pinned to (`start`; None: not pinned), and the
            trainer process's where there is one.
        process: run the forward and backward passes in a worker process of their own (CPU only;
            real_backend.train_compute.ProcessCompute: off the driver's interpreter lock); False: in this process.
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
        self.eps, self.mini_batches = eps, mini_batches
        self.max_grad_norm, self.micro_batch_tokens, self.mask_resumed = max_grad_norm, micro_batch_tokens, mask_resumed
        self.recompute_logprobs = recompute_logprobs
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=self.dtype).to(self.device)
        self.model.train()
        pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        # foreach: a handful of calls into torch per step instead of ~10 per tensor (the default on CPU). Each call gives
        # up the interpreter's lock and waits to get it back, so beside a driver streaming a rollout the per-tensor step
        # took 0.2-1.2 s instead of 5 ms (`python -m paper.experiments.measure_update_gil`); the result is bit-identical.
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay, foreach=True)
        settings = dict(pad_id=pad_id, clip=clip, micro_batch_tokens=micro_batch_tokens)  # the passes' (self.compute)
        self.compute = (ProcessCompute(self.model, model_dir, **settings, threads=threads, cpus=job_cpus) if process
                        else LocalCompute(self.model, **settings, device=self.device))
        self.rng = np.random.default_rng(seed)
        self.version = 0
        self.last_sync_seconds = 0.0
        self.train_mask = None  # a policy's train_mask hook (set_train_mask); None: every token trained
        self.last_pruning: dict = {}  # what the hook pruned at the last step (in its metrics too)
        self.lane = TrainLane(job_cpus)  # where `start`'s jobs (and `feed`'s streamed groups) run
        self._streams: dict[int, GradientStream] = {}  # step -> its groups fed so far (hybrid streams them)
        # A run checkpointed beside the rollout (keep_states): the trainer's state after each job, by the weights
        # version it made, until a checkpoint no longer needs it (real_backend.checkpoint).
        self.states: dict[int, dict] | None = None
        self._states_lock = threading.Lock()  # the lane adds states, a checkpoint (the controller's thread) drops them
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

    def rerun(self, groups: list[Group], step: int) -> ThreadTrainJob:
        """`start` for a resumed run: an update its checkpoint had not seen pushed, run again (its times are the
        resume's, not its step's: train_job.fill_step_rows leaves the step's own)."""
        return self.lane.start(self, groups, step, rerun=True)

    def feed(self, group: Group, step: int) -> None:
        """Step `step`'s update takes `group` now, beside the rollout (lssim.loop.contracts.Trainer.feed: hybrid hands
        over each group as it ends): its forward and backward run on the lane, the gradients accumulate
        (real_backend.train_stream), and `start(batch, step)` finishes the update. Nothing happens where the update
        cannot stream (several mini-batches, a policy's train_mask): `start` then runs it whole."""
        if self.mini_batches != 1 or self.train_mask is not None:
            return
        stream = self._streams.get(step)
        if stream is None:
            stream = self._streams[step] = GradientStream(step)
        stream.work.append(self.lane.submit(self.stream_group, stream, group))

    def stream_group(self, stream: GradientStream, group: Group) -> None:
        """One fed group's forward and backward on the caller's thread, its gradient added unnormalised into `stream`:
        what `feed` runs on the lane for each group (real_backend.host_sharing times these pieces beside the engine)."""
        t0, cpu0, began = time.monotonic(), time.process_time(), self._clock()()
        if not stream.keys:  # the step's first group: the gradients start from zero
            self.compute.zero_grad(self.optimizer)
            stream.start = began
        stream.keys.add(group_key(group))
        samples = self._samples([group], stream.step)
        if samples and self.recompute_logprobs:
            t1, cpu1 = time.monotonic(), time.process_time()
            self.compute.recompute_logprobs(samples)
            stream.logprob_seconds += time.monotonic() - t1
            stream.logprob_cpu_seconds += time.process_time() - cpu1
        loss, clipped, gap = self.compute.accumulate(samples, 1.0)
        stream.samples += len(samples)
        stream.signal_groups += bool(samples)
        stream.tokens += int(sum(s.n_loss for s in samples))
        stream.loss, stream.clipped, stream.gap = stream.loss + loss, stream.clipped + clipped, stream.gap + gap
        stream.seconds += time.monotonic() - t0
        stream.cpu_seconds += time.process_time() - cpu0
        stream.pieces.append([round(began, 6), round(self._clock()(), 6), len(samples)])

    def stream_start(self, step: int) -> float | None:
        """When step `step`'s streamed part began on the engine's clock; None if nothing of it was streamed."""
        stream = self._streams.get(step)
        return None if stream is None or math.isnan(stream.start) else stream.start

    def keep_states(self, version: int) -> None:
        """Keep the trainer's state after each job from now on (a checkpoint beside the rollout restores the one whose
        weights are on the engine, real_backend.checkpoint), starting with the state now, of weights `version` (the
        engine's). Call it with nothing running on the lane."""
        with self._states_lock:
            self.states = {version: capture(self)}

    def keep_state(self, version: int, weights: dict) -> None:
        """On the lane, as a job ends: the state after it, of weights `version` (`weights`: the job's snapshot of
        them, shared), if states are kept."""
        if self.states is not None:
            state = capture(self, weights)
            with self._states_lock:
                self.states[version] = state

    def state_for(self, version: int) -> dict:
        """The trainer's state when it made weights `version` (kept by keep_states): that of the newest update up to
        it (a step with nothing to train made no update: its version's weights are the one before). Older states
        are let go."""
        with self._states_lock:
            made = max((v for v in self.states or () if v <= version), default=None)
            if made is None:
                raise ValueError(f"no trainer state kept for weights version {version} (kept: {sorted(self.states or ())})")
            for old in [v for v in self.states if v < made]:
                del self.states[old]
            return self.states[made]

    def started_jobs(self) -> list[ThreadTrainJob]:
        return self.lane.jobs

    def finish_jobs(self) -> None:
        self.lane.shutdown()

    def close(self) -> None:
        """Wait for the jobs and end the worker process (if any): the trainer cannot train after."""
        self.finish_jobs()
        self.compute.close()

    def update(self, groups: list[Group], step: int) -> dict:
        """The step's update alone (no weight push): its metrics, `sync_seconds` 0. The groups `feed` streamed in
        for this step already have their gradients; only the rest are computed now."""
        t0, cpu0 = time.monotonic(), time.process_time()
        stream = self._take_stream(step, groups)
        metrics = learning_metrics(groups, step)
        if stream is None:
            metrics.update(self._whole_update(groups, step))
        else:
            metrics.update(self._streamed_update(stream, groups, step))
        # (process_time is the process's CPU time: for a job beside the rollout it counts the controller's thread too.)
        compute, compute_cpu = time.monotonic() - t0, time.process_time() - cpu0
        logprob, logprob_cpu = metrics.pop("_logprob"), metrics.pop("_logprob_cpu")
        if stream is not None:  # its streamed part ran earlier, beside the rollout
            compute, compute_cpu = compute + stream.seconds, compute_cpu + stream.cpu_seconds
            logprob, logprob_cpu = logprob + stream.logprob_seconds, logprob_cpu + stream.logprob_cpu_seconds
        self.version = step + 1 if metrics["optimizer_steps"] else self.version
        # Keys become `train_<key>` in the step's row; none may be "seconds" (the controller's own train_seconds).
        metrics.update(compute_seconds=compute, logprob_seconds=logprob, update_seconds=compute - logprob, sync_seconds=0.0,
                       logprob_cpu_seconds=logprob_cpu, update_cpu_seconds=compute_cpu - logprob_cpu,
                       streamed_groups=0 if stream is None else len(stream.keys),
                       pieces=json.dumps([] if stream is None else stream.pieces), **self.last_pruning)
        return metrics

    def _whole_update(self, groups: list[Group], step: int) -> dict:
        """The update on the whole batch at once: `mini_batches` optimizer steps on slices of its samples."""
        samples = self._samples(groups, step)
        metrics = _empty_metrics(samples)
        metrics["groups_with_signal"] = len({s.group for s in samples})
        if samples and metrics["tokens"] > 0 and self.recompute_logprobs:
            t1, cpu1 = time.monotonic(), time.process_time()
            self.compute.recompute_logprobs(samples)
            metrics.update(_logprob=time.monotonic() - t1, _logprob_cpu=time.process_time() - cpu1)
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
        return metrics

    def _streamed_update(self, stream: GradientStream, groups: list[Group], step: int) -> dict:
        """The update whose fed groups' gradients are in already: the other groups' added, the sum divided by the
        batch's loss tokens (the token-level mean's denominator, known only now), then the one optimizer step."""
        rest = [g for g in groups if group_key(g) not in stream.keys]
        samples = self._samples(rest, step)
        n_samples, n_tokens = stream.samples + len(samples), stream.tokens + int(sum(s.n_loss for s in samples))
        metrics = {**_empty_metrics(samples), "samples": n_samples, "tokens": n_tokens,
                   "groups_with_signal": stream.signal_groups + len({s.group for s in samples})}
        if not (n_samples and n_tokens > 0):
            return metrics
        if samples and self.recompute_logprobs:
            t1, cpu1 = time.monotonic(), time.process_time()
            self.compute.recompute_logprobs(samples)
            metrics.update(_logprob=time.monotonic() - t1, _logprob_cpu=time.process_time() - cpu1)
        self.rng.permutation(n_samples)  # the draw the whole update makes (one slice), so later steps draw the same
        loss, clipped, gap = self.compute.accumulate(samples, 1.0)
        self.compute.publish()
        torch._foreach_div_([p.grad for p in self.model.parameters() if p.grad is not None], n_tokens)  # one call (above)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm, foreach=True)
        self.optimizer.step()
        metrics.update(loss=(stream.loss + loss) / n_tokens, grad_norm=float(norm), optimizer_steps=1,
                       clip_fraction=(stream.clipped + clipped) / n_tokens, logprob_gap=(stream.gap + gap) / n_tokens)
        return metrics

    def _take_stream(self, step: int, groups: list[Group]) -> GradientStream | None:
        """Step `step`'s stream, if it streamed anything and every group it took is in `groups` (else its gradients are
        not the update's: the update runs whole). Streams of earlier steps are dropped."""
        for old in [k for k in self._streams if k < step]:
            del self._streams[old]
        stream = self._streams.pop(step, None)
        for work in stream.work if stream is not None else ():
            work.result()  # done (the lane ran it before this update): a fed group that failed fails the update
        return stream if stream is not None and stream.keys and stream.covers(groups) else None

    def _clock(self):
        """The clock a job's times are on: the engine's (seconds since it started), or the process's without one."""
        return self.engine.now if self.engine is not None else time.monotonic

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
        self.compute.zero_grad(self.optimizer)
        total_loss, total_clipped, total_gap = self.compute.accumulate(samples, n_tokens)
        self.compute.publish()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm, foreach=True)
        self.optimizer.step()
        return total_loss, float(norm), total_clipped / n_tokens, total_gap / n_tokens


def _empty_metrics(samples: list["Sample"]) -> dict:
    """An update's metrics before it runs (NaN: no optimizer step yet)."""
    return {"samples": len(samples), "tokens": int(sum(s.n_loss for s in samples)), "loss": math.nan, "grad_norm": math.nan,
            "clip_fraction": math.nan, "logprob_gap": math.nan, "optimizer_steps": 0, "_logprob": 0.0, "_logprob_cpu": 0.0}


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
