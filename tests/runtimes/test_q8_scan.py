"""`--dtype stored` with the layers scanned, its pairs held for the TPU's Q8_0 kernels (`linnet.compiler.jax.q8_kernel`:
the CPU holding them as a TPU does, the kernels interpreted): the scan hands each layer's body a view of the stacked
pairs (`StackedLayerQ8`), and the kernels read that layer's tiles from the stacks, never a copy of the layer's
matrices (a scan's slice handed to a custom call is copied out of the stack first: the chip ran Qwen3-8B's scanned
decode at 21 % of streaming its weights, unrolled Llama-3.1-8B's at 100 %). Against the unrolled model (each layer's
own pairs) and against the product of the dequantized matrices in f64."""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from tests.runtimes.conftest import LLAMA
from tests.runtimes.test_q8_kernel import assert_same_greedy_tokens, kernel_sized_models, q8_matrix, spy_kernels

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.jax

LAYERS, N = 3, 2048  # square layers [N, N] in tiles of 1024 x 512: a layer's matrix is 8 of the kernel's blocks


def _scanned(x, codes, scales_t):
    """Three square layers, `h = h @ W_l^T`, as the generated code runs a stacked list: the prelude's `scan_layers`
    over a `Stacked` whose one parameter is a pair held for the kernel, multiplied by `quantized_linear`."""
    from linnet.compiler.jax.prelude import Module, Stacked, quantized_linear, scan_layers
    from linnet.compiler.jax.q8_kernel import KMajorQ8

    class Layer(Module):
        PARAMS = ("weight",)

    items = Stacked(Layer, {"weight": KMajorQ8(codes, scales_t)}, LAYERS)
    return scan_layers(items, lambda layer, h: quantized_linear(h, layer.weight, "highest"), x)


