"""april -- Active Partial Rollouts: over-provision, stop at the target, carry the rest (APRIL; slime).

Source: Zhou et al., "APRIL: Active Partial Rollouts in Reinforcement Learning to Tame Long-tail
Generation" (arXiv 2509.18521), as implemented in slime (`--partial-rollout`,
`--over-sampling-batch-size`, `--mask-offpolicy-in-partial-rollout`): the rollout asks for more groups
than the step trains on, ends as soon as the target number of groups has finished, aborts the rest
and puts every unfinished group back in a buffer, from which the next rollout takes first; a resumed
response keeps its tokens and continues under the new weights. Nothing is discarded.

Rule, each step:
- Target: the nominal groups per step (at most what the run has left).
- Plan: the groups carried from the last step are resubmitted first (the controller does that); the
  plan tops the proposal up, from the data loader (`ctx.draw`), to `over_provision` x target groups
  in flight, carried ones included (slime: buffer first, then fresh prompts).
- end_rollout: once `groups_done` (groups whose every member ended this step) reaches the target.
  Every group done by then trains (a few more than the target when several finish at once).
- on_unfinished: carry, always. A carried group's finished members wait with it; its unfinished
  members resume next step with the tokens they have (`tokens_before_resume`, and the versions they
  spanned in `policy_version_first/last`).
- Bounded staleness, `max_carry_steps` (default None: unbounded, as slime): a response carried that
  many times is forced to finish -- the rollout does not end while one is still running -- so no
  response spans more than max_carry_steps + 1 policy versions. Chosen over dropping it: nothing
  generated is thrown away.
- The run's last step (the target reaches what the run has left) does not over-provision and runs
  to completion, so every carried response ends before the run does.
- `mask_stale_tokens` (default False): a need (`needs()`), read by the trainer, not by the rollout. When
  True the trainer leaves out of the loss each response's leading tokens generated under weights older
  than the step that trains it (`lssim.loop.core.off_policy_tokens`: the tokens before its last resume, or all
  of them for a member that finished steps before its group did). slime's `--mask-offpolicy-in-partial-rollout`.
  The share of such tokens is the step column `off_policy_token_fraction`.

Over-provisioning changes which prompts meet at a step (the loader's next batch starts early). The simulator
answers a group by the loader batch it came from, so april replays a baseline's trace exactly; and a trace of an
april run, which recorded each group at the step it ran in, says which batch it came from (its `batch` column), so
the twin of that run is exact too (lssim.traces.workload.Workload.request_key). The summary says how much was modelled.
"""

from __future__ import annotations

import numpy as np

from lssim.loop.policy import CARRY, Policy, PolicyNeeds


class APRIL(Policy):
    name = "april"

    def __init__(self, over_provision: float = 2.0, max_carry_steps: int | None = None, mask_stale_tokens: bool = False):
        if over_provision < 1.0:
            raise ValueError(f"april: over_provision must be >= 1, got {over_provision}")
        if max_carry_steps is not None and max_carry_steps < 1:
            raise ValueError(f"april: max_carry_steps must be >= 1 or None, got {max_carry_steps}")
        self.over_provision, self.max_carry_steps, self.mask_stale_tokens = over_provision, max_carry_steps, bool(mask_stale_tokens)
        self._target = 0
        self._last_step = False
        self._carries: dict[int, int] = {}  # rid -> times carried so far (counted only where max_carry_steps reads it)
        self._must_finish: set[int] = set()  # rids carried max_carry_steps times: the rollout waits for them

    def needs(self):
        return PolicyNeeds(mask_stale_tokens=self.mask_stale_tokens)

    def plan(self, ctx, proposal):
        self._target = max(0, min(ctx.groups_per_step, ctx.groups_left))
        self._last_step = ctx.groups_left <= ctx.groups_per_step
        if self._last_step or ctx.draw is None:
            return proposal
        extra = round(self.over_provision * self._target) - ctx.carried_groups - len(proposal)
        return proposal + ctx.draw(extra) if extra > 0 else proposal

    def _ends(self, groups_done, must_finish_running):
        """The rule, for numbers and arrays alike: the target's groups are done and no response that must finish
        still runs (not on the run's last step, which runs to completion)."""
        return (not self._last_step) & (groups_done >= self._target) & (must_finish_running == 0)

    def end_rollout(self, state):
        return bool(self._ends(state.groups_done, len(self._must_finish)))

    def end_rollout_at(self, progress):
        must_finish = np.fromiter(self._must_finish, np.int64, len(self._must_finish))
        running = len(must_finish) - progress.ended_by(must_finish) if len(must_finish) else 0
        ends = np.flatnonzero(self._ends(progress.groups_done, running))
        return int(ends[0]) if len(ends) else -1

    def on_unfinished(self, request):
        self._carry(request.rid)
        return CARRY

    def on_unfinished_rows(self, unfinished):
        if self.max_carry_steps is not None:
            self._carry(*unfinished.rid.tolist())
        return np.ones(len(unfinished), bool)

    def _carry(self, *rids):
        """Each of `rids` (distinct) carried once more; those carried max_carry_steps times must finish. Unbounded,
        nothing reads the counts: none is kept (a cut's thousands of rids were a dict update each step)."""
        if self.max_carry_steps is None:
            return
        carries = self._carries
        counts = [carries.get(rid, 0) + 1 for rid in rids]
        carries.update(zip(rids, counts))
        self._must_finish.update(rid for rid, n in zip(rids, counts) if n >= self.max_carry_steps)

    def on_finish(self, request, state):
        if self._carries.pop(request.rid, None) is not None:
            self._must_finish.discard(request.rid)

    def on_finishes(self, ended, state):
        carries = self._carries
        if not carries:  # (unbounded: none counted)
            return
        for rid in [rid for rid in ended.rid.tolist() if rid in carries]:
            del carries[rid]
            self._must_finish.discard(rid)
