"""Build the reference model of the real backend: tokenizer, SFT data, training, checkpoint.

    python -m real_backend.make_reference_model          # ~6 min on 2 CPU cores

writes real_backend/reference_model/ (Llama checkpoint + word-level tokenizer) and
real_backend/data/prompts.jsonl. Everything is seeded, so a rerun gives the same
prompts and (on the same torch build and thread count) the same weights.

The model is trained deliberately briefly: it should be right on short traces and often
wrong on long ones, so that RL has something to improve (see TASK.md).
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


def sample_start(rng: random.Random) -> int:
    """Training start values: mostly like the prompts (n = 3 mod 4), over a wider range
    than the prompts so the model learns the step rule rather than the 482 trajectories."""
    while True:
        r = rng.random()
        n = rng.randrange(3, 10_000, 4) if r < 0.75 else (
            rng.randrange(1, 10_000, 4) if r < 0.9 else rng.randrange(2, 10_000, 2))
        if n > 2 and task.fits(n):
            return n


def encode_example(tok, n: int) -> tuple[list[int], int]:
    """(token ids of prompt + response + EOS, number of prompt tokens)."""
    p = tok(task.prompt_text(n))["input_ids"]
    r = tok(task.solution_text(n), add_special_tokens=False)["input_ids"] + [task.EOS_ID]
    return p + r, len(p)


def batches(tok, rng: random.Random, token_budget: int):
    """Endless stream of (input_ids, labels) batches of similar-length sequences, so
    padding stays small despite the long-tailed lengths; labels mask prompt and pad."""
    while True:
        pool = sorted((encode_example(tok, sample_start(rng)) for _ in range(2048)),
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


def train(model, tok, steps: int, lr: float, token_budget: int, seed: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = 100
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    model.train()
    t0, ema = time.time(), None
    for step, (x, y) in zip(range(steps), batches(tok, random.Random(seed), token_budget)):
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--token-budget", type=int, default=6144, help="tokens per batch incl. padding")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(task.MODEL_DIR))
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    prompts = task.make_prompts(N_PROMPTS, PROMPT_SEED)
    task.save_prompts(prompts, task.PROMPTS_PATH)
    print(f"wrote {len(prompts)} prompts to {task.PROMPTS_PATH}")

    tok = task.build_tokenizer()
    model = build_model()
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters")
    t0 = time.time()
    train(model, tok, args.steps, args.lr, args.token_budget, args.seed)
    print(f"training took {time.time() - t0:.0f}s")

    model.generation_config.bos_token_id = task.BOS_ID
    model.generation_config.eos_token_id = task.EOS_ID
    model.generation_config.pad_token_id = task.PAD_ID
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
