"""The run's data loader: the groups a step proposes and a policy draws, batch after batch of a PromptSource.

A batch is fetched once, in step order, so a source that is itself a cursor (real_backend's TaskPrompts) sees a
plain stream; what is drawn is consumed, as in slime's data source. The controller owns one (Controller.loader).
"""

from __future__ import annotations

import functools
import operator
from typing import Sequence

import numpy as np

from lssim.loop.contracts import PromptSource
from lssim.loop.core import Group, GroupSpec, GroupSpecs


class DataLoader:
    """`prompts`' batches for a run of `config`'s shape (lssim.loop.controller.RunConfig): a cursor over them and the
    batches fetched so far (the last two: a step's and the one drawn ahead)."""

    def __init__(self, prompts: PromptSource, config):
        self.prompts, self.config = prompts, config
        self.batches: dict[int, list[GroupSpec]] = {}  # the batches fetched so far, by step
        self.cursor = (0, 0)  # (batch, offset) of the next group the loader gives
        self.batch_samples: dict[int, dict[int, int]] = {}  # loader batch -> prompt -> samples of it generated so far
        self.left_out: set[int] = set()  # rids a recorded group says were not trained (GroupSpec.member_trained)

    def start_step(self, step: int) -> None:
        """A step's proposal starts at its own batch (or past what was drawn)."""
        self.cursor = max(self.cursor, (step, 0))

    def take(self, n: int) -> Sequence[GroupSpec]:
        """The next n groups of the data loader: the rest of the current step's batch, then the next batches.
        Each batch is fetched once, in step order, so a source that is itself a cursor sees a plain stream.
        Slices of batches given as columns (lssim.loop.core.GroupSpecs) stay columns; anything else is a list."""
        pieces: list[Sequence[GroupSpec]] = []
        k, i, got = *self.cursor, 0
        while got < n:
            batch = self.batch(k)
            if not batch:
                break
            if i >= len(batch):
                k, i = k + 1, 0
                continue
            taken = batch[i:i + n - got]
            if isinstance(taken, GroupSpecs):
                taken = taken.from_batch(k)
            else:
                for g in taken:
                    if g.batch is None:
                        g.batch = k
            pieces.append(taken)
            got += len(taken)
            i += len(taken)
        self.cursor = (k, i)
        return pieces[0] if len(pieces) == 1 else _joined(pieces)

    def batch(self, k: int) -> list[GroupSpec]:
        batch = self.batches.get(k)
        if batch is None:
            cfg = self.config
            batch = self.batches[k] = self.prompts.default_groups(k, cfg.groups_per_step, cfg.group_size, cfg.max_tokens)
            for old in [j for j in self.batches if j < k - 1]:
                del self.batches[old]
                self.batch_samples.pop(old, None)
        return batch

    def proposal_size(self, step: int, carried: int, groups_left: int) -> int:
        """Groups the step's proposal takes from the loader: its own batch whole, less the carried groups, within
        what the run has left. A recorded batch (a trace's step) may differ in size from the run's nominal
        `groups_per_step`; a dataset's batches are that size. Where the loader was drawn past the step's batch, or
        the carried groups fill the nominal batch, the nominal size counts (and no batch is fetched that the
        proposal would not take: a source that is a cursor sees the same stream as before)."""
        nominal = self.config.groups_per_step
        if self.cursor == (step, 0) and nominal > carried and groups_left > carried:
            nominal = len(self.batch(step))
        return max(0, min(nominal - carried, groups_left - carried))

    def leave_out(self, selected: list[Group], done: list[Group]) -> tuple[list[Group], int]:
        """The selected groups less the members their recorded group says were not trained, and how many groups
        that left empty: those were generated, and used, but not trained, as in the run the trace recorded."""
        if not self.left_out:
            return selected, 0
        left_out, trained, emptied = self.left_out, [], 0
        out = np.fromiter(left_out, np.int64, len(left_out))
        for g in selected:
            keep = ~np.isin(g.column("rid"), out)
            if keep.all():
                trained.append(g)
            elif keep.any():
                trained.append(g.subset(keep))
            else:
                emptied += 1
        left_out.difference_update(rid for g in done for rid in g.column("rid").tolist())  # settled: forget them
        return trained, emptied


def _joined(pieces: list[Sequence[GroupSpec]]) -> Sequence[GroupSpec]:
    """Slices of the loader's batches as one sequence: columns where every slice is columns no one has read a group
    of (no GroupSpec made: GroupSpecs' concatenation), else a list (none: an empty one)."""
    if not pieces or not all(isinstance(p, GroupSpecs) and p.untouched for p in pieces):
        return [g for piece in pieces for g in piece]
    return functools.reduce(operator.add, pieces)
