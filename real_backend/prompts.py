"""TaskPrompts: the lssim `PromptSource` over the task's prompts (real_backend/task.py).

What a policy sees is the pool (prompt ids and their lengths in tokens); what a policy with no opinion
trains on is verl's data loader: a seeded shuffle of the pool per epoch, cut into batches in order, the
leftover that cannot fill a batch dropped (`drop_last`). The engine gets each prompt's token ids from
here, and the reward function decodes a response and scores it with the task's verifier.

Held-out prompts (`heldout`: real_backend/data/heldout.json for the task's prompts) are tokenized and scored like the
others but never in the pool, so training never draws them; real_backend.evaluate samples them (`heldout_ids`).
"""

from __future__ import annotations

import numpy as np

from lssim.loop.contracts import PromptSource
from lssim.loop.core import GroupSpec, PromptPool, Request

from . import task


class TaskPrompts(PromptSource):
    def __init__(self, prompts: list[task.Prompt], tokenizer, seed: int = 0, heldout: list[int] | None = None):
        if not prompts:
            raise ValueError("no prompts")
        all_ids = [p.prompt_id for p in prompts]
        if len(set(all_ids)) != len(all_ids):
            raise ValueError("prompt ids are not unique")
        held = set(heldout or ())
        self.heldout_ids = [i for i in all_ids if i in held]  # the held-out prompts among these, in file order
        ids = [i for i in all_ids if i not in held]
        if not ids:
            raise ValueError("every prompt is held out: nothing to train on")
        self.prompts = {p.prompt_id: p for p in prompts}
        self.tokenizer = tokenizer
        self.seed = seed
        self._tokens = {p.prompt_id: list(tokenizer(p.text)["input_ids"]) for p in prompts}
        self.pool = PromptPool(np.array(ids, dtype=np.int64), np.array([len(self._tokens[i]) for i in ids], dtype=np.int64))
        self._epoch = -1
        self._order: list[int] = []
        self._cursor = 0

    @classmethod
    def from_files(cls, prompts_path, model_dir, n_prompts: int | None = None, seed: int = 0,
                   heldout_path=None) -> "TaskPrompts":
        """The prompts of `prompts_path`, those listed in `heldout_path` (task.write_heldout's JSON) held out: the pool
        is the first `n_prompts` of the others (all of them if None); every held-out prompt is kept for evaluation."""
        prompts = task.load_prompts(prompts_path)
        held = set(task.load_heldout(heldout_path)) if heldout_path is not None else set()
        train = [p for p in prompts if p.prompt_id not in held]
        if n_prompts is not None:
            if n_prompts < 1:
                raise ValueError(f"n_prompts must be >= 1, got {n_prompts}")
            train = train[:n_prompts]
        if not train:
            raise ValueError(f"{prompts_path}: no prompts")
        heldout = [p for p in prompts if p.prompt_id in held]
        return cls(train + heldout, task.load_tokenizer(model_dir), seed, [p.prompt_id for p in heldout])

    # -- PromptSource ------------------------------------------------------------------------------
    def default_groups(self, step: int, n_groups: int, group_size: int, max_tokens: int) -> list[GroupSpec]:
        if n_groups <= 0:
            return []
        if n_groups > len(self.pool):
            raise ValueError(f"{n_groups} groups per step but only {len(self.pool)} prompts")
        if self._cursor + n_groups > len(self._order):
            self._new_epoch()
        batch = self._order[self._cursor:self._cursor + n_groups]
        self._cursor += n_groups
        return [GroupSpec(pid, group_size, max_tokens) for pid in batch]

    def prompt_len(self, prompt_id: int) -> int:
        return len(self._tokens[prompt_id])

    def loader_state(self) -> dict:
        """The loader's cursor: epoch, shuffled order, position in it (a checkpoint keeps it)."""
        return {"_epoch": self._epoch, "_order": self._order, "_cursor": self._cursor}

    def set_loader_state(self, state: dict) -> None:
        self._epoch, self._order, self._cursor = state["_epoch"], state["_order"], state["_cursor"]

    # -- what the engine and trainer need ------------------------------------------------------------
    def prompt_tokens(self, prompt_id: int) -> list[int]:
        return self._tokens[prompt_id]

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def reward(self, request: Request) -> float:
        """The task's verifier on the decoded response (1.0 right, 0.0 wrong or unfinished)."""
        return task.reward(self.prompts[request.prompt_id], self.decode(request.tokens or []))

    def _new_epoch(self) -> None:
        self._epoch += 1
        rng = np.random.default_rng([self.seed, self._epoch])
        self._order = self.pool.prompt_id[rng.permutation(len(self.pool))].tolist()
        self._cursor = 0
