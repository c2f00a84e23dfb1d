"""`--dtype stored`, the loader side: a GGUF file's quantized matrices load as `GroupQuantized` (equal to the
dequantized load, Q/K rows un-permuted), `prepare` lowers in f32 and refuses checkpoints with nothing quantized,
and the backends that do not run it say so."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.errors import BackendError, LoadError
from linnet.runtimes.backends import BACKENDS, check_options
from linnet.runtimes.checkpoints import open_checkpoint
from linnet.runtimes.gguf_quants import GroupQuantized
from linnet.runtimes.loading import planned_tensors, prepare
from tests.runtimes.conftest import LLAMA
from tests.runtimes.gguf_writing import write_llama_gguf

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

# SmolLM2's mix: every layer matrix Q4_1, the tied token_embd Q8_0, norms f32
SMOLLM2_MIX = {"*": "q4_1", "token_embd.weight": "q8_0"}


def tiny_llama(seed: int = 0):
    """A tiny SmolLM2-shaped transformers Llama (tied head, 4 query heads over 2 KV heads, dims multiples of 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # ones at init: make them count
                p.copy_(torch.rand_like(p) + 0.5)
    return model


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("stored") / "tiny-q4_1.gguf"
    write_llama_gguf(path, tiny_llama(), quantize=SMOLLM2_MIX)
    return path


def test_stored_load_keeps_blocks_and_equals_the_dequantized_load(quantized_gguf):
    with open_checkpoint(quantized_gguf) as ckpt:
        kinds = {}
        for name in ckpt.tensor_names:
            stored = ckpt.load(name, "stored")
            if isinstance(stored, GroupQuantized):
                kinds[name] = stored.ggml_type
                # the Q/K rows un-permuted as whole rows of blocks: the same matrix as the dequantized load
                np.testing.assert_array_equal(stored.dequantize(), ckpt.load(name))
            else:
                assert stored.dtype == np.float32 and stored.ndim == 1, name
        assert kinds["model.embed_tokens.weight"] == "q8_0"
        assert kinds["model.layers.1.self_attn.q_proj.weight"] == "q4_1"
        assert len(kinds) == 1 + 2 * 7


def test_prepare_stored_lowers_f32_and_yields_group_quantized(quantized_gguf):
    prepared = prepare(LLAMA, quantized_gguf, dtype="stored", max_positions=32)
    assert prepared.stored and prepared.program.dtype.name == "f32"
    assert any("stay quantized" in note for note in prepared.notes)
    values = dict(planned_tensors(prepared, progress=False, dtype="f32"))
    assert isinstance(values["model.layers.0.mlp.down_proj.weight"], GroupQuantized)
    assert values["model.norm.weight"].dtype == np.float32


def test_stored_refuses_checkpoints_with_nothing_quantized(tmp_path):
    plain = tmp_path / "f32.gguf"
    write_llama_gguf(plain, tiny_llama())
    with pytest.raises(LoadError, match="every tensor of .* is f32: nothing in it is quantized"):
        prepare(LLAMA, plain, dtype="stored")
    folder = tmp_path / "hf"
    tiny_llama().save_pretrained(folder)
    with pytest.raises(LoadError, match="is a hf checkpoint: nothing in it is quantized"):
        prepare(LLAMA, folder, dtype="stored")
    with pytest.raises(LoadError, match="give --weights"):
        prepare(LLAMA, random_weights=True, dtype="stored")


@pytest.mark.parametrize("name", ["xla", "jax", "torch-interpret"])
def test_backends_without_stored_say_so(name):
    with pytest.raises(BackendError, match=rf"--dtype stored .* is not built for {name}: it runs on"):
        check_options(BACKENDS[name], "stored", "equivalent", "cpu")
