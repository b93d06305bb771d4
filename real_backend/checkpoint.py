"""Checkpoints of a real run: everything `lssim real --resume DIR` needs to go on from the last finished step.

    save_checkpoint(out_dir, controller, trainer, prompts, recorder, run_info)   # after every step (run_real does it)
    ckpt = load_checkpoint(out_dir)                                              # -> Checkpoint
    restore(ckpt, controller, trainer, prompts, recorder)                        # then push the weights, go on

One file, `DIR/checkpoint.pt`, written beside and renamed over the old one (lssim.results.atomic_write), so a
run killed at any moment (SIGKILL included) leaves the checkpoint of the last step whose on_step ran, whole.
It holds, as torch.save of plain objects:

- the trainer: `model.state_dict()`, `optimizer.state_dict()` (AdamW's moments and step counts), its weights
  version, its numpy generator (mini-batch order) and torch's CPU generator state;
- the controller's own state (`Controller.state()`, a plain dict): the run's generators (request seeds, the policy's generator), the id counters, the data loader's
  cursor in the controller and the batches it fetched, the response table and step rows so far, the groups
  trained, and the carried responses (with their tokens and logprobs) and their open groups. A carried response
  resumes in the next step on the new engine exactly as it would have (prompt + its tokens, re-prefilled);
- the policy object itself, pickled in the same pickle as the controller's state, so what they share stays shared
  (its scoreboards, histories, generators);
- the prompt source's cursor (TaskPrompts: epoch, shuffled order, position in it);
- the recorder's per-response signals (entropy, logprob, loop start, text of responses already ended);
- the mode's weights version, and what the run was started with (config, setup, policy spec) for the CLI.

Modes that train beside the rollout (disaggregated, async, hybrid; lssim.loop.modes) are checkpointed without
waiting for the updates still running, so the checkpoint never stalls the rollout: the trainer's state saved is
the one that made the weights on the engine (`mode.version`; GRPOTrainer.keep_states keeps it from the job that
made them), and the updates whose weights are not on the engine yet (`mode.pending()`) are saved as their steps
and groups, pickled with the controller's state. A resume restores that state, pushes its weights, and runs those
updates again on the new trainer (the same updates, from the same state and generators), which the mode then
waits for or takes as they end, as before. Responses an async run keeps generating across the boundary are saved
as carried (`Controller.state`): on the new engine they go on from their tokens so far (prompt + tokens
re-prefilled, as after an interruption by new weights).

What it does not hold: the engine (a new one is started; the weights are pushed into it) and anything on the old
engine's clock (the next step's times start from the new engine's clock: `Controller.restore` counts the first
resumed step's step_seconds from the resume; an update run again after a resume keeps its step's times as they
were, NaN where it had not ended: train_job.fill_step_rows).

Pickle: the file runs code when loaded (as any torch checkpoint with weights_only=False): load only your own.
"""

from __future__ import annotations

import io
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lssim.results import atomic_write

from .recorder import CHECKPOINT

FORMAT = 1  # format 1 files written before Controller.state() hold the controller's attributes: restore reads both


@dataclass
class Checkpoint:
    """A loaded checkpoint: the step it was taken after, and the pieces `restore` puts back."""

    step: int  # the last finished step; the resumed run starts at step + 1
    model: dict
    optimizer: dict
    trainer: dict
    controller: dict
    policy: object
    prompts: dict
    recorder: dict
    mode_version: int
    run: dict  # config, setup, policy_spec, mode, meta of the run that wrote it
    jobs: list = None  # (step, groups) of the updates whose weights were not on the engine yet, in order
    draw: "_Draw | None" = None  # what a kept StepContext.draw calls: bound to the new controller by `restore`

    @property
    def carried(self) -> list:
        """The responses the run carried into the step after the checkpoint (Controller.carried, as saved)."""
        state = self.controller  # a file written before Controller.state() names it by the attribute, _carried
        return state["carried"] if "carried" in state else state.get("_carried", [])


