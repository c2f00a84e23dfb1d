"""Fixtures of the training tests: a shrunk Llama random-initialised by transformers with a seed and saved with
`save_pretrained` (loaded by Linnet through the folder, as a user's checkpoint), and token-id rows.

Nothing here imports torch or transformers at import time."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.runtimes.conftest import LLAMA

__all__ = ["LLAMA", "VOCAB", "STEPS", "LOSS_ATOL", "COMMON", "tiny_llama", "id_rows", "write_jsonl", "trl_sft_losses"]

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


STEPS = 20
# f32 on both sides; the losses differ by the summation order of the matmuls (~1e-6 relative) compounded over
# 20 AdamW steps. Each test prints the max difference it sees.
LOSS_ATOL = 2e-4

# One schedule for every comparison: 2 rows per micro-batch, 2 micro-batches per step (so the loss is normalised
# over an accumulated step), linear warmup then decay, clipping and weight decay all active.
COMMON = dict(
    max_steps=STEPS,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    learning_rate=1e-3,
    warmup_steps=3,
    lr_scheduler_type="linear",
    max_grad_norm=1.0,
    weight_decay=0.01,
)


def trl_sft_losses(model_or_folder, rows, options: dict, output_dir: Path | None = None) -> tuple[list, list]:
    """TRL SFTTrainer's per-step (losses, grad_norms) on `rows` (prompt_ids/completion_ids), given to TRL as
    pre-tokenized `input_ids` + `completion_mask` (TRL builds the labels from the mask under
    `completion_only_loss=True`, the value its default None takes for prompt/completion data), sequential
    sampling, f32 on CPU. `model_or_folder`: a saved folder (full SFT) or a model (a PeftModel for LoRA).
    With `output_dir`, TRL saves its checkpoints there (`options` then sets `save_steps`); else it saves none."""
    import contextlib
    import tempfile

    import torch
    import transformers
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from trl import SFTConfig, SFTTrainer

    model = model_or_folder
    if isinstance(model_or_folder, (str, Path)):
        model = transformers.LlamaForCausalLM.from_pretrained(model_or_folder, dtype=torch.float32)
    data = Dataset.from_list(
        [
            {
                "input_ids": r["prompt_ids"] + r["completion_ids"],
                "completion_mask": [0] * len(r["prompt_ids"]) + [1] * len(r["completion_ids"]),
            }
            for r in rows
        ]
    )
    # TRL wants a processing class even for tokenized rows: a word-level vocabulary of the model's ids (pads with 0)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="t0", bos_token="t1", eos_token="t2"
    )
    place = contextlib.nullcontext(str(output_dir)) if output_dir is not None else tempfile.TemporaryDirectory()
    with place as out:
        args = SFTConfig(
            output_dir=out,
            **options,
            logging_steps=1,
            bf16=False,
            use_cpu=True,
            report_to="none",
            save_strategy="no" if output_dir is None else "steps",
            train_sampling_strategy="sequential",
            activation_checkpointing=False,
            completion_only_loss=True,
            max_length=None,
            seed=0,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return [h["loss"] for h in logs], [h["grad_norm"] for h in logs]
