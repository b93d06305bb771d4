"""slime: the rollout dumps of ``--save-debug-rollout-data`` (or ``--dump-details DIR``).

Read against THUDM/slime at commit 624b824 (2026-08-21):

- ``slime/observability/rollout_data_utils.py::save_debug_rollout_data`` writes
  ``torch.save({"rollout_id": rollout_id, "samples": [sample.to_dict() for sample in data]}, path)``
  to ``args.save_debug_rollout_data.format(rollout_id=...)``; evaluation rollouts go to the same
  template with ``eval_`` before the id (skipped here: they are not training steps).
- ``slime/utils/arguments.py``: ``--dump-details DIR`` sets that template to
  ``DIR/rollout_data/{rollout_id}.pt`` (and writes the tokenizer to ``DIR/tokenizer``).
- ``slime/utils/types.py::Sample``: ``to_dict()`` is the sample's ``__dict__`` with ``status`` as
  its string value (``pending``, ``completed``, ``truncated``, ``aborted``, ``failed``);
  ``tokens`` is prompt + response token ids, ``response_length`` the response's share of them (the
  last ones), ``rollout_log_probs`` the log-prob of each response token as sampled (None where the
  rollout did not keep them),
  ``weight_versions`` one string per generation call (several for a partial rollout resumed under
  newer weights), ``reward`` a float or, with ``--reward-key``, a dict, ``remove_sample`` drops a
  sample from the loss.
- ``slime/rollout/data_source.py``: ``group_index`` counts prompt groups over the whole run,
  ``index`` samples, so two groups of one prompt in a step stay apart.

Measured: steps (rollout ids), groups, prompt and response lengths in tokens, rewards, finish
reasons, weight versions, samples removed from training, the early-exit signals (from the response's
token ids, and its ``rollout_log_probs`` where the dump has them: else the entropy is NaN). Inferred: the cap of responses that
were not truncated (``--max-tokens``, else the longest truncated response, else the longest
response), and the prompt id (a hash of the prompt, unless ``--prompt-key`` names a field).

A dump is data, not code: files are loaded with ``torch.load(weights_only=True)``; one that needs
arbitrary unpickling is refused unless ``--trust-pickle`` is given.
"""

from __future__ import annotations

import argparse
import pickle
import re
from pathlib import Path
from typing import Any

from lssim.traces.importers.common import (DumpError, Imported, Response, as_reward, build_trace, check_no_gaps, descend, prompt_hash,
                                           signal_stride, signals_said, step_files)
from lssim.traces.signal_trace import DEFAULT_STRIDE

