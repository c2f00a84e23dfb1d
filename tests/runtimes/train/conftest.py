"""Fixtures of the training tests: a shrunk Llama random-initialised by transformers with a seed and saved with
`save_pretrained` (loaded by Linnet through the folder, as a user's checkpoint), and token-id rows.

Nothing here imports torch or transformers at import time."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.runtimes.conftest import LLAMA

__all__ = ["LLAMA", "VOCAB", "tiny_llama", "id_rows", "write_jsonl"]

VOCAB = 128


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer Llama (hidden 32, vocab 128, GQA 4/2), seed 0, f32, saved as a Hugging Face folder."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama_config()).float().eval()
    folder = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(folder)
    return folder


def id_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` prompt/completion rows as token ids of varied lengths (prompt 3-8, completion 2-7 tokens), ids 3..127
    (0-2 are pad, BOS and EOS)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 8))]
        completion = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 7))]
        rows.append({"prompt_ids": prompt, "completion_ids": completion})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