def save_checkpoint(out_dir, step: int, controller, trainer, prompts, recorder, run_info: dict,
                    writer: "CheckpointWriter | None" = None) -> Path:
    """Write `out_dir/checkpoint.pt` for the state after step `step` (atomically; raises if anything cannot be
    pickled, naming it). `writer`: write it on that thread (beside the rollout, where what is saved is copies)."""
    mode = controller.mode
    jobs = [(job.step, job.groups) for job in mode.pending()]  # their weights are not on the engine yet
    if mode.trains_beside:  # the state that made the engine's weights (jobs may be running on the trainer's thread)
        base = trainer.state_for(mode.version)
    else:
        base = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "trainer": {"version": trainer.version, "rng": trainer.rng.bit_generator.state,
                            "torch_rng": torch.get_rng_state()}}
    try:
        buf = io.BytesIO()
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump({"controller": controller.state(), "policy": controller.policy,
                                                              "jobs": jobs})
        blob = buf.getvalue()
    except Exception as e:
        raise ValueError(f"cannot checkpoint policy {controller.policy.name!r} or the controller's state: "
                         f"{type(e).__name__}: {e}") from e
    obj = {
        "format": FORMAT, "step": int(step), "model": base["model"], "optimizer": base["optimizer"], "trainer": base["trainer"],
        "state": blob,
        "prompts": loader_state(prompts),
        "recorder": {"signals": recorder.signals()},
        "mode_version": int(controller.mode.version),
        "run": run_info,
    }
    path = Path(out_dir) / CHECKPOINT
    if writer is None:
        atomic_write(path, lambda tmp: torch.save(obj, tmp))
    else:
        writer.write(path, obj)
    return path


class Checkpointer:
    """The checkpoint of the state after each step, a step observer (real_backend.world.run_real adds it after the
    files are written). `background`: written on a thread of its own (modes that train beside the rollout, whose
    checkpoint holds copies); `finish` waits for the last. A policy that cannot be pickled turns checkpoints off
    for the run, which goes on and says so (meta.json "checkpoint")."""

    def __init__(self, controller, trainer, prompts, recorder, run_info: dict, background: bool = False):
        self.controller, self.trainer, self.prompts, self.recorder, self.run_info = controller, trainer, prompts, recorder, run_info
        self.writer = CheckpointWriter() if background else None

    def __call__(self, row: dict) -> None:
        recorder = self.recorder
        if recorder.meta.get("checkpoint", "on") != "on":
            return
        try:
            save_checkpoint(recorder.out, int(row["step"]), self.controller, self.trainer, self.prompts, recorder,
                            self.run_info, self.writer)
        except ValueError as e:
            print(f"lssim real: warning: no checkpoints for this run: {e}", file=sys.stderr, flush=True)
            recorder.meta["checkpoint"] = f"off: {e}"
            recorder.remove_checkpoint()
            self.trainer.states = None  # no checkpoint will ask for the trainer's states after its updates

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.finish()


