"""The synthetic reasoning task of the real backend: Collatz stopping-time traces.

A prompt is a start value n (odd, n = 3 mod 4). The response iterates the Collatz map
(x -> x/2 if x is even, 3x+1 if odd) from n, writing one step per state, until the
first value below n, then writes that value as the answer:

    prompt:   "7 2 0 0 0 :"                         (n = 27)
    response: "t 2 8 0 0 0 h 1 4 0 0 0 ... = 3 2 0 0 0" <eos>

Every number is written with exactly WIDTH digits, least significant first and zero
padded, so digit i of a state sits a fixed distance (WIDTH + 1 tokens) after digit i of
the state before it, and carries (3x+1) and borrows (x/2) only touch neighbouring
digits: a 2-4 layer model can learn each step with fixed-offset attention. Each step
opens with its operation token ("t" for 3x+1, "h" for x/2), chosen from the previous
state's parity; "=" stops. The number of steps (the stopping time) is heavy-tailed
across start values (half of them take 6 steps, 27 takes 96), which is what makes the
response lengths long-tailed. See TASK.md.
"""
from __future__ import annotations

import functools
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

WIDTH = 5                # digits per number; every state of an eligible trajectory < 10**WIDTH
MAX_STEPS = 84           # 84 steps * 6 tokens + "=" + answer + EOS = 511 tokens <= 512
START_MAX = 2000         # prompt start values are drawn from [3, START_MAX)

SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
DIGITS = [str(d) for d in range(10)]
OPS = {"t": "3x+1", "h": "x/2"}
STOP, PROMPT_END = "=", ":"
VOCAB = SPECIAL + DIGITS + list(OPS) + [STOP, PROMPT_END]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
EOS_TOKEN = "<eos>"

_HERE = Path(__file__).resolve().parent
MODEL_DIR = _HERE / "reference_model"
PROMPTS_PATH = _HERE / "data" / "prompts.jsonl"
# The held-out prompts of PROMPTS_PATH (heldout_split; regenerate with `python -m real_backend.task --write-heldout`):
# training never draws them (real_backend.prompts.TaskPrompts), evaluation scores them (real_backend.evaluate).
HELDOUT_PATH = _HERE / "data" / "heldout.json"


@dataclass(frozen=True)
class Prompt:
    prompt_id: int
    text: str            # what is fed to the model (space-separated vocab tokens)
    answer: str          # the first trajectory value below the start, in ordinary decimal
    reference_len: int   # tokens of the reference solution, EOS included


def encode_number(x: int) -> str:
    """WIDTH digits, least significant first: 27 -> '7 2 0 0 0'."""
    if not 0 <= x < 10**WIDTH:
        raise ValueError(f"{x} does not fit in {WIDTH} digits")
    return " ".join(str(x)[::-1].ljust(WIDTH, "0"))


def decode_number(tokens: list[str]) -> int | None:
    """Inverse of encode_number; None unless exactly WIDTH digit tokens."""
    if len(tokens) != WIDTH or not all(t in DIGITS for t in tokens):
        return None
    return int("".join(reversed(tokens)))


def trajectory(n: int) -> list[int]:
    """Collatz states after n, up to and including the first one below n."""
    xs, x = [], n
    while True:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        xs.append(x)
        if x < n:
            return xs


def solution_text(n: int, states: list[int] | None = None) -> str:
    """Response text for start n (states default to the correct trajectory)."""
    states = trajectory(n) if states is None else states
    parts, prev = [], n
    for x in states:
        parts.append(("h " if prev % 2 == 0 else "t ") + encode_number(x))
        prev = x
    parts.append(f"{STOP} {encode_number(states[-1])}")
    return " ".join(parts)


def prompt_text(n: int) -> str:
    return f"{encode_number(n)} {PROMPT_END}"


def fits(n: int) -> bool:
    """Trajectory short enough for max_tokens 512 and narrow enough for WIDTH digits."""
    xs = trajectory(n)
    return len(xs) <= MAX_STEPS and max(xs) < 10**WIDTH


@functools.lru_cache(maxsize=1)
def eligible_starts() -> tuple[int, ...]:
    # n = 3 (mod 4): n = 1 (mod 4) always stops after 3 steps, which would put half of
    # the prompts at one trivial length; the remaining ones still have a heavy tail.
    return tuple(n for n in range(3, START_MAX, 4) if fits(n))


