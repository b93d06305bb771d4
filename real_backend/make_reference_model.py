"""Build the reference model of the real backend: tokenizer, SFT data, training, checkpoint.

    python -m real_backend.make_reference_model          # ~5 min on 2 idle CPU cores

writes real_backend/reference_model/ (Llama checkpoint + word-level tokenizer) and
real_backend/data/prompts.jsonl. Everything is seeded, so a rerun gives the same
prompts and (on the same torch build and thread count) the same weights.

The model is meant to be imperfect: right on short traces, often wrong on long ones, now
and then stuck in a loop, so that RL has something to improve. It learns that from SFT
traces with injected slips and loops (`noisy_response`) and a short training (see TASK.md).
"""
from __future__ import annotations

import argparse
import math
import random
import time

import torch

from real_backend import task

PROMPT_SEED = 1234
N_PROMPTS = 482           # every eligible start value (the pool is small), shuffled
MAX_RESPONSE = 512        # the max_tokens of the RL runs


def sample_start(rng: random.Random) -> int:
    """Training start values: mostly like the prompts (n = 3 mod 4), over a wider range
    than the prompts so the model learns the step rule rather than the 482 trajectories."""
    while True:
        r = rng.random()
        n = rng.randrange(3, 10_000, 4) if r < 0.75 else (
            rng.randrange(1, 10_000, 4) if r < 0.9 else rng.randrange(2, 10_000, 2))
        if n > 2 and task.fits(n):
            return n


def noisy_response(n: int, rng: random.Random, p_slip: float,
                   p_loop: float) -> tuple[list[str], bool]:
    """Response tokens for start n as an imperfect solver would write them, and whether it
    ends (with EOS) rather than running into max_tokens.

    Imitated at temperature 1.0, this data gives the model calibrated mistakes:
    - slip (p_slip per step): one significant digit of the new state is wrong and the trace
      carries on, consistently, from the wrong value. Wrong values have their own stopping
      times, so lengths spread within a group, and long traces collect more slips.
    - loop (p_loop per step): instead of going on, the last 1-3 steps are repeated verbatim,
      never closed by EOS, so the model learns that a started repetition continues: the
      degenerate loop of real LLMs, running to max_tokens.
    States leave the WIDTH-digit range by wrapping, as a WIDTH-digit writer would.
    """
    W, toks, x = task.WIDTH, [], n
    while True:
        op, y = ("h", x // 2) if x % 2 == 0 else ("t", 3 * x + 1)
        y %= 10**W
        if rng.random() < p_slip:
            digits = list(str(y)[::-1])
            i = rng.randrange(len(digits))
            digits[i] = rng.choice([d for d in task.DIGITS if d != digits[i]])
            y = int("".join(reversed(digits)))
        toks += [op] + task.encode_number(y).split()
        if len(toks) + W + 2 > MAX_RESPONSE:  # runaway trace: cut like max_tokens would
            return toks[:MAX_RESPONSE], False
        if rng.random() < p_loop:
            k = rng.randint(1, min(3, len(toks) // (W + 1)))
            block = toks[-k * (W + 1):]
            return (toks + block * rng.randint(3, 8))[:MAX_RESPONSE], False
        if y < n:
            return toks + [task.STOP] + task.encode_number(y).split(), True
        x = y


def encode_example(tok, n: int, rng: random.Random, p_slip: float, p_loop: float):
    """(token ids of prompt + response [+ EOS], number of prompt tokens)."""
    p = tok(task.prompt_text(n))["input_ids"]
    resp, ended = noisy_response(n, rng, p_slip, p_loop)
    r = tok.convert_tokens_to_ids(resp) + ([task.EOS_ID] if ended else [])
    return p + r, len(p)


def batches(tok, rng: random.Random, token_budget: int, p_slip: float, p_loop: float):
    """Endless stream of (input_ids, labels) batches of similar-length sequences, so
    padding stays small despite the long-tailed lengths; labels mask prompt and pad."""
    while True:
        pool = sorted((encode_example(tok, sample_start(rng), rng, p_slip, p_loop) for _ in range(2048)),
                      key=lambda e: len(e[0]))
        chunks, cur = [], []
        for e in pool:
            if cur and (len(cur) + 1) * len(e[0]) > token_budget:
                chunks.append(cur)
                cur = []
            cur.append(e)
        chunks.append(cur)
        rng.shuffle(chunks)
        for chunk in chunks:
            T = max(len(ids) for ids, _ in chunk)
            x = torch.full((len(chunk), T), task.PAD_ID)
            y = torch.full((len(chunk), T), -100)
            for i, (ids, np_) in enumerate(chunk):
                x[i, :len(ids)] = torch.tensor(ids)
                y[i, np_:len(ids)] = torch.tensor(ids[np_:])
            yield x, y


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(
        vocab_size=len(task.VOCAB), hidden_size=128, intermediate_size=384,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID,
        torch_dtype="float32")
    return LlamaForCausalLM(cfg)


def train(model, tok, args) -> None:
    steps, lr = args.steps, args.lr
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = 100
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    model.train()
    # Tiny late-training values are denormal floats, which slow CPU math several-fold. Set
    # here, after transformers' imports, since numpy's float-limits probe warns under it.
    torch.set_flush_denormal(True)
    t0, ema = time.time(), None
    for step, (x, y) in zip(range(steps), batches(
            tok, random.Random(args.seed), args.token_budget, args.p_slip, args.p_loop)):
        loss = model(input_ids=x, attention_mask=(x != task.PAD_ID).long(), labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {ema:.4f}  lr {sched.get_last_lr()[0]:.2e}  "
                  f"{time.time() - t0:6.0f}s", flush=True)
    torch.set_flush_denormal(False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--token-budget", type=int, default=6144, help="tokens per batch incl. padding")
    ap.add_argument("--p-slip", type=float, default=0.03, help="per-step digit slip in SFT data")
    ap.add_argument("--p-loop", type=float, default=0.006, help="per-step loop start in SFT data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads; 1 is far faster when another job holds a core")
    ap.add_argument("--out", default=str(task.MODEL_DIR))
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    prompts = task.make_prompts(N_PROMPTS, PROMPT_SEED)
    task.save_prompts(prompts, task.PROMPTS_PATH)
    print(f"wrote {len(prompts)} prompts to {task.PROMPTS_PATH}")

    tok = task.build_tokenizer()
    model = build_model()
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters")
    t0 = time.time()
    train(model, tok, args)
    print(f"training took {time.time() - t0:.0f}s")

    model.generation_config.bos_token_id = task.BOS_ID
    model.generation_config.eos_token_id = task.EOS_ID
    model.generation_config.pad_token_id = task.PAD_ID
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
