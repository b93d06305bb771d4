"""The recorder: responses read from a verl run, written as an lssim trace (`lssim.traces.trace`).

Lengths, versions and rewards are the ones verl stored in TransferQueue (records.py), never re-tokenized text;
finish reasons and budgets are the ones lssim's agent loop wrote, or inferred from the cap where it did not run
(`inferred_responses` counts those). Column by column:

    step                  verl's global_steps of the step that drew the prompt, minus one (verl counts from 1)
    prompt_id             the prompt's row in the train dataset (lssim's dataset field, else verl's `index`)
    sample_idx            the response's session within its group; a prompt drawn twice in one step (two groups)
                          numbers its second group's sessions after the first's, as lssim's controller does
    prompt_len, response_len, policy_version_first/last   the tags' prompt_len, response_len, min/max_global_steps
    reward                the sum of `rm_scores` (verl puts the score on the last response token)
    finish_reason, max_tokens   `extra_fields["lssim"]` (agent_loop.py), else the cap and "length" at the cap
    step_rollout_seconds  sync trainer only: how long `sample` waited for the step's groups (verl's timing_s/gen);
                          NaN in async modes, where a step's responses come from several rollouts

A group verl generated but did not train (a policy's `select` left it out, or verl's staleness bound dropped it)
is written with `trained = False` where the trace schema has that column, and left out (counted in
`untrained_responses`) where it does not. The file is rewritten atomically (`lssim.traces.trace.write_trace`) after each
step, so a run that stops keeps every step recorded until then.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import Iterable

import numpy as np
import pandas as pd

from lssim.loop.policy import StepOutcome
from lssim.traces.trace import SCHEMA, write_trace

from lssim.integrations.verl.records import VerlResponse


class TraceRecorder:
    """Collects the responses of a verl run, step after step, and writes them as one lssim trace."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)
        self._rows: list[dict] = []
        self._next_sample: dict[tuple[int, int], int] = defaultdict(int)  # (step, prompt) -> next free sample_idx
        self._group_base: dict[str, int] = {}  # uid -> sample_idx of its session 0
        self.inferred_responses = 0
        self.untrained_responses = 0

    def add(self, responses: Iterable[VerlResponse], trained: bool, rollout_seconds: float = math.nan) -> int:
        """Record one settled batch of responses (whole groups). Returns how many rows were added."""
        added = 0
        for r in sorted(responses, key=lambda r: (r.uid, r.session_id)):
            base = self._group_base.get(r.uid)
            if base is None:  # a new group: its sessions take the next free sample indices of (step, prompt)
                base = self._group_base[r.uid] = self._next_sample[(r.step, r.prompt_id)]
            sample_idx = base + r.session_id
            self._next_sample[(r.step, r.prompt_id)] = max(self._next_sample[(r.step, r.prompt_id)], sample_idx + 1)
            self.inferred_responses += not r.measured
            if not trained and "trained" not in SCHEMA:
                self.untrained_responses += 1
                continue
            row = {"step": r.step, "prompt_id": r.prompt_id, "sample_idx": sample_idx, "prompt_len": r.prompt_len,
                   "response_len": r.response_len, "reward": r.reward, "finish_reason": r.finish_reason,
                   "max_tokens": r.max_tokens, "policy_version_first": r.version_first,
                   "policy_version_last": r.version_last, "step_rollout_seconds": rollout_seconds}
            if "trained" in SCHEMA:
                row["trained"] = trained
            self._rows.append(row)
            added += 1
        return added

    def frame(self) -> pd.DataFrame:
        """The responses recorded so far, as a trace frame (not yet validated)."""
        frame = pd.DataFrame(self._rows)
        if len(frame) and frame["step_rollout_seconds"].notna().any():
            # One value per step: the wait of the sample call that took the step's groups (sync mode: one call).
            frame["step_rollout_seconds"] = frame.groupby("step")["step_rollout_seconds"].transform("max")
        return frame

    def write(self, path: str | os.PathLike | None = None) -> pd.DataFrame:
        """Validate and write the trace atomically (lssim.traces.trace.write_trace); returns the written frame."""
        target = path if path is not None else self.path
        if target is None:
            raise ValueError("TraceRecorder.write: no path (give one here or to the constructor)")
        if not self._rows:
            raise ValueError(f"TraceRecorder.write({os.fspath(target)}): nothing recorded yet")
        return write_trace(self.frame(), target)


def step_outcome(step: int, responses: list[VerlResponse], trained_uids: set[str], rollout_seconds: float) -> StepOutcome:
    """What a policy remembers of a verl step (Policy.end_step): every response settled in it, and the prompts
    of the groups that went to training."""
    ordered = sorted(responses, key=lambda r: (r.uid, r.session_id))
    trained_pids = sorted({r.prompt_id for r in ordered if r.uid in trained_uids})
    return StepOutcome(
        step=step,
        prompt_id=np.array([r.prompt_id for r in ordered], dtype=np.int64),
        sample_idx=np.array([r.session_id for r in ordered], dtype=np.int64),
        response_len=np.array([r.response_len for r in ordered], dtype=np.int64),
        max_tokens=np.array([r.max_tokens for r in ordered], dtype=np.int64),
        reward=np.array([r.reward for r in ordered], dtype=float),
        finish_reason=np.array([r.finish_reason for r in ordered], dtype=object),
        rollout_seconds=float(rollout_seconds),
        trained_prompt_ids=np.array(trained_pids, dtype=np.int64),
    )
