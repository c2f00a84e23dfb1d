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

from tests.runtimes.train.conftest import COMMON, LLAMA, LOSS_ATOL, STEPS, id_rows, trl_sft_losses, write_jsonl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import linnet  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


def test_sft_matches_trl(tiny_llama, tmp_path):
    rows = id_rows(16)
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    result = linnet.train(LLAMA, tiny_llama, data=data, method="full", shuffle=False, progress=False, **COMMON)
    ours = [r["loss"] for r in result.history]
    ours_norm = [r["grad_norm"] for r in result.history]
    theirs, theirs_norm = trl_sft_losses(tiny_llama, rows, COMMON)
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
