"""What Linnet adds to inductor when it compiles a decode step (`torch.compile(..., options=DECODE_OPTIONS)`).

`OneRowProductsAsReductions` is a post-grad graph pass (inductor's `post_grad_custom_pre_pass` hook): a matrix
product with one row on the CPU, x: [1, K] @ w: [K, N] (a decode step's linears at batch 1, `aten.mm` and
`aten.addmm` once F.linear is decomposed), becomes `(x[:, :, None] * w[None]).sum(1)`, which inductor compiles into
one parallel, vectorised loop that streams w once. The extern kernel it replaces is MKL's sgemv, which runs on one
thread whatever `torch.set_num_threads` says: on the 2-core AMD EPYC (AVX2) it read 5.9 GB/s from memory, the
reduction 11.9 GB/s (120 distinct 1536 x 576 f32 matrices, 424 MB, in one compiled function), and
SmolLM2's compiled f32 decode step went from 84 to 47 ms (lm_head's 113 MB included).

It is inductor's own rewrite (torch/_inductor/fx_passes/decompose_mem_bound_mm.py, `decompose_mm_pass`), taken
without that pass's CPU size cap (K and N at most 2048, which leaves out lm_head) and with the products and the
sum written in f32: the bf16 kernel it replaces also multiplies and sums in f32 (oneDNN), so only the summation
order changes, as it does between any two GEMV kernels. Products of more rows (prefill, batched decode) keep the
extern GEMM, which is parallel and reuses each weight across rows. x is written to a buffer of its own before the
loop: inductor inlines the producers of a reduction's input where it has one reader (an inductor module's joined q,
k and v: `prelude.linears`), and then recomputed the residual sum and the norm for each of the N columns (SmolLM2's
bf16 decode step 22.1-22.5 -> 25.7-26.8 ms with q, k and v joined).

The same pass rewrites attention with one query row on the CPU (a decode step's SDPA, which under compile reads the
whole masked KV cache): `aten._scaled_dot_product_flash_attention_for_cpu` becomes its math, `_one_row_attention`
(scores, masked softmax, weighted sum of the values, GQA as the op does it, products and sums in f32, the kernel's
casts), which inductor fuses into a few parallel reductions beside the step's other loops. The kernel it replaces
blocks for many query rows and, in bf16 on a CPU without bf16 dot instructions (AVX2), emulates its bf16 GEMMs: on
the 2-core AMD EPYC a profile put it at 765 us a layer in SmolLM2's bf16 decode step (21 of 51 ms), 382 us in f32.
With the rewrite the step went from 48 to 34 ms in bf16 and from 48 to 42 ms in f32 (fastest of 6 rounds, old and
new pass alternating in one process, 2 threads), with the same greedy tokens. Prefill (more query rows) and causal
or dropout calls keep the kernel. Inductor keeps fused intermediates in f32 (unless `emulate_precision_casts`), so
in bf16 the attention weights are not rounded to bf16 before the values' sum as the kernel rounds them: the
compiled step is, if anything, closer to f32 there.
"""

from __future__ import annotations

import operator

import torch
from torch._inductor import inductor_prims
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._inductor.pattern_matcher import (
    Arg,
    CallFunction,
    KeywordArg,
    Match,
    PatternMatcherPass,
    register_graph_pattern,
)
from torch.fx.operator_schemas import normalize_function

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
    # x in a buffer of its own: inlined, its producers (the residual sum and the norm) would be recomputed for each
    # of the N columns
    xf = inductor_prims.force_stride_order(x.float(), [x.shape[1], 1])
    return (xf[:, :, None] * w[None, :, :].float()).sum(1).to(x.dtype)


@register_graph_pattern(CallFunction(aten.mm, Arg(), Arg()), pass_dict=_PATTERNS)
def _mm(match: Match, x: torch.fx.Node, w: torch.fx.Node) -> None:
    if _one_row_on_cpu(x, w):
        match.replace_by_example(_product, [x, w])


@register_graph_pattern(CallFunction(aten.addmm, Arg(), Arg(), Arg()), pass_dict=_PATTERNS)
def _addmm(match: Match, bias: torch.fx.Node, x: torch.fx.Node, w: torch.fx.Node) -> None:
    if _one_row_on_cpu(x, w):
        match.replace_by_example(lambda b, x, w: _product(x, w) + b, [bias, x, w])


_FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default


def _one_query_row_on_cpu(q: torch.fx.Node, k: torch.fx.Node, v: torch.fx.Node, mask: torch.fx.Node | None) -> bool:
    """Whether q: [B, H, 1, D], k, v: [B, Hkv, T, D] (H a multiple of Hkv) and the mask are static-shaped CPU
    tensors that `_one_row_attention` takes as they are (the graph's fake values say)."""
    vals = [n.meta.get("val") for n in (q, k, v)] + ([] if mask is None else [mask.meta.get("val")])
    if not all(isinstance(t, torch.Tensor) and t.is_cpu for t in vals):
        return False
    if not all(isinstance(d, int) for t in vals for d in t.shape):
        return False
    qv, kv, vv = vals[:3]
    if not (qv.dim() == kv.dim() == vv.dim() == 4 and qv.shape[2] == 1 and kv.shape == vv.shape):
        return False
    if qv.shape[0] != kv.shape[0] or qv.shape[3] != kv.shape[3] or qv.shape[1] % kv.shape[1]:
        return False
    if qv.dtype not in (torch.float32, torch.bfloat16, torch.float16) or not qv.dtype == kv.dtype == vv.dtype:
        return False
    if mask is None:
        return True
    mv = vals[3]
    try:  # SDPA's own rule: the mask broadcasts to [B, H, 1, T]
        torch.broadcast_shapes(mv.shape, (qv.shape[0], qv.shape[1], 1, kv.shape[2]))
    except RuntimeError:
        return False
    return mv.dtype in (torch.float32, qv.dtype)


