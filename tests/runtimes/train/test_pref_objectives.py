"""Linnet's DPO and GRPO objectives (linnet.runtimes.train.dpo / grpo) against TRL 1.16's own `_compute_loss` on
the same batch, the same model and the same weights: the tiny Llama of `toy_pref` with a PEFT LoRA adapter whose
B matrices are made non-zero, so the trained model and the reference (adapter disabled) differ.

The logits both sides use come from the same transformers model, so these tests check the objectives' math
(summed log-probs, masks, the sigmoid loss, advantages, the clipped ratio, the k3 KL, the dapo normaliser,
the metrics), not a backend; test_dpo.py and test_grpo.py run Linnet's trainer against TRL's."""

from __future__ import annotations

import pytest

from tests.runtimes.train import toy_pref
from tests.runtimes.train.trl_reference import dpo_trainer, grpo_trainer

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from linnet.runtimes.train.dpo import dpo_loss, preference_batch  # noqa: E402
from linnet.runtimes.train.grpo import completion_logps, group_advantages, grpo_loss  # noqa: E402
from linnet.runtimes.train.logprobs import sequence_logps  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

TOL = 1e-6  # f32, same logits on both sides: only the order of the sums differs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return toy_pref.save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def perturb_lora(model, seed: int = 3) -> None:
    """Give every LoRA B a random value (PEFT initialises B = 0, which makes the adapted model the reference)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_and_metrics_equal_trl(model_dir, tmp_path, beta):
    rows = toy_pref.multiplication_preferences(3, seed=1)
    trainer = dpo_trainer(model_dir, rows, tmp_path, steps=1, batch_size=3, beta=beta)
    model = trainer.model
    perturb_lora(model)
    model.train()
    examples = [trainer.train_dataset[i] for i in range(len(rows))]
    inputs = trainer.data_collator(examples)
    trl_loss = trainer._compute_loss(model, inputs, return_outputs=False)
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    tokenized = [(e["prompt_ids"], e["chosen_ids"], e["rejected_ids"]) for e in examples]
    batch = preference_batch(tokenized, pad_id=trainer.processing_class.pad_token_id)
    assert torch.equal(batch.input_ids, inputs["input_ids"])  # the same stacking and right padding
    assert torch.equal(batch.completion_mask, inputs["completion_mask"])
    with torch.no_grad():
        logps = sequence_logps(model(batch.input_ids).logits, batch.input_ids, batch.completion_mask)
        with model.disable_adapter():
            ref = sequence_logps(model(batch.input_ids).logits, batch.input_ids, batch.completion_mask)
    n = len(rows)
    loss, metrics = dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], beta=beta)
    assert abs(loss.item() - trl_loss.item()) < TOL
    assert abs(loss.item() - 0.6931) > 1e-3  # the adapter moved the model away from the reference
    for name in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen"):
        assert metrics[name] == pytest.approx(trl_metrics[name], abs=1e-5), name


def test_group_advantages_equal_trl_formula():
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0])
    adv, metrics = group_advantages(rewards, num_generations=4)
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, 4)
    want = (rewards - grouped.mean(1).repeat_interleave(4)) / (nanstd(grouped, dim=1).repeat_interleave(4) + 1e-4)
    assert torch.allclose(adv, want, atol=1e-7)
    assert torch.all(adv[4:] == 0)  # a group of equal rewards carries no signal
    assert metrics["frac_reward_zero_std"] == 0.5


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_loss_equals_trl_on_a_sampled_batch(model_dir, tmp_path, beta):
    rows = toy_pref.multiplication_prompts(2, seed=1)
    trainer = grpo_trainer(model_dir, rows, [toy_pref.digit_share_reward], tmp_path, steps=1, beta=beta)
    model = trainer.model
    perturb_lora(model)
    torch.manual_seed(0)
    model.eval()  # sampling as TRL does it, outside the train step
    batch = trainer._generate_and_score_completions([{"prompt": rows[0]["prompt"]}] * 4)
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # what `training_step` sets before it calls the loss
    trl_loss = trainer._compute_loss(model, batch)
    trl_grads = lora_grads(model, trl_loss)
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
    mask = batch["completion_mask"]
    rewards = torch.tensor(toy_pref.digit_share_reward([rows[0]["prompt"]] * 4, trl_completions(trainer, batch)))
    advantages, _ = group_advantages(rewards, 4)
    assert torch.allclose(advantages, batch["advantages"], atol=1e-6)

    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    logps = completion_logps(model(ids).logits, completion_ids, prompt_ids.shape[1], temperature=1.0)
    ref = None
    if beta:
        with torch.no_grad(), model.disable_adapter():
            ref = completion_logps(model(ids).logits, completion_ids, prompt_ids.shape[1])
    loss, metrics = grpo_loss(logps, advantages, mask, num_items=mask.sum().item(), ref_per_token_logps=ref, beta=beta)
    assert abs(loss.item() - trl_loss.item()) < TOL
    # with equal-length completions and beta 0 the loss is ~0 (advantages sum to 0 per group): the gradient is
    # what carries the signal, so compare it too
    grads = lora_grads(model, loss)
    assert max(g.abs().max().item() for g in trl_grads.values()) > 1e-4
    for name, g in grads.items():
        assert torch.allclose(g, trl_grads[name], atol=1e-6), name
    if beta:
        assert metrics["kl"] == pytest.approx(trl_metrics["kl"], abs=1e-6)
        assert metrics["kl"] > 0


def lora_grads(model, loss) -> dict:
    """d loss / d (every LoRA parameter), leaving no gradient behind."""
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if "lora_" in n}
    model.zero_grad()
    return grads


def trl_completions(trainer, batch) -> list[str]:
    """The completions' text as TRL hands it to reward functions (decoded, special tokens skipped)."""
    ids = batch["completion_ids"].tolist()
    mask = batch["completion_mask"].tolist()
    return [
        trainer.processing_class.decode([t for t, m in zip(row, ms) if m], skip_special_tokens=True)
        for row, ms in zip(ids, mask)
    ]
