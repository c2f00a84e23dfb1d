"""The JAX trainer as it runs on an accelerator (`linnet train --backend jax --device tpu`), proven on the CPU with
the shrunk Llama of this folder's conftest:

- the TPU machine has no torch: LoRA SFT on JAX imports none (a subprocess whose torch import fails), and the fresh
  adapters are PEFT's (torch's generator) values all the same;
- bf16 mixed precision (`--bf16` on JAX): bf16 weights and activations, f32 master adapters; its losses within
  bf16's tolerance of the f32 run's, the adapters saved in f32;
- ragged rows compile a few padded shapes (length buckets, rows padded to the batch), not one per length;
- each step's record fetched once the next step is queued (but before a checkpoint of that step);
- activation checkpointing on JAX: the same losses, each layer checkpointed;
- on the TPU (marked tpu), the CPU's losses and gradient norms, in f32 and in bf16 mixed precision.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.runtimes.train.conftest import LLAMA, id_rows, write_jsonl

pytest.importorskip("jax")
pytest.importorskip("optax")

import linnet  # noqa: E402
from linnet.runtimes.train import LoraSettings  # noqa: E402

pytestmark = [pytest.mark.jax]

# `python -m linnet` with every `import torch` failing, as on the TPU machine
WITHOUT_TORCH = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["linnet", *sys.argv[1:]]
runpy.run_module("linnet", run_name="__main__")
"""
OPTIONS = dict(backend="jax", shuffle=False, progress=False, per_device_train_batch_size=2, learning_rate=1e-3)


def test_lora_sft_on_jax_runs_without_torch(tiny_llama, tmp_path):
    """Before: `linnet train` imported torch for JAX too (the seed, `check_trains`, LoRA's init, DPO's module)."""
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(6))
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", WITHOUT_TORCH, "train", str(LLAMA), "--weights", str(tiny_llama), "--data",
           str(data), "--backend", "jax", "--max-steps", "2", "--batch-size", "2", "--lr", "1e-3", "--no-shuffle",
           "--quiet", "-o", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 2 steps" in proc.stderr
    with_torch = linnet.train(LLAMA, tiny_llama, data=data, max_steps=2, **OPTIONS)
    got = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert got == pytest.approx([r["loss"] for r in with_torch.history], abs=1e-6)


def test_fresh_adapters_are_torchs_draw(tiny_llama):
    """The fresh A (`torch_rand_f32`, numpy) is the `torch.rand` draw PEFT's init makes from the seeded generator."""
    torch = pytest.importorskip("torch")
    import math

    from linnet.runtimes.train.lora import prepare_with_adapters

    prepared, adapters = prepare_with_adapters(LLAMA, tiny_llama, LoraSettings(r=4, targets="all-linear"), seed=7)
    fresh = {p: prepared.checkpoint.load(p) for p in adapters.paths()}
    g = torch.Generator().manual_seed(7)
    for m in adapters.members:
        bound = 1.0 / math.sqrt(m.in_features)
        want = (torch.rand((4, m.in_features), generator=g, dtype=torch.float32) * (2 * bound) - bound).numpy()
        np.testing.assert_array_equal(fresh[f"{m.path}.lora_A.weight"], want)
        assert not fresh[f"{m.path}.lora_B.weight"].any()


def test_bf16_mixed_precision_tracks_f32_with_f32_master_adapters(tiny_llama, tmp_path):
    """Before: `bf16=True` on JAX was refused. Now: the model in bf16, the adapters trained in f32."""
    from safetensors.numpy import load_file

    data = write_jsonl(tmp_path / "d.jsonl", id_rows(8))
    f32 = linnet.train(LLAMA, tiny_llama, data=data, max_steps=6, **OPTIONS)
    bf16 = linnet.train(LLAMA, tiny_llama, data=data, output=tmp_path / "out", max_steps=6, bf16=True, **OPTIONS)
    ours, ref = [r["loss"] for r in bf16.history], [r["loss"] for r in f32.history]
    rel = max(abs(a - b) / b for a, b in zip(ours, ref))
    print(f"JAX bf16 mixed precision vs f32 over 6 steps: max relative loss difference {rel:.1e}")
    assert 0 < rel < 1e-2
    params = bf16.model.params
    assert params["model.layers.0.mlp.up_proj.weight"].dtype.name == "bfloat16"
    assert params["model.layers.0.self_attn.q_proj.lora_A.weight"].dtype.name == "bfloat16"
    master = bf16.model.master_params["model.layers.0.self_attn.q_proj.lora_A.weight"]
    saved = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert saved[key].dtype == np.float32 and master.dtype.name == "float32"
    np.testing.assert_array_equal(saved[key], np.asarray(master))


def trainer_for(tiny_llama, data, **options):
    from linnet.runtimes.train import TrainConfig, objective_for
    from linnet.runtimes.train.data import read_jsonl
    from linnet.runtimes.train.jax_trainer import policy_and_trainer
    from linnet.runtimes.train.run import load_for_training

    cfg = TrainConfig(lora=LoraSettings(), **options)
    model, trainable = load_for_training(LLAMA, tiny_llama, backend="jax", lora=cfg.lora)
    policy, trainer_class = policy_and_trainer(model, trainable, cfg)
    objective = objective_for("sft")
    rows = objective.token_rows(read_jsonl(data), policy.tokenizer, policy.vocab_size, None)
    return trainer_class(policy, objective, rows, cfg)