def _make_prompt(prompt_id: int, n: int) -> Prompt:
    states = trajectory(n)
    ref_len = len(solution_text(n, states).split()) + 1  # + EOS
    return Prompt(prompt_id, prompt_text(n), str(states[-1]), ref_len)


def start_value(prompt: Prompt) -> int:
    toks = prompt.text.split()
    n = decode_number(toks[:-1])
    if n is None or toks[-1] != PROMPT_END:
        raise ValueError(f"malformed prompt text: {prompt.text!r}")
    return n


def make_prompts(n: int, seed: int) -> list[Prompt]:
    """n distinct prompts drawn (without replacement) from the eligible start values."""
    pool = eligible_starts()
    if not 0 <= n <= len(pool):
        raise ValueError(f"n must be in [0, {len(pool)}], got {n}")
    starts = random.Random(seed).sample(pool, n)
    return [_make_prompt(i, s) for i, s in enumerate(starts)]


def reference_solution(prompt: Prompt) -> str:
    return solution_text(start_value(prompt))


def reward(prompt: Prompt, response_text: str) -> float:
    """1.0 iff the response ends with '= <answer>' (WIDTH digits), else 0.0.

    Only the final answer is checked, not the trace (outcome reward, as in GRPO).
    A response cut off at max_tokens lacks the closing '= answer' and scores 0; the
    one blind spot is a cut exactly after the answer digits, where EOS was due anyway.
    """
    toks = response_text.replace(EOS_TOKEN, " ").split()
    if len(toks) < WIDTH + 1 or toks[-WIDTH - 1] != STOP:
        return 0.0
    return 1.0 if decode_number(toks[-WIDTH:]) == int(prompt.answer) else 0.0


def save_prompts(prompts: list[Prompt], path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in prompts:
            f.write(json.dumps(asdict(p)) + "\n")


def load_prompts(path) -> list[Prompt]:
    prompts = []
    with Path(path).open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                p = Prompt(int(d["prompt_id"]), str(d["text"]), str(d["answer"]),
                           int(d["reference_len"]))
                start_value(p)  # text must parse
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: bad prompt record: {e}") from e
            prompts.append(p)
    return prompts


def heldout_split(prompts: list[Prompt], block: int = 5, seed: int = 0) -> list[int]:
    """The held-out prompt ids: the prompts sorted by (reference_len, prompt_id), cut into blocks of `block`, one per
    block held out (picked with random.Random(seed)); the held-out set then spans every length. For the task's 482
    prompts: 97 held out, 385 left to train on."""
    order = sorted(prompts, key=lambda p: (p.reference_len, p.prompt_id))
    rng = random.Random(seed)
    held = []
    for i in range(0, len(order), block):
        chunk = order[i:i + block]
        held.append(chunk[rng.randrange(len(chunk))].prompt_id)
    return sorted(held)


def write_heldout(prompts_path=PROMPTS_PATH, path=HELDOUT_PATH, block: int = 5, seed: int = 0) -> list[int]:
    """heldout_split of the prompts file, written to `path` as JSON (with how it was made)."""
    held = heldout_split(load_prompts(prompts_path), block, seed)
    record = {"prompts": Path(prompts_path).name, "rule": f"sorted by (reference_len, prompt_id), blocks of {block}, "
              f"one per block held out with random.Random({seed})", "command": "python -m real_backend.task --write-heldout",
              "prompt_ids": held}
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    return held


def load_heldout(path=HELDOUT_PATH) -> list[int]:
    """The held-out prompt ids written by write_heldout."""
    return [int(i) for i in json.loads(Path(path).read_text())["prompt_ids"]]


def load_tokenizer(model_dir=MODEL_DIR):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(model_dir))


def build_tokenizer():
    """Word-level tokenizer over VOCAB; prepends <bos> like a normal LM tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token=EOS_TOKEN, pad_token="<pad>",
        unk_token="<unk>", model_max_length=1024)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write-heldout"]:
        sys.exit("usage: python -m real_backend.task --write-heldout   (rewrites real_backend/data/heldout.json)")
    print(f"{len(write_heldout())} held-out prompt ids written to {HELDOUT_PATH}")
