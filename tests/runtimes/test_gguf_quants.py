"""`group_quantized` (GGUF blocks in affine group form) against gguf-py's `gguf.quants.dequantize`, the reference,
on random blocks of every type it supports."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.errors import CheckpointError
from linnet.runtimes.formats.gguf_quants import BLOCK_BYTES, STORED_TYPES, group_quantized

gguf = pytest.importorskip("gguf")

# byte ranges of each block's f16 fields (ggml-common.h block_*): random bytes there could read as Inf/NaN
F16_FIELDS = {
    "q4_0": [0],
    "q4_1": [0, 2],
    "q5_0": [0],
    "q5_1": [0, 2],
    "q8_0": [0],
    "q4_k": [0, 2],
    "q5_k": [0, 2],
    "q6_k": [208],
}


def random_blocks(ggml_type: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """u8[rows, bytes per row]: random codes and 6-bit scales, finite f16 scales (normal and a few subnormal)."""
    rng = np.random.default_rng(seed)
    block, block_bytes = BLOCK_BYTES[ggml_type]
    n_blocks = rows * cols // block
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for at in F16_FIELDS[ggml_type]:
        d = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-7, 1, n_blocks)).astype(np.float16)
        blocks[:, at : at + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("ggml_type", STORED_TYPES)
def test_dequantize_equals_gguf_reference(ggml_type):
    # exact, not within an ulp: every product of the affine form is exact in f32 (module docstring)
    rows, cols = 6, 512
    raw = random_blocks(ggml_type, rows, cols)
    gq = group_quantized(raw, ggml_type, (rows, cols))
    reference = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ggml_type.upper()])
    assert reference.shape == (rows, cols)
    assert gq.codes.dtype == np.uint8 and gq.codes.shape == (rows, cols)
    assert int(gq.codes.max()) < 2**gq.bits
    assert gq.scales.shape == gq.offsets.shape == (rows, cols // gq.group)
    assert gq.scales.dtype == gq.offsets.dtype == np.float32
    np.testing.assert_array_equal(gq.dequantize(), reference)
    zero = gq.zero_points
    if zero is not None:  # the symmetric types: offset = -zero * scale, exactly
        np.testing.assert_array_equal(gq.offsets, -zero.astype(np.float32) * gq.scales)


def test_take_rows_moves_whole_rows():
    raw = random_blocks("q4_1", 4, 64, seed=1)
    gq = group_quantized(raw, "q4_1", (4, 64))
    order = np.array([2, 0, 3, 1])
    np.testing.assert_array_equal(gq.take_rows(order).dequantize(), gq.dequantize()[order])


def test_unsupported_type_names_tensor_and_supported_list():
    with pytest.raises(CheckpointError, match=r"blk\.0\.attn_q\.weight: GGUF type q2_k cannot be kept quantized.*q4_0"):
        group_quantized(np.zeros((1, 84), np.uint8), "q2_k", (1, 256), name="blk.0.attn_q.weight")


def test_wrong_byte_count_is_located():
    with pytest.raises(CheckpointError, match=r"w: 17 bytes of q4_0 data, expected 18"):
        group_quantized(np.zeros(17, np.uint8), "q4_0", (1, 32), name="w")
