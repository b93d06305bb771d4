"""Measure the reference model's response-length distribution on a real vLLM engine.

    VLLM_CPU_KVCACHE_SPACE=1 python -m paper.experiments.measure_task --prompts 64 --samples 8

Samples `--samples` responses per prompt (temperature 1.0, max_tokens 512 by default) for the first
`--prompts` prompts of prompts.jsonl and prints the figures quoted in TASK.md.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from real_backend import task


def is_loop(text: str, max_period: int = 3 * (task.WIDTH + 1), reps: int = 3) -> bool:
    """The text ends in a block of <= max_period tokens repeated `reps` times verbatim."""
    toks = text.split()
    return any(len(toks) >= k * reps and toks[-k * reps:] == toks[-k:] * reps
               for k in range(1, max_period + 1))


def is_repetitive(text: str, window: int = 6, tail: int = 96) -> bool:
    """Degenerate tail: its last `tail` tokens hold few distinct `window`-grams (a correct
    trace almost never repeats a 6-gram; a loop, even a slightly garbled one, mostly does)."""
    toks = text.split()[-tail:]
    grams = {tuple(toks[i:i + window]) for i in range(len(toks) - window + 1)}
    return len(toks) == tail and len(grams) < 0.5 * (tail - window + 1)


def summarize(prompts, outputs, max_tokens: int) -> dict:
    """Figures over the groups: outputs[i] is the list of (text, n_tokens, finish_reason)."""
    lens, rews, trunc, ref, loops, reps = [], [], [], [], 0, 0
    for p, group in zip(prompts, outputs):
        lens.append([n for _, n, _ in group])
        rews.append([task.reward(p, t) for t, _, _ in group])
        trunc.append([fr == "length" for _, _, fr in group])
        loops += sum(fr == "length" and is_loop(t) for t, _, fr in group)
        reps += sum(fr == "length" and is_repetitive(t) for t, _, fr in group)
        ref.append(p.reference_len)
    L, R, X = np.array(lens, float), np.array(rews), np.array(trunc)
    q = lambda a: {k: float(np.percentile(a, v)) for k, v in
                   [("p10", 10), ("p50", 50), ("p90", 90), ("p99", 99), ("max", 100)]}
    grp_mean, grp_rate = L.mean(1), R.mean(1)
    return {
        "prompts": len(prompts), "samples_per_prompt": L.shape[1], "max_tokens": max_tokens,
        "response_len": q(L.ravel()),
        "reference_len_of_these_prompts": q(np.array(ref, float)),
        "truncated_frac": float(X.mean()),
        "truncated_in_verbatim_loop_frac": loops / X.size,
        "truncated_repetitive_frac": reps / X.size,
        "mean_reward": float(R.mean()),
        # Pearson between length and reward over all samples (negative: longer, more wrong)
        "corr_len_reward": float(np.corrcoef(L.ravel(), R.ravel())[0, 1]),
        "corr_len_reward_excl_truncated": float(np.corrcoef(L[~X], R[~X])[0, 1]),
        "mean_reward_by_ref_len": {
            f"ref<={hi}" if hi else f"ref>{lo}": float(R[(np.array(ref) > lo) & (
                np.array(ref) <= (hi or 10**9))].mean())
            for lo, hi in [(0, 60), (60, 150), (150, 0)]},
        # within-group spread: coefficient of variation and max/min of lengths per group
        "within_group_cv_median": float(np.median(L.std(1) / grp_mean)),
        "within_group_max_over_min_median": float(np.median(L.max(1) / L.min(1))),
        "groups_with_distinct_lengths_frac": float((L.max(1) > L.min(1)).mean()),
        "per_prompt_success_rate_quantiles": q(grp_rate),
        "groups_all_right_frac": float((grp_rate == 1).mean()),
        "groups_all_wrong_frac": float((grp_rate == 0).mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    ap.add_argument("--model", default=str(task.MODEL_DIR))
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--dump", help="also write every response here (jsonl)")
    ap.add_argument("--reference-only", action="store_true",
                    help="only the reference-solution lengths of all prompts (no engine)")
    args = ap.parse_args()
    if args.reference_only:
        lens = np.array([p.reference_len for p in task.load_prompts(task.PROMPTS_PATH)])
        qs = [10, 50, 90, 99, 100]
        print(f"{len(lens)} prompts, reference_len p10/p50/p90/p99/max:",
              "/".join(f"{np.percentile(lens, q):.0f}" for q in qs), f"mean {lens.mean():.1f}",
              f"share >= 200 tokens {np.mean(lens >= 200):.3f}")
        return

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    prompts = task.load_prompts(task.PROMPTS_PATH)[: args.prompts]
    t0 = time.time()
    llm = LLM(model=args.model, tokenizer=args.model, dtype="float32", enforce_eager=True,
              max_model_len=1024, seed=args.seed)
    print(f"engine up in {time.time() - t0:.0f}s")
    # no per-request seed: the n samples of a request would share it; LLM(seed=) suffices
    sp = SamplingParams(n=args.samples, temperature=args.temperature, max_tokens=args.max_tokens)
    t0 = time.time()
    res = llm.generate([p.text for p in prompts], sp)
    print(f"generated in {time.time() - t0:.0f}s")
    outputs = [[(o.text, len(o.token_ids), o.finish_reason) for o in r.outputs] for r in res]
    stats = summarize(prompts, outputs, args.max_tokens)
    print(json.dumps(stats, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(stats, f, indent=1)
    if args.dump:
        with open(args.dump, "w") as f:
            for p, group in zip(prompts, outputs):
                for text, n, fr in group:
                    f.write(json.dumps({"prompt_id": p.prompt_id, "n_tokens": n,
                                        "finish_reason": fr, "reward": task.reward(p, text),
                                        "text": text}) + "\n")
    # a few truncated responses, to see what the loops look like
    shown = 0
    for p, group in zip(prompts, outputs):
        for text, n, fr in group:
            if fr == "length" and shown < 6:
                print(f"truncated (start {task.start_value(p)}): ...{text[-110:]}")
                shown += 1


if __name__ == "__main__":
    main()
