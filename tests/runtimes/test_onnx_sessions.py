"""The ONNX Runtime sessions the backend makes: a decoder's (a program with a KV cache, whose shapes change every
step) run without ORT's per-shape memory pattern, which only grew their arena (runtimes/onnx_backend.py, `session`);
an encoder's keep it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import EXAMPLES

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_ir")

import linnet.onnx as lo  # noqa: E402

pytestmark = pytest.mark.onnxruntime

LLAMA = {"num_hidden_layers": 1, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}  # fmt: skip
BERT = {"num_hidden_layers": 1, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}


def test_a_decoder_runs_without_the_memory_pattern_and_an_encoder_with_it():
    decoder = lo.load(EXAMPLES / "llama.linnet", config=LLAMA, random_weights=True, max_positions=16, progress=False)
    encoder = lo.load(EXAMPLES / "bert.linnet", config=BERT, random_weights=True, max_positions=16, progress=False)
    for entry in decoder.program.entries:
        assert decoder.session(entry).get_session_options().enable_mem_pattern is False
    for entry in encoder.program.entries:
        assert encoder.session(entry).get_session_options().enable_mem_pattern is True
    # and the decoder still decodes: a prefill then a step, each the forward's logits at that position
    ids = np.array([[3, 9, 4, 1]])
    want = np.asarray(decoder.forward(ids))[0]
    decoder.reset_state()
    rows = np.array([0])
    got = [np.asarray(decoder.run("step", ids[:, :3], np.array([0]), rows)[0])[0]]
    got.append(np.asarray(decoder.run("step", ids[:, 3:], np.array([3]), rows)[0])[0])
    np.testing.assert_allclose(np.stack(got), want[[2, 3]], rtol=1e-5, atol=1e-6)