NAME = "slime"
HELP = "slime --save-debug-rollout-data / --dump-details files (rollout_data/{rollout_id}.pt)"
FINISH = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "abort"}
"""slime's Sample.Status -> the trace's finish_reason (a failed tool call ended the generation early)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, help="the run's --rollout-max-response-len (default: inferred from the "
                   "longest truncated response)")
    p.add_argument("--prompt-key", metavar="FIELD", help="sample field (or metadata field) to use as prompt id "
                   "(default: a hash of the prompt)")
    p.add_argument("--reward-key", metavar="KEY", help="key of the reward dict (slime's --reward-key)")
    p.add_argument("--trust-pickle", action="store_true", help="load files that need arbitrary unpickling "
                   "(only for dumps you trust: unpickling can run code)")


def run(args: argparse.Namespace) -> Imported:
    return read_slime(args.source, max_tokens=args.max_tokens, prompt_key=args.prompt_key, reward_key=args.reward_key,
                      trust_pickle=args.trust_pickle, allow_gaps=args.allow_gaps, stride=signal_stride(args))


def read_slime(source: str | Path, *, max_tokens: int | None = None, prompt_key: str | None = None,
               reward_key: str | None = None, trust_pickle: bool = False, allow_gaps: bool = False,
               stride: int | None = DEFAULT_STRIDE) -> Imported:
    """The trace of a slime dump; ``stride``: tokens between the measured early-exit signals (None: not measured)."""
    root = descend(Path(source), "rollout_data")
    files = step_files(root, r"(\d+)(?:[._-].*)?\.pt", "rollout files ({rollout_id}.pt)",
                       skip=lambda p: p.name.startswith("eval_"))
    check_no_gaps(files, root, "rollout file", allow_gaps)
    responses: list[Response] = []
    for step, paths in files.items():
        for path in paths:
            samples = _samples(path, step, trust_pickle)
            rel = str(path)  # as reached from SOURCE: an error names a file the user can open
            responses += [_response(s, i, step, rel, prompt_key, reward_key) for i, s in enumerate(samples)]
    cap = max_tokens if max_tokens is not None else _inferred_cap(responses)
    notes = [] if max_tokens is not None else [f"cap of untruncated responses inferred as {cap} tokens; pass --max-tokens to set it"]
    frame = build_trace(responses, cap, stride)
    measured = ["steps", "groups", "prompt and response lengths", "rewards", "finish reasons"]
    measured += [c for c in ("policy versions",) if "policy_version_first" in frame]
    measured += [c for c in ("samples removed from training",) if "trained" in frame]
    with_logprobs = sum(r.logprobs is not None for r in responses)
    if stride is None:
        notes.append(signals_said(None, ""))
    else:
        measured.append(signals_said(stride, "the dump's token ids" + (" and rollout_log_probs" if with_logprobs else "")))
    if stride is not None and with_logprobs < len(responses):
        notes.append(f"{len(responses) - with_logprobs} of {len(responses)} samples have no rollout_log_probs: "
                     "their early-exit entropy is NaN (repetition measured)")
    inferred = ([] if max_tokens is not None else ["max_tokens of untruncated responses"]) + \
        ([] if prompt_key else ["prompt ids (hash of the prompt)"])
    if "policy_version_first" not in frame:
        notes.append("weight_versions missing or not numbers: policy versions left equal to the step")
    return Imported(frame, NAME, measured, inferred, notes)


def _samples(path: Path, step: int, trust_pickle: bool) -> list[dict]:
    data = _load(path, trust_pickle)
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise DumpError(f"{path}: not a slime rollout dump (expected a dict with a 'samples' list)")
    rid = data.get("rollout_id")
    if rid is not None and int(rid) != step:
        raise DumpError(f"{path}: rollout_id {rid} inside, but the file name says {step}")
    return data["samples"]


def _load(path: Path, trust_pickle: bool) -> Any:
    try:
        import torch
    except ImportError:
        raise DumpError(f"{path}: reading slime dumps needs torch (pip install torch)") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as e:
        if trust_pickle:
            raise DumpError(f"{path}: cannot unpickle ({_first_line(e)})") from None
        m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        needs = f" ({m.group(1)})" if m else ""
        raise DumpError(f"{path}: needs arbitrary unpickling{needs}, which can run code; a dump is data: "
                        "pass --trust-pickle only if you trust where it came from") from None
    except Exception as e:  # noqa: BLE001  (a truncated or foreign file)
        raise DumpError(f"{path}: not a torch.save file ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _response(s: Any, i: int, step: int, rel: str, prompt_key: str | None, reward_key: str | None) -> Response:
    where = f"{rel}: sample {i}"
    if not isinstance(s, dict):
        raise DumpError(f"{where}: not a Sample.to_dict() (a {type(s).__name__})")
    if s.get("index") is not None:
        where += f" (index {s['index']})"
    for key in ("response_length", "tokens", "status"):
        if s.get(key) is None:
            raise DumpError(f"{where}: no {key!r}")
    status = getattr(s["status"], "value", s["status"])
    if status not in FINISH:
        raise DumpError(f"{where}: status {status!r} (expected one of {', '.join(FINISH)}; a pending sample was never generated)")
    response_len, total = int(s["response_length"]), len(s["tokens"])
    if not 0 <= response_len < total:
        raise DumpError(f"{where}: response_length {response_len} does not fit in its {total} tokens")
    versions = _versions(s.get("weight_versions"))
    logprobs = s.get("rollout_log_probs")
    return Response(
        step=step, prompt_id=_prompt_id(s, where, prompt_key),
        group_key=("g", s["group_index"]) if s.get("group_index") is not None else ("p", prompt_hash(s.get("prompt", ""))),
        order=int(s["index"]) if s.get("index") is not None else i,
        prompt_len=total - response_len, response_len=response_len,
        reward=as_reward(s.get("reward"), where, reward_key), finish_reason=FINISH[status],
        source_file=rel, source_record=i,
        policy_version_first=min(versions) if versions else None,
        policy_version_last=max(versions) if versions else None,
        trained=None if "remove_sample" not in s else not bool(s["remove_sample"]),
        tokens=[int(t) for t in s["tokens"][total - response_len:]],
        logprobs=None if logprobs is None or len(logprobs) == 0 else [float(x) for x in logprobs],
    )


def _prompt_id(s: dict, where: str, prompt_key: str | None) -> int | str:
    if prompt_key is None:
        return prompt_hash(s.get("prompt", ""))
    meta = s.get("metadata") or {}
    value = s.get(prompt_key, meta.get(prompt_key) if isinstance(meta, dict) else None)
    if value is None:
        raise DumpError(f"{where}: no field {prompt_key!r} (in the sample or its metadata) for --prompt-key")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else str(value)


def _versions(raw: Any) -> list[int]:
    """slime's weight versions as ints; empty where any is missing or not a number (sglang's 'default')."""
    if not raw:
        return []
    try:
        return [int(v) for v in raw]
    except (TypeError, ValueError):
        return []


def _inferred_cap(responses: list[Response]) -> int:
    truncated = [r.response_len for r in responses if r.finish_reason == "length"]
    return max(truncated) if truncated else max(r.response_len for r in responses)
