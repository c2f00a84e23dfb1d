"""Linnet's inductor pass for decode steps (compiler/torch/inductor_passes.py): one-row CPU matrix products compile
as reductions (no extern GEMM call in the generated code), agree with the extern kernel within f32 summation order,
and products of more rows keep the extern kernel."""

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
