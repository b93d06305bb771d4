"""AReaL: the trajectories dumped by ``InferenceEngineConfig.dump_to_file``.

Read against inclusionAI/AReaL at commit 4aef98d (2026-05-21, version 1.0.4):
``areal/infra/workflow_executor.py::WorkflowExecutor._dump_trajectory`` appends, for each finished
rollout task, to ``{fileroot}/logs/{user}/{experiment}/{trial}/rollout/{tail_version}/{task_id}.jsonl``
(``eval-rollout/`` for evaluation, not read here) one JSON object per sample of the task's batch:
``task_id``, ``sample_idx``, ``seqlen`` (prompt + response tokens, from the attention mask),
``prompt_len`` (tokens before the first loss-masked token), ``head_version`` / ``tail_version``
(min / max of the trajectory's per-token weight versions), ``reward``, ``prompt`` and
``completion`` (decoded text). A task is one prompt's group (``GroupedRolloutWorkflow`` in
``areal/infra/remote_inf_engine.py`` runs ``group_size`` episodes and concatenates them), and its
versions are taken over the whole group. Every executor (one per rollout rank) writes its own
tasks into the same version folders, so a step is all the task files of one folder. Samples with
an empty completion are not dumped; rejected trajectories (``should_accept_fn``) are, and the dump
does not say which they were.

Measured: steps (the tail weight version, the folder name), groups (tasks), prompt and response
lengths in tokens, rewards, the last weight version of each group. Inferred: finish reasons (a
response reaching ``--max-tokens``, AReaL's ``gconfig.max_new_tokens``, is ``length``), the first
weight version where the dump's ``head_version`` is -1 (the prompt tokens carry version -1 in
``areal/workflow/rlvr.py``, so their minimum says nothing; the tail version is used), and prompt ids
(a hash of the prompt text).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from lssim.traces.importers.common import DumpError, Imported, Response, as_reward, build_trace, check_no_gaps, descend, prompt_hash

NAME = "areal"
HELP = "AReaL dump_to_file trajectories (rollout/{version}/{task_id}.jsonl)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, required=True, help="the run's gconfig.max_new_tokens (the response-token cap)")


def run(args: argparse.Namespace) -> Imported:
    return read_areal(args.source, max_tokens=args.max_tokens, allow_gaps=args.allow_gaps)


def read_areal(source: str | Path, *, max_tokens: int, allow_gaps: bool = False) -> Imported:
    root = descend(Path(source), "rollout")
    versions = {int(d.name): d for d in sorted(root.iterdir()) if d.is_dir() and re.fullmatch(r"\d+", d.name)}
    if not versions:
        raise DumpError(f"{root}: no version folders (rollout/{{tail_version}}/{{task_id}}.jsonl) found")
    check_no_gaps(versions, root, "version folder", allow_gaps)
    responses: list[Response] = []
    first_unknown = 0
    for version, folder in sorted(versions.items()):
        tasks = sorted(folder.glob("*.jsonl"), key=lambda p: (len(p.stem), p.stem))
        if not tasks:
            raise DumpError(f"{folder}: no task files ({{task_id}}.jsonl)")
        for path in tasks:
            for rec in _task(path, version):
                first_unknown += rec.policy_version_first is None
                responses.append(rec)
    for r in responses:
        if r.policy_version_first is None:
            r.policy_version_first = r.policy_version_last
    frame = build_trace(responses, max_tokens)
    notes = [f"{first_unknown:,} responses had head_version -1 (prompt tokens): first weight version set to the tail's"] \
        if first_unknown else []
    return Imported(frame, NAME, ["steps (tail weight versions)", "groups (tasks)", "prompt and response lengths",
                                  "rewards", "last weight versions"],
                    ["finish reasons (from --max-tokens)", "prompt ids (hash of the prompt text)"]
                    + (["first weight versions"] if first_unknown else []), notes)


def _task(path: Path, version: int) -> list[Response]:
    rel = str(path)  # as reached from SOURCE, so an error names a file the user can open
    out: list[Response] = []
    seen: set[int] = set()
    with open(path, encoding="utf-8") as f:
        for line_no, text in enumerate(f, start=1):
            if not text.strip():
                continue
            where = f"{rel}: line {line_no}"
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise DumpError(f"{where}: not JSON ({e.msg})") from None
            for key in ("seqlen", "prompt_len", "tail_version", "sample_idx"):
                if not isinstance(rec.get(key), int):
                    raise DumpError(f"{where}: no {key!r}" + (" (no length)" if "len" in key else ""))
            if rec["tail_version"] != version:
                raise DumpError(f"{where}: tail_version {rec['tail_version']}, but it is in folder {version}")
            if rec["sample_idx"] in seen:
                raise DumpError(f"{where}: sample_idx {rec['sample_idx']} twice in one task (a restarted run "
                                "appending to the same folder?)")
            seen.add(rec["sample_idx"])
            response_len = rec["seqlen"] - rec["prompt_len"]
            if rec["prompt_len"] < 1 or response_len < 1:
                raise DumpError(f"{where}: seqlen {rec['seqlen']} and prompt_len {rec['prompt_len']} leave no prompt or response")
            head = rec.get("head_version")
            out.append(Response(
                step=version, prompt_id=prompt_hash(rec.get("prompt", "")), group_key=("task", rec.get("task_id", rel)),
                order=rec["sample_idx"], prompt_len=rec["prompt_len"], response_len=response_len,
                reward=as_reward(rec.get("reward"), where), source_file=rel, source_record=line_no,
                policy_version_first=head if isinstance(head, int) and 0 <= head <= version else None,
                policy_version_last=version))
    if not out:
        raise DumpError(f"{rel}: no records")
    return out
