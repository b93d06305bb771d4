"""Where GRPOTrainer's forward and backward passes run: in the trainer's process (LocalCompute) or in a worker process
of their own (ProcessCompute, `RealSetup.trainer_process`).

    compute = LocalCompute(model, pad_id=0, clip=0.2, micro_batch_tokens=16384)
    compute = ProcessCompute(model, model_dir, pad_id=0, clip=0.2, micro_batch_tokens=16384, threads=1)
    compute.zero_grad(optimizer)                       # a step's gradients start from zero
    loss, clipped, gap = compute.accumulate(samples, divisor)   # forward and backward, gradients added in
    compute.recompute_logprobs(samples)                # each sample's old log-probs from the current weights
    compute.publish()                                  # the gradients where the optimizer reads them (p.grad)

Why a process: the trainer's update beside the rollout (the modes other than collocated) ran on a thread of the
driver's process, so it shared the interpreter's lock with the driver (the controller, the policy, vLLM's
output handling). The update's small-tensor work waits for the lock whenever the driver holds it: while the driver
works in Python 30% of the time a streamed piece takes 1.2-1.5x, all of the time 19-24x
(`python -m paper.experiments.measure_gil_share`). Production trainers (verl's, AReaL's, slime's) run in processes of
their own. With ProcessCompute the driver's process keeps the model's weights, the optimizer and its state, and
builds the samples (a policy's train_mask runs there); the worker holds the same weights (shared memory: the
optimizer's in-place step is seen at once) and its own gradients, and runs the micro-batches. The driver's thread
that asked waits on a pipe, without the lock. `publish` copies the worker's gradients into shared buffers that
are the driver's parameters' `.grad`, so clipping and the optimizer step run as before. Gradients accumulate in
the worker exactly as they do in one process (the same additions in the same order): the update is the same up to
what torch computes in a different process (tests/test_train_compute.py).

CPU only: on a GPU the trainer has devices of its own and the worker would need the CUDA context and IPC handles.
"""

from __future__ import annotations

import os
import traceback
import weakref

import torch

from lssim.sim.train_batches import pack_padded


# A process's first passes pay for torch's start-up there (its thread pool, the allocator growing to the passes'
# sizes, each operation's first call): a fresh trainer process's first update took 0.12-0.15 s longer than its later
# ones (`python -m paper.experiments.measure_first_update`), which the trainer profile (it discards a warm-up) does
# not price. One throwaway `accumulate` at least as large as a step's micro-batch (here 20 sequences of up to ~290
# tokens) before the first step leaves 0.00-0.06 s of it; it costs ~0.7 s once per process.
WARM_UP_SHAPE = (20, 512)  # sequences x tokens
_warmed_devices: set[str] = set()


class LocalCompute:
    """The passes on `model` in this process (also what the worker runs on its copy). The first one made on a
    device in a process warms that device up (`warm_up`)."""

    def __init__(self, model, *, pad_id: int, clip: float, micro_batch_tokens: int, device=None):
        self.model, self.pad_id, self.clip, self.micro_batch_tokens = model, pad_id, clip, micro_batch_tokens
        self.device = device if device is not None else next(model.parameters()).device
        if str(self.device) not in _warmed_devices:
            self.warm_up()
            _warmed_devices.add(str(self.device))

    def warm_up(self, shape: tuple[int, int] = WARM_UP_SHAPE) -> None:
        """One throwaway `accumulate` (the loss's own operations included) of random tokens, on a model with no step
        taken yet: the gradients it leaves are dropped, the weights and every random generator are as before."""
        from .trainer import Sample

        n, length = shape
        n = max(1, min(n, self.micro_batch_tokens // length))  # never more than one micro-batch of the real update
        shape, prompt = (n, length), min(8, length - 1)
        tokens = torch.randint(0, int(self.model.config.vocab_size), shape, generator=torch.Generator().manual_seed(0))
        zeros, ones = [0.0] * (length - prompt), [1.0] * (length - prompt)
        samples = [Sample(row[:prompt], row[prompt:], zeros, ones, 1.0 if i % 2 else -1.0, i // 2)
                   for i, row in enumerate(tokens.tolist())]
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            self.accumulate(samples, float(n * length))
        for p in self.model.parameters():
            p.grad = None

    def zero_grad(self, optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)

    def publish(self) -> None:
        """The gradients are the model's own already."""

    def close(self) -> None:
        """Nothing to end."""

    def accumulate(self, samples, divisor: float) -> tuple[float, float, float]:
        """Forward and backward of `samples` by micro-batch, each micro-batch's loss `-sum(surrogate * mask) / divisor`
        added into the gradients; returns the sums of that loss, of clipped tokens and of |logp - behaviour|."""
        total_loss, total_clipped, total_gap = 0.0, 0.0, 0.0
        for idx in pack_padded([s.length for s in samples], self.micro_batch_tokens):
            ids, attn, targets, behaviour, adv, mask = self.collate([samples[i] for i in idx])
            logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, 1:].unsqueeze(-1)).squeeze(-1)
            m = mask[:, 1:]
            old = behaviour[:, 1:]
            ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))  # no inf * 0 on masked positions
            a = adv.unsqueeze(1)
            surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * a)
            loss = -(surrogate * m).sum() / divisor
            loss.backward()
            with torch.no_grad():
                total_loss += float(loss)
                total_clipped += float((((ratio - 1).abs() > self.clip).float() * m).sum())
                total_gap += float(((logp - old).abs() * m).sum())
        return total_loss, total_clipped, total_gap

    @torch.no_grad()
    def recompute_logprobs(self, samples) -> None:
        """The current weights' log-prob of each response token becomes the sample's old log-prob (verl's
        compute_log_prob): one forward pass over the whole batch, packed as the update packs it."""
        for idx in pack_padded([s.length for s in samples], self.micro_batch_tokens):
            batch = [samples[i] for i in idx]
            ids, attn, targets, *_ = self.collate(batch)
            logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, 1:].unsqueeze(-1)).squeeze(-1).cpu()
            for row, s in enumerate(batch):
                P, R = len(s.prompt), len(s.response)
                s.behaviour = logp[row, P - 1:P + R - 1].tolist()  # position j predicts token j + 1

    def collate(self, batch):
        """One micro-batch padded to its longest sample: ids, attention mask, targets, behaviour log-probs,
        advantages, loss mask (lssim.sim.training.pack_padded decides what goes together)."""
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


