"""A weight-only int8 matrix product for Q8_0 matrices on the TPU: a Pallas kernel computing y[M, N] = x[M, K] @ W^T,
W = codes * scales (codes i8[N, K], one scale per block of 32 values of a row), the matrix read from HBM once, as
int8, and dequantized block by block in VMEM.

Why a kernel: XLA compiles the dequantized dot to an f32 multiply-reduce on the VPU (53 GB/s on a v5e, 9 % of its
streaming limit: bench/results/tpu_q8_2026-12-06.json), and inside the decode loop it hoists the loop-invariant
dequantization out of the loop, materialising every matrix (out of HBM for an 8B model). Nothing here can be hoisted.

How: a grid over tiles of M and N (parallel) and K (the reduction, last), each step reading codes [tn, tk] and the
scales [tk / 32, tn] of those blocks. The scales are applied after the dot, not to the codes: x's tile [M, tk] is spread
block-diagonally to [M * G, tk] (G = tk / 32 blocks; row (m, g) keeps block g of row m, zeros elsewhere), one MXU
dot with the codes gives every block's partial sum P[(m, g), n] (the codes exact in bf16), and y[m, n] += sum_g
P[(m, g), n] * s[g, n] on the VPU (M * G * tn multiplies a step, not tn * tk). For M up to a few dozen rows the MXU
is no busier: it is bound by streaming the codes through it, not by x's rows.

Held layout (`KMajorQ8`, made at load by `hold`): the codes as the file has them, i8[N, K]; the scales transposed
and widened to f32[K / 32, N] (each a block's row of N values: the layout the VPU multiplies by; f32 because f16 is
exact in it and the chip's vector unit has no f16): 1.125 bytes a weight instead of 1.0625.

Numerics: `fast` (precision None) dots x in bf16 with the codes in bf16, f32 accumulation; `equivalent` ("highest")
dots in f32. Both apply the f32 scales in f32. The sum runs per block first, then over blocks (the dequantized
matrix's dot sums over K at once): the same values in another order, within f32 rounding.

Rows: up to `PREFILL_ROWS` (64: decode, a serving batch) in one grid step of the kernel above. The spread costs G times
the MXU work of x's rows, free while the codes' stream bounds the step (a few rows), not for prefill (16 times the
FLOPs: 0.62 s TTFT for a 512-token prompt of the 8B on a v5e, against a 50 ms FLOP bound). So more rows go through a
second kernel (`_dequantizing_kernel`): each step dequantizes its codes tile to the dot's dtype in VMEM (codes [tn, tk]
widened to f32 and transposed to [tk, tn], times the scales [tk / 32, tn] repeated over each block's 32 sublanes:
`SCALE_EXPAND`) and runs one plain [tm, tk] x [tk, tn] dot, rows tiled by up to `TILE_M_PREFILL` (512: the codes read
once per 512 rows). Its `fast` dot rounds the dequantized weights to bf16 (the decode kernel's keeps them exact and
scales in f32 after), as a bf16 model's weights are. Every multiply of a matrix on the chip goes through one of the two,
so no dequantized matrix is ever made in HBM (XLA's dot over a dequantized matrix materialised them, out of HBM for the
8B). Only shapes no tiling fits (a tiny model's) keep XLA's dot over the dequantized matrix (`KMajorQ8.matmul`).

Layers scanned (`lax.scan` over stacked layers, the prelude's `Stacked.scan`): each pair is held stacked, codes
i8[L, N, K] and scales f32[L, K / 32, N]. A scan's slice of them, handed to a custom call (which takes its operands
as whole buffers and fuses no slice), was copied out of the stack for every layer before its kernel ran: three times
a layer's bytes a step, one copy after another (the chip: Qwen3-8B's scanned decode at 21 % of streaming, unrolled
Llama-3.1-8B's at 100 %). So the scan hands its body each stacked pair as a view of layer `i`
(`KMajorQ8.at_layer`: `StackedLayerQ8`), whose `matmul` gives the kernel the whole stacks and the layer's index as a
scalar prefetched into SMEM (`pltpu.PrefetchScalarGridSpec`); the blocks' index maps read layer `i`'s tiles from
the stacks, so each is read once, from where it is held (Pallas's paged attention indexes its pages so).

Rows unknown when traced (an exported entry's symbolic batch and sequence: the `xla` backend) reach the kernels too:
the grid's row count is then symbolic (Pallas lowers it as a dynamic grid bound), and the kernel and its row tile
are picked when the entry runs (`lax.switch` on the row count): the decode kernel in tiles of 8 rows (up to 8) or
64 (up to `PREFILL_ROWS`), the dequantizing kernel in tiles of `TILE_M_SYMBOLIC` (256) beyond.
"""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