def _specs(rows):
    import jax.numpy as jnp

    from linnet.compiler.jax.q8_kernel import BLOCK

    return (
        jax.ShapeDtypeStruct((rows, N), jnp.float32),
        jax.ShapeDtypeStruct((LAYERS, N, N), jnp.int8),
        jax.ShapeDtypeStruct((LAYERS, N // BLOCK, N), jnp.float32),
    )


def int8_arrays(hlo_text: str) -> list[tuple[int, ...]]:
    """The shapes of the s8 arrays the instructions of an optimized HLO module make (their results' types)."""
    shapes = []
    for line in hlo_text.splitlines():
        _, eq, rhs = line.partition(" = ")
        if eq:
            head = rhs.split("(", 1)[0]  # the result's type, before the operands
            shapes += [tuple(int(d) for d in dims.split(",")) for dims in re.findall(r"s8\[([\d,]+)\]", head)]
    return shapes


def test_a_scanned_layer_multiplies_without_copying_its_matrix_out_of_the_stack():
    # The compiled scan (the CPU's XLA, the kernel interpreted: its grid reads blocks of 1024 x 512): no instruction
    # makes an int8 array of a layer's N x N values (the scan's slice of the stack, or a copy of it for the kernel);
    # the product equals the dequantized layers' in f64.
    from linnet.compiler.jax.q8_kernel import hold

    text = jax.jit(_scanned).lower(*_specs(1)).compile().as_text()
    layer = [s for s in int8_arrays(text) if math.prod(s) == N * N]
    assert not layer, layer
    rng = np.random.default_rng(0)
    matrices = [q8_matrix(N, N, seed=i) for i in range(LAYERS)]
    held = [hold(codes, scales) for codes, scales, _ in matrices]
    x = rng.standard_normal((1, N), dtype=np.float32) * 0.1
    got = np.asarray(jax.jit(_scanned)(x, np.stack([h.codes for h in held]), np.stack([h.scales_t for h in held])))
    want = functools.reduce(lambda h, m: h @ m[2].T, matrices, x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def tpu_custom_calls(stablehlo: str) -> list[list[str]]:
    """The operand types of each `tpu_custom_call` in a StableHLO module's text (`tensor<3x2048x2048xi8>`, ...): the
    call's signature ends its line, `: (operand types) -> result type`."""
    lines = [line for line in stablehlo.splitlines() if "@tpu_custom_call(" in line]
    return [re.findall(r"tensor<[^>]*>", line.rsplit(" : (", 1)[1].split(") -> ")[0]) for line in lines]


@pytest.mark.parametrize("rows", [1, 512, "m"])
def test_a_scanned_layers_kernel_takes_the_stacks_on_a_tpu(rows):
    # Lowered for a TPU (Mosaic's custom call, what the chip compiles): each call takes the whole stacks and the
    # layer's index (scalar-prefetched), and nothing slices a layer's codes out of the stack; decode's rows (the
    # decode kernel), prefill's (the dequantizing kernel) and symbolic rows (an exported entry's: three kernels).
    from jax import export

    from linnet.compiler.jax import q8_kernel

    matmul = q8_kernel.q8_matmul
    try:
        q8_kernel.q8_matmul = functools.partial(matmul, interpret=False)  # the TPU's kernel, not the CPU's interpreter
        specs = _specs(export.symbolic_shape(rows)[0] if isinstance(rows, str) else rows)
        fresh = jax.jit(lambda *a: _scanned(*a))  # traced anew: `jax.jit(_scanned)` keeps the interpreted trace
        text = export.export(fresh, platforms=["tpu"])(*specs).mlir_module()
    finally:
        q8_kernel.q8_matmul = matmul
    calls = tpu_custom_calls(text)
    assert len(calls) == (3 if isinstance(rows, str) else 1), rows
    for operands in calls:
        assert "tensor<1xi32>" in operands and f"tensor<{LAYERS}x{N}x{N}xi8>" in operands, operands
    assert not re.search(r"dynamic_slice[^\n]*-> tensor<[^>]*xi8>", text)


def test_the_scanned_models_step_hands_the_kernels_its_stacked_pairs(tmp_path, monkeypatch):
    # The kernel-sized Llama's step (both layers scanned, the pairs held as a TPU holds them) lowered for a TPU:
    # every matrix of a layer reaches its kernel as the stack [2, N, K], lm_head as its own [N, K]; a decode step
    # (one row: the decode kernel) and `forward` over 80 tokens (the dequantizing kernel).
    import jax.numpy as jnp

    from linnet.compiler.jax import q8_kernel
    from linnet.compiler.jax.x64 import scope

    _, load_relaid = kernel_sized_models(tmp_path, monkeypatch, "jax")
    monkeypatch.setattr(q8_kernel, "q8_matmul", functools.partial(q8_kernel.q8_matmul, interpret=False))
    model = load_relaid()
    params, state = (
        jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), t) for t in (model.params, model.state)
    )
    stacked = {"tensor<2x512x256xi8>", "tensor<2x256x256xi8>", "tensor<2x1024x256xi8>", "tensor<2x256x512xi8>"}
    for entry, inputs in (("step", ((1, 1), (1,), (1,))), ("forward", ((1, 80),))):
        inputs = [jax.ShapeDtypeStruct(shape, jnp.int64) for shape in inputs]
        fn = model.functions[entry].jitted
        with scope():
            text = fn.trace(params, state if entry == "step" else {}, *inputs).lower(lowering_platforms=("tpu",))
            text = text.as_text()
        codes = {t for operands in tpu_custom_calls(text) for t in operands if t.endswith("xi8>")}
        assert codes == stacked | {"tensor<256x256xi8>"}, (entry, codes)
        assert not re.search(r"dynamic_slice[^\n]*-> tensor<[^>]*xi8>", text), entry


# `xla` in the slow set: the default run's tests/runtimes/test_q8_kernel.py runs its scanned kernels against XLA's dot
@pytest.mark.parametrize("backend", ["jax", pytest.param("xla", marks=pytest.mark.slow)])
def test_scanned_stored_logits_equal_the_unrolled_models(tmp_path, monkeypatch, backend):
    # The same Q8_0 file held for the kernels (interpreted), layers scanned (the kernels reading the stacks) and
    # unrolled (each layer's own pairs): the same logits at 7 and 80 rows (the decode kernel, the dequantizing one;
    # `xla`: rows symbolic, the kernel picked when the entry runs) and the same greedy tokens, host and device loop.
    from linnet.compiler.jax import q8_kernel
    from tests.runtimes.test_jax_stored import OPTIONS

    _, load_relaid = kernel_sized_models(tmp_path, monkeypatch, backend)
    used = spy_kernels(monkeypatch)
    scanned = load_relaid()
    assert isinstance(scanned.params["model.layers.*.mlp.down_proj.weight"], q8_kernel.KMajorQ8)
    path = tmp_path / "kernel-sized-q8_0.gguf"
    options = dict(OPTIONS, weights=path, dtype="stored", numerics="equivalent", scan_layers=False)
    unrolled = BACKENDS[backend].load(LLAMA, **options)
    assert isinstance(unrolled.params["model.layers.1.mlp.down_proj.weight"], q8_kernel.KMajorQ8)
    for rows in (7, 80):
        ids = np.random.default_rng(rows).integers(0, 256, (1, rows))
        (got,), (want,) = scanned.run("forward", ids), unrolled.run("forward", ids)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
    assert set(used) == {"_kernel", "_dequantizing_kernel"}
    assert_same_greedy_tokens(unrolled, scanned)
