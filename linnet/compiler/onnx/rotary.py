"""Rotary position embeddings as one ONNX Runtime `com.microsoft` `RotaryEmbedding` node each, under `fast`.

The lowering writes `apply_rope` (linnet/std/rope.linnet, transformers' `apply_rotary_pos_emb`) as the seven nodes of
its body:

    x * unsqueeze(cos, 1) + concat([-x[..., R:], x[..., :R]], dim=-1) * unsqueeze(sin, 1)      x [B, H, S, 2R]

ONNX Runtime runs each node on its own, so that a SmolLM2 decode step spends its time on 14 such nodes a layer, not on
the arithmetic (bench/ort_profile.py). ORT's contrib op computes the same rotation in one kernel
(contrib_ops/cpu/bert/rotary_embedding.cc; schema `RotaryEmbedding`, com.microsoft, version 1):

    out[..., :R] = x1 * cos_cache[p] - x2 * sin_cache[p]      out[..., R:] = x1 * sin_cache[p] + x2 * cos_cache[p]

with x1, x2 the halves of x and p = position_ids[b, s]. That is the body's arithmetic when the body's `cos` and `sin`
repeat their first half in their second (rope_cos_sin: `cos(concat([freqs, freqs]))`), which `fuse_rotary_embedding`
proves from the graph before it rewrites anything: `cos` and `sin` must be `Cos` and `Sin` of one `Concat([f, f])`
along the last axis (through `Cast`s, which keep equal halves equal). The caches handed to the op are the body's own
cos and sin, their first halves flattened to [B * S, R], and position_ids [B, S] = b * S + s, so row (b, s) reads its
own angles: the rotation is the one the source computes, at whatever positions the source computed them for.

Only the rounding may differ: ORT's kernel may fuse a multiply and an add, so this is a `fast` rewrite
(`lower_entry` applies it under `fast` only; a model written by `linnet onnx --numerics fast` then runs on ONNX
Runtime only). f32 only: the CPU provider registers the op for float and float16, and float16 is not what `fast`
asks for on the CPU. A partial rotary (Phi-3's, rope.linnet applied to x's first dims) is a full rotation of that
slice and is fused; anything that does not match stays as written: an interleaved rotation, cos and sin that are
not the plain Cos and Sin of repeated angles (Phi-3's longrope and gpt-oss's YaRN scale them), angles broadcast over
the batch or the sequence (cos [1, S, 2R] for x [B, H, S, 2R]).

Measured with bench/generate_speed.py-style A/B runs (one process per arm, SmolLM2-135M, 512 + 128 tokens, 2 threads,
an Intel Xeon with AVX-512): f32 decode 32.8 -> 35.6 tok/s; stored `fast` 66.5 -> 70 tok/s.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.convenience import get_const_tensor

from .quantized import MS_DOMAIN

__all__ = ["fuse_rotary_embedding"]


def fuse_rotary_embedding(model: ir.Model) -> int:
    """Rewrites each rotate-half rotary embedding of `model`'s main graph whose cos and sin provably repeat their
    halves into one `com.microsoft.RotaryEmbedding` (see the module docstring); returns how many. x must be
    f32 [B, H, S, 2R] with 2R known. Adds the com.microsoft opset import when it fuses one."""
    graph = model.graph
    caches: dict[tuple[int, int], tuple[ir.Value, ir.Value, ir.Value]] = {}
    bodies: list[ir.Node] = []
    fused = 0
    for node in list(graph):
        match = _match(node)
        if match is None:
            continue
        x, cos, sin, half = match
        bodies += _body(node, stop={id(x), id(cos), id(sin)})
        key = (id(cos), id(sin))
        if key not in caches:
            prep, caches[key] = _caches(cos, sin, half)
            graph.insert_before(node, prep)
        position_ids, cos_cache, sin_cache = caches[key]
        rotary = ir.node("RotaryEmbedding", [x, position_ids, cos_cache, sin_cache], domain=MS_DOMAIN)
        written, out = node.outputs[0], rotary.outputs[0]
        out.dtype, out.shape = written.dtype, written.shape
        out.name, written.name = written.name, f"{written.name}_written"  # the name (an output's, say) moves over
        graph.insert_before(node, rotary)
        written.replace_all_uses_with(out, replace_graph_outputs=True)
        fused += 1
    if fused:
        _drop_dead(graph, bodies)
        model.opset_imports.setdefault(MS_DOMAIN, 1)
    return fused


def _match(add: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value, int] | None:
    """(x, cos, sin, R) when `add` is x * unsqueeze(cos, 1) + rotate_half(x) * unsqueeze(sin, 1) with cos and sin
    repeating their halves, else None."""
    if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
        return None
    for plain, rotated in (add.inputs, add.inputs[::-1]):
        for x, cos4 in _mul_operands(plain):
            for turned, sin4 in _mul_operands(rotated):
                half = _rotate_half_of(turned, x)
                if half is None or not _is_f32_bhsd(x, 2 * half):
                    continue
                cos, sin = _unsqueezed_1(cos4), _unsqueezed_1(sin4)
                if cos is None or sin is None or not _halves_repeat(cos, sin):
                    continue
                if not (_rows_of(cos, x) and _rows_of(sin, x)):
                    continue
                if cos.dtype != x.dtype or sin.dtype != x.dtype:
                    continue
                return x, cos, sin, half
    return None


def _mul_operands(v: ir.Value | None) -> list[tuple[ir.Value, ir.Value]]:
    """Both orders of a Mul's operands when `v` is a Mul's output."""
    node = v.producer() if v is not None else None
    if node is None or node.op_type != "Mul" or node.domain != "" or len(node.inputs) != 2:
        return []
    a, b = node.inputs
    return [(a, b), (b, a)]


def _rotate_half_of(v: ir.Value, x: ir.Value) -> int | None:
    """R when `v` is concat([-x[..., R:2R], x[..., :R]], axis=-1) of a rank-4 x with last dim 2R."""
    concat = v.producer()
    if concat is None or concat.op_type != "Concat" or len(concat.inputs) != 2:
        return None
    if _last_axis(concat.attributes.get_int("axis", 0), x) is None:
        return None
    neg, first = (u.producer() if u is not None else None for u in concat.inputs)
    if neg is None or neg.op_type != "Neg" or first is None:
        return None
    second = neg.inputs[0].producer() if neg.inputs[0] is not None else None
    width = _static_last_dim(x)
    if width is None or width % 2:
        return None
    half = width // 2
    if _slice_of(first, x) != (0, half) or _slice_of(second, x) != (half, width):
        return None
    return half


def _slice_of(node: ir.Node | None, x: ir.Value) -> tuple[int, int] | None:
    """(start, end) of a unit-step Slice of `x` along its last axis, the end clamped to the dim."""
    if node is None or node.op_type != "Slice" or node.inputs[0] is not x or len(node.inputs) < 4:
        return None
    starts, ends, axes = (_ints(v) for v in node.inputs[1:4])
    steps = _ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if starts is None or ends is None or axes is None or steps != [1] or len(starts) != 1 or len(axes) != 1:
        return None
    width = _static_last_dim(x)
    if _last_axis(axes[0], x) is None or width is None or starts[0] < 0 or ends[0] < 0:
        return None
    return starts[0], min(ends[0], width)


def _unsqueezed_1(v: ir.Value) -> ir.Value | None:
    """t when `v` is Unsqueeze(t, axes=[1]) of a rank-3 t."""
    node = v.producer()
    if node is None or node.op_type != "Unsqueeze" or len(node.inputs) != 2 or _ints(node.inputs[1]) != [1]:
        return None
    t = node.inputs[0]
    return t if t.shape is not None and len(t.shape) == 3 else None


def _rows_of(angles: ir.Value, x: ir.Value) -> bool:
    """Whether cos or sin [B', S', 2R] has x [B, H, S, 2R]'s own B and S (the same number or the same symbolic
    dim), not a broadcast 1: the op reads one row of its caches per (b, s) of x, through position_ids made from
    the angles' own shape (ORT refuses a batch dim that differs)."""
    a, b = angles.shape, x.shape
    return all(d is not None and d == e for d, e in ((a[0], b[0]), (a[1], b[2])))


