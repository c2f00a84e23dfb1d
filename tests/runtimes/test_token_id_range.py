"""Token ids outside the embedding table (issue 43, items 4 and 5): one check in `LoadedModel.run` for every backend,
a `RunError` naming the input, the id, its index and the table (JAX and XLA used to clamp to the last row and
return its logits, PyTorch and ONNX Runtime raised their own IndexError / InvalidArgument); and `linnet run
--weights DIR --compare` draws its random ids from the checkpoint's vocabulary (256), not the source's default
(32000), so every backend runs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from linnet.errors import RunError
from tests.conftest import ROOT, installed
from tests.runtimes.conftest import LLAMA

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import linnet  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 256
BACKENDS = [b for b in ("torch-interpret", "torch", "jax", "xla", "onnxruntime") if installed(b.split("-")[0])]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    out = tmp_path_factory.mktemp("ids") / "hf"
    model.save_pretrained(out)
    with torch.no_grad():
        reference = model(torch.tensor([[5, 255, 7]])).logits.numpy()
    return out, reference


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_id_outside_the_vocabulary_is_a_run_error_on_every_backend(folder, backend):
    path, reference = folder
    model = linnet.load(LLAMA, weights=path, backend=backend, max_positions=32, progress=False)
    (logits,) = model.run("forward", [[5, 255, 7]])  # the last row: transformers' logits
    np.testing.assert_allclose(logits, reference, atol=1e-4)
    for ids, bad, at in (([[5, 300, 7]], 300, [0, 1]), ([[5, 7, VOCAB]], VOCAB, [0, 2]), ([[-1, 5, 7]], -1, [0, 0])):
        with pytest.raises(RunError) as e:
            model.run("forward", ids)
        assert str(e.value) == (
            f"`forward` input `input_ids` holds {bad} at index {at}, outside [0, {VOCAB}): the rows of "
            "`model.embed_tokens.weight` (ids index it; a backend would fail or silently clamp)"
        )
    with pytest.raises(RunError, match=r"`step` input `input_ids` holds 300 at index \[0, 0\], outside \[0, 256\)"):
        model.run("step", [[300]], [0], [0])


def test_the_index_bounds_follow_calls_to_the_table():
    """BERT's three tables: input_ids and token_type_ids are each checked against their own rows."""
    from linnet.ir import build
    from linnet.runtimes.model import _index_bounds

    config = {"vocab_size": 99, "type_vocab_size": 3, "hidden_size": 16, "num_attention_heads": 2}
    program = build(ROOT / "examples" / "bert.linnet", config=config | {"intermediate_size": 32})
    graph = program.entries["forward"]
    bounds = {graph.inputs[i].name: b for i, b in _index_bounds(graph).items()}
    assert bounds["input_ids"][0] == 99 and bounds["input_ids"][1].endswith("word_embeddings.weight")
    assert "attention_mask" not in bounds


@pytest.mark.skipif(len(BACKENDS) < 2, reason="needs two backends")
def test_run_compare_draws_ids_from_the_checkpoints_vocabulary(folder):
    path, _ = folder
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "run", str(LLAMA), "--weights", str(path), "--compare", ",".join(BACKENDS)]
        + ["--format", "json", "--max-positions", "32"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    report = json.loads(r.stdout)
    assert report["inputs"][0]["shape"] == [1, 8]
    failed = [row for row in report["backends"] if row["status"] != "ok"]
    assert not failed and all(row["outputs"][0]["shape"] == [1, 8, VOCAB] for row in report["backends"]), report
