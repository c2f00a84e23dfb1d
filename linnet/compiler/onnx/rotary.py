"""`apply_rope` (linnet/std/rope.linnet, transformers' `apply_rotary_pos_emb`) natively: one ONNX Runtime
`com.microsoft` `RotaryEmbedding` node a rotation, under `fast`.

The composite's body is seven nodes:

    x * unsqueeze(cos, 1) + concat([-x[..., R:], x[..., :R]], dim=-1) * unsqueeze(sin, 1)      x [B, H, S, 2R]

ONNX Runtime runs each node on its own, so that a SmolLM2 decode step spends its time on 14 such nodes a layer, not on
the arithmetic (bench/ort_profile.py). ORT's contrib op computes the same rotation in one kernel
(contrib_ops/cpu/bert/rotary_embedding.cc; schema `RotaryEmbedding`, com.microsoft, version 1):

    out[..., :R] = x1 * cos_cache[p] - x2 * sin_cache[p]      out[..., R:] = x1 * sin_cache[p] + x2 * cos_cache[p]

with x1, x2 the halves of x and p = position_ids[b, s]. That is the body's arithmetic when `cos` and `sin` repeat
their first half in their second (rope_cos_sin: `cos(concat([freqs, freqs]))`), which `native_apply_rope` proves
from the program before it lowers anything: `cos` and `sin` must be the `cos` and `sin` ops of one
`concat([f, f])` along the last dim (through `cast`s, which keep equal halves equal). The caches handed to the op
are the body's own cos and sin, their first halves flattened to [B * S, R], and position_ids [B, S] = b * S + s,
so row (b, s) reads its own angles: the rotation is the one the source computes, at whatever positions the source
computed them for.

Only the rounding may differ: ORT's kernel may fuse a multiply and an add, so this native form is `fast`'s alone
(`PASSES.native`; a model written by `linnet onnx --numerics fast` then runs on ONNX Runtime only). f32 only: the
CPU provider registers the op for float and float16, and float16 is not what `fast` asks for on the CPU. A partial
rotary (Phi-3's, applied to x's first dims) is a full rotation of that slice; anything else runs the body: cos and
sin that are not the plain cos and sin of repeated angles (Phi-3's longrope and gpt-oss's YaRN scale them), angles
broadcast over the batch or the sequence (cos [1, S, 2R] for x [B, H, S, 2R]).

Measured with bench/generate_speed.py-style A/B runs (one process per arm, SmolLM2-135M, 512 + 128 tokens, 2 threads,
an Intel Xeon with AVX-512): f32 decode 32.8 -> 35.6 tok/s; stored `fast` 66.5 -> 70 tok/s (as the graph rewrite
this replaced).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from linnet.ir.core import Op, Value

from .quantized import MS_DOMAIN

__all__ = ["native_apply_rope"]


def native_apply_rope(L: Any, op: Op) -> ir.Value | None:
    """The `apply_rope` composite `op` as one `RotaryEmbedding` node on the lowering `L`, or None (the body runs)
    when its operands do not provably fit the op (see the module docstring). The caches are made once per cos and
    sin pair, before the first rotation that reads them (`L.rotary_caches`)."""
    x, cos, sin = op.args["x"], op.args["cos"], op.args["sin"]
    if len(x.dims) != 4 or any(v.dtype.name != "f32" for v in (x, cos, sin)):
        return None
    width = x.dims[3].as_int()
    if width is None or width % 2 or not _halves_repeat(cos, sin) or not (_rows_of(cos, x) and _rows_of(sin, x)):
        return None
    key = (id(cos), id(sin))
    if key not in L.rotary_caches:
        L.rotary_caches[key] = _caches(L, L.get(cos), L.get(sin), width // 2)
    position_ids, cos_cache, sin_cache = L.rotary_caches[key]
    inputs = [L.get(x), position_ids, cos_cache, sin_cache]
    return L.op("RotaryEmbedding", inputs, hint=op.result.name, like=op.result, domain=MS_DOMAIN)


def _rows_of(angles: Value, x: Value) -> bool:
    """Whether cos or sin [B', S', 2R] has x [B, H, S, 2R]'s own B and S (the same number or the same symbolic
    dim), not a broadcast 1: the op reads one row of its caches per (b, s) of x, through position_ids made from
    the angles' own shape (ORT refuses a batch dim that differs)."""
    return len(angles.dims) == 3 and angles.dims[0] == x.dims[0] and angles.dims[1] == x.dims[2]


def _halves_repeat(cos: Value, sin: Value) -> bool:
    """Whether cos and sin are the `cos` and `sin` ops (through `cast`s) of one `concat([f, f])` along its last
    dim."""
    cos_op, sin_op = _through_casts(cos), _through_casts(sin)
    if cos_op is None or sin_op is None or cos_op.name != "cos" or sin_op.name != "sin":
        return False
    angles = cos_op.args["x"]
    if sin_op.args["x"] is not angles or angles.producer is None or angles.producer.name != "concat":
        return False
    concat = angles.producer
    parts, dim = concat.args["xs"], concat.args.get("dim", -1)
    return len(parts) == 2 and parts[0] is parts[1] and dim in (-1, len(angles.dims) - 1)


def _through_casts(v: Value) -> Op | None:
    op = v.producer
    while op is not None and op.name == "cast":
        op = op.args["x"].producer
    return op


def _caches(L: Any, cos: ir.Value, sin: ir.Value, half: int) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(position_ids [B, S] = b * S + s, cos_cache, sin_cache [B * S, R]) from cos and sin [B, S, 2R]."""

    def i64(values, scalar: bool = False) -> ir.Value:
        array = np.array(values, dtype=np.int64)
        return L.const(array.reshape(()) if scalar else array)

    first_half = [i64([0]), i64([half]), i64([-1])]
    flat = i64([-1, half])
    cos_cache = L.op("Reshape", [L.op("Slice", [cos, *first_half]), flat], hint="cos_cache")
    sin_cache = L.op("Reshape", [L.op("Slice", [sin, *first_half]), flat], hint="sin_cache")
    batch_and_seq = L.op("Slice", [L.op("Shape", [cos]), i64([0]), i64([2])], hint="batch_and_seq")
    rows = L.op("ReduceProd", [batch_and_seq], {"keepdims": 0}, hint="rows")
    ids = L.op("Range", [i64(0, True), rows, i64(1, True)], hint="position_ids")
    position_ids = L.op("Reshape", [ids, batch_and_seq], hint="position_ids")
    for v, dtype in ((cos_cache, cos.dtype), (sin_cache, sin.dtype), (position_ids, ir.DataType.INT64)):
        v.dtype = dtype
    return position_ids, cos_cache, sin_cache
