"""What Linnet adds to inductor when it compiles a decode step (`torch.compile(..., options=DECODE_OPTIONS)`).

`OneRowProductsAsReductions` is a post-grad graph pass (inductor's `post_grad_custom_pre_pass` hook): a matrix
product with one row on the CPU, x: [1, K] @ w: [K, N] (a decode step's linears at batch 1, `aten.mm` and
`aten.addmm` once F.linear is decomposed), becomes `(x[:, :, None] * w[None]).sum(1)`, which inductor compiles into
one parallel, vectorised loop that streams w once. The extern kernel it replaces is MKL's sgemv, which runs on one
thread whatever `torch.set_num_threads` says: on the 2-core AMD EPYC (AVX2) it read 5.9 GB/s from memory, the
reduction 11.9 GB/s (120 distinct 1536 x 576 f32 matrices, 424 MB, in one compiled function; scratch gemv4.py), and
SmolLM2's compiled f32 decode step went from 84 to 47 ms (lm_head's 113 MB included).

It is inductor's own rewrite (torch/_inductor/fx_passes/decompose_mem_bound_mm.py, `decompose_mm_pass`), taken
without that pass's CPU size cap (K and N at most 2048, which leaves out lm_head) and with the products and the
sum written in f32: the bf16 kernel it replaces also multiplies and sums in f32 (oneDNN), so only the summation
order changes, as it does between any two GEMV kernels. Products of more rows (prefill, batched decode) keep the
extern GEMM, which is parallel and reuses each weight across rows.
"""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._inductor.pattern_matcher import Arg, CallFunction, Match, PatternMatcherPass, register_graph_pattern

__all__ = ["OneRowProductsAsReductions", "DECODE_OPTIONS"]

aten = torch.ops.aten
_PATTERNS = PatternMatcherPass(pass_name="linnet_one_row_products_as_reductions")


def _one_row_on_cpu(x: torch.fx.Node, w: torch.fx.Node) -> bool:
    """Whether x: [1, K] and w: [K, N] are static-shaped CPU matrices (the graph's fake values say)."""
    xv, wv = x.meta.get("val"), w.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor):
        return False
    static = all(isinstance(d, int) for d in (*xv.shape, *wv.shape))
    return static and xv.dim() == wv.dim() == 2 and xv.shape[0] == 1 and xv.is_cpu and wv.is_cpu


def _product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w as a reduction: [1, K], [K, N] -> [1, N] in x's dtype; products and sum in f32."""
    return (x[:, :, None].float() * w[None, :, :].float()).sum(1).to(x.dtype)


@register_graph_pattern(CallFunction(aten.mm, Arg(), Arg()), pass_dict=_PATTERNS)
def _mm(match: Match, x: torch.fx.Node, w: torch.fx.Node) -> None:
    if _one_row_on_cpu(x, w):
        match.replace_by_example(_product, [x, w])


@register_graph_pattern(CallFunction(aten.addmm, Arg(), Arg(), Arg()), pass_dict=_PATTERNS)
def _addmm(match: Match, bias: torch.fx.Node, x: torch.fx.Node, w: torch.fx.Node) -> None:
    if _one_row_on_cpu(x, w):
        match.replace_by_example(lambda b, x, w: _product(x, w) + b, [bias, x, w])


class OneRowProductsAsReductions(CustomGraphPass):
    """The post-grad pass (module docstring): one-row CPU matrix products as inductor reductions."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        _PATTERNS.apply(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))


# inductor options for a compiled decode step (`torch.compile(options=...)`)
DECODE_OPTIONS = {"post_grad_custom_pre_pass": OneRowProductsAsReductions()}