__all__ = [
    "KMajorQ8",
    "StackedLayerQ8",
    "hold",
    "held_spec",
    "uses_kernel",
    "q8_matmul",
    "tiles",
    "TILE_M",
    "PREFILL_ROWS",
    "BLOCK",
]

BLOCK = 32  # Q8_0's values per scale
TILE_M = 64  # rows of x (batch * tokens) a grid step of the decode kernel takes
PREFILL_ROWS = TILE_M  # more rows than this go through the dequantizing kernel (None: never, the decode kernel's tiles)
TILE_M_PREFILL = 512  # rows of x a grid step of the dequantizing kernel takes (the codes read once per tile)
TILE_M_SYMBOLIC = 256  # its rows a step when the count is symbolic (a tile fixed at trace time: at most 255 padded)
# How the dequantizing kernel repeats each block's scale over its 32 rows of W^T's tile: "broadcast" (a sublane
# broadcast and a tile-aligned reshape) or "dot" (a 0/1 matrix [tk, G] times the scales on the MXU, split in two
# bf16 halves so the product is exact: an f16 scale has 11 significant bits, bf16 8). Two ways to the same values,
# for whichever Mosaic compiles (bench/tpu_q8.py's prefill section tries both on the chip).
SCALE_EXPAND = "broadcast"
SYMBOLIC_ROWS = True  # symbolic row counts through the kernels (False: XLA's dequantized dot, as before they could)
TILE_N, TILE_K = 1024, 512  # default tile targets: codes 512 KB a step, double-buffered
MAX_TILE_K = 2048  # K's tile grows up to this where N has few divisors (`tiles`)
SPREAD_BYTES = 4 * 1024 * 1024  # the decode kernel's spread x (f32 [M * tk / 32, tk]) stays under this
WIDEN_CODES = True  # codes widened to bf16 on the VPU before a `fast` dot (False: the dot takes them as int8)
VMEM_LIMIT = 64 * 1024 * 1024  # a step's buffers at the largest bench tiles (2048 x 2048) stay well under it


def uses_kernel(platform: str) -> bool:
    """Whether matrices held quantized on a device of `platform` (jax's name: "tpu", "cpu") are held for the
    kernel: on a TPU."""
    return platform == "tpu"