class CheckpointWriter:
    """Checkpoints written on a thread of their own, one after another (a run that trains beside the rollout: its
    checkpoint holds copies, and writing it, ~50 ms for the reference model here, would hold up the next rollout).
    A write's error is raised by the next `write` or by `finish` (the run's end, which waits for the last)."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._last = None

    def write(self, path: Path, obj: dict) -> None:
        self._raise_failed()
        self._last = self._pool.submit(atomic_write, path, lambda tmp: torch.save(obj, tmp))

    def finish(self) -> None:
        self._pool.shutdown(wait=True)
        self._raise_failed()

    def _raise_failed(self) -> None:
        if self._last is not None and self._last.done() and self._last.exception() is not None:
            raise self._last.exception()


def load_checkpoint(out_dir) -> Checkpoint:
    """The checkpoint in `out_dir`; ValueError naming the file if there is none or it is not one."""
    path = Path(out_dir) / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"--resume {out_dir}: no {CHECKPOINT} there (a run writes one after every finished step)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
        draw = _Draw()
        state = _Unpickler(io.BytesIO(obj["state"]), draw).load()
    except Exception as e:
        raise ValueError(f"{path}: not a readable checkpoint: {type(e).__name__}: {e}") from e
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {obj.get('format') if isinstance(obj, dict) else '?'}, "
                         f"this version reads {FORMAT}")
    return Checkpoint(step=obj["step"], model=obj["model"], optimizer=obj["optimizer"], trainer=obj["trainer"],
                      controller=state["controller"], policy=state["policy"], prompts=obj["prompts"],
                      recorder=obj["recorder"], mode_version=obj["mode_version"], run=obj["run"],
                      jobs=state.get("jobs", []), draw=draw)


def restore(ckpt: Checkpoint, controller, trainer, prompts, recorder) -> None:
    """Put a checkpoint's state back into freshly built objects of the same run (the controller must have been built
    with `ckpt.policy`). The trainer's weights are restored but not pushed: the caller pushes them into the engine
    and starts `ckpt.jobs` again (`restart_jobs`)."""
    trainer.model.load_state_dict(ckpt.model)
    trainer.optimizer.load_state_dict(ckpt.optimizer)
    trainer.version = ckpt.trainer["version"]
    trainer.rng = np.random.default_rng()
    trainer.rng.bit_generator.state = ckpt.trainer["rng"]
    torch.set_rng_state(ckpt.trainer["torch_rng"])
    controller.restore({**ckpt.controller, "mode_version": ckpt.mode_version})  # counts the next step from now
    if ckpt.draw is not None:
        ckpt.draw.controller = controller
    set_loader_state(prompts, ckpt.prompts)
    recorder.restore_signals(ckpt.recorder["signals"])


def restart_jobs(ckpt: Checkpoint, controller, trainer) -> None:
    """The updates the checkpoint saw running or waiting (`ckpt.jobs`) run again on `trainer` (restored, its weights
    pushed), in order, and the mode waits for them or takes them as before; from now on the trainer keeps the state
    after each update for the next checkpoint."""
    if not controller.mode.trains_beside:
        return
    trainer.keep_states(ckpt.mode_version)
    controller.mode.resume_jobs([trainer.rerun(groups, step) for step, groups in ckpt.jobs or []])


def recorded_train_times(out_dir, rows: list[dict]) -> None:
    """The step rows a checkpoint took while their update ran (train_end NaN) get the times the killed run's
    steps.parquet recorded once the update ended, if it did: the step's own times, which the update run again after
    the resume cannot give (train_job.fill_step_rows leaves a re-run's times alone)."""
    import pandas as pd

    try:
        old = pd.read_parquet(Path(out_dir) / "steps.parquet", columns=["step", "train_start", "train_end"])
    except (OSError, ValueError, KeyError):  # no file, or one without these columns: nothing to take back
        return
    ended = {int(step): (start, end) for step, start, end in old.itertuples(index=False) if end == end}
    for row in rows:
        if row.get("train_end") != row.get("train_end") and int(row["step"]) in ended:
            row["train_start"], row["train_end"] = ended[int(row["step"])]


class _Draw:
    """A policy may keep the StepContext it was given (dapo does); its `draw` is a lambda on the controller, which
    pickle cannot write. It is written as a name and read back as this, which draws from the new controller."""

    controller = None

    def __call__(self, n: int):
        if self.controller is None:
            raise RuntimeError("a restored StepContext.draw was called before its controller was restored")
        return self.controller.draw(n)


_DRAW = "Controller._proposal.<locals>.<lambda>"


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return "draw" if callable(obj) and getattr(obj, "__qualname__", None) == _DRAW else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, draw: _Draw):
        super().__init__(file)
        self.draw = draw

    def persistent_load(self, pid):
        if pid == "draw":
            return self.draw
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def loader_state(prompts) -> dict:
    """The prompt source's cursor (PromptSource.loader_state; TaskPrompts: epoch, order, position)."""
    return prompts.loader_state()


def set_loader_state(prompts, state: dict) -> None:
    prompts.set_loader_state(state)


__all__ = ["CHECKPOINT", "Checkpoint", "Checkpointer", "CheckpointWriter", "save_checkpoint", "load_checkpoint", "restore", "restart_jobs", "recorded_train_times",
           "loader_state", "set_loader_state"]
