"""`--dtype stored` on PyTorch end to end: a tiny GGUF in SmolLM2's mix (Q4_1 layers, a tied Q8_0 token_embd)
run with its matrices kept quantized (`QuantizedWeight`) against the same file loaded dequantized in f32."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from tests.runtimes.conftest import LLAMA
from tests.runtimes.gguf_writing import write_llama_gguf
from tests.runtimes.test_gguf_stored import SMOLLM2_MIX, tiny_llama

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch-stored") / "tiny-q4_1.gguf"
    write_llama_gguf(path, tiny_llama(), quantize=SMOLLM2_MIX)
    return path


def load(path, dtype, backend="torch", max_batch=1):
    options = dict(dtype=dtype, max_positions=64, max_batch=max_batch, progress=False)
    return BACKENDS[backend].load(LLAMA, weights=path, **options)


def test_stored_logits_match_the_dequantized_f32_model(quantized_gguf):
    from linnet.compiler.torch.quantized import QuantizedWeight

    stored, f32 = load(quantized_gguf, "stored"), load(quantized_gguf, "f32")
    embed = stored.module.tensors["model.embed_tokens.weight"]
    assert isinstance(embed, QuantizedWeight) and embed.ggml_type == "q8_0"  # the tied head reads it too
    assert stored.module.tensors["model.norm.weight"].dtype == torch.float32
    ids = np.random.default_rng(0).integers(0, 96, size=(1, 24))
    # 5 tokens: the int4 kernel, bf16 activations into every matmul (8 significant bits) over 2 layers: measured
    # 3.5e-3 on logits up to 0.94, bounded at 2 % of their scale
    (got,) = stored.run("forward", ids[:, :5])
    (want,) = f32.run("forward", ids[:, :5])
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()
    # 24 tokens (over DENSE_ROWS): each matrix dequantized exactly in f32 for its matmul: the f32 model's logits
    (got,) = stored.run("forward", ids)
    (want,) = f32.run("forward", ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_stored_generation_on_both_torch_backends(quantized_gguf):
    eager, compiled = load(quantized_gguf, "stored"), load(quantized_gguf, "stored", "torch-compile")
    prompt = np.array([[5, 17, 42]])
    steps = [m.step_model() for m in (eager, compiled)]
    for s in steps:
        s.warm_up([3], [1])
    first = [s.step(prompt, np.array([0]), np.array([0])) for s in steps]
    np.testing.assert_array_equal(first[0], first[1])
    token = np.array([[int(first[0].argmax())]])
    nxt = [s.step(token, np.array([3]), np.array([0])) for s in steps]  # decode: compiled under torch-compile
    np.testing.assert_allclose(nxt[1], nxt[0], rtol=0, atol=1e-5)
    ids = np.arange(24)[None] % 7 + 3  # over DENSE_ROWS: the dense path, which torch-compile's `forward` runs eagerly
    np.testing.assert_array_equal(compiled.run("forward", ids)[0], eager.run("forward", ids)[0])


@pytest.mark.slow  # 47 s on a 2-core AVX2 VM: a 17-row compile of the dense path
def test_compiled_decode_over_the_kernel_rows_is_the_dequantized_models(quantized_gguf):
    # a decode batch over DENSE_ROWS rows: torch-compile's static-shape step traces the dense path (each matrix
    # dequantized exactly in f32 inside the compiled graph), so it equals the same file dequantized in f32
    from linnet.compiler.torch.quantized import DENSE_ROWS

    batch = DENSE_ROWS + 1
    stored = load(quantized_gguf, "stored", "torch-compile", max_batch=batch).step_model()
    f32 = load(quantized_gguf, "f32", max_batch=batch).step_model()
    rng = np.random.default_rng(5)
    prompt, token = rng.integers(0, 96, (batch, 4)), rng.integers(0, 96, (batch, 1))
    rows = np.arange(batch)
    for model in (stored, f32):
        model.step(prompt, np.zeros(batch, dtype=np.int64), rows)  # prefill: eager
    got, want = (m.step(token, np.full(batch, 4), rows) for m in (stored, f32))  # decode: compiled for `stored`
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.slow  # 83 s on a 2-core AVX2 VM: a dynamic-shape compile of the dense path
def test_dense_path_traces_with_dynamic_shapes(quantized_gguf):
    # with dynamic shapes a bound QuantizedWeight's shape is symbolic; reading its planes back by that shape was
    # refused ("convert all Tensors to FakeTensors first"): the dense path now takes its sizes from its fields
    model = load(quantized_gguf, "stored")
    forward = model.module.root.forward
    ids = torch.tensor(np.arange(24)[None] % 7 + 3)  # over DENSE_ROWS: the dense path
    with torch.inference_mode():
        got = torch.compile(forward, fullgraph=True, dynamic=True)(ids)
        want = forward(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # inductor fuses the dequantization: 1.8e-7 seen
