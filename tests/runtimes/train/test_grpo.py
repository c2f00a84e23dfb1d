"""GRPO on PyTorch against TRL 1.16's GRPOTrainer + PEFT, on the tiny Llama of `toy_pref` (char tokenizer,
two-number multiplication prompts in file order on both sides: Linnet `shuffle=False`, TRL `shuffle_dataset=False`),
f32, LoRA from the same initial adapter (PEFT draws A, B = 0), one prompt and a group of 4 completions per step.

Sampling cannot be bit-identical across two libraries (different random streams), so GRPO is compared twice:
- exactly: Linnet replays the completions TRL sampled at each step (the `rollout` option) and must reach TRL's
  loss, gradient norm, reward and KL at every step (beta 0.04, so the k3 term and the reference, TRL's frozen copy
  of the starting adapter, are exercised); then the adapter Linnet wrote loads in PEFT with Linnet's logits;
- statistically: each side samples its own completions (Linnet through its generation runner, seeded) for a few
  steps at a small learning rate, and the mean rewards must agree within 4 standard errors (Welch).

Observed (8 steps): max |Δloss| 2.5e-8; the grad norms agree to ~1e-6 relative; mean rewards 0.232 (Linnet) and 0.229
(TRL), within one standard error (0.005).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.runtimes.train import toy_pref
from tests.runtimes.train.conftest import LLAMA, write_jsonl
from tests.runtimes.train.trl_reference import peft_model, trl_grpo

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

import linnet  # noqa: E402
from linnet.errors import TrainError  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

STEPS = 8
G = 4
REWARD = "tests.runtimes.train.toy_pref:digit_share_reward"
COMMON = dict(max_steps=STEPS, per_device_train_batch_size=1, learning_rate=3e-2, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return toy_pref.save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def completions_of(batch: dict) -> list[list[int]]:
    """A TRL generation batch's completions as token-id lists (EOS included, padding dropped)."""
    return [
        [int(t) for t, m in zip(ids, mask) if m]
        for ids, mask in zip(batch["completion_ids"], batch["completion_mask"], strict=True)
    ]


def test_lora_grpo_on_trls_completions_matches_trl_and_peft(model_dir, tmp_path):
    rows = toy_pref.multiplication_prompts(STEPS, seed=1)
    reference = peft_model(model_dir)
    initial = tmp_path / "initial_adapter"
    reference.save_pretrained(initial)
    ref = trl_grpo(
        model_dir, rows, [toy_pref.digit_share_reward], tmp_path / "trl", steps=STEPS, num_generations=G,
        lora=reference, beta=0.04, learning_rate=COMMON["learning_rate"],
    )  # fmt: skip
    replayed = [completions_of(b) for b in ref.batches]
    out = tmp_path / "out"
    options = dict(reward=REWARD, num_generations=G, max_completion_length=6, beta=0.04,
                   rollout=lambda prompts, step: replayed[step])  # fmt: skip
    result = linnet.train(
        LLAMA, model_dir, data=write_jsonl(tmp_path / "g.jsonl", rows), output=out, method="grpo", adapter=initial,
        shuffle=False, progress=False, method_options=options, **COMMON,
    )  # fmt: skip
    worst = 0.0
    for want, got in zip(ref.metrics, result.history, strict=True):
        worst = max(worst, abs(want["loss"] - got["loss"]))
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-6), want["step"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4), want["step"]
        assert got["reward"] == pytest.approx(want["reward"], abs=1e-6)
        assert got["kl"] == pytest.approx(want["kl"], abs=1e-6)
    print(f"LoRA GRPO on TRL's completions: max |loss diff| over {STEPS} steps = {worst:.2e}")
    assert max(h["kl"] for h in result.history) > 1e-4  # the adapter moved away from the reference

    import transformers
    from peft import PeftModel

    base = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, out).eval()
    ids = np.array([[1, 8, 9, 14, 10, 11, 15, 6]])
    with torch.no_grad():
        expected = loaded(input_ids=torch.tensor(ids)).logits.numpy()
    assert np.abs(result.model.forward(ids)[0] - expected).max() < 1e-5


