"""SFT and full fine-tuning on PyTorch against the references, on a shrunk Llama (2 layers, hidden 32, vocab 128)
random-initialised by transformers (seed 0), saved with `save_pretrained` and loaded by Linnet from the folder, f32:

- SFT on prompt/completion rows (completion-only loss, normalised by the loss tokens of the whole accumulated
  step) against TRL's `SFTTrainer` (trl 1.16): 20 optimizer steps, 2 rows per micro-batch, 2 micro-batches per
  step, linear schedule with warmup, gradient clipping and weight decay, per-step losses and gradient norms;
- full fine-tuning on language-modelling rows (`input_ids`, every token) against a plain PyTorch loop on the
  transformers model (torch AdamW, `transformers.get_scheduler`, `clip_grad_norm_`).

The same rows in the same order on both sides: Linnet with `shuffle=False`, TRL with
`train_sampling_strategy="sequential"`, the plain loop in file order.
"""

from __future__ import annotations

import pytest

from tests.runtimes.train.conftest import LLAMA, id_rows, write_jsonl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import linnet  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

STEPS = 20
# f32 on both sides; the losses differ by the summation order of the matmuls (~1e-6 relative) compounded over
# 20 AdamW steps. Observed max differences are reported by each test.
LOSS_ATOL = 2e-4

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


def trl_sft_losses(folder, rows) -> tuple[list[float], list[float]]:
    """TRL SFTTrainer's per-step (loss, grad_norm) on `rows` given as pre-tokenized `input_ids` +
    `completion_mask` (TRL builds the labels from the mask under `completion_only_loss=True`, the value its
    default None takes for prompt/completion data)."""
    import tempfile

    import transformers
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from trl import SFTConfig, SFTTrainer

    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    data = Dataset.from_list(
        [
            {
                "input_ids": r["prompt_ids"] + r["completion_ids"],
                "completion_mask": [0] * len(r["prompt_ids"]) + [1] * len(r["completion_ids"]),
            }
            for r in rows
        ]
    )
    # TRL wants a processing class even for tokenized rows: a word-level vocabulary of the model's ids (pads with id 0)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="t0", bos_token="t1", eos_token="t2"
    )
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out,
            **COMMON,
            logging_steps=1,
            bf16=False,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
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


def test_sft_matches_trl(tiny_llama, tmp_path):
    rows = id_rows(16)
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    result = linnet.train(LLAMA, tiny_llama, data=data, method="full", shuffle=False, progress=False, **COMMON)
    ours = [r["loss"] for r in result.history]
    ours_norm = [r["grad_norm"] for r in result.history]
    theirs, theirs_norm = trl_sft_losses(tiny_llama, rows)
    assert len(ours) == len(theirs) == STEPS
    delta = max(abs(a - b) for a, b in zip(ours, theirs))
    delta_norm = max(abs(a - b) for a, b in zip(ours_norm, theirs_norm))
    print(f"SFT vs TRL over {STEPS} steps: max |loss diff| {delta:.2e}, max |grad_norm diff| {delta_norm:.2e}")
    assert delta < LOSS_ATOL, (ours, theirs)
    assert delta_norm < 10 * LOSS_ATOL
    assert ours[-1] < ours[0] - 0.1  # it learns: the reference is not trivially equal


def plain_torch_losses(folder, rows) -> list[float]:
    """A plain PyTorch loop on the transformers model: every token after the first is a target; the loss of a
    step is the summed NLL over its two micro-batches divided by their target count."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    sched = transformers.get_scheduler("linear", opt, num_warmup_steps=3, num_training_steps=STEPS)
    order = [r["input_ids"] for r in rows]
    losses, i = [], 0
    for _ in range(STEPS):
        micro = []
        for _ in range(2):
            micro.append([order[(i + k) % len(order)] for k in range(2)])
            i += 2
        n = sum(len(x) - 1 for batch in micro for x in batch)
        total = 0.0
        for batch in micro:
            width = max(len(x) for x in batch)
            ids = torch.tensor([x + [0] * (width - len(x)) for x in batch])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in batch])
            logits = model(input_ids=ids, attention_mask=mask).logits
            logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
            loss = -(logp * mask[:, 1:]).sum() / n
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def test_full_fine_tuning_matches_a_plain_pytorch_loop(tiny_llama, tmp_path):
    rows = [{"input_ids": r["prompt_ids"] + r["completion_ids"]} for r in id_rows(12, seed=1)]
    data = write_jsonl(tmp_path / "lm.jsonl", rows)
    out = tmp_path / "out"
    result = linnet.train(
        LLAMA, tiny_llama, data=data, output=out, method="full", shuffle=False, progress=False, **COMMON
    )
    ours = [r["loss"] for r in result.history]
    theirs = plain_torch_losses(tiny_llama, rows)
    delta = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"full fine-tuning vs plain PyTorch over {STEPS} steps: max |loss diff| {delta:.2e}")
    assert delta < LOSS_ATOL, (ours, theirs)
    assert ours[-1] < ours[0] - 0.1
    # the folder written is a Hugging Face checkpoint of the trained weights: transformers' logits equal Linnet's
    import transformers

    trained = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([rows[0]["input_ids"]])
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        got = result.model.native.forward(ids)
    assert torch.allclose(got, expected, atol=1e-5), float((got - expected).abs().max())
    metrics = (out / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == STEPS
