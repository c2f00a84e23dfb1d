"""Linnet's inductor pass for decode steps (linnet/compiler/torch/inductor_passes.py): one-row CPU matrix products
compile as reductions (no extern GEMM call in the generated code), agree with the extern kernel within f32 summation
order, and products of more rows keep the extern kernel; attention with one query row compiles as reductions too (no
call of the CPU flash-attention kernel), agrees with SDPA in f64 within the dtype's rounding, and more query rows keep
the kernel."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch.nn.functional as F  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

from linnet.compiler.torch.inductor_passes import DECODE_OPTIONS  # noqa: E402


def mlp(x, w_in, b_in, w_out):
    """A linear with a bias, a pointwise op, a linear without: addmm and mm once decomposed."""
    return F.linear(F.silu(F.linear(x, w_in, b_in)), w_out)


def compiled_code(fn, *args) -> tuple[torch.Tensor, str]:
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, options=DECODE_OPTIONS)
    out, code = run_and_get_code(compiled, *args)
    return out, "\n".join(code)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_products_compile_as_reductions(dtype):
    g = torch.Generator().manual_seed(0)
    w_in = torch.randn(96, 40, generator=g).to(dtype)
    b_in = torch.randn(96, generator=g).to(dtype)
    w_out = torch.randn(24, 96, generator=g).to(dtype)
    x = torch.randn(1, 1, 40, generator=g).to(dtype)
    out, code = compiled_code(mlp, x, w_in, b_in, w_out)
    assert "extern_kernels.mm" not in code and "extern_kernels.addmm" not in code
    # the reference: the same sums in f64 from the dtype's values; f32 within its rounding, bf16 within its last bit
    ref = mlp(x.double(), w_in.double(), b_in.double(), w_out.double())
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_more_rows_keep_the_extern_kernel():
    g = torch.Generator().manual_seed(1)
    w_in, b_in, w_out = torch.randn(96, 40, generator=g), torch.randn(96, generator=g), torch.randn(24, 96, generator=g)
    x = torch.randn(2, 3, 40, generator=g)
    out, code = compiled_code(mlp, x, w_in, b_in, w_out)
    assert "extern_kernels.mm" in code or "extern_kernels.addmm" in code or "mkl" in code
    torch.testing.assert_close(out, mlp(x, w_in, b_in, w_out), rtol=1e-5, atol=1e-5)


def attention(q, k, v, mask):
    """SDPA as the generated decode step calls it under compile: the whole cache, a bool mask, GQA."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)


def attention_inputs(dtype, n_queries=1, seed=2):
    """q: [3, 6, n_queries, 16], k, v: [3, 2, 40, 16] (query heads 0-2 read key/value head 0), mask: bool[3, 1,
    n_queries, 40]: row 0 attends 25 keys with a hole, row 1 all 40, row 2 none (a cache row with no tokens)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 6, n_queries, 16, generator=g).to(dtype)
    k = (2 * torch.randn(3, 2, 40, 16, generator=g)).to(dtype)
    v = torch.randn(3, 2, 40, 16, generator=g).to(dtype)
    mask = torch.zeros(3, 1, n_queries, 40, dtype=torch.bool)
    mask[0, :, :, :25] = True
    mask[0, :, :, 7] = False
    mask[1] = True
    return q, k, v, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_query_row_attention_compiles_as_reductions(dtype):
    q, k, v, mask = attention_inputs(dtype)
    out, code = compiled_code(attention, q, k, v, mask)
    assert "_scaled_dot_product_flash_attention_for_cpu" not in code
    assert out.dtype == dtype and out.shape == q.shape
    # the reference: SDPA in f64 on the dtype's values; the CPU kernel gives a row with no attended key zeros
    ref = attention(q.double(), k.double(), v.double(), mask)
    assert torch.equal(ref[2], torch.zeros_like(ref[2])) and torch.equal(out[2], torch.zeros_like(out[2]))
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    # and the kernel it replaces, in the dtype: within the same bound
    torch.testing.assert_close(out.double(), attention(q, k, v, mask).double(), rtol=2 * tol, atol=2 * tol)


def test_more_query_rows_keep_the_attention_kernel():
    q, k, v, mask = attention_inputs(torch.float32, n_queries=3)
    out, code = compiled_code(attention, q, k, v, mask)
    assert "_scaled_dot_product_flash_attention_for_cpu" in code
    torch.testing.assert_close(out, attention(q, k, v, mask), rtol=1e-5, atol=1e-5)