def test_own_sampling_rewards_agree_with_trl(model_dir, tmp_path):
    """Both sides sample (T = 1, G = 8, 4 steps, learning rate 1e-3 so the policy stays close to its start); the
    mean rewards over the 32 completions of each side agree within 4 standard errors."""
    steps, g = 4, 8
    rows = toy_pref.multiplication_prompts(steps, seed=2)
    ref = trl_grpo(model_dir, rows, [toy_pref.digit_share_reward], tmp_path / "trl", steps=steps, num_generations=g,
                   max_completion_length=6, learning_rate=1e-3)  # fmt: skip
    result = linnet.train(
        LLAMA, model_dir, data=write_jsonl(tmp_path / "g.jsonl", rows), method="grpo", shuffle=False, progress=False,
        method_options=dict(reward=REWARD, num_generations=g, max_completion_length=6),
        max_steps=steps, per_device_train_batch_size=1, learning_rate=1e-3,
    )  # fmt: skip
    ours = [h["reward"] for h in result.history]
    theirs = [m["reward"] for m in ref.metrics]
    # the per-step reward std (Bessel, over G samples) gives each mean's standard error
    var = [h["reward_std"] ** 2 / g for h in result.history] + [m["reward_std"] ** 2 / g for m in ref.metrics]
    se = math.sqrt(sum(var)) / steps
    delta = abs(np.mean(ours) - np.mean(theirs))
    print(f"GRPO mean reward: Linnet {np.mean(ours):.3f}, TRL {np.mean(theirs):.3f}, |diff| {delta:.3f}, SE {se:.3f}")
    assert se > 0 and delta < 4 * se
    assert all(h["completions/mean_length"] > 0 for h in result.history)


def write_prompts(tmp_path, rows):
    return write_jsonl(tmp_path / "g.jsonl", rows)


def test_a_raising_reward_function_names_itself_and_the_row(model_dir, tmp_path):
    rows = [{"prompt": "12*34="}, {"prompt": "56*78="}]
    out = tmp_path / "out"
    with pytest.raises(TrainError) as err:
        linnet.train(
            LLAMA, model_dir, data=write_prompts(tmp_path, rows), output=out, method="grpo", shuffle=False,
            progress=False, max_steps=1, per_device_train_batch_size=1,
            method_options=dict(reward="tests.runtimes.train.toy_pref:raising_reward", num_generations=2,
                                max_completion_length=2),
        )  # fmt: skip
    message = str(err.value)
    assert "g.jsonl:1" in message and "tests.runtimes.train.toy_pref:raising_reward" in message
    assert "ZeroDivisionError: division by zero" in message
    assert not out.exists() and not list(tmp_path.glob(".out.*"))  # nothing written half-way


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        ("tests.runtimes.train.toy_pref", "must be `module:function`"),
        ("tests.runtimes.train.no_such_module:f", "cannot import `tests.runtimes.train.no_such_module`"),
        ("tests.runtimes.train.toy_pref:nope", "has no `nope`"),
        (None, "needs a reward function"),
    ],
)
def test_bad_reward_paths(model_dir, tmp_path, reward, expected):
    with pytest.raises(TrainError, match=expected):
        linnet.train(LLAMA, model_dir, data=write_prompts(tmp_path, [{"prompt": "1*2="}]), method="grpo",
                     progress=False, max_steps=1, method_options=dict(reward=reward))  # fmt: skip


def test_a_row_without_a_prompt(model_dir, tmp_path):
    data = write_prompts(tmp_path, [{"prompt": "1*2="}, {"question": "3*4="}])
    with pytest.raises(TrainError, match=r'g\.jsonl:2: field "prompt" is missing'):
        linnet.train(LLAMA, model_dir, data=data, method="grpo", progress=False, max_steps=1,
                     method_options=dict(reward=REWARD))  # fmt: skip
