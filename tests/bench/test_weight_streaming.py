"""bench/weight_streaming.py (the weight-streaming limit rows of bench/generate_speed.py): the stored layouts it
unpacks are ggml's blocks, and the GEMV kernels it times compute x @ W^T of the weights the GGUF holds (gguf-py's
quantize/dequantize as the reference), so a fast limit row cannot come from a kernel computing something else."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.conftest import ROOT

gguf = pytest.importorskip("gguf")
sys.path.insert(0, str(ROOT / "bench"))
import weight_streaming as ws  # noqa: E402  (bench/ is not a package)

OUT, IN = 48, 96  # three blocks of 32 a row


def matrix(qtype: str, seed: int = 0) -> ws.Matrix:
    """A random [OUT, IN] matrix quantized by gguf-py to `qtype`, as `decode_matrices` reads one."""
    values = np.random.default_rng(seed).standard_normal((OUT, IN)).astype(np.float32)
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType[qtype])
    return ws.Matrix(f"blk.0.attn_q.weight ({qtype})", qtype, OUT, IN, raw)


def test_q4_1_fields_rebuild_gguf_dequantize():
    m = matrix("Q4_1")
    codes, d, mins = ws._q4_1_fields(m)
    assert codes.shape == (OUT, IN) and codes.max() <= 15 and d.shape == mins.shape == (OUT, IN // 32)
    rebuilt = codes * np.repeat(d, 32, axis=1) + np.repeat(mins, 32, axis=1)  # ggml: w = d q + m
    np.testing.assert_allclose(rebuilt, m.dequantized(), rtol=1e-6, atol=1e-6)


def test_q8_0_fields_rebuild_gguf_dequantize():
    m = matrix("Q8_0")
    codes, d = ws._q8_0_fields(m)
    np.testing.assert_allclose(codes * np.repeat(d, 32, axis=1), m.dequantized(), rtol=1e-6, atol=1e-6)


def test_q8_0_matmul_nbits_blob_is_the_codes_around_128():
    m = matrix("Q8_0")
    blob, scales, zeros, bits = ws._matmul_nbits_fields(m)
    codes, d = ws._q8_0_fields(m)
    assert bits == 8 and zeros is None and blob.shape == (OUT, IN // 32, 32)
    np.testing.assert_array_equal(blob.reshape(OUT, IN).astype(np.int16) - 128, codes)
    np.testing.assert_array_equal(scales, d)


def x_by_in() -> dict:
    return {IN: np.random.default_rng(1).standard_normal((1, IN)).astype(np.float32)}


@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("bf16", 3e-2)])
def test_torch_and_onnxruntime_dense_passes_match_numpy(dtype, tol):
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    mats = [matrix("Q4_1"), matrix("Q8_0", seed=2)]
    assert ws.torch_pass(mats, dtype, x_by_in(), 1, 0.0)["max_rel_error"] < tol
    assert ws.torch_mv_pass(mats, dtype, x_by_in(), 1, 0.0)["max_rel_error"] < tol
    if dtype == "f32":  # ONNX Runtime's CPU MatMul has no bf16 kernel; the generated module's blocks are f32 only
        assert ws.onnxruntime_pass(mats, dtype, x_by_in(), 1, 0.0)["max_rel_error"] < tol
        import torch

        threads = torch.get_num_threads()
        try:
            blocks = ws.torch_blocks_pass(mats, dtype, x_by_in(), 2, 0.0)
        finally:
            torch.set_num_threads(threads)
        assert blocks["kernels"] == ["torch.bmm over blocks (of rows; of in where held transposed)"]
        assert blocks["max_rel_error"] < tol


def test_the_blocks_pass_holds_a_wide_matrix_transposed_as_a_fast_module_does(monkeypatch):
    """A wide matrix (out > in: gate, up, the head) runs as blocks of `in` over its transpose, checked against
    numpy like every pass (the check reads the first and the last matrix: the wide one is last)."""
    pytest.importorskip("torch")
    import torch

    values = np.random.default_rng(3).standard_normal((2 * IN, IN)).astype(np.float32)
    wide = ws.Matrix("blk.0.ffn_up.weight (Q8_0)", "Q8_0", 2 * IN, IN,
                     gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0))  # fmt: skip
    calls = []
    real = torch.bmm

    def spy(a, b):
        calls.append(tuple(b.shape))
        return real(a, b)

    monkeypatch.setattr(torch, "bmm", spy)
    threads = torch.get_num_threads()
    try:
        blocks = ws.torch_blocks_pass([matrix("Q4_1"), wide], "f32", x_by_in(), 2, 0.0)
    finally:
        torch.set_num_threads(threads)
    assert (2, IN // 2, 2 * IN) in calls  # the wide matrix: blocks of `in` of its [in, out] memory
    assert (2, IN, OUT // 2) in calls  # the other: blocks of its rows
    assert blocks["max_rel_error"] < 1e-5


def test_stored_passes_compute_the_stored_weights():
    """torch's int4 kernel is exact for Q4_1 (up to its bf16 activations); MatMulNBits is exact for Q8_0 (up to its
    int8 activations at accuracy level 4)."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    assert ws.torch_pass([matrix("Q4_1")], "stored", x_by_in(), 1, 0.0)["max_rel_error"] < 2e-2
    assert ws.onnxruntime_pass([matrix("Q8_0")], "stored", x_by_in(), 1, 0.0)["max_rel_error"] < 2e-2


@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("bf16", 3e-2)])
def test_the_inductor_pass_matches_numpy(dtype, tol):
    """The compiled pass (one-row products as inductor reductions, as a compiled decode step runs its linears)
    computes x @ W^T of the GGUF's weights, checked on the first and the last matrix."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        got = ws.inductor_pass([matrix("Q4_1"), matrix("Q8_0", seed=2)], dtype, x_by_in(), 1, 0.0)
    finally:
        torch.set_num_threads(threads)
    assert got["kernels"] == ["inductor (one-row products as reductions: DECODE_OPTIONS)"]
    assert got["max_rel_error"] < tol
    with pytest.raises(ValueError):
        ws.inductor_pass([matrix("Q4_1")], "stored", x_by_in(), 1, 0.0)