class ProcessCompute:
    """The passes in a worker process on the same weights (module docstring). `model`'s parameters are moved into
    shared memory and given shared `.grad` buffers; the worker loads `model_dir`'s architecture and takes them."""

    def __init__(self, model, model_dir: str, *, pad_id: int, clip: float, micro_batch_tokens: int,
                 threads: int | None = None, cpus: tuple[int, ...] | None = None):
        if next(model.parameters()).device.type != "cpu":
            raise ValueError("a trainer process (RealSetup.trainer_process) is for a trainer on the CPU")
        model.share_memory()
        names, self.params = zip(*model.named_parameters())
        self.grads = [torch.zeros_like(p).share_memory_() for p in self.params]
        ctx = torch.multiprocessing.get_context("spawn")  # fork would copy vLLM's and the driver's threads' state
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, name="grpo-trainer", daemon=True,
                                    args=(child, str(model_dir), model.dtype, list(names), [p.data for p in self.params], self.grads,
                                          dict(pad_id=pad_id, clip=clip, micro_batch_tokens=micro_batch_tokens),
                                          threads, cpus))
        self._process.start()
        child.close()
        self._finalizer = weakref.finalize(self, _stop, self._conn, self._process)
        self._ask("ready")

    def zero_grad(self, optimizer) -> None:
        self._ask("zero")

    def accumulate(self, samples, divisor: float) -> tuple[float, float, float]:
        return self._ask("accumulate", samples, divisor)

    def recompute_logprobs(self, samples) -> None:
        for s, behaviour in zip(samples, self._ask("logprobs", samples)):
            s.behaviour = behaviour

    def publish(self) -> None:
        """The worker's gradients into the shared buffers, which become the parameters' `.grad` (None where the
        worker has none, as after a backward that did not reach them)."""
        present = self._ask("publish")
        for p, g, has in zip(self.params, self.grads, present):
            p.grad = g if has else None

    def close(self) -> None:
        self._finalizer()

    def _ask(self, what: str, *args):
        if not self._finalizer.alive:
            raise RuntimeError("the trainer process was closed")
        try:
            self._conn.send((what, args))
            status, value = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            raise RuntimeError(f"the trainer process ended (exit code {self._process.exitcode}) while asked to {what}: "
                               f"{type(e).__name__}") from None
        if status == "error":
            raise RuntimeError(f"the trainer process failed to {what}:\n{value}")
        return value


def _stop(conn, process) -> None:
    try:
        conn.send(("stop", ()))
    except (OSError, BrokenPipeError):
        pass
    process.join(timeout=30)
    if process.is_alive():
        process.kill()
    conn.close()


def _serve(conn, model_dir: str, dtype, names, params, grads, settings: dict, threads, cpus) -> None:
    """The worker: the model on the shared weights, its own gradients; answers the driver's requests until "stop"."""
    if threads:
        torch.set_num_threads(threads)
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
    own = dict(model.named_parameters())
    for name, shared in zip(names, params):
        own[name].data = shared  # the driver's weights themselves: its optimizer's steps are seen here
    model.train()
    local = LocalCompute(model, **settings)
    mine = [own[n] for n in names]
    while True:
        what, args = conn.recv()
        if what == "stop":
            return
        try:
            conn.send(("ok", _answer(what, args, local, mine, grads)))
        except Exception:  # the driver raises it, with this traceback
            conn.send(("error", traceback.format_exc()))


def _answer(what: str, args, local: LocalCompute, params, grads):
    if what == "ready":
        return None
    if what == "zero":
        for p in params:
            p.grad = None
        return None
    if what == "accumulate":
        return local.accumulate(*args)
    if what == "logprobs":
        samples = args[0]
        local.recompute_logprobs(samples)
        return [s.behaviour for s in samples]
    if what == "publish":
        present = []
        for p, g in zip(params, grads):
            present.append(p.grad is not None)
            if p.grad is not None:
                g.copy_(p.grad)
        return present
    raise ValueError(f"unknown request {what!r}")


__all__ = ["LocalCompute", "ProcessCompute"]