class KMajorQ8(NamedTuple):
    """A Q8_0 matrix held for the kernel: codes i8[N, K] and scales_t f32[K / 32, N] (W[n, k] = codes[n, k] *
    scales_t[k // 32, n]). A pytree (a NamedTuple); the prelude's `quantized_linear` calls `matmul`, its
    `dequantize` and `quantized_take` read `row_scales`."""

    codes: jax.Array
    scales_t: jax.Array

    def row_scales(self, indices=None):
        """The scales f32[N, K / 32], one row per output row (the pair's usual layout); or only rows `indices`
        ([...] -> f32[..., K / 32], clipped), taken from the held columns without transposing the rest."""
        if indices is None:
            return self.scales_t.T
        return jnp.moveaxis(jnp.take(self.scales_t, indices, axis=1, mode="clip"), 0, -1)

    def matmul(self, x, precision):
        """`x @ W^T`: x [..., K] -> [..., N] in x's dtype; the kernels when a tiling fits (rows known when traced
        or symbolic: an exported entry's, unless `SYMBOLIC_ROWS` is off), else XLA's dot over the matrix dequantized
        in x's dtype (tiny dims)."""
        y = _through_kernel(x, self.codes, self.scales_t, None, precision)
        if y is not None:
            return y
        *_, k = x.shape
        n = self.codes.shape[0]
        w = self.codes.reshape(n, k // BLOCK, BLOCK).astype(x.dtype) * self.row_scales().astype(x.dtype)[..., None]
        return jnp.einsum("...i,oi->...o", x, w.reshape(n, k), precision=precision)

    def at_layer(self, layer) -> StackedLayerQ8:
        """This pair held stacked (codes i8[L, N, K], scales_t f32[L, K / 32, N]: a scanned list's member) seen as
        layer `layer`'s (an int32 or int64 scalar, traced: a scan's index), without slicing it (`StackedLayerQ8`)."""
        return StackedLayerQ8(self.codes, self.scales_t, layer)


class StackedLayerQ8(NamedTuple):
    """Layer `layer` of a pair held stacked for the kernel (codes i8[L, N, K], scales_t f32[L, K / 32, N]), as a scan's
    body reads it (`KMajorQ8.at_layer`): `matmul` hands the kernel the stacks and the index (read in place, tile by
    tile); what takes no kernel (tiny dims' dot, `row_scales`) reads the layer's own pair (`pair`: a slice)."""

    codes: jax.Array
    scales_t: jax.Array
    layer: jax.Array

    def pair(self) -> KMajorQ8:
        """The layer's own pair (codes i8[N, K], scales_t f32[K / 32, N]): a dynamic slice of each stack."""
        return KMajorQ8(*(lax.dynamic_index_in_dim(a, self.layer, 0, False) for a in (self.codes, self.scales_t)))

    def row_scales(self, indices=None):
        """The layer's scales f32[N, K / 32] (or rows `indices`'), as `KMajorQ8.row_scales`."""
        return self.pair().row_scales(indices)

    def matmul(self, x, precision):
        """`x @ W^T` of the layer's W: x [..., K] -> [..., N] in x's dtype, as `KMajorQ8.matmul`, the kernels reading
        the layer's tiles from the stacks (no copy of the layer's matrices)."""
        y = _through_kernel(x, self.codes, self.scales_t, self.layer, precision)
        return y if y is not None else self.pair().matmul(x, precision)


def _through_kernel(x, codes, scales_t, layer, precision):
    """`x @ W^T` (x [..., K] -> [..., N] in x's dtype) by `q8_matmul` when a tiling fits and the rows are known when
    traced or symbolic (an exported entry's, unless `SYMBOLIC_ROWS` is off); else None (the caller's dot). `layer`
    None: codes [N, K] is the matrix; else the stacks' layer `layer`."""
    *lead, k = x.shape
    n = codes.shape[-2]
    rows = functools.reduce(operator.mul, lead, 1)  # an int, or a symbolic dim (`B * S`)
    if tiles(n, k) is None or not (isinstance(rows, int) or SYMBOLIC_ROWS):
        return None
    y = q8_matmul(x.reshape(rows, k), codes, scales_t, layer, precision=precision)
    return y.reshape(*lead, n).astype(x.dtype)


def hold(codes: np.ndarray, scales: np.ndarray) -> KMajorQ8:
    """The held pair (codes i8[N, K], scales f16[N, K / 32]) re-laid for the kernel, on the host: the scales
    transposed and widened to f32 (exact)."""
    return KMajorQ8(codes, np.ascontiguousarray(scales.astype(np.float32).T))


def held_spec(n: int, k: int, group: int = BLOCK) -> KMajorQ8:
    """The ShapeDtypeStructs of an [N, K] matrix held by `hold` (an exported entry's parameter)."""
    return KMajorQ8(jax.ShapeDtypeStruct((n, k), jnp.int8), jax.ShapeDtypeStruct((k // group, n), jnp.float32))


def _tile(dim: int, unit: int, target: int) -> int | None:
    """The largest multiple of `unit` dividing `dim` and at most `target`, or None."""
    return next((t for t in range(min(target, dim) // unit * unit, 0, -unit) if dim % t == 0), None)


def tiles(n: int, k: int, tn: int = TILE_N, tk: int = TILE_K, rows: int = 1) -> tuple[int, int] | None:
    """(tn, tk) for an [N, K] matrix: tn a multiple of 128 (lanes) dividing N, tk a multiple of 256 (8 sublanes of
    scales: 8 blocks of 32) dividing K, each the largest at most its target. Where N's tile falls short of its
    target (Qwen3's vocab 151936 = 128 x 1187 takes tiles of 128), K's target grows by as much (up to `MAX_TILE_K`,
    and while the decode kernel's spread of `rows` rows stays under `SPREAD_BYTES`): a step still reads about tn x tk
    codes, so the grid's per-step cost does not multiply. None when N or K has no such divisor (a tiny model's 64 or
    96: then XLA's dot); the 8B's N (4096, 6144, 24576, 28672, 128256, 151936) and K (4096, 12288, 14336) have."""
    fit_n = _tile(n, 128, tn)
    if fit_n is not None and fit_n < tn:
        spread_cap = int(np.sqrt(SPREAD_BYTES * BLOCK / 4 / max(rows, 1)))  # rows * (tk / 32) * tk * 4 bytes
        tk = max(tk, min(tk * tn // fit_n, MAX_TILE_K, spread_cap))
    fit_k = _tile(k, 8 * BLOCK, tk)
    return None if fit_n is None or fit_k is None else (fit_n, fit_k)


def _kernel(x_ref, q_ref, s_ref, o_ref, *, dot_dtype, precision, widen_codes):
    """One grid step (m tile r, n tile j, k tile i): o[tm, tn] += sum_g (blockdiag(x)[tm * G, tk] @ q[tn, tk]^T)[(m, g)]
    * s[g]."""

    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    x = x_ref[...].astype(jnp.float32)  # [M, tk]
    m, tk = x.shape
    g = tk // BLOCK
    offset = lax.broadcasted_iota(jnp.int32, (g, tk), 1) - BLOCK * lax.broadcasted_iota(jnp.int32, (g, tk), 0)
    mine = (offset >= 0) & (offset < BLOCK)  # [G, tk]: row g keeps block g (lanes 32 g .. 32 g + 31); no division
    spread = jnp.where(mine[None], x[:, None, :], 0.0).reshape(m * g, tk).astype(dot_dtype)
    # [tn, tk], exact (|q| <= 127); or the int8 codes as the dot's operand, widened by Mosaic (jax's own
    # quantized_matmul kernel dots bf16 x int8 so)
    codes = q_ref[...].astype(jnp.float32).astype(dot_dtype) if widen_codes else q_ref[...]
    partial = lax.dot_general(
        spread, codes, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
    )  # [M * G, tn]: each block's partial sum
    tn = partial.shape[-1]
    o_ref[...] += jnp.sum(partial.reshape(m, g, tn) * s_ref[...][None], axis=1)


def _expanded_scales(s, expand: str):
    """f32[G, tn] -> f32[G * 32, tn]: row g repeated 32 times (`SCALE_EXPAND` says the two ways), exactly."""
    g, tn = s.shape
    if expand == "broadcast":
        return jnp.broadcast_to(s[:, None, :], (g, BLOCK, tn)).reshape(g * BLOCK, tn)
    offset = lax.broadcasted_iota(jnp.int32, (g * BLOCK, g), 0) - BLOCK * lax.broadcasted_iota(
        jnp.int32, (g * BLOCK, g), 1
    )
    ones = ((offset >= 0) & (offset < BLOCK)).astype(jnp.bfloat16)  # [tk, G]: row k has a 1 in column k // 32
    high = s.astype(jnp.bfloat16)
    low = (s - high.astype(jnp.float32)).astype(jnp.bfloat16)  # exact: the 3 bits of an f16 that bf16 drops
    dot = functools.partial(
        lax.dot_general, dimension_numbers=(((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )
    return dot(ones, high) + dot(ones, low)  # one nonzero term per output: exact in f32


def _dequantizing_kernel(x_ref, q_ref, s_ref, o_ref, *, dot_dtype, precision, expand):
    """One grid step (m tile r, n tile j, k tile i) for many rows: o[tm, tn] += x[tm, tk] @ W^T[tk, tn], W^T's tile
    dequantized here (codes^T * each block's scales) in the dot's dtype."""

    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    codes_t = q_ref[...].astype(jnp.float32).T  # [tk, tn]: a 32-bit transpose (Mosaic's XLU has those)
    scales = _expanded_scales(s_ref[...], expand)  # [tk, tn]
    w_t = (codes_t * scales).astype(dot_dtype)  # exact in f32; `fast`: rounded to bf16
    o_ref[...] += lax.dot_general(
        x_ref[...].astype(dot_dtype), w_t, (((1,), (0,)), ((), ())), precision=precision,
        preferred_element_type=jnp.float32,
    )  # fmt: skip


def _row_tile(rows: int, prefill: bool) -> int:
    """The rows a grid step takes: all of decode's (up to `TILE_M`) or `TILE_M`; for the dequantizing kernel all
    rows rounded up to 16 (sublanes of a bf16 tile), up to `TILE_M_PREFILL`."""
    if not prefill:
        return rows if rows <= TILE_M else TILE_M
    return min(-(-rows // 16) * 16, TILE_M_PREFILL)


@functools.partial(
    jax.jit, static_argnames=("precision", "tn", "tk", "widen_codes", "prefill", "expand", "interpret")
)  # fmt: skip
def q8_matmul(
    x, codes, scales_t, layer=None, *, precision=None, tn=TILE_N, tk=TILE_K, widen_codes=WIDEN_CODES, prefill=None,
    expand=None, interpret=None,
):  # fmt: skip
    """y f32[M, N] = x[M, K] @ (codes i8[N, K] * scales_t f32[K / 32, N] per block)^T, by a Pallas kernel (the module
    docstring): the decode kernel (block-diagonal x, scales after the dot) for up to `PREFILL_ROWS` rows, the
    dequantizing kernel for more (`prefill` True or False forces one); M may be symbolic (an exported entry's: the
    kernel picked when it runs). With `layer` (an integer scalar, traced or not), codes i8[L, N, K] and scales_t
    f32[L, K / 32, N] are stacks and the matrix is their layer `layer`, read in place (the module docstring).
    `precision` None (`fast`: a bf16 dot) or "highest" (`equivalent`: an f32 dot); `tn`, `tk` tile targets (`tiles`);
    `widen_codes` False hands the decode kernel's `fast` dot the int8 codes (Mosaic widens them); `expand` the
    dequantizing kernel's way to repeat the scales (None: `SCALE_EXPAND`); `interpret` None runs the kernel compiled
    on a TPU and interpreted elsewhere (slow: for tests). Raises ValueError when no tiling fits (`tiles`)."""
    rows, k = x.shape
    n = codes.shape[-2]
    if tiles(n, k, tn, tk) is None:
        raise ValueError(f"q8_matmul: no tiling of a [{n}, {k}] matrix (N a multiple of 128, K of 256)")
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    call = functools.partial(
        _padded_call, codes=codes, scales_t=scales_t, precision=precision, tn=tn, tk=tk, widen_codes=widen_codes,
        expand=expand or SCALE_EXPAND, interpret=interpret,
        layer=None if layer is None else jnp.asarray(layer, jnp.int32).reshape(1),
    )  # fmt: skip
    if isinstance(rows, int):
        if prefill is None:
            prefill = PREFILL_ROWS is not None and rows > PREFILL_ROWS
        return call(x, prefill=prefill, tm=_row_tile(rows, prefill))
    # symbolic rows: a tile fixed now, the kernel and tile picked when the entry runs
    branches = [functools.partial(call, prefill=False, tm=8), functools.partial(call, prefill=False, tm=TILE_M)]
    branches.append(functools.partial(call, prefill=True, tm=TILE_M_SYMBOLIC))
    if prefill is not None or PREFILL_ROWS is None:
        return branches[2 if prefill else 1](x)
    count = jnp.asarray(rows)
    return lax.switch((count > 8).astype(jnp.int32) + (count > PREFILL_ROWS).astype(jnp.int32), branches, x)


def _padded_call(
    x, *, codes, scales_t, precision, tn, tk, widen_codes, expand, prefill: bool, tm: int, interpret, layer=None
):  # fmt: skip
    """`q8_matmul` by one kernel (`prefill`: the dequantizing one), x's rows (an int or symbolic) padded to whole
    tiles of `tm`: f32[M, N]. `layer` (i32[1]) or None: the stacks' layer whose tiles the blocks read, prefetched."""
    rows, k = x.shape
    n = codes.shape[-2]
    m = (rows + tm - 1) // tm * tm  # rows padded to whole tiles (symbolic arithmetic too)
    x = x if isinstance(m, int) and m == rows else jnp.pad(x, ((0, m - rows), (0, 0)))
    tn, tk = tiles(n, k, tn, tk, rows=1 if prefill else tm)
    highest = precision is not None and str(precision).lower().endswith("highest")
    dot = dict(dot_dtype=jnp.float32 if highest else jnp.bfloat16, precision=lax.Precision.HIGHEST if highest else None)
    if prefill:
        kernel = functools.partial(_dequantizing_kernel, **dot, expand=expand)
    else:
        kernel = functools.partial(_kernel, **dot, widen_codes=widen_codes or highest)
    # blocks (r: x's rows, j: N, i: K), and in a stack layer `layer[0]`'s (its dim squeezed out of the block)
    blocks = [((tm, tk), lambda r, j, i: (r, i)), ((tn, tk), lambda r, j, i: (j, i))]
    blocks += [((tk // BLOCK, tn), lambda r, j, i: (i, j)), ((tm, tn), lambda r, j, i: (r, j))]
    stacked = (False, True, True, False)  # x, codes, scales, out
    grid = (m // tm, n // tn, k // tk)
    if layer is None:
        specs = [pl.BlockSpec(shape, index) for shape, index in blocks]
        grid_spec = pl.GridSpec(grid=grid, in_specs=specs[:3], out_specs=specs[3])
        operands = (x, codes, scales_t)
    else:
        specs = [
            pl.BlockSpec((pl.squeezed, *shape), lambda r, j, i, ly, f=index: (ly[0], *f(r, j, i)))
            if lead
            else pl.BlockSpec(shape, lambda r, j, i, ly, f=index: f(r, j, i))
            for (shape, index), lead in zip(blocks, stacked)
        ]
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=grid, in_specs=specs[:3], out_specs=specs[3]
        )
        kernel = functools.partial(_after_prefetch, kernel)
        operands = (layer, x, codes, scales_t)
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"), vmem_limit_bytes=VMEM_LIMIT
        ),
        interpret=interpret,
    )
    if isinstance(m, int):
        return call(*operands)[:rows]
    # A symbolic grid bound is an operand of the kernel's custom call, of the dimension type: i64 under Linnet's
    # 64-bit scope, which the TPU compiler cannot rewrite to 32-bit inside a custom call ("While rewriting
    # computation to not contain X64 element types ... not implemented": every `xla` entry with stored matrices
    # failed to compile on the chip). Traced with 32-bit types, the bound is i32.
    with jax.enable_x64(False):
        return call(*operands)[:rows]


def _after_prefetch(kernel, layer_ref, *refs):
    """`kernel(*refs)`: a kernel body called past the scalar-prefetch ref, which only the index maps read."""
    return kernel(*refs)
