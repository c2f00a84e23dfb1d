"""bench/tpu_peer.py (Linnet against KerasHub on a TPU): the Hugging Face folder both sides load holds the model the
bench means, and its CPU reference is that model's, with transformers (the folder's own library) as the reference."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.conftest import ROOT

pytest.importorskip("jax")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(ROOT / "bench"))
import tpu  # noqa: E402  (bench/ is not a package)
import tpu_peer  # noqa: E402


def test_folder_and_cpu_reference_match_transformers(tmp_path, monkeypatch):
    import linnet.runtimes.loading as loading

    monkeypatch.setattr(loading, "random_params", tpu.fast_random_params)  # as bench/tpu.py's main sets it
    folder = tmp_path / "hf"
    config = tpu_peer.make_folder("tiny", True, folder)
    ids = np.random.default_rng(2).integers(0, config["vocab_size"], 24).astype(np.int64)
    ours = tpu_peer.cpu_reference(folder, ids)

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids)[None]).logits[0, -1].numpy()
        generated = model.generate(
            torch.from_numpy(ids)[None], max_new_tokens=tpu_peer.REFERENCE_TOKENS, do_sample=False, min_length=0
        )[0, len(ids) :].tolist()
    assert config["num_hidden_layers"] == tpu.TINY["num_hidden_layers"] and config["dtype"] == "bfloat16"
    np.testing.assert_allclose(ours["logits"], logits, rtol=1e-4, atol=1e-4)
    assert ours["tokens"] == generated


def test_prefix_len():
    assert tpu_peer.prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert tpu_peer.prefix_len([1, 2], [1, 2, 3]) == 2
    assert tpu_peer.prefix_len([], [1]) == 0