def test_ragged_rows_compile_a_few_padded_shapes(tiny_llama, tmp_path):
    """Before: each micro-batch's longest row rounded up to a multiple of 16 made its shape (an epoch's short last
    batch another), each a compile of the step. Now: the length buckets (16, 24, 32, 48, ...), rows padded to the
    batch's."""
    import random

    from linnet.runtimes.train.jax_trainer import padded_length

    assert [padded_length(n) for n in (1, 16, 17, 24, 25, 33, 49, 96, 97, 300, 512, 513)] == [
        16, 16, 24, 24, 32, 48, 64, 96, 128, 384, 512, 768,
    ]  # fmt: skip
    rng = random.Random(0)
    rows = [{"input_ids": [rng.randrange(3, 128) for _ in range(n)]} for n in range(17, 301, 17)]
    data = write_jsonl(tmp_path / "ragged.jsonl", rows)  # 17 rows of 17 .. 289 tokens: 5 micro-batches an epoch
    trainer = trainer_for(tiny_llama, data, max_steps=12, per_device_train_batch_size=4, learning_rate=1e-3)
    shapes, lengths = set(), set()
    padded = trainer._padded

    def watched(batch):
        lengths.add(batch.input_ids.shape)
        out = padded(batch)
        shapes.add(out[0].shape)
        return out

    trainer._padded = watched
    trainer.train()
    print(f"{len(lengths)} micro-batch shapes ({sorted(lengths)}) padded to {sorted(shapes)}")
    assert len(lengths) > 5 and shapes <= {(4, 96), (4, 128), (4, 192), (4, 256), (4, 384)}, shapes


def test_each_record_is_fetched_once_the_next_step_is_queued_but_before_a_checkpoint(tiny_llama, tmp_path):
    """Before: each micro-batch's metrics were read with `float()` as soon as it was queued (the host waiting for
    the device at every micro-batch, the device idle while the host prepared the next step). Now: one `device_get`
    per step, after the next step is queued (the trained values already a step ahead), but for a step a checkpoint
    follows (`save_steps`: the checkpoint must hold that step's values)."""
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(8))
    trainer = trainer_for(
        tiny_llama, data, max_steps=5, save_steps=2, gradient_accumulation_steps=2, per_device_train_batch_size=2
    )
    seen = []
    trainer.on_step = lambda record: seen.append((record["step"], getattr(trainer, "state_step", None)))
    history = trainer.train()
    assert seen == [(1, 2), (2, 2), (3, 4), (4, 4), (5, 5)]
    assert all(np.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in history)


def test_gradient_checkpointing_on_jax_gives_the_same_losses_one_layer_at_a_time(tiny_llama, tmp_path):
    """Before: refused on JAX. Now: each decoder layer under `jax.checkpoint` (its weight matmuls' outputs kept, the
    rest recomputed in the backward pass): the same losses, and one checkpointed region (its optimization barrier)
    per layer in the step. (XLA:CPU's buffer assignment shows no saving; a TPU's scheduler is what it is for.)"""
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(8))
    plain = linnet.train(LLAMA, tiny_llama, data=data, max_steps=3, **OPTIONS)
    remat = linnet.train(LLAMA, tiny_llama, data=data, max_steps=3, gradient_checkpointing=True, **OPTIONS)
    assert [r["loss"] for r in remat.history] == pytest.approx([r["loss"] for r in plain.history], abs=1e-6)

    barriers = {}
    for flag in (False, True):
        trainer = trainer_for(tiny_llama, data, max_steps=1, gradient_checkpointing=flag)
        ids, mask = trainer._padded(trainer.objective.collate(next(trainer.micro_batches), 0))
        args = (trainer._zeros(trainer.policy.trainable), trainer.policy.trainable, trainer.policy.frozen, ids, mask,
                np.float32(10), trainer.dropout_key)  # fmt: skip
        barriers[flag] = trainer._accumulate.lower(*args).as_text().count("optimization_barrier")
    assert barriers == {False: 0, True: 2}  # the shrunk Llama's 2 layers


def random_llama(folder, dtype: str = "f32"):
    """The shrunk Llama's shape (conftest's) with Linnet's seeded random weights, written as a Hugging Face folder
    (no torch: the TPU machine's tests make it there)."""
    from linnet.runtimes.export.hf import export_hf

    config = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
    model = linnet.load(LLAMA, backend="jax", config=config, random_weights=True, seed=0, dtype=dtype, progress=False)
    export_hf(model, folder)
    return folder


@pytest.mark.tpu
def test_lora_sft_on_the_tpu_gives_the_cpus_losses(tmp_path):
    """The same rows and steps on the TPU (`--device tpu`) and on the host's CPU (f32, the reference), each step's
    loss and gradient norm: in f32 (`equivalent`: full-precision f32 matmuls) to 1e-4 relative, in bf16 mixed
    precision to 1e-2 (bf16 rounds to 2^-8)."""
    from tests.conftest import tpu_tests_device
    from tests.runtimes.conftest import report

    device = tpu_tests_device()
    weights = random_llama(tmp_path / "llama")
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(12))
    options = dict(max_steps=4, gradient_accumulation_steps=2, weight_decay=0.01, warmup_steps=1, **OPTIONS)
    cpu = linnet.train(LLAMA, weights, data=data, device="cpu", **options).history
    for bf16, bound in ((False, 1e-4), (True, 1e-2)):
        ours = linnet.train(LLAMA, weights, data=data, device=device, bf16=bf16, **options).history
        for key in ("loss", "grad_norm"):
            rel = max(abs(a[key] - b[key]) / b[key] for a, b in zip(ours, cpu))
            report(f"LoRA SFT on {device} ({'bf16' if bf16 else 'f32'}) vs the CPU's f32, {key} (relative)", rel)
            assert rel < bound, (key, [r[key] for r in ours], [r[key] for r in cpu])
