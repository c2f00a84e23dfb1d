"""The JAX trainer on a 2-device mesh (XLA_FLAGS=--xla_force_host_platform_device_count=2, in a subprocess: the
device count is fixed when JAX starts) gives the one-device losses: each micro-batch split on its rows over the
devices (3 rows padded to 4 with zero-mask rows), parameters and optimizer state replicated, XLA's partitioner
summing the gradients. LoRA SFT of the training tests' shrunk Llama, 5 steps with accumulation 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtimes.train.conftest import LLAMA, id_rows, write_jsonl

pytest.importorskip("torch")  # the fixture's checkpoint is made by transformers
pytest.importorskip("transformers")
pytest.importorskip("jax")
pytest.importorskip("optax")

import linnet  # noqa: E402

pytestmark = [pytest.mark.jax]

ROOT = Path(__file__).parents[3]
# a bound, not a timing: on a machine shared by many test runs, importing torch alone has taken 80 s
SUBPROCESS_TIMEOUT_S = 900
OPTIONS = dict(
    method="sft", backend="jax", shuffle=False, progress=False, max_steps=5, per_device_train_batch_size=3,
    gradient_accumulation_steps=2, learning_rate=1e-3, warmup_steps=1, max_grad_norm=1.0, weight_decay=0.01,
)  # fmt: skip
RUN = """
import json, sys
import jax, linnet
result = linnet.train(sys.argv[1], sys.argv[2], data=sys.argv[3], **json.loads(sys.argv[4]))
print(json.dumps({"devices": jax.device_count(), "history": result.history}))
"""


@pytest.mark.slow  # a second process starts JAX and compiles the step: about 30 s on an idle core
def test_two_devices_give_the_one_device_losses(tiny_llama, tmp_path):
    data = write_jsonl(tmp_path / "sft.jsonl", id_rows(12))
    one = linnet.train(LLAMA, tiny_llama, data=data, **OPTIONS).history
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }  # fmt: skip
    cmd = [sys.executable, "-c", RUN, str(LLAMA), str(tiny_llama), str(data), json.dumps(OPTIONS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = json.loads(proc.stdout.splitlines()[-1])
    assert two["devices"] == 2
    for key in ("loss", "grad_norm", "num_loss_tokens"):
        delta = max(abs(a[key] - b[key]) for a, b in zip(two["history"], one))
        print(f"JAX on 2 devices vs 1, {key}: max |diff| {delta:.2e}")
        assert delta < 1e-5, key