def _halves_repeat(cos: ir.Value, sin: ir.Value) -> bool:
    """Whether cos and sin are Cos and Sin (through Casts) of one Concat([f, f]) along its last axis."""
    cos_node, sin_node = _through_casts(cos), _through_casts(sin)
    if cos_node is None or sin_node is None or cos_node.op_type != "Cos" or sin_node.op_type != "Sin":
        return False
    angles = cos_node.inputs[0]
    if sin_node.inputs[0] is not angles:
        return False
    concat = angles.producer()
    if concat is None or concat.op_type != "Concat" or len(concat.inputs) != 2:
        return False
    if concat.inputs[0] is not concat.inputs[1]:
        return False
    return _last_axis(concat.attributes.get_int("axis", 0), angles) is not None


def _through_casts(v: ir.Value) -> ir.Node | None:
    node = v.producer()
    while node is not None and node.op_type == "Cast":
        node = node.inputs[0].producer()
    return node


def _is_f32_bhsd(x: ir.Value, width: int) -> bool:
    return x.dtype == ir.DataType.FLOAT and x.shape is not None and len(x.shape) == 4 and x.shape[3] == width


def _static_last_dim(x: ir.Value) -> int | None:
    if x.shape is None or len(x.shape) == 0:
        return None
    last = x.shape[-1]
    return last if isinstance(last, int) else None


