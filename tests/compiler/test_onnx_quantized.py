"""Quantized weights on ONNX Runtime (`--dtype stored`): `MatMulNBits` and `GatherBlockQuantized` as
`linnet.compiler.onnx.quantized` emits them, on random GGUF blocks of every stored type, against numpy on the
dequantized weights (`GroupQuantized.dequantize`, itself equal to gguf-py's reference)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("gguf")

import onnx_ir as ir  # noqa: E402

from linnet.compiler.onnx import quantized as Q  # noqa: E402
from linnet.compiler.onnx.lower import IR_VERSION, OPSET, Lowering, to_proto  # noqa: E402
from linnet.runtimes.formats.gguf_quants import BLOCK_BYTES, STORED_TYPES, group_quantized  # noqa: E402
from tests.runtimes.test_gguf_quants import F16_FIELDS, random_blocks  # noqa: E402

pytestmark = pytest.mark.onnxruntime

N, K, M = 40, 512, 3  # K holds two K-quant super-blocks; M rows of activations
F32_EPS = np.finfo(np.float32).eps


def run_graph(build, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Build one output with `build(L, inputs)` on a fresh `Lowering` and run it on ORT's CPU provider."""
    import onnxruntime as ort

    L = Lowering()
    L.names.add("y")  # the output's name, kept from the intermediate values
    inputs = []
    for name, a in feeds.items():
        v = ir.Value(name=name, type=ir.TensorType(ir.DataType.from_numpy(a.dtype)), shape=ir.Shape(a.shape))
        inputs.append(v)
    out = build(L, inputs)
    out.name = "y"
    graph = ir.Graph(
        inputs,
        [out],
        nodes=L.tape.nodes,
        initializers=L.extra_initializers,
        opset_imports={"": OPSET, Q.MS_DOMAIN: 1},
    )
    proto = to_proto(ir.Model(graph, ir_version=IR_VERSION))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def weights(ggml_type: str, seed: int = 0, spread: str = "wide"):
    """A random quantized [N, K] weight. `wide`: f16 scales and offsets over seven decades (their sums of unlike
    magnitude rarely fit f32, so the zero points stay); `narrow`: all within one decade, as a real file's are
    (the packing moves every plane to MatMulNBits's default zero point)."""
    raw = random_blocks(ggml_type, N, K, seed=seed)
    if spread == "narrow":
        rng = np.random.default_rng(seed + 100)
        blocks = raw.reshape(-1, BLOCK_BYTES[ggml_type][1])
        for at in F16_FIELDS[ggml_type]:
            d = (rng.uniform(1, 10, len(blocks)) * rng.choice([-1e-3, 1e-3], len(blocks))).astype(np.float16)
            blocks[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
        raw = blocks.reshape(raw.shape)
    return group_quantized(raw, ggml_type, (N, K))


@pytest.mark.parametrize("spread", ["wide", "narrow"])
@pytest.mark.parametrize("ggml_type", STORED_TYPES)
def test_matmul_nbits_equals_the_dequantized_matmul_in_f32(ggml_type, spread):
    gq = weights(ggml_type, spread=spread)
    x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
    packed = Q.pack_weight(gq, "equivalent")
    assert all(p.bits == 4 for p in packed.planes)  # MLAS's f32-activation kernels are 4-bit
    y = run_graph(lambda L, ins: Q.matmul_nbits(L, ins[0], 2, [("w", packed)], "y"), {"x": x})
    w = gq.dequantize().astype(np.float64)
    want = x.astype(np.float64) @ w.T
    # every plane's weights are exact in f32 (module docstring), so what is left is f32 accumulation over K
    # (in any order: K eps of the sum of magnitudes), for the planes and the offsets' share alike
    magnitude = (
        np.abs(x).astype(np.float64)
        @ (np.abs(gq.codes * gq.scales.repeat(gq.group, 1)) + np.abs(gq.offsets).repeat(gq.group, 1)).T
    )
    assert np.all(np.abs(y - want) <= K * F32_EPS * magnitude + 1e-30)


@pytest.mark.parametrize("ggml_type", ["q4_0", "q4_1", "q8_0", "q4_k", "q6_k"])
def test_matmul_nbits_fast_is_within_int8_activation_rounding(ggml_type):
    gq = weights(ggml_type, seed=2)
    x = np.random.default_rng(3).standard_normal((M, K)).astype(np.float32)
    packed = Q.pack_weight(gq, "fast")
    assert packed.accuracy_level == 4 and all(p.bits == (4 if gq.bits == 4 else 8) for p in packed.planes)
    y = run_graph(lambda L, ins: Q.matmul_nbits(L, ins[0], 2, [("w", packed)], "y"), {"x": x})
    w = gq.dequantize().astype(np.float64)
    want = x.astype(np.float64) @ w.T
    # accuracy_level 4 quantizes x to int8 per block of `group` values (scale = the block's max |x| / 127): each
    # value moves by at most one step, so y moves by at most sum over blocks of step * sum |w| over the block
    step = np.abs(x).reshape(M, -1, gq.group).max(-1) / 127
    bound = step @ np.abs(w).reshape(N, -1, gq.group).sum(-1).T
    assert np.all(np.abs(y - want) <= bound + K * F32_EPS * (np.abs(x) @ np.abs(w).T))


@pytest.mark.parametrize("spread", ["wide", "narrow"])
@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("ggml_type", STORED_TYPES)
def test_gather_block_quantized_rows_are_the_dequantized_rows(ggml_type, numerics, spread):
    gq = weights(ggml_type, seed=4, spread=spread)
    ids = np.array([[3, 0, 39], [7, 7, 1]], dtype=np.int64)
    packed = Q.pack_weight(gq, numerics)
    y = run_graph(lambda L, ins: Q.gather_block_quantized(L, ins[0], 2, "w", packed, "y"), {"ids": ids})
    # (code - zero) * scale is exact in f32 plane by plane, and the offset is added once, as the reference does
    np.testing.assert_array_equal(y, gq.dequantize()[ids])


@pytest.mark.parametrize("ggml_type", ["q8_0", "q4_1", "q6_k"])
def test_a_tied_head_and_its_lookup_read_one_initializer(ggml_type):
    # ONNX Runtime copies each initializer it is handed: a table the head multiplies by and the embedding gathers
    # from is one array (SmolLM2's Q8_0 table: 28 MB, the session's peak RSS 593 -> 567 MB)
    packed = Q.pack_weight(weights(ggml_type, seed=2, spread="narrow"), "fast")
    ids = np.array([[5, 1]], dtype=np.int64)
    x = np.random.default_rng(0).standard_normal((1, K)).astype(np.float32)
    nodes = {}

    def both(L, ins):
        rows = Q.gather_block_quantized(L, ins[0], 2, "w", packed, "rows")
        (y,) = [Q.matmul_nbits(L, ins[1], 2, [("w", packed)], "y")]
        nodes.update({n.op_type: n for n in L.tape.nodes if n.domain == Q.MS_DOMAIN})
        return L.op("Concat", [L.op("Reshape", [rows, L.const(np.array([-1], np.int64))]),
                               L.op("Reshape", [y, L.const(np.array([-1], np.int64))])], {"axis": 0})  # fmt: skip

    out = run_graph(both, {"ids": ids, "x": x})
    assert nodes["GatherBlockQuantized"].inputs[0] is nodes["MatMulNBits"].inputs[1]  # one array, one name
    np.testing.assert_array_equal(out[: 2 * K], Q.dequantized(packed)[ids[0]].ravel())


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("ggml_type", STORED_TYPES)
def test_planes_take_the_default_zero_point_when_that_is_exact(ggml_type, numerics):
    # MLAS runs MatMulNBits 1.25-1.45x faster without a zero-point input: with a real file's scales every type
    # gets there, by shifting codes (q5_0, q6_k, q8_0's high plane...) or adding (default - zero) * scale to the
    # offsets (q4_1, the K-quants, low planes), exact in f32
    narrow = Q.pack_weight(weights(ggml_type, seed=9, spread="narrow"), numerics)
    assert all(p.zero_points is None for p in narrow.planes)
    # scales and offsets seven decades apart: (default - zero) * scale + offset does not fit f32, the zero points stay
    wide = weights(ggml_type, seed=9)
    packed = Q.pack_weight(wide, numerics)
    if ggml_type in ("q4_1", "q4_k") or (numerics == "equivalent" and ggml_type in ("q5_1", "q5_k")):
        assert any(p.zero_points is not None for p in packed.planes)
    np.testing.assert_array_equal(Q.dequantized(packed), wide.dequantize())
    np.testing.assert_array_equal(Q.dequantized(narrow), weights(ggml_type, seed=9, spread="narrow").dequantize())


def test_fused_rows_of_mixed_types_stay_in_parts():
    parts = [("q", Q.pack_weight(weights("q4_k"))), ("k", Q.pack_weight(weights("q4_k", 5)))]
    parts.append(("v", Q.pack_weight(weights("q6_k", 6))))
    fused = Q.concat_rows(parts)
    assert [name for name, _ in fused] == ["q+k", "v"] and fused[0][1].shape == (2 * N, K)
    x = np.random.default_rng(7).standard_normal((M, K)).astype(np.float32)
    y = run_graph(lambda L, ins: Q.matmul_nbits(L, ins[0], 2, fused, "y"), {"x": x})
    w = np.concatenate([weights("q4_k").dequantize(), weights("q4_k", 5).dequantize(), weights("q6_k", 6).dequantize()])
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-4, atol=1e-4 * np.abs(x @ w.T).max())


@pytest.mark.parametrize("ggml_type", ["q4_1", "q8_0", "q6_k"])
def test_packed_weight_dequantizes_back(ggml_type):
    gq = weights(ggml_type, seed=8)
    for numerics in ("equivalent", "fast"):
        np.testing.assert_array_equal(Q.dequantized(Q.pack_weight(gq, numerics)), gq.dequantize())
