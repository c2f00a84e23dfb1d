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