def _last_axis(axis: int, v: ir.Value) -> int | None:
    """`axis` when it names `v`'s last axis (-1 or rank - 1), else None."""
    if v.shape is None:
        return axis if axis == -1 else None
    return axis if axis in (-1, len(v.shape) - 1) else None


def _ints(v: ir.Value | None) -> list[int] | None:
    """A constant's integers (an initializer or a Constant node's value), else None."""
    tensor = get_const_tensor(v) if v is not None else None
    return None if tensor is None else [int(a) for a in np.asarray(tensor.numpy()).ravel()]


def _caches(cos: ir.Value, sin: ir.Value, half: int) -> tuple[list[ir.Node], tuple[ir.Value, ir.Value, ir.Value]]:
    """The nodes making (position_ids [B, S] = b * S + s, cos_cache, sin_cache [B * S, R]) from cos and sin
    [B, S, 2R]: made once per cos/sin pair, before the first rotation that reads them."""
    nodes: list[ir.Node] = []

    def make(op: str, inputs: list[ir.Value], **attributes) -> ir.Value:
        node = ir.node(op, inputs, attributes=attributes)
        nodes.append(node)
        return node.outputs[0]

    def const(values, scalar: bool = False) -> ir.Value:
        array = np.array(values, dtype=np.int64)
        return make("Constant", [], value=ir.tensor(array.reshape(()) if scalar else array))

    first_half = [const([0]), const([half]), const([-1])]
    flat = const([-1, half])
    cos_cache = make("Reshape", [make("Slice", [cos, *first_half]), flat])
    sin_cache = make("Reshape", [make("Slice", [sin, *first_half]), flat])
    batch_and_seq = make("Slice", [make("Shape", [cos]), const([0]), const([2])])
    rows = make("ReduceProd", [batch_and_seq], keepdims=0)
    position_ids = make("Reshape", [make("Range", [const(0, True), rows, const(1, True)]), batch_and_seq])
    for v, dtype in ((cos_cache, cos.dtype), (sin_cache, sin.dtype), (position_ids, ir.DataType.INT64)):
        v.dtype = dtype
    return nodes, (position_ids, cos_cache, sin_cache)


def _body(add: ir.Node, stop: set[int]) -> list[ir.Node]:
    """The nodes of a matched rotation, from its Add back to (not into) x, cos and sin."""
    seen: dict[int, ir.Node] = {}
    todo = [add]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        for v in node.inputs:
            if v is not None and id(v) not in stop and v.producer() is not None:
                todo.append(v.producer())
    return list(seen.values())


def _drop_dead(graph: ir.Graph, candidates: list[ir.Node]) -> None:
    """Removes those of `candidates` (the rotations' old bodies) whose outputs nothing reads any more; an
    Unsqueeze of cos another node still reads stays."""
    outputs = set(map(id, graph.outputs))
    left = {id(n): n for n in candidates}
    changed = True
    while changed:
        changed = False
        for key, node in list(left.items()):
            if all(not v.uses() and id(v) not in outputs for v in node.outputs):
                graph.remove(node, safe=True)
                del left[key]
                changed = True
