"""DPO on PyTorch (and LoRA DPO on JAX) against TRL 1.16's DPOTrainer, on the tiny Llama of `toy_pref` (2 layers,
hidden 32, a character tokenizer) random-initialised by transformers (seed 0), saved with `save_pretrained` and
loaded by Linnet from the folder, f32, multiplication preference rows in file order on both sides (Linnet
`shuffle=False`, TRL `train_sampling_strategy="sequential"`), TRL's defaults for the loss (sigmoid, beta 0.1) and
the reference (ref_model=None).

Tolerance: the losses differ only by the summation order of f32 matmuls, compounded over the steps; observed
max |Δloss| over 8 steps: 1.4e-6 for full DPO at beta 0.5, 3.6e-7 for LoRA DPO at beta 0.1 (1.8e-7 on JAX); the
tests allow 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtimes.train import toy_pref
from tests.runtimes.train.conftest import LLAMA, write_jsonl
from tests.runtimes.train.trl_reference import peft_model, trl_dpo

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from linnet.errors import TrainError  # noqa: E402
from linnet.runtimes.train import TrainConfig, objective_for  # noqa: E402
from linnet.runtimes.train.data import read_jsonl  # noqa: E402
from linnet.runtimes.train.policy import TorchPolicy  # noqa: E402
from linnet.runtimes.train.run import load_for_training  # noqa: E402
from linnet.runtimes.train.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

STEPS = 8
LOSS_ATOL = 1e-5
COMMON = dict(max_steps=STEPS, per_device_train_batch_size=2, learning_rate=1e-3, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return toy_pref.save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def rows():
    return toy_pref.multiplication_preferences(16, seed=1)


def linnet_dpo_full(model_dir, data, **options):
    """Every parameter trained by Linnet's DPO objective and torch trainer."""
    model, trainable = load_for_training(LLAMA, model_dir)
    policy = TorchPolicy(model, trainable)
    objective = objective_for("dpo", **options.pop("method_options", {}))
    cfg = TrainConfig(method="dpo", shuffle=False, **COMMON, **options)
    token_rows = objective.token_rows(read_jsonl(data), policy.tokenizer, policy.vocab_size, cfg.max_length)
    return Trainer(policy, objective, token_rows, cfg).train()


def compare(trl_metrics: list[dict], history: list[dict]) -> float:
    assert len(history) == len(trl_metrics) == STEPS
    worst = 0.0
    for want, got in zip(trl_metrics, history, strict=True):
        worst = max(worst, abs(want["loss"] - got["loss"]))
        assert got["loss"] == pytest.approx(want["loss"], abs=LOSS_ATOL), (want["step"], want, got)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
            assert got[name] == pytest.approx(want[name], abs=1e-5), (want["step"], name)
    return worst


def test_full_dpo_losses_match_trl(model_dir, rows, tmp_path):
    """Every parameter trained, beta 0.5 (the LoRA test runs TRL's default 0.1); TRL's reference is a second copy
    of the checkpoint, Linnet's the starting values of the trained parameters."""
    beta = 0.5
    ref = trl_dpo(model_dir, rows, tmp_path / "trl", steps=STEPS, batch_size=2, lora=False, beta=beta)
    history = linnet_dpo_full(model_dir, write_jsonl(tmp_path / "d.jsonl", rows), method_options={"beta": beta})
    worst = compare(ref.metrics, history)
    assert min(h["loss"] for h in history) < 0.68  # the run moves: from ln 2 = 0.693
    print(f"DPO full beta={beta}: max |loss diff| over {STEPS} steps = {worst:.2e}")


def test_lora_dpo_matches_trl_and_peft(model_dir, rows, tmp_path):
    """LoRA (PEFT's defaults: r 8, alpha 8, q_proj and v_proj) from the same initial adapter on both sides (PEFT
    draws A, B = 0; Linnet loads that folder): TRL's reference is a frozen copy of that adapter (B = 0: the base
    model), Linnet's the model with adapters disabled. Then the adapter Linnet wrote loads in
    `PeftModel.from_pretrained` with Linnet's logits."""
    import linnet

    reference = peft_model(model_dir)
    initial = tmp_path / "initial_adapter"
    reference.save_pretrained(initial)
    ref = trl_dpo(model_dir, rows, tmp_path / "trl", steps=STEPS, batch_size=2, lora=reference, learning_rate=3e-2)
    out = tmp_path / "out"
    result = linnet.train(
        LLAMA, model_dir, data=write_jsonl(tmp_path / "d.jsonl", rows), output=out, method="dpo", adapter=initial,
        shuffle=False, progress=False, **{**COMMON, "learning_rate": 3e-2},
    )  # fmt: skip
    worst = compare(ref.metrics, result.history)
    print(f"LoRA DPO vs TRL + PEFT: max |loss diff| over {STEPS} steps = {worst:.2e}")
    assert min(h["loss"] for h in result.history) < 0.69  # moved from ln 2 = 0.6931
    # the same run on JAX (its reference: the adapter's starting values, B = 0: the base model exactly)
    on_jax = linnet.train(
        LLAMA, model_dir, data=write_jsonl(tmp_path / "d.jsonl", rows), output=tmp_path / "out-jax", method="dpo",
        adapter=initial, backend="jax", shuffle=False, progress=False, **{**COMMON, "learning_rate": 3e-2},
    )  # fmt: skip
    worst_jax = compare(ref.metrics, on_jax.history)
    print(f"LoRA DPO on JAX vs TRL + PEFT: max |loss diff| over {STEPS} steps = {worst_jax:.2e}")

    import transformers
    from peft import PeftModel

    base = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, out).eval()
    ids = np.array([[1, 8, 9, 14, 10, 11, 15, 6]])
    with torch.no_grad():
        expected = loaded(input_ids=torch.tensor(ids)).logits.numpy()
    got = result.model.forward(ids)[0]
    print(f"Linnet vs PeftModel.from_pretrained logits: max |diff| {np.abs(got - expected).max():.2e}")
    assert np.abs(got - expected).max() < 1e-5
    assert (out / "metrics.jsonl").read_text().count("rewards/margins") == STEPS


def test_dpo_row_missing_a_field_names_file_line_and_field(model_dir, tmp_path):
    good = {"prompt_ids": [0, 5, 6], "chosen_ids": [7, 1], "rejected_ids": [8, 1]}
    data = write_jsonl(tmp_path / "d.jsonl", [good, {"prompt_ids": [0, 5], "chosen_ids": [7]}])
    objective = objective_for("dpo")
    with pytest.raises(TrainError, match=r'd\.jsonl:2: field "rejected_ids" is missing'):
        objective.token_rows(read_jsonl(data), None, 64, None)


def test_dpo_refuses_a_non_positive_beta():
    with pytest.raises(TrainError, match="beta must be positive"):
        objective_for("dpo", beta=0.0)
