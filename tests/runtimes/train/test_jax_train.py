"""Training on JAX (`jax.value_and_grad` of the generated `forward`, optax AdamW) against the references, on the
shrunk Llama of this folder's conftest (2 layers, hidden 32, vocab 128, seed 0, f32), the same rows in file order
on both sides and the same schedule (`COMMON`: 20 steps, 2 x 2 micro-batches, warmup, linear decay, clipping,
weight decay):

- LoRA SFT against TRL's `SFTTrainer` on a PEFT model, both started from the same adapter (PEFT's A, B = 0):
  per-step losses; the adapter JAX wrote loads in `PeftModel.from_pretrained` with JAX's logits;
- full fine-tuning against the plain PyTorch loop on the transformers model (test_sft.py's).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtimes.train.conftest import COMMON, LLAMA, LOSS_ATOL, STEPS, id_rows, trl_sft_losses, write_jsonl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("jax")
pytest.importorskip("optax")

import linnet  # noqa: E402
from linnet.errors import TrainError  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.jax, pytest.mark.usefixtures("one_torch_thread")]

IDS = np.array([[1, 5, 9, 22, 7, 100, 3, 64]])


def test_lora_sft_on_jax_matches_trl_and_peft(tiny_llama, tmp_path):
    import transformers
    from peft import PeftModel

    from tests.runtimes.train.test_lora import peft_model

    rows = id_rows(16)
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    reference = peft_model(tiny_llama)
    initial = tmp_path / "initial_adapter"
    reference.save_pretrained(initial)
    out = tmp_path / "out"
    result = linnet.train(
        LLAMA, tiny_llama, data=data, output=out, adapter=initial, backend="jax", shuffle=False, progress=False,
        **COMMON,
    )  # fmt: skip
    assert result.model.backend == "jax"
    ours = [r["loss"] for r in result.history]
    theirs, _ = trl_sft_losses(reference, rows, COMMON)
    delta = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"LoRA SFT on JAX vs TRL + PEFT over {STEPS} steps: max |loss diff| {delta:.2e}")
    assert len(ours) == len(theirs) == STEPS
    assert delta < LOSS_ATOL, (ours, theirs)
    assert ours[-1] < ours[0] - 0.05
    assert (out / "metrics.jsonl").read_text().count("\n") == STEPS

    base = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        expected = loaded(input_ids=torch.tensor(IDS)).logits.numpy()
    got = result.model.forward(IDS)
    print(f"JAX vs PeftModel.from_pretrained logits: max |diff| {np.abs(got - expected).max():.2e}")
    assert np.abs(got - expected).max() < 1e-5
    assert np.abs(np.asarray(loaded.get_base_model()(input_ids=torch.tensor(IDS)).logits.detach()) - got).max() > 0


@pytest.mark.slow  # about 40 s: 20 JAX steps and the plain loop
def test_full_fine_tuning_on_jax_matches_a_plain_pytorch_loop(tiny_llama, tmp_path):
    from tests.runtimes.train.test_sft import plain_torch_losses

    rows = [{"input_ids": r["prompt_ids"] + r["completion_ids"]} for r in id_rows(12, seed=1)]
    data = write_jsonl(tmp_path / "lm.jsonl", rows)
    result = linnet.train(LLAMA, tiny_llama, data=data, method="full", backend="jax", shuffle=False, progress=False,
                          **COMMON)  # fmt: skip
    ours = [r["loss"] for r in result.history]
    theirs = plain_torch_losses(tiny_llama, rows)
    delta = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"full fine-tuning on JAX vs a plain PyTorch loop over {STEPS} steps: max |loss diff| {delta:.2e}")
    assert delta < LOSS_ATOL, (ours, theirs)
    assert ours[-1] < ours[0] - 0.1


def test_lora_dropout_on_jax_draws_masks_from_the_key_it_is_given(tiny_llama, tmp_path):
    """lora_dropout 0.1 on JAX: the trainer gives each micro-batch's forward a key (from the seed, the step and the
    micro-batch); the trained model's `forward` without a key is inference (dropout the identity: what
    `model.forward` and PEFT in eval mode compute) and with one draws masks, the same for the same key."""
    import jax
    import transformers
    from peft import PeftModel

    from linnet.compiler.jax.codegen import DROPOUT_KEY
    from linnet.compiler.jax.module import compile_program
    from linnet.runtimes.train import LoraSettings

    data = write_jsonl(tmp_path / "sft.jsonl", id_rows(8))
    lora = LoraSettings(r=4, lora_alpha=8, lora_dropout=0.1)
    result = linnet.train(
        LLAMA, tiny_llama, data=data, output=tmp_path / "out", backend="jax", lora=lora, shuffle=False,
        progress=False, seed=0, **{**COMMON, "max_steps": 3},
    )  # fmt: skip
    assert len(result.history) == 3 and all(np.isfinite(r["loss"]) for r in result.history)
    model = result.model
    program = compile_program(model.prepared.program, model.numerics, fuse_linear_weights=False)
    forward = jax.jit(program.entry_fn("forward"))
    with jax.enable_x64(True):  # the entry's i64, as Linnet's own calls run it (docs/backends.md, "JAX's config")
        ids = jax.numpy.asarray(IDS)
        plain = np.asarray(forward(model.params, {}, ids))
        keyed = [np.asarray(forward({**model.params, DROPOUT_KEY: jax.random.PRNGKey(k)}, {}, ids)) for k in (0, 0, 1)]
    np.testing.assert_array_equal(plain, model.forward(IDS))
    np.testing.assert_array_equal(keyed[0], keyed[1])
    assert np.abs(keyed[0] - plain).max() > 1e-6 and np.abs(keyed[0] - keyed[2]).max() > 1e-6

    base = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, tmp_path / "out").eval()
    assert loaded.peft_config["default"].lora_dropout == 0.1
    with torch.no_grad():
        assert np.abs(loaded(input_ids=torch.tensor(IDS)).logits.numpy() - plain).max() < 1e-5


def test_jax_refuses_what_it_does_not_train(tiny_llama, tmp_path):
    data = write_jsonl(tmp_path / "sft.jsonl", id_rows(4))
    with pytest.raises(TrainError, match="backend xla does not train"):
        linnet.train(LLAMA, tiny_llama, data=data, backend="xla", max_steps=1, progress=False)
    assert not any(tmp_path.iterdir()) or [p.name for p in tmp_path.iterdir()] == ["sft.jsonl"]


def test_each_steps_time_is_its_own_dispatch_and_wait_the_last_included(monkeypatch):
    # The pipelined loop fetches step N's record after step N+1 is dispatched. On a host-bound run (a dispatch of
    # 1.0 s of host work, the device done by the time it is asked), every step costs 1.0 s; the last step's
    # record, fetched with no dispatch after it, read only its wait (0 s: tokens/s of 1e18, the breaker's
    # 99,718 against ~5). A fake clock, so the accounting is exact: each step 1.0 s, and they add to the run's 5.0.
    from types import SimpleNamespace

    from linnet.runtimes.train import jax_trainer

    clock = [0.0]
    monkeypatch.setattr(jax_trainer.time, "perf_counter", lambda: clock[0])
    trainer = object.__new__(jax_trainer.JaxTrainer)
    trainer.config = SimpleNamespace(max_steps=5, save_steps=0)
    trainer.first_step, trainer.history, trainer.on_step = 1, [], None
    trainer.policy = SimpleNamespace(commit=lambda: None)
    trainer.deliver_now = lambda step: step == 3  # a signal asks for step 3's record before step 4 starts

    def dispatch(step):
        t0 = clock[0]
        clock[0] += 1.0  # host work: collate, pad, queue
        micro = [SimpleNamespace(num_tokens=10)]
        metrics = [{"sums": {"loss": 1.0}, "means": {}}]
        return {"step": step, "micro": micro, "metrics": metrics, "grad_norm": 1.0, "lr": 1e-3, "t0": t0,
                "dispatch_s": clock[0] - t0}  # fmt: skip

    trainer.dispatch = dispatch
    records = trainer.train()
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["elapsed_s"] for r in records] == [1.0] * 5
    assert [r["tokens_per_s"] for r in records] == [10.0] * 5