def _one_row_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor:
    """What `aten._scaled_dot_product_flash_attention_for_cpu` computes for one query row, written as reductions.

    q: [B, H, 1, D], k, v: [B, Hkv, T, D] with query head h reading key/value head h // (H / Hkv) (SDPA's
    `enable_gqa`, repeat_interleave), mask: additive, broadcast to [B, H, 1, T], or None -> [B, H, 1, D] in q's
    dtype. The steps and casts are the CPU kernel's (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp,
    `cpu_flash_attention`): scores q.k in f32, times `scale` (default 1/sqrt(D)), plus the mask in f32; a max and
    `exp(s - max)` in f32, summed in f32; the exponentials rounded to q's dtype when that is bf16/f16 (the kernel's
    `qk_reduced` buffer) before the f32 sum over the values; times 1/sum, rounded to q's dtype. A row every key of
    which is masked gives zeros, as in the kernel. The kernel walks the keys in blocks of 512 with a running max;
    this takes one max over all T, so the sums differ in order and, in bf16, the rounded exponentials by their
    last bit."""
    B, H, _, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = D**-0.5 if scale is None else scale
    qg = q.reshape(B, Hkv, G, 1, D).float()
    # Stored once: inductor would otherwise inline q's producers (the rotary embedding's pow, cos and sin) into the
    # score loop and recompute them for each of the T keys (SmolLM2's bf16 decode step was then 1.4x slower than
    # with the flash kernel, instead of faster).
    qg = inductor_prims.force_stride_order(qg, qg.stride())
    scores = (qg * k[:, :, None].float()).sum(-1) * scale  # [B, Hkv, G, T]
    if mask is not None:
        scores = scores + mask.float().expand(B, H, 1, T).reshape(B, Hkv, G, T)
    top = scores.amax(-1, keepdim=True)
    top = torch.where(top == float("-inf"), 0.0, top)  # a row masked everywhere: exp(-inf) = 0, not nan
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    total = torch.where(total == 0, 1.0, total)
    if q.dtype != torch.float32:
        weights = weights.to(q.dtype).float()
    out = (weights[..., None] * v[:, :, None].float()).sum(-2)  # [B, Hkv, G, D]
    return (out * (1.0 / total)).to(q.dtype).reshape(B, H, 1, D)


# The pattern matcher drops a call's keywords the pattern does not name and fills in defaults for those it names
# but the call leaves out, so one pattern sees every call; `_attention` reads the whole call itself.
_FLASH_OUTPUT = CallFunction(
    operator.getitem,
    CallFunction(_FLASH_CPU, Arg(), Arg(), Arg(), attn_mask=KeywordArg("attn_mask"), scale=KeywordArg("scale")),
    0,
)


@register_graph_pattern(_FLASH_OUTPUT, pass_dict=_PATTERNS)
def _attention(match: Match, q: torch.fx.Node, k: torch.fx.Node, v: torch.fx.Node, **_) -> None:
    """`getitem(_scaled_dot_product_flash_attention_for_cpu(q, k, v, ...), 0)` (the output; the log-sum-exp
    unused) for one query row without dropout or causal masking becomes `_one_row_attention`."""
    (flash,) = [n for n in match.nodes if n.target is _FLASH_CPU]
    normalized = normalize_function(flash.target, flash.args, flash.kwargs, normalize_to_only_use_kwargs=True)
    if normalized is None:
        return
    call = normalized.kwargs
    mask, scale = call["attn_mask"], call["scale"]
    if call["dropout_p"] != 0 or call["is_causal"] is not False or isinstance(scale, torch.fx.Node):
        return
    if mask is not None and not isinstance(mask, torch.fx.Node):
        return
    if not _one_query_row_on_cpu(q, k, v, mask):
        return
    if mask is None:
        match.replace_by_example(lambda q, k, v: _one_row_attention(q, k, v, None, scale), [q, k, v])
    else:
        match.replace_by_example(lambda q, k, v, m: _one_row_attention(q, k, v, m, scale), [q, k, v, mask])


class OneRowProductsAsReductions(CustomGraphPass):
    """The post-grad pass (module docstring): one-row CPU matrix products and one-query-row CPU attention as inductor
    reductions."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        _PATTERNS.apply(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))


# inductor options for a compiled decode step (`torch.compile(options=...)`)
DECODE_OPTIONS = {"post_grad_custom_pre_pass": OneRowProductsAsReductions()}
