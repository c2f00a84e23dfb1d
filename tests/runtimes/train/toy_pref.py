"""The tiny model, tokenizer and data the preference-training tests (DPO, GRPO) share.

A seeded 2-layer Llama (`conftest.tiny_llama_config`) random-initialised by transformers and saved with
`save_pretrained`, next to a character-level `tokenizer.json` (digits, `*`, `=`, space; `<s>` BOS added by the
post-processor, `</s>` EOS, `<pad>`, with the model config's ids), so TRL (which needs a tokenizer) and Linnet
(which loads the same folder) see the same ids. The data are two-number multiplication prompts ("12*34=") and the
reward functions below score their answers (TRL's reward-function signature, importable as
`tests.runtimes.train.toy_pref:exact_product_reward`). Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import random
from pathlib import Path

CHARS = "0123456789*= "
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # the ids of conftest.tiny_llama_config: pad 0, BOS 1, EOS 2
VOCAB_SIZE = 128  # the tokenizer uses 17 ids; the rest are never produced by it (the model may sample them)


def save_char_tokenizer(folder: Path) -> None:
    """Write a character-level fast tokenizer (tokenizer.json + tokenizer_config.json) into `folder`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({c: len(SPECIALS) + i for i, c in enumerate(CHARS)})
    for i in range(len(vocab), VOCAB_SIZE):
        vocab[f"<extra_{i}>"] = i
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)


def save_tiny_llama(folder: Path, seed: int = 0, **config_overrides) -> Path:
    """The training tests' 2-layer Llama (`conftest.tiny_llama_config`: hidden 32, GQA 4/2, vocab 128, pad 0,
    BOS 1, EOS 2), seeded, with weights drawn wider than Llama's 0.02 so that an untrained model's distributions
    are not flat, and the char tokenizer, saved into `folder` with save_pretrained in f32. `config_overrides`
    replace LlamaConfig fields (bench/train_speed.py's larger shrunk model). Returns `folder`."""
    import torch
    from transformers import LlamaForCausalLM

    from tests.runtimes.train.conftest import tiny_llama_config

    config = tiny_llama_config()
    config.initializer_range = 0.2
    for key, value in config_overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    save_char_tokenizer(folder)
    return folder


def multiplication_prompts(n: int, seed: int = 0) -> list[dict]:
    """`n` GRPO rows {"prompt": "ab*cd="} of two 2-digit numbers (all prompts have the same length, 7 ids with
    BOS, so no prompt is padded), from a seeded `random.Random`."""
    rng = random.Random(seed)
    return [{"prompt": f"{rng.randint(10, 99)}*{rng.randint(10, 99)}="} for _ in range(n)]


def multiplication_preferences(n: int, seed: int = 0) -> list[dict]:
    """`n` DPO rows {"prompt", "chosen", "rejected"}: the product as chosen, a wrong product (off by a seeded
    amount) as rejected."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        wrong = a * b + rng.choice([-1, 1]) * rng.randint(1, 300)
        rows.append({"prompt": f"{a}*{b}=", "chosen": str(a * b), "rejected": str(wrong)})
    return rows


def _product(prompt: str) -> str:
    a, b = prompt.rstrip("=").split("*")
    return str(int(a) * int(b))


def exact_product_reward(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """1.0 where the completion is the product of the prompt's two numbers, else 0.0 (TRL's reward-function
    signature: one float per completion)."""
    return [float(c.strip() == _product(p)) for p, c in zip(prompts, completions, strict=True)]


def product_digits_reward(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """Partial credit, so a random model's group rewards differ (an exact-answer reward is 0 for every sample of
    an untrained model, and so is every advantage): over the answer's positions, 0.5 for a digit and 0.5 more for
    the right digit; 1.0 exactly when the completion starts with the product."""
    scores = []
    for p, c in zip(prompts, completions, strict=True):
        answer = _product(p)
        hits = sum(0.5 * ch.isdigit() + 0.5 * (ch == want) for ch, want in zip(c, answer))
        scores.append(hits / len(answer))
    return scores


def digit_share_reward(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """The share of a completion's characters that are digits (a format reward that varies a lot between the
    samples of an untrained model, so advantages are seldom all 0)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def raising_reward(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """A reward function with a bug, for the error tests."""
    raise ZeroDivisionError("division by zero")
