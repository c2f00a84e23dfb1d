"""Qwen3 GGUF files (llama.cpp's `qwen3` architecture) read into examples/qwen3.linnet: a seeded tiny transformers
Qwen3 written as convert_hf_to_gguf.py writes it (gguf-py's own tensor names, Q/K rows as they are: NEOX rotation)
gives transformers' logits; the same model in Q8_0 runs `--dtype stored` on XLA as its dequantized self."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from tests.conftest import EXAMPLES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("jax")
pytestmark = pytest.mark.jax

QWEN3 = EXAMPLES / "qwen3.linnet"
OPTIONS = dict(max_positions=64, progress=False)


def tiny_qwen3(seed: int = 0, **dims):
    """A seeded two-layer transformers Qwen3 (`dims` override its config), its norms not ones."""
    torch.manual_seed(seed)
    config = dict(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**(config | dims))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # ones at init: make them count
                p.copy_(torch.rand_like(p) + 0.5)
    return model


def write_qwen3_gguf(path, model, q8_0: bool) -> None:
    """`model` as llama.cpp's convert_hf_to_gguf.py writes a Qwen3 (`Qwen3Model`): gguf-py's tensor names, the
    `qwen3.*` keys of `set_gguf_parameters`, every matrix Q8_0 (gguf-py's quantizer) when `q8_0`."""
    c = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, c.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), "qwen3")
    for key, value in {
        "vocab_size": c.vocab_size, "context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
        "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
        "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
        "attention.key_length": c.head_dim, "attention.value_length": c.head_dim,
    }.items():  # fmt: skip
        w.add_uint32(f"qwen3.{key}", value)
    w.add_float32("qwen3.rope.freq_base", float(c.rope_parameters["rope_theta"]))
    w.add_float32("qwen3.attention.layer_norm_rms_epsilon", float(c.rms_norm_eps))
    for name, tensor in model.state_dict().items():
        data = np.ascontiguousarray(tensor.detach().float().numpy())
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if q8_0 and data.ndim == 2:
            w.add_tensor(
                gname,
                gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            w.add_tensor(gname, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def reference():
    return tiny_qwen3()


def test_a_qwen3_gguf_gives_transformers_logits(reference, tmp_path):
    path = tmp_path / "qwen3-f32.gguf"
    write_qwen3_gguf(path, reference, q8_0=False)
    ids = np.random.default_rng(0).integers(0, 96, (1, 20))
    model = BACKENDS["xla"].load(QWEN3, weights=path, **OPTIONS)
    assert model.prepared.checkpoint.config["model_type"] == "qwen3"
    (got,) = model.run("forward", ids)
    with torch.no_grad():
        want = reference(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)  # f32 against f32 (ARCHITECTURE.md's target)


def test_a_qwen3_q8_0_gguf_runs_stored_as_its_dequantized_self(reference, tmp_path):
    path = tmp_path / "qwen3-q8_0.gguf"
    write_qwen3_gguf(path, reference, q8_0=True)
    stored = BACKENDS["xla"].load(QWEN3, weights=path, dtype="stored", **OPTIONS)
    f32 = BACKENDS["xla"].load(QWEN3, weights=path, dtype="f32", **OPTIONS)
    assert stored.params["lm_head.weight"][0].dtype == np.int8
    # the layers scanned (the CPU's default): held stacked, [layers, ...], the norms in f32 and the pairs in int8
    assert stored.params["model.layers.*.self_attn.q_norm.weight"].dtype == np.float32
    assert stored.params["model.layers.*.self_attn.o_proj.weight"][0].shape[0] == 2
    ids = np.random.default_rng(1).integers(0, 96, (1, 20))
    (got,) = stored.run("forward", ids)
    (want,) = f32.run("forward", ids)
    # the same f32 values on both sides (test_jax_stored.py says why): only a dot's summation order may differ
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def kernel_sized_qwen3(tied: bool):
    """A one-layer Qwen3 whose every matrix tiles for the TPU's kernels (N a multiple of 128, K of 256; the vocab
    384 = 3 x 128, so its tiles are 128 wide, as Qwen3-8B's 151936 = 1187 x 128)."""
    dims = dict(vocab_size=384, hidden_size=256, intermediate_size=512, num_hidden_layers=1, head_dim=64)
    return tiny_qwen3(seed=3, **dims, max_position_embeddings=256, rope_theta=1e6, tie_word_embeddings=tied)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_qwen3_q8_0_gguf_through_the_tpu_kernels_gives_its_dequantized_logits(tmp_path, monkeypatch, tied):
    # `--dtype stored` on `jax` as a TPU runs it: the pairs held for the kernels (uses_kernel patched: the kernels
    # interpreted on the CPU), a 7-token prompt's matrices through the decode kernel and an 80-token one's (past
    # PREFILL_ROWS) through the dequantizing kernel, q/k norms and the head (tied: the embeddings' pair) included,
    # against the same file dequantized to f32 at load, on XLA.
    from linnet.compiler.jax import q8_kernel
    from tests.runtimes.test_q8_kernel import spy_kernels

    path = tmp_path / "qwen3-kernel-sized-q8_0.gguf"
    write_qwen3_gguf(path, kernel_sized_qwen3(tied), q8_0=True)
    f32 = BACKENDS["xla"].load(QWEN3, weights=path, dtype="f32", **OPTIONS)
    monkeypatch.setattr(q8_kernel, "uses_kernel", lambda platform: True)
    kernels = spy_kernels(monkeypatch)
    options = dict(OPTIONS, max_positions=128)
    for numerics in ("equivalent", "fast"):
        stored = BACKENDS["jax"].load(QWEN3, weights=path, dtype="stored", numerics=numerics, **options)
        assert isinstance(stored.params["model.embed_tokens.weight"], q8_kernel.KMajorQ8)
        for rows, kernel in ((7, "_kernel"), (80, "_dequantizing_kernel")):
            ids = np.random.default_rng(rows).integers(0, 384, (1, rows))
            kernels.clear()
            q8_kernel.q8_matmul.clear_cache()  # traced again (another test's shapes), so the spies see the kernels
            (got,) = stored.run("forward", ids)
            (want,) = f32.run("forward", ids)
            assert set(kernels) == {kernel}, (numerics, rows)
            scale = np.abs(want).max()
            if numerics == "equivalent":
                # the same f32 values on both sides, summed per block then over blocks by the kernels: f32 rounding
                # of the dots' sums only (test_jax_stored.py); bounded at 1e-5 of the logits' scale
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
            else:
                # `fast`: every kernel dot rounds x to bf16 (2^-9), and the dequantizing kernel W too, through one
                # layer and the head: bounded at 2^-5 of the logits' scale
                np.testing.assert_allclose(got, want, rtol=0, atol=2.0**-5 * scale)
