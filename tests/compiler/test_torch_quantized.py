"""`QuantizedWeight` (`--dtype stored` on PyTorch): `F.linear` through torch's int4 CPU kernel against
x @ W.T in f64 on the dequantized matrix, `F.embedding` rows equal to the dequantized rows bit for bit, per GGUF
block type, on random blocks (gguf-py's layouts, as `test_gguf_quants` writes them)."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.formats.gguf_quants import STORED_TYPES, group_quantized
from tests.runtimes.test_gguf_quants import random_blocks

torch = pytest.importorskip("torch")
F = torch.nn.functional
quantized = pytest.importorskip("linnet.compiler.torch.quantized")

# The kernel rounds x, the scales and the zeros to bf16 (8 significant bits: relative error <= 2^-9 each) and
# returns bf16 (another 2^-9 of |y| <= |x| @ |W|.T), and a two-plane type sums two halves of the row: so
# |y - x @ W.T| <= 3 * 2^-8 * (|x| @ |W|.T) with room to spare. A wrong code, scale or layout misses it by 10x.
BOUND = 3 * 2.0**-8


def packed(ggml_type: str, rows: int, cols: int = 256, seed: int = 0):
    gq = group_quantized(random_blocks(ggml_type, rows, cols, seed), ggml_type, (rows, cols))
    return gq, quantized.QuantizedWeight.from_groups(gq)


# 128 rows: the kernel's planes, rows read from them; 48 rows: planes, but rows kept as codes (not a multiple of
# the packer's 64-row block); q6_k (groups of 16) never fits the kernel: dequantized per call.
@pytest.mark.parametrize("rows", [128, 48])
@pytest.mark.parametrize("ggml_type", STORED_TYPES)
def test_linear_matches_the_dequantized_matmul(ggml_type, rows):
    gq, w = packed(ggml_type, rows)
    weights = gq.dequantize().astype(np.float64)
    generator = torch.Generator().manual_seed(1)
    for tokens in (1, 5, quantized.DENSE_ROWS + 1):  # decode (the kernel), a few rows, prefill (dense f32)
        x = torch.randn(2, tokens, 256, generator=generator)
        y = F.linear(x, w)
        assert y.dtype == torch.float32 and y.shape == (2, tokens, rows)
        x64 = x.double().numpy()
        error = np.abs(y.double().numpy() - x64 @ weights.T)
        # the dense path multiplies the exact matrix in f32: f32 accumulation only (K * 2^-24 < 2^-16)
        bound = BOUND if tokens <= quantized.DENSE_ROWS and w.planes else 2.0**-16
        assert (error <= bound * (np.abs(x64) @ np.abs(weights).T)).all(), (ggml_type, tokens, error.max())


@pytest.mark.parametrize("rows", [128, 48])
@pytest.mark.parametrize("ggml_type", STORED_TYPES)
def test_embedding_rows_and_dequantize_are_exact(ggml_type, rows):
    gq, w = packed(ggml_type, rows, seed=2)
    ids = torch.tensor([[0, 31, 32, rows - 1], [rows // 2 + 1, 5, 0, 0]])  # both nibbles of a block's bytes
    np.testing.assert_array_equal(F.embedding(ids, w).numpy(), gq.dequantize()[ids.numpy()])
    np.testing.assert_array_equal(w.dequantize().numpy(), gq.dequantize())


def test_kernel_path_is_taken_where_it_fits():
    assert quantized._row_block() in (64, 32)  # the packer's layout is the one `_unpack_rows` reads
    _, q4 = packed("q4_1", 128)
    _, q8 = packed("q8_0", 128)
    _, q6 = packed("q6_k", 128)
    assert (len(q4.planes), q4.halves, q4.codes) == (1, 1, None)
    assert (len(q8.planes), q8.halves, q8.codes) == (1, 2, None)  # [hi | lo] along K: one kernel call
    assert (q6.planes, q6.codes.dtype) == ([], torch.uint8)


def test_other_functions_read_the_dequantized_matrix():
    gq, w = packed("q4_0", 64)
    np.testing.assert_array_equal((w.t() * 2).numpy(), gq.dequantize().T * 2)
    np.testing.assert_array_equal(w.T.numpy(), gq.dequantize().T)  # a property that is values, not metadata
    assert w.shape == (64, 256) and w.dtype == torch.float32 and not w._is_view()


@pytest.mark.parametrize("ggml_type", ["q4_1", "q8_0", "q6_k"])  # one plane, [hi | lo], codes
def test_a_deep_copy_stays_quantized(ggml_type):
    """`copy.deepcopy` (of a stored model, say) keeps the packed form, owns its arrays and computes the same:
    through `__torch_function__` it was the dequantized f32 matrix."""
    import copy

    _, w = packed(ggml_type, 128)
    twin = copy.deepcopy(w)
    assert type(twin) is quantized.QuantizedWeight and twin.shape == w.shape
    assert [p.data_ptr() for p in twin.planes] != [p.data_ptr() for p in w.planes] or not w.planes
    assert twin.scales.data_ptr() != w.scales.data_ptr()
    x, ids = torch.randn(1, 256, generator=torch.Generator().manual_seed(5)), torch.tensor([3, 70])
    assert torch.equal(F.linear(x, twin), F.linear(x, w)) and torch.equal(F.embedding(ids, twin), F.embedding(ids, w))


def test_compiled_linear_and_embedding_equal_eager():
    _, w = packed("q8_0", 128)
    x, ids = torch.randn(1, 256, generator=torch.Generator().manual_seed(4)), torch.tensor([3, 70])
    with torch.inference_mode():  # as the runtime runs entries
        y, rows = torch.compile(lambda x, ids: (F.linear(x, w), F.embedding(ids, w)), fullgraph=True)(x, ids)
    assert torch.equal(y, F.linear(x, w)) and torch.equal(rows, F.embedding(ids, w))


def test_pack_refuses_other_devices():
    from linnet.errors import BackendError

    gq = group_quantized(random_blocks("q4_0", 16, 32), "q4_0", (16, 32))
    with pytest.raises(BackendError, match="CPU kernels only, not on cuda"):
        quantized.QuantizedWeight.from_groups(gq, device="cuda")


def test_packing_equals_torchs_packer():
    for rows in (256, 48):  # written here (a multiple of the row block), torch's packer (not)
        codes = torch.randint(0, 16, (rows, 64), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
        expected = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        assert torch.equal(quantized._int4pack(codes), expected)
