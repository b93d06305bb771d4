"""What verl's TransferQueue holds about one response, read as an lssim response row.

Read from verl 0.9.1 (the PyPI wheel verl-0.9.1-py3-none-any.whl, sha256 db6e6f2a8d9d5808...; source at
github.com/verl-project/verl, formerly volcengine/verl):

- `verl/trainer/ppo/v1/agent_loop_tq.py`, `AgentLoopWorkerTQ._agent_loop_postprocess`: every agent-loop output
  goes into TransferQueue under the key `{uid}_{session_id}_{index}` (uid: the prompt's, drawn per prompt;
  session_id: 0..n-1 within its group; index: the output's position for agent loops with several outputs), with
  the tag `{"status": "success", "prompt_len", "response_len", "seq_len", "global_steps", "min_global_steps",
  "max_global_steps"}` -- `global_steps` is the trainer step whose data loader drew the prompt, min/max the
  weight versions of its first and last token -- and as fields `AgentLoopOutput.as_dict()` (`rm_scores`: the
  reward on the last response token; `extra_fields`: a dict) merged with the prompt's dataset fields (`index`,
  `uid`, `session_id`, and any field the dataset row carries).
- `_run_prompt` (same file): the prompt's own key `{uid}` has the tag `{"is_prompt": True, "status":
  pending|running|finished|failure, "global_steps"}`; the group size is the row's `__rollout_n__`, else
  `rollout.n`.
- `verl/workers/rollout/vllm_rollout/vllm_async_server.py`, `generate`: `TokenOutput.stop_reason` is
  "completed" for vLLM's "stop" AND "length", "aborted" for "abort"; `verl/workers/rollout/llm_server.py`,
  `FullyAsyncLLMServerClient.generate`, sets "length" when a resumed generation reaches its budget. The tags
  therefore carry exact lengths and versions but no finish reason and no budget: lssim's agent loop
  (`agent_loop.py`) writes both into `extra_fields["lssim"]`, with the count of tokens the engine generated
  (the tag's response_len is what verl trains on, after the tokenizer's boundary handling: the same count
  for verl's default builder); without it the budget is the cap and the finish reason is inferred from it.

Nothing here imports verl: fields may be TensorDict columns (tensors, nested tensors, NonTensorStack) or
plain lists, so the same code reads real TransferQueue batches and the tests' fixtures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from lssim.loop.core import ABORT, LENGTH, STOP

# Fields lssim adds to a verl dataset row (dataset.py) and to an agent-loop output (agent_loop.py).
PROMPT_ID_FIELD = "lssim_prompt_id"  # the prompt's position in lssim's pool (= its row in the train dataset)
BUDGET_FIELD = "lssim_max_tokens"  # the response budget the policy chose for the prompt's group
ROLLOUT_N_FIELD = "__rollout_n__"  # verl's own per-row group size (AgentLoopWorkerTQ._run_prompt pops it)
EXTRA_KEY = "lssim"  # extra_fields["lssim"] = {"max_tokens", "finish_reason"} written by lssim's agent loop

# What verl's rollout servers report in TokenOutput.stop_reason, mapped to lssim's finish reasons.
_ABORTED = ("aborted", "abort")


def finish_reason_of(stop_reason: str | None, n_tokens: int, max_tokens: int, ends_with_eos: bool) -> str:
    """The lssim finish reason of one generation, from what verl's server reported.

    vLLM's "length" and "stop" both arrive as "completed", so the budget decides: a response that filled its
    budget without ending on an end-of-sequence token hit the budget (vLLM reports "stop" when the budget's
    last token is EOS, and so does this)."""
    if stop_reason in _ABORTED:
        return ABORT
    if stop_reason == "length":
        return LENGTH
    return LENGTH if n_tokens >= max_tokens and not ends_with_eos else STOP


def parse_key(key: str) -> tuple[str, int, int]:
    """`{uid}_{session_id}_{index}` -> (uid, session_id, index). uids are uuid4 strings (no underscore)."""
    parts = str(key).rsplit("_", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"TransferQueue key {key!r} is not a trajectory key {{uid}}_{{session_id}}_{{index}}")
    return parts[0], int(parts[1]), int(parts[2])


def column(fields: Mapping[str, Any], name: str, n: int) -> list | None:
    """One field of a fetched batch as a Python list of n values (None if the batch lacks the field)."""
    try:
        values = fields[name]
    except KeyError:
        return None
    if hasattr(values, "is_nested") and values.is_nested:  # a jagged torch tensor: one tensor per sample
        out = list(values.unbind())
    elif hasattr(values, "tolist"):  # torch tensor, numpy array, tensordict NonTensorStack
        out = values.tolist()
    else:
        out = list(values)
    if len(out) != n:
        raise ValueError(f"TransferQueue field {name!r} has {len(out)} values for {n} keys")
    return out


def _total(value: Any) -> float:
    """A token-level score (verl's rm_scores: the reward sits on the last token) as one number."""
    if hasattr(value, "sum"):
        return float(value.sum())
    if isinstance(value, (list, tuple)):
        return float(sum(_total(v) for v in value))
    return float(value)


@dataclass(slots=True, frozen=True)
class VerlResponse:
    """One response as lssim records it, with where in TransferQueue it came from."""

    key: str
    uid: str
    step: int  # 0-based: verl's global_steps (1-based) of the step that drew the prompt, minus one
    prompt_id: int
    session_id: int
    prompt_len: int
    response_len: int
    reward: float
    finish_reason: str
    max_tokens: int
    version_first: int
    version_last: int
    measured: bool  # True: finish reason and budget written by lssim's agent loop; False: inferred from the cap


def _int(value: Any, what: str, key: str) -> int:
    if value is None or isinstance(value, bool):
        raise ValueError(f"{key}: {what} is missing")
    number = float(value.item() if hasattr(value, "item") else value)
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{key}: {what} must be an integer, got {value!r}")
    return int(number)


def responses_from_batch(keys: Sequence[str], tags: Sequence[Mapping], fields: Mapping[str, Any],
                         default_max_tokens: int) -> list[VerlResponse]:
    """Read a batch of trajectories (keys, their tags, their fields fetched from TransferQueue) as responses.

    `fields` needs `rm_scores` and the prompt id (`lssim_prompt_id`, else verl's `index`); `extra_fields` is read
    when present. Of an agent loop with several outputs per session, the last output is the response (as verl's
    own validation metrics do). `default_max_tokens` (rollout.response_length) is the budget where the agent
    loop did not record one."""
    n = len(keys)
    scores = column(fields, "rm_scores", n)
    if scores is None:
        raise ValueError("TransferQueue batch has no rm_scores: the reward is computed after sampling (a colocated reward "
                         "model); recording needs streaming rewards (rule-based, or reward.reward_model.enable_resource_pool=True)")
    prompt_ids = column(fields, PROMPT_ID_FIELD, n) or column(fields, "index", n)
    if prompt_ids is None:
        raise ValueError(f"TransferQueue batch has neither {PROMPT_ID_FIELD!r} nor 'index': no prompt id to record")
    extras = column(fields, "extra_fields", n) or [{}] * n
    last = {}  # (uid, session) -> position of its last output
    for i, key in enumerate(keys):
        uid, session, index = parse_key(key)
        if (uid, session) not in last or index > parse_key(keys[last[(uid, session)]])[2]:
            last[(uid, session)] = i
    out = []
    for i in sorted(last.values()):
        out.append(_response(keys[i], tags[i], prompt_ids[i], scores[i], extras[i], default_max_tokens))
    return out


def _response(key: str, tag: Mapping, prompt_id: Any, score: Any, extra: Any, default_max_tokens: int) -> VerlResponse:
    uid, session, _ = parse_key(key)
    step = _int(tag.get("global_steps"), "tag global_steps", key) - 1
    if step < 0:
        raise ValueError(f"{key}: tag global_steps must be >= 1 (verl counts steps from 1), got {step + 1}")
    response_len = _int(tag.get("response_len"), "tag response_len", key)
    first, last = tag.get("min_global_steps"), tag.get("max_global_steps")
    version_first = step if first is None else _int(first, "tag min_global_steps", key)
    version_last = version_first if last is None else _int(last, "tag max_global_steps", key)
    reward = _total(score)
    if not math.isfinite(reward):
        raise ValueError(f"{key}: reward {reward} is not finite")
    info = extra.get(EXTRA_KEY) if isinstance(extra, Mapping) else None
    if info:  # lssim's agent loop: the budget sent, why vLLM ended, and how many tokens the engine generated
        max_tokens = _int(info.get("max_tokens"), "extra_fields.lssim.max_tokens", key)
        finish = str(info.get("finish_reason"))
        response_len = _int(info.get("generated"), "extra_fields.lssim.generated", key)
    else:  # plain verl agent loop: the cap is the configured one, and a response that fills it was cut
        max_tokens = default_max_tokens
        finish = LENGTH if response_len >= max_tokens else STOP
    if finish not in (STOP, LENGTH, ABORT):
        raise ValueError(f"{key}: finish reason {finish!r} is not one of stop, length, abort")
    return VerlResponse(key=key, uid=uid, step=step, prompt_id=_int(prompt_id, "prompt id", key), session_id=session,
                        prompt_len=_int(tag.get("prompt_len"), "tag prompt_len", key), response_len=response_len,
                        reward=reward, finish_reason=finish, max_tokens=max_tokens, version_first=version_first,
                        version_last=version_last, measured=bool(info))
