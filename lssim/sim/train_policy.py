"""Training-side policies (`Policy.train_mask`) in the simulator: the batch the SimTrainer shows them, the measured
saving a policy falls back on where the world has no tokens, and how the trainer prices what is left.

    mask = policy.train_mask(sim_batch(groups, step))             # a TrainMask, or None
    phases, metrics = price_masked(cost, batch, mask, n_devices=8, collocated=True)

The simulator knows each response's length and reward, not its tokens, so a policy that decides per token (G2TP
scores |advantage| x (1 - p_old) per token; micro-entropy pruning reads per-token surprisal) cannot decide there.
It gives counts instead (`measured_mask`): the share of loss tokens it prunes and the share of forward tokens the
real trainer still ran over when it pruned that way, measured by `python -m paper.experiments.measure_pruning`
(lssim/sim/data/pruning_cpu.json). The cut is spread over the responses' suffixes in proportion to their lengths
(an assumption: the real trainer drops whole sequences and cuts uneven suffixes). What is priced is then the
trainer's own cost model over the shortened sequences, so padding, packing and attention follow the lengths.

Pricing never makes a step dearer: a trainer may always only mask (the same update, docs/training.md) and does
so when the cost model prices the compacted batch higher (packing can be non-monotone in the lengths).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lssim.loop.policy import TrainBatch, TrainMask
from lssim.sim.training import TrainCostModel, TrainPhases

# The measured fractions, shipped as package data; MEASURE_COMMAND regenerates them on the real trainer.
MEASUREMENT = Path(__file__).resolve().parent / "data" / "pruning_cpu.json"
MEASURE_COMMAND = "python -m paper.experiments.measure_pruning --out lssim/sim/data/pruning_cpu.json"


def grpo_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO's per-member advantage in one group: (reward - mean) / (std + eps); 0 everywhere without signal, and 0
    for a member without a reward (NaN), which is left out of the statistics as the real trainer does."""
    rewards = np.asarray(rewards, dtype=float)
    out = np.zeros(len(rewards))
    ok = np.isfinite(rewards)
    if ok.sum() < 2 or rewards[ok].std() == 0.0:
        return out
    out[ok] = (rewards[ok] - rewards[ok].mean()) / (rewards[ok].std() + eps)
    return out


