"""`--dtype stored`, the loader side: a GGUF file's quantized matrices load as `GroupQuantized` (equal to the
dequantized load, Q/K rows un-permuted), `prepare` lowers in f32 and refuses checkpoints with nothing quantized,
and the backends that do not run it say so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from linnet.errors import BackendError, LoadError
from linnet.runtimes.backends import BACKENDS, check_options
from linnet.runtimes.formats.checkpoints import open_checkpoint
from linnet.runtimes.formats.gguf_quants import GroupQuantized
from linnet.runtimes.loading import LoadOptions, planned_tensors, prepare
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
    prepared = prepare(LLAMA, quantized_gguf, LoadOptions(dtype="stored", max_positions=32))
    assert prepared.stored and prepared.program.dtype.name == "f32"
    assert any("stay quantized" in note for note in prepared.notes)
    values = dict(planned_tensors(prepared, progress=False, dtype="f32"))
    assert isinstance(values["model.layers.0.mlp.down_proj.weight"], GroupQuantized)
    assert values["model.norm.weight"].dtype == np.float32


def test_stored_refuses_checkpoints_with_nothing_quantized(tmp_path):
    plain = tmp_path / "f32.gguf"
    write_llama_gguf(plain, tiny_llama())
    with pytest.raises(LoadError, match="every tensor of .* is f32: nothing in it is quantized"):
        prepare(LLAMA, plain, LoadOptions(dtype="stored"))
    folder = tmp_path / "hf"
    tiny_llama().save_pretrained(folder)
    with pytest.raises(LoadError, match="is a hf checkpoint: nothing in it is quantized"):
        prepare(LLAMA, folder, LoadOptions(dtype="stored"))
    with pytest.raises(LoadError, match="give --weights"):
        prepare(LLAMA, options=LoadOptions(random_weights=True, dtype="stored"))


def test_stored_refuses_types_it_cannot_keep_before_reading_them(tmp_path):
    path = tmp_path / "iq4_nl.gguf"
    model = tiny_llama()
    write_llama_gguf(path, model, quantize={**SMOLLM2_MIX, "blk.1.ffn_down.weight": "iq4_nl"})
    message = r"cannot keep 1 tensor\(s\) of .*iq4_nl.gguf quantized: `model.layers.1.mlp.down_proj.weight` \(iq4_nl\)"
    with pytest.raises(LoadError, match=message + r"; it keeps q4_0, q4_1, .*, q6_k; use --dtype f32"):
        prepare(LLAMA, path, LoadOptions(dtype="stored"))


@pytest.mark.parametrize("name", ["torch-interpret", "cuda-graphs"])
def test_backends_without_stored_say_so(name):
    with pytest.raises(BackendError, match=rf"--dtype stored .* is not built for {name}: it runs on"):
        check_options(BACKENDS[name], "stored", "equivalent", "cpu")


@pytest.mark.onnxruntime
@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
def test_onnxruntime_stored_logits_are_the_dequantized_models(quantized_gguf, numerics):
    pytest.importorskip("onnxruntime")
    import linnet.onnx as lo

    ids = np.random.default_rng(0).integers(0, 96, (2, 12))
    dequantized = lo.load(LLAMA, weights=quantized_gguf, max_positions=32, progress=False)
    stored = lo.load(LLAMA, weights=quantized_gguf, dtype="stored", numerics=numerics, max_positions=32, progress=False)
    kinds = {n.op_type for n in stored.model_ir("forward").graph if n.domain == "com.microsoft"}
    # every matrix and the embeddings read as stored (and under `fast` the rotations fused:
    # linnet/compiler/onnx/rotary.py)
    assert kinds - {"RotaryEmbedding"} == {"MatMulNBits", "GatherBlockQuantized"}
    want = np.asarray(dequantized.forward(ids))  # [2, 12, vocab]
    got = np.asarray(stored.forward(ids))
    distance = float(np.abs(got - want).max())
    scale = float(np.abs(want).max())
    print(f"--dtype stored ({numerics}) vs dequantized f32: max |logits diff| {distance:.3g} of {scale:.3g}")
    if numerics == "equivalent":
        # the same weights exactly (f32 planes); only f32 accumulation order differs through 2 layers: 4.8e-7 seen
        assert distance <= 1e-5 * scale
    else:
        # int8 activations (one step = 1/127 of a block's max) at every matmul; 1 % seen, 5 % allowed
        assert distance <= 0.05 * scale
    stored.reset_state()
    step = stored.step_model().step(ids[:1], np.array([0]), np.array([0]))
    assert np.abs(step[0] - want[0, -1]).max() <= (1e-5 if numerics == "equivalent" else 0.05) * scale


def _mapped_kb(path) -> int:
    """This process's resident kB of the mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")
def test_release_pages_drops_the_mapping_from_rss_and_keeps_views(quantized_gguf, tmp_path):
    import shutil

    from linnet.runtimes.formats.gguf_reader import GGUFFile

    path = Path(shutil.copy(quantized_gguf, tmp_path / "pages.gguf")).resolve()  # a path no other test maps
    with GGUFFile(path) as f:
        views = {name: f.raw(name) for name in f.tensors}
        copies = {name: v.copy() for name, v in views.items()}  # touches every page
        assert _mapped_kb(path) >= path.stat().st_size // 1024 - 4
        f.release_pages()
        assert _mapped_kb(path) == 0
        for name, v in views.items():  # read back from the file
            np.testing.assert_array_equal(v, copies[name])


def test_stored_load_releases_pages_after_each_quantized_matrix(quantized_gguf, monkeypatch):
    # the backend has repacked each quantized matrix when it asks for the next tensor: the file's pages go then
    # (on a small file the kernel's fault-around maps them back at the next read, so this counts the calls)
    from linnet.runtimes.formats.gguf import GGUFCheckpoint

    prepared = prepare(LLAMA, quantized_gguf, LoadOptions(dtype="stored", max_positions=32))
    calls = []
    monkeypatch.setattr(GGUFCheckpoint, "release_pages", lambda self: calls.append(1))
    values = dict(planned_tensors(prepared, progress=False, dtype="f32"))
    assert len(calls) == sum(isinstance(v, GroupQuantized) for v in values.values()) == 1 + 2 * 7
    dense = prepare(LLAMA, quantized_gguf, LoadOptions(max_positions=32))
    dict(planned_tensors(dense, progress=False, dtype="f32"))
    assert len(calls) == 15  # a dequantized load keeps the file's pages
