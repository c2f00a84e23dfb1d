"""The JAX/XLA and ONNX Runtime backends load, run and generate without torch: on the embedded SmolLM2
(GGUF, dequantized with numpy) and on a Hugging Face folder of safetensors written with numpy, in a fresh
process where `import torch` fails, and with neither torch nor transformers in `sys.modules` afterwards."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.runtimes.conftest import LLAMA

pytestmark = pytest.mark.slow

TINY = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "max_position_embeddings": 64,
}

# Runs in the child: torch is made unimportable first, so any path that reaches for it fails loudly.
CHILD = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
import numpy as np
import linnet
from linnet.cli import main
from linnet.runtimes.generation import Generator
from linnet.runtimes.sampling import SamplingParams

backend, folder = sys.argv[1], sys.argv[2]
greedy = SamplingParams(max_new_tokens=4)

m = linnet.load("{llama}", backend=backend, max_positions=64, progress=False)  # the preset's embedded SmolLM2
tok = m.tokenizer()
ids = tok.encode("The capital of France is")
(logits,) = m.run("forward", np.array([ids]))
assert logits.shape == (1, len(ids), 49152) and isinstance(logits, np.ndarray), logits.shape
text = Generator(m.step_model(), tok).generate(ids, greedy).text
assert "Paris" in text, text

m = linnet.load("{llama}", folder, backend=backend, max_positions=32, progress=False)
(logits,) = m.run("forward", np.array([[1, 2, 3]]))
tokens = Generator(m.step_model(), None).generate([1, 2, 3], greedy).token_ids
assert len(tokens) == 4

rc = main(["run", "{llama}", "--backend", backend, "--weights", folder, "--max-positions", "32", "--format", "json"])
assert rc == 0, rc
loaded = [k for k, v in sys.modules.items() if v is not None and k.split(".")[0] in ("torch", "transformers")]
print("HEAVY", sorted(loaded))
print("TOKENS", tokens)
"""


@pytest.fixture(scope="module")
def numpy_folder(tmp_path_factory):
    """A Llama checkpoint folder (config.json + model.safetensors) written with numpy alone."""
    from safetensors.numpy import save_file

    from linnet.ir import build

    program = build(LLAMA, config=TINY, max_positions=32)
    rng = np.random.default_rng(3)
    tensors = {}
    for p in program.params:
        scale = 1.0 if p.path.endswith("norm.weight") else 0.0  # norm scales near 1, the rest near 0
        tensors[p.path] = (scale + rng.standard_normal(p.shape) * 0.05).astype(np.float32)
    folder = tmp_path_factory.mktemp("numpy-llama")
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **TINY}))
    return folder


@pytest.mark.parametrize("backend", ["jax", "onnxruntime"])
def test_backend_runs_without_torch(backend, numpy_folder):
    pytest.importorskip({"jax": "jax", "onnxruntime": "onnxruntime"}[backend])
    code = textwrap.dedent(CHILD).replace("{llama}", str(LLAMA))
    done = subprocess.run(
        [sys.executable, "-c", code, backend, str(numpy_folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("HEAVY", "TOKENS")))
    assert lines["HEAVY"] == "[]", lines["HEAVY"]
    if importlib.util.find_spec("torch") is not None:  # the same greedy tokens as the torch backend's
        import linnet
        from linnet.runtimes.generation import Generator
        from linnet.runtimes.sampling import SamplingParams

        m = linnet.load(LLAMA, numpy_folder, backend="torch", max_positions=32, progress=False)
        expected = Generator(m.step_model(), None).generate([1, 2, 3], SamplingParams(max_new_tokens=4)).token_ids
        assert lines["TOKENS"] == str(expected)


# Runs in the child: torch blocked by a meta path finder (what a machine without torch answers: an ImportError), then
# `linnet train` on JAX with each preference method, and on PyTorch.
TRAIN_CHILD = """
import sys


class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None


sys.meta_path.insert(0, NoTorch())
from linnet.cli import main

folder, data, out = sys.argv[1], sys.argv[2], sys.argv[3]
common = ["train", "{llama}", "--weights", folder, "--max-steps", "2", "--max-length", "16", "--quiet"]
runs = {
    "dpo-jax": ["--method", "dpo", "--backend", "jax", "--data", data + "/dpo.jsonl", "-o", out + "/dpo"],
    "grpo-jax": ["--method", "grpo", "--backend", "jax", "--data", data + "/grpo.jsonl", "-o", out + "/grpo",
                 "--reward", "tests.runtimes.train.toy_pref:digit_share_reward"],
    "dpo-torch": ["--method", "dpo", "--backend", "torch", "--data", data + "/dpo.jsonl", "-o", out + "/torch"],
}
for name, args in runs.items():
    print(f"RC {name} {main(common + args)}", flush=True)
print("TORCH", sorted(k for k, v in sys.modules.items() if v is not None and k.split(".")[0] == "torch"))
"""


def test_preference_training_without_torch(numpy_folder, tmp_path):
    """DPO trains on JAX where torch cannot be imported (its module imported torch at load: a traceback); GRPO,
    which JAX does not train yet, and training on PyTorch say so and exit 2, naming what to install."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    with open(tmp_path / "dpo.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt_ids": [1, 2 + i, 3], "chosen_ids": [5, 6], "rejected_ids": [7, 8 + i]}) + "\n")
    (tmp_path / "grpo.jsonl").write_text("".join(json.dumps({"prompt_ids": [1, 2 + i, 3]}) + "\n" for i in range(4)))
    code = textwrap.dedent(TRAIN_CHILD).replace("{llama}", str(LLAMA))
    done = subprocess.run(
        [sys.executable, "-c", code, str(numpy_folder), str(tmp_path), str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rcs = dict(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RC "))
    assert rcs == {"dpo-jax": "0", "grpo-jax": "2", "dpo-torch": "2"}, (rcs, done.stderr[-4000:])
    assert "method grpo does not train on JAX yet (JAX trains: sft, full, dpo)" in done.stderr
    assert "training on torch needs torch, which is not installed (pip install 'linnet[torch]')" in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "out" / "dpo" / "metrics.jsonl").read_text().count("\n") == 2
    assert "TORCH []" in done.stdout