def group_advantages(rewards: np.ndarray, sizes: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """`grpo_advantages` of consecutive groups of `sizes` members, at once: the groups of one size with every reward
    finite as the rows of one array (numpy reduces each row as it reduces one group's array), any other group alone."""
    rewards, sizes = np.asarray(rewards, dtype=float), np.asarray(sizes, np.int64)
    out = np.zeros(len(rewards))
    starts = np.cumsum(sizes) - sizes
    group = np.repeat(np.arange(len(sizes)), sizes)
    finite = np.bincount(group, ~np.isfinite(rewards), len(sizes)) == 0
    for g in np.flatnonzero(~finite).tolist():
        out[starts[g]:starts[g] + sizes[g]] = grpo_advantages(rewards[starts[g]:starts[g] + sizes[g]], eps)
    for n in np.unique(sizes[finite & (sizes >= 2)]).tolist():
        of = np.flatnonzero(finite & (sizes == n))
        at = starts[of][:, None] + np.arange(n)  # row k: the members of group of[k]
        rows = rewards.reshape(len(of), n) if len(of) * n == len(rewards) else rewards[at]
        std = rows.std(axis=1, keepdims=True)
        out[at] = np.where(std != 0.0, (rows - rows.mean(axis=1, keepdims=True)) / (std + eps), 0.0)
    return out


def sim_batch(groups, step: int, signal_only: bool = False) -> TrainBatch:
    """The batch a SimTrainer prices (every member of the groups; `signal_only`: of groups with signal) as a
    TrainBatch without tokens, read from the groups' columns (no Group object is made for a step's GroupBatch)."""
    from lssim.loop.columns import gather, with_signal

    cols, sizes = gather(groups)
    rewards = np.asarray(cols.reward, dtype=float)
    keep = with_signal(rewards, sizes) if signal_only else np.ones(len(sizes), bool)
    members = np.repeat(keep, sizes)
    sizes = sizes[keep]
    return TrainBatch(step, cols.prompt_len[members], cols.generated[members], group_advantages(rewards[members], sizes),
                      np.repeat(np.arange(len(sizes)), sizes), rid=cols.rid[members])


def measured_mask(batch: TrainBatch, computed_fraction: float, pruned_fraction: float) -> TrainMask:
    """Counts for a batch without tokens: `pruned_fraction` of each sequence's loss tokens pruned, and the forward
    cut to `computed_fraction` of the batch's prompt + response tokens, taken from the responses' suffixes in
    proportion to their lengths (rounded down: never more than measured), each keeping at least one response token
    (a share below the prompts' cannot be met by cutting responses)."""
    if not 0 < computed_fraction <= 1 or not 0 <= pruned_fraction <= 1:
        raise ValueError(f"computed_fraction must be in (0, 1] and pruned_fraction in [0, 1], got "
                         f"{computed_fraction}, {pruned_fraction}")
    resp = np.asarray(batch.response_len, dtype=np.int64)
    total, responses = int((batch.prompt_len + resp).sum()), int(resp.sum())
    cut = min(responses - len(resp), int((1.0 - computed_fraction) * total))  # each keeps a token: none is dropped
    per_seq = (resp * cut) // responses if responses else np.zeros_like(resp)
    computed = resp - per_seq
    loss = np.minimum(np.round((1.0 - pruned_fraction) * batch.loss_before()).astype(np.int64), computed)
    return TrainMask.from_counts(computed, loss)


def _load(path) -> dict:
    """A PruningMeasurement JSON (paper/experiments/measure_pruning.py); ValueError naming the file."""
    try:
        payload = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"pruning measurement {path} does not exist (make one with `{MEASURE_COMMAND}`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(payload, dict) or payload.get("kind") != "PruningMeasurement":
        raise ValueError(f"{path}: not a pruning measurement (missing kind='PruningMeasurement')")
    return payload


def measured_fractions(path, method: str, settings: dict) -> tuple[float, float]:
    """(computed_token_fraction, pruned_loss_fraction) of the measured variant with exactly these settings
    (`method` and e.g. fraction, compact); ValueError listing what was measured when none matches."""
    variants = _load(path).get("variants") or {}
    for name, v in variants.items():
        measured = v.get("settings") or {}
        if measured.get("method") == method and all(measured.get(k) == val for k, val in settings.items()):
            try:
                return float(v["computed_token_fraction"]), float(v["pruned_loss_fraction"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: variant {name!r}: {exc!r}") from None
    raise ValueError(f"{path}: no measurement of {method} with {settings} (measured: "
                     f"{[v.get('settings') for v in variants.values()]}); in the simulator give computed_fraction= "
                     f"(and pruned_fraction=) yourself, or measure it: `{MEASURE_COMMAND}` with those settings")


def price_masked(model: TrainCostModel, batch: TrainBatch, mask: TrainMask, n_devices: int, *,
                 collocated: bool) -> tuple[TrainPhases, dict]:
    """The phases of the step as pruned, and what the pruning did and saved (`pruning_saved_seconds`)."""
    prompt, resp = np.asarray(batch.prompt_len, np.int64), np.asarray(batch.response_len, np.int64)
    full = model.phases(prompt + resp, prompt, n_devices, collocated=collocated)
    kept = mask.computed > 0
    pruned = model.phases(prompt[kept] + mask.computed[kept], prompt[kept], n_devices, collocated=collocated)
    compacted = pruned.total <= full.total
    phases = pruned if compacted else full  # masking alone trains the same update at the full price
    metrics = mask.summary(batch)
    if not compacted:
        metrics.update(forward_tokens_after=metrics["forward_tokens_before"], computed_token_fraction=1.0)
    metrics.update(pruning_saved_seconds=full.total - phases.total, compacted=bool(compacted))
    return phases, metrics
