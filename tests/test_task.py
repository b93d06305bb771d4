"""Tests of the real backend's task (real_backend/task.py); no vLLM needed."""
import json

import numpy as np
import pytest

from real_backend import task


@pytest.fixture(scope="module")
def prompts():
    return task.load_prompts(task.PROMPTS_PATH)


def test_collatz_27_known_stopping_time():
    # 27 is the classic long one: 96 steps before dropping below 27 (to 23).
    xs = task.trajectory(27)
    assert len(xs) == 96 and xs[-1] == 23 and max(xs) == 9232


def test_number_encoding_is_lsd_first_and_roundtrips():
    assert task.encode_number(27) == "7 2 0 0 0"
    for x in [0, 1, 9, 10, 12345, 99999]:
        assert task.decode_number(task.encode_number(x).split()) == x
    with pytest.raises(ValueError):
        task.encode_number(10**task.WIDTH)


def test_reward_accepts_reference_solution(prompts):
    for p in prompts:
        assert task.reward(p, task.reference_solution(p)) == 1.0
        assert len(task.reference_solution(p).split()) + 1 == p.reference_len


def test_reward_rejects_wrong_missing_truncated(prompts):
    p = prompts[0]
    ref = task.reference_solution(p)
    toks = ref.split()
    wrong_digit = toks[:-task.WIDTH] + [str((int(toks[-task.WIDTH]) + 1) % 10)] + toks[-task.WIDTH + 1:]
    assert task.reward(p, " ".join(wrong_digit)) == 0.0
    assert task.reward(p, "") == 0.0
    assert task.reward(p, ref.rsplit("=", 1)[0]) == 0.0         # no answer
    assert task.reward(p, " ".join(toks[:-1])) == 0.0          # answer cut short
    assert task.reward(p, " ".join(toks[: len(toks) // 2])) == 0.0  # truncated mid-trace
    assert task.reward(p, ref + " t 1 0 0 0 0") == 0.0           # ran on after the answer
    assert task.reward(p, ref + " <eos>") == 1.0                 # EOS left in the text is fine
    # only the outcome counts: a wrong trace ending in the right answer still scores
    assert task.reward(p, "h 0 0 0 0 0 " + " ".join(toks[-task.WIDTH - 1:])) == 1.0


def test_prompts_parse_and_are_eligible(prompts):
    assert 200 <= len(prompts) <= 5000
    assert [p.prompt_id for p in prompts] == list(range(len(prompts)))
    starts = [task.start_value(p) for p in prompts]
    assert len(set(starts)) == len(starts)
    for p, n in zip(prompts, starts):
        assert n % 4 == 3 and task.fits(n)
        assert int(p.answer) == task.trajectory(n)[-1] < n
        assert p.reference_len <= 512


def test_make_prompts_deterministic_and_saved_file_matches(tmp_path, prompts):
    a, b = task.make_prompts(50, seed=7), task.make_prompts(50, seed=7)
    assert a == b and a != task.make_prompts(50, seed=8)
    task.save_prompts(a, tmp_path / "p.jsonl")
    assert task.load_prompts(tmp_path / "p.jsonl") == a
    # the shipped file is what the build script's seed produces
    from real_backend.make_reference_model import N_PROMPTS, PROMPT_SEED
    assert task.make_prompts(N_PROMPTS, PROMPT_SEED) == prompts


def test_load_prompts_bad_file_names_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    good = json.dumps({"prompt_id": 0, "text": "7 2 0 0 0 :", "answer": "23", "reference_len": 584})
    f.write_text(good + "\n" + '{"prompt_id": 1, "text": "oops"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        task.load_prompts(f)
    f.write_text("not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        task.load_prompts(f)


def test_reference_lengths_are_long_tailed(prompts):
    lens = np.array([p.reference_len for p in prompts])
    p50, p90, p99 = np.percentile(lens, [50, 90, 99])
    assert 40 <= p50 <= 80
    assert p99 >= 4 * p50 and lens.max() >= 400 and lens.max() <= 512
    assert (lens <= 2 * p50).mean() >= 0.7       # many short ...
    assert 0.01 <= (lens >= 200).mean() <= 0.2    # ... a few very long


def test_tokenizer_roundtrips(prompts):
    tok = task.load_tokenizer()
    assert len(tok) == len(task.VOCAB) <= 64
    assert tok.eos_token_id == task.EOS_ID and tok.bos_token_id == task.BOS_ID
    for p in prompts[:20]:
        text = p.text + " " + task.reference_solution(p)
        ids = tok(text)["input_ids"]
        assert ids[0] == task.BOS_ID and task.UNK_ID not in ids
        assert len(ids) == 1 + len(text.split())
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_checkpoint_loads_and_solves_a_short_prompt(prompts):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(task.MODEL_DIR))
    cfg = model.config
    assert cfg.model_type == "llama" and cfg.vocab_size == len(task.VOCAB)
    assert cfg.max_position_embeddings >= 1024 and cfg.eos_token_id == task.EOS_ID
    tok = task.load_tokenizer()
    short = sorted(prompts, key=lambda p: p.reference_len)[:8]
    ok = 0
    for p in short:
        ids = torch.tensor([tok(p.text)["input_ids"]])
        out = model.generate(ids, max_new_tokens=p.reference_len + 8, do_sample=False,
                             eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID)
        ok += task.reward(p, tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    assert ok >= 6  # greedy decoding gets the shortest traces right
