"""`LssimSingleTurnAgentLoop`: verl's single-turn agent loop with the policy's per-group budget, recording why
each response ended.

verl 0.9.1 (PyPI wheel verl-0.9.1, sha256 db6e6f2a8d9d5808...):
- `verl/experimental/agent_loop/agent_loop.py`, `AgentLoopWorker.__init__`: `actor_rollout_ref.rollout.agent.
  agent_loop_config_path` names a YAML list of `{name, _target_}` entries added to the agent-loop registry;
  `_run_agent_loop` instantiates the row's `agent_name` (default `rollout.agent.default_agent_loop`) with
  hydra and awaits `run(sampling_params, **row_fields)`.
- `verl/experimental/agent_loop/single_turn_agent_loop.py`, `SingleTurnAgentLoop.run`: one
  `server_manager.generate(request_id, prompt_ids, sampling_params, ...)` call, the response cut at
  `rollout.response_length`.
- `verl/workers/rollout/vllm_rollout/vllm_async_server.py`, `generate`: `sampling_params["max_tokens"]`, when
  given, is the request's budget (clamped to the model's context); `TokenOutput.stop_reason` is "completed"
  for vLLM's stop and length alike (records.finish_reason_of tells them apart).

This loop reads the budget the policy chose (`lssim_max_tokens`, a field of the row lssim's dataset served),
caps it at `rollout.response_length`, generates through verl's own single-turn loop, and writes
`extra_fields["lssim"] = {"max_tokens", "finish_reason", "generated"}`, which verl stores with the trajectory in
TransferQueue and the recorder reads back. Multi-turn (tool) loops are not wrapped: their responses mix
generated and tool tokens.

Register it with a YAML file (`python -m lssim.integrations.verl config` writes one):

    - name: lssim_single_turn
      _target_: lssim.integrations.verl.agent_loop.LssimSingleTurnAgentLoop
"""

from __future__ import annotations

from typing import Any

from lssim.integrations.verl.records import BUDGET_FIELD, EXTRA_KEY, finish_reason_of

AGENT_NAME = "lssim_single_turn"
AGENT_LOOP_YAML = f"""- name: {AGENT_NAME}
  _target_: lssim.integrations.verl.agent_loop.LssimSingleTurnAgentLoop
"""


def budget_for(requested: Any, cap: int) -> int:
    """The request's max_tokens: the policy's budget (None: the cap), at most the cap, at least 1."""
    if requested is None:
        return int(cap)
    return max(1, min(int(requested), int(cap)))


def eos_ids(tokenizer: Any) -> set[int]:
    """The token ids that end a sequence (the tokenizer's eos, and generation config's list if it has one)."""
    ids = getattr(tokenizer, "eos_token_id", None)
    if ids is None:
        return set()
    return {int(i) for i in ids} if isinstance(ids, (list, tuple, set)) else {int(ids)}


def lssim_extra(token_output: Any, max_tokens: int, eos: set[int]) -> dict:
    """What the loop records of one generation (verl's TokenOutput: token_ids, stop_reason)."""
    tokens = list(getattr(token_output, "token_ids", None) or [])
    ends_with_eos = bool(tokens) and int(tokens[-1]) in eos
    finish = finish_reason_of(getattr(token_output, "stop_reason", None), len(tokens), max_tokens, ends_with_eos)
    return {"max_tokens": int(max_tokens), "finish_reason": finish, "generated": len(tokens)}


class _RecordingServer:
    """Stands in for the loop's server_manager: every call goes through; the last generation's output is kept."""

    def __init__(self, server: Any):
        self._server = server
        self.last = None

    async def generate(self, *args, **kwargs):
        self.last = await self._server.generate(*args, **kwargs)
        return self.last

    def __getattr__(self, name):
        return getattr(self._server, name)


try:  # the class exists where verl does
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
except ImportError:
    SingleTurnAgentLoop = None

if SingleTurnAgentLoop is not None:

    class LssimSingleTurnAgentLoop(SingleTurnAgentLoop):
        """verl's single-turn loop with the row's budget (`lssim_max_tokens`) and a recorded finish reason."""

        async def run(self, sampling_params: dict[str, Any], **kwargs):
            max_tokens = budget_for(kwargs.get(BUDGET_FIELD), self.response_length)
            params = dict(sampling_params)
            params["max_tokens"] = max_tokens
            server = self.server_manager = _RecordingServer(self.server_manager)
            output = await super().run(params, **kwargs)
            output.extra_fields[EXTRA_KEY] = lssim_extra(server.last, max_tokens, eos_ids(self.tokenizer))
            return output
