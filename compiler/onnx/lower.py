"""Core IR to ONNX, built with onnx-ir (the builder torch's own exporter uses; no hand-written
protobuf). This file imports onnx-ir and numpy, never onnxruntime: lowering needs no runtime.

`lower_entry(program, name, params=...)` gives one `onnx_ir.Model` per entry:

- inputs named as the entry's parameters (`input_ids`, `positions`, `rows`); the entry's
  symbolic dims (`B`, `S`) are symbolic ONNX dims, and so are the dims computed from them
  (`B * S`); every value carries its Linnet type;
- parameters are initializers named by checkpoint name when `params` gives their values
  (`params="inputs"`: graph inputs of the same names, for a graph without weights);
- the KV cache of a decoder: layer i's state tensors in program order are the inputs
  `past_key_values.i.key` / `.value` and the new values the outputs `present.i.key` /
  `.value`; `cache_write` is a `ScatterND` over (row, head, position) index triples, so the
  present tensor is the past one with the new block written and a runtime may bind both to
  one buffer;
- a `composite` is lowered by its body (its meaning), except where a native ONNX op computes
  what the reference implementation computes (`NATIVE`: Softmax, Gelu, LayerNormalization
  under `equivalent`). GQA is the body's `repeat_interleave` (query head h reads KV head
  h // G), lowered as Unsqueeze + Expand + Reshape, never as a Tile.

`UNSUPPORTED` lists registry ops without a lowering, each with its reason (the op test
holds every registry op to one of the two).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx_ir as ir

from linnet.ir.core import Graph, Op, Program, Value
from linnet.ops.rearrange import rearrange_plan
from linnet.semantics.dims import Dim, format_dim
from linnet.semantics.types import DType

OPSET = 21
IR_VERSION = 10
NUMERICS = ("equivalent", "fast")
INT64_MAX = np.iinfo(np.int64).max

ONNX_DTYPES = {
    "f64": ir.DataType.DOUBLE,
    "f32": ir.DataType.FLOAT,
    "f16": ir.DataType.FLOAT16,
    "bf16": ir.DataType.BFLOAT16,
    "i64": ir.DataType.INT64,
    "i32": ir.DataType.INT32,
    "bool": ir.DataType.BOOL,
}
NP_DTYPES = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "i64": np.int64,
    "i32": np.int32,
    "bool": np.bool_,
}

# Registry ops the ONNX backend cannot express, with the reason (none at present).
UNSUPPORTED: dict[str, str] = {}


class LoweringError(Exception):
    """An op, dtype or argument the ONNX backend cannot express (names the op)."""


def np_dtype(dtype: DType | str):
    name = dtype if isinstance(dtype, str) else dtype.name
    if name == "bf16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return NP_DTYPES[name]


def cache_names(program: Program) -> dict[str, tuple[str, str]]:
    """State path -> (input name, output name): layer i's cache tensors, in program order, are
    `past_key_values.i.key` / `.value` in and `present.i.key` / `.value` out. The layer is the
    path without its last segment (`model.layers.3.self_attn`); the last segment says key or
    value (`k_cache`, `v_cache`). Other state keeps its path (`past.PATH` / `present.PATH`)."""
    layers: dict[str, int] = {}
    out: dict[str, tuple[str, str]] = {}
    for spec in program.state:
        owner, _, last = spec.path.rpartition(".")
        kind = "key" if last.startswith("k") else "value" if last.startswith("v") else None
        if kind is None:
            out[spec.path] = (f"past.{spec.path}", f"present.{spec.path}")
            continue
        i = layers.setdefault(owner, len(layers))
        out[spec.path] = (f"past_key_values.{i}.{kind}", f"present.{i}.{kind}")
    return out


# ----------------------------------------------------------------------------- the lowering


@dataclass
class Lowering:
    """Lowers one graph onto a tape. `values` maps Core IR values (by id) to ONNX values."""

    numerics: str = "equivalent"
    tape: ir.tape.Tape = field(default_factory=ir.tape.Tape)
    values: dict[int, ir.Value] = field(default_factory=dict)
    dim_sources: dict[str, ir.Value] = field(default_factory=dict)  # dim var -> int64[1]
    dim_cache: dict[Any, ir.Value] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    param_values: dict[str, ir.Value] = field(default_factory=dict)
    state_values: dict[str, ir.Value] = field(default_factory=dict)
    consts: dict[Any, ir.Value] = field(default_factory=dict)

    # ----- naming and typing
    def fresh(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint or "t") or "t"
        name, n = base, 0
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    def op(self, op_type: str, inputs, attributes=None, hint: str = "", like: Value | None = None) -> ir.Value:
        out = self.tape.op(op_type, list(inputs), attributes or None)
        out.name = self.fresh(hint or op_type.lower())
        if like is not None:
            set_type(out, like)
        return out

    def get(self, v: Value) -> ir.Value:
        try:
            return self.values[id(v)]
        except KeyError:
            raise LoweringError(f"%{v.name} is used before it is defined") from None

    def const(self, array: np.ndarray, hint: str = "c") -> ir.Value:
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.consts:
            out = self.op("Constant", [], {"value": ir.tensor(array)}, hint=hint)
            out.dtype = ir.DataType(ir.tensor(array).dtype)
            out.shape = ir.Shape(array.shape)
            self.consts[key] = out
        return self.consts[key]

    def operand(self, x, dtype: DType) -> ir.Value:
        """A value, or a compile-time number as a 0-d constant of `dtype` (numbers are weak)."""
        if isinstance(x, Value):
            return self.get(x)
        if isinstance(x, Dim):
            x = x.as_int()
        return self.const(np.array(x, dtype=np_dtype(dtype)), "scalar")

    # ----- dims
    def dim(self, d: Dim) -> ir.Value:
        """int64[1] holding `d` (a polynomial in the entry's dims, computed from input shapes)."""
        n = d.as_int()
        if n is not None:
            return self.const(np.array([n], dtype=np.int64), "dim")
        key = d.key()
        if key in self.dim_cache:
            return self.dim_cache[key]
        total = None
        for mono, coeff in d.val.terms:
            term = self.const(np.array([coeff], dtype=np.int64), "coeff") if (coeff != 1 or not mono) else None
            for atom, power in mono:
                if atom.name not in self.dim_sources:
                    raise LoweringError(f"dim `{format_dim(d)}`: `{atom.name}` is not a dim of the entry's inputs")
                for _ in range(power):
                    factor = self.dim_sources[atom.name]
                    term = factor if term is None else self.op("Mul", [term, factor], hint="dim")
            total = term if total is None else self.op("Add", [total, term], hint="dim")
        self.dim_cache[key] = total
        return total

    def scalar_dim(self, d: Dim) -> ir.Value:
        n = d.as_int()
        if n is not None:
            return self.const(np.array(n, dtype=np.int64), "dim")
        return self.op("Squeeze", [self.dim(d), self.const(np.array([0], dtype=np.int64), "axes")], hint="dim")

    def shape(self, dims) -> ir.Value:
        """int64[len(dims)] of a shape."""
        dims = [d if isinstance(d, Dim) else Dim.of(d) for d in dims]
        if all(d.as_int() is not None for d in dims):
            return self.const(np.array([d.as_int() for d in dims], dtype=np.int64), "shape")
        parts = [self.dim(d) for d in dims]
        return self.op("Concat", parts, {"axis": 0}, hint="shape")

    # ----- graphs
    def graph(self, g: Graph) -> None:
        for op in g.ops:
            self.lower_op(op)

    def lower_op(self, op: Op) -> None:
        if op.name == "composite":
            return self.composite(op)
        if op.name == "param":
            self.values[id(op.result)] = self.param_values[op.attrs["path"]]
            return
        if op.name == "state":
            self.values[id(op.result)] = self.state_values[op.attrs["path"]]
            return
        lower = LOWERINGS.get(op.name)
        if lower is None:
            raise LoweringError(f"the ONNX backend has no lowering for `{op.name}`")
        out = lower(self, op)
        outs = out if isinstance(out, (list, tuple)) else [out]
        for v, o in zip(op.results, outs):
            set_type(o, v)
            self.values[id(v)] = o

    def composite(self, op: Op) -> None:
        name = op.attrs["name"]
        native = NATIVE.get(name)
        if native is not None and self.numerics in native[0]:
            out = native[1](self, op)
            set_type(out, op.result)
            self.values[id(op.result)] = out
            return
        body = op.body
        for iv in body.inputs:
            self.values[id(iv)] = self.get(op.args[iv.name])
        self.graph(body)
        for outer, inner in zip(op.results, body.outputs):
            self.values[id(outer)] = self.get(inner)


def ir_shape(dims) -> ir.Shape:
    return ir.Shape([d.as_int() if d.as_int() is not None else format_dim(d) for d in dims])


def set_type(out: ir.Value, v: Value) -> None:
    out.dtype = ONNX_DTYPES[v.dtype.name]
    out.shape = ir_shape(v.dims)


# ----------------------------------------------------------------------------- op lowerings

Lower = Callable[[Lowering, Op], "ir.Value | list[ir.Value]"]
LOWERINGS: dict[str, Lower] = {}


def _unary(onnx_op: str) -> Lower:
    return lambda L, op: L.op(onnx_op, [L.get(op.args["x"])], hint=op.result.name)


for _name, _onnx in {
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "sin": "Sin",
    "cos": "Cos",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "erf": "Erf",
    "abs": "Abs",
    "neg": "Neg",
    "logical_not": "Not",
}.items():
    LOWERINGS[_name] = _unary(_onnx)


def _rsqrt(L: Lowering, op: Op) -> ir.Value:
    return L.op("Reciprocal", [L.op("Sqrt", [L.get(op.args["x"])])], hint=op.result.name)


LOWERINGS["rsqrt"] = _rsqrt


def _operand_dtype(op: Op) -> DType:
    """The dtype numbers in a binary op take: the tensor operand's."""
    for k in ("x", "y"):
        if isinstance(op.args[k], Value):
            return op.args[k].dtype
    return op.result.dtype


def _binary(onnx_op: str, attributes: dict | None = None, negate: bool = False) -> Lower:
    def lower(L: Lowering, op: Op) -> ir.Value:
        dtype = _operand_dtype(op)
        x, y = L.operand(op.args["x"], dtype), L.operand(op.args["y"], dtype)
        out = L.op(onnx_op, [x, y], attributes, hint=op.result.name)
        return L.op("Not", [out], hint=op.result.name) if negate else out

    return lower


for _name, _onnx in {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "pow": "Pow",
    "maximum": "Max",
    "minimum": "Min",
    "eq": "Equal",
    "lt": "Less",
    "le": "LessOrEqual",
    "gt": "Greater",
    "ge": "GreaterOrEqual",
    "logical_and": "And",
    "logical_or": "Or",
}.items():
    LOWERINGS[_name] = _binary(_onnx)
LOWERINGS["ne"] = _binary("Equal", negate=True)
LOWERINGS["mod"] = _binary("Mod", {"fmod": 0})  # integers; the divisor's sign, as Python's and torch's %


def _reduction(onnx_op: str) -> Lower:
    def lower(L: Lowering, op: Op) -> ir.Value:
        x = L.get(op.args["x"])
        if onnx_op == "ReduceSum" and op.args["x"].dtype.name == "bool":
            x = L.op("Cast", [x], {"to": ir.DataType.INT64})  # counts are i64 (the registry's dtype rule)
        axes = L.const(np.array([op.args["dim"]], dtype=np.int64), "axes")
        return L.op(onnx_op, [x, axes], {"keepdims": int(bool(op.args["keepdim"]))}, hint=op.result.name)

    return lower


for _name, _onnx in {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin"}.items():
    LOWERINGS[_name] = _reduction(_onnx)
LOWERINGS["argmax"] = lambda L, op: L.op(
    "ArgMax",
    [L.get(op.args["x"])],
    {"axis": op.args["dim"], "keepdims": int(bool(op.args["keepdim"])), "select_last_index": 0},
    hint=op.result.name,
)
LOWERINGS["matmul"] = lambda L, op: L.op("MatMul", [L.get(op.args["x"]), L.get(op.args["y"])], hint=op.result.name)
LOWERINGS["reshape"] = lambda L, op: L.op(
    "Reshape", [L.get(op.args["x"]), L.shape(op.args["shape"])], hint=op.result.name
)


def _perm(rank: int, dim0: int, dim1: int) -> list[int]:
    perm = list(range(rank))
    a, b = dim0 % rank, dim1 % rank
    perm[a], perm[b] = perm[b], perm[a]
    return perm


LOWERINGS["transpose"] = lambda L, op: L.op(
    "Transpose",
    [L.get(op.args["x"])],
    {"perm": _perm(op.args["x"].rank, op.args["dim0"], op.args["dim1"])},
    hint=op.result.name,
)
LOWERINGS["permute"] = lambda L, op: L.op(
    "Transpose", [L.get(op.args["x"])], {"perm": [int(d) for d in op.args["dims"]]}, hint=op.result.name
)
LOWERINGS["unsqueeze"] = lambda L, op: L.op(
    "Unsqueeze", [L.get(op.args["x"]), L.const(np.array([op.args["dim"]], dtype=np.int64), "axes")], hint=op.result.name
)
LOWERINGS["squeeze"] = lambda L, op: L.op(
    "Squeeze", [L.get(op.args["x"]), L.const(np.array([op.args["dim"]], dtype=np.int64), "axes")], hint=op.result.name
)
LOWERINGS["expand"] = lambda L, op: L.op(
    "Expand", [L.get(op.args["x"]), L.shape(op.args["shape"])], hint=op.result.name
)
LOWERINGS["concat"] = lambda L, op: L.op(
    "Concat", [L.get(x) for x in op.args["xs"]], {"axis": op.args["dim"]}, hint=op.result.name
)
LOWERINGS["cast"] = lambda L, op: L.op(
    "Cast", [L.get(op.args["x"])], {"to": ONNX_DTYPES[op.args["dtype"].name]}, hint=op.result.name
)


def _split(L: Lowering, op: Op) -> list[ir.Value]:
    sizes = L.shape(op.args["sizes"])
    outs = L.tape.op_multi_out(
        "Split", [L.get(op.args["x"]), sizes], {"axis": op.args["dim"]}, num_outputs=len(op.args["sizes"])
    )
    for o, v in zip(outs, op.results):
        o.name = L.fresh(v.name)
    return list(outs)


LOWERINGS["split"] = _split


def _repeat_interleave(L: Lowering, op: Op) -> ir.Value:
    """Each slice along `dim` repeated in place: unsqueeze after `dim`, expand that axis to
    `repeats`, merge the two (query head h of GQA reads KV head h // repeats)."""
    x: Value = op.args["x"]
    dim = op.args["dim"] % x.rank
    repeats = op.args["repeats"]
    repeats = repeats if isinstance(repeats, Dim) else Dim.of(repeats)
    dims = list(x.dims)
    wide = dims[: dim + 1] + [repeats] + dims[dim + 1 :]
    u = L.op("Unsqueeze", [L.get(x), L.const(np.array([dim + 1], dtype=np.int64), "axes")], hint="repeat")
    e = L.op("Expand", [u, L.shape(wide)], hint="repeat")
    e.dtype, e.shape = ONNX_DTYPES[x.dtype.name], ir_shape(wide)
    return L.op("Reshape", [e, L.shape(op.result.dims)], hint=op.result.name)


LOWERINGS["repeat_interleave"] = _repeat_interleave


def _rearrange(L: Lowering, op: Op) -> ir.Value:
    x: Value = op.args["x"]
    expanded, perm, out = rearrange_plan(list(x.dims), op.args["pattern"], dict(op.args["sizes"]))
    cur = L.get(x)
    if [d.key() for d in expanded] != [d.key() for d in x.dims]:
        cur = L.op("Reshape", [cur, L.shape(expanded)], hint="rearrange")
    if perm != list(range(len(perm))):
        cur = L.op("Transpose", [cur], {"perm": list(perm)}, hint="rearrange")
    permuted = [expanded[i] for i in perm]
    if [d.key() for d in out] != [d.key() for d in permuted]:
        cur = L.op("Reshape", [cur, L.shape(out)], hint="rearrange")
    if cur is L.get(x):
        cur = L.op("Identity", [cur], hint=op.result.name)
    return cur


LOWERINGS["rearrange"] = _rearrange
LOWERINGS["take"] = lambda L, op: L.op(
    "Gather", [L.get(op.args["x"]), L.get(op.args["indices"])], {"axis": op.args["dim"]}, hint=op.result.name
)


def _bound(L: Lowering, d, default: int) -> ir.Value:
    if d is None:
        return L.const(np.array([default], dtype=np.int64), "bound")
    return L.dim(d if isinstance(d, Dim) else Dim.of(d))


LOWERINGS["slice"] = lambda L, op: L.op(
    "Slice",
    [
        L.get(op.args["x"]),
        _bound(L, op.args["start"], 0),
        _bound(L, op.args["stop"], INT64_MAX),
        L.const(np.array([op.args["dim"]], dtype=np.int64), "axes"),
    ],
    hint=op.result.name,
)
LOWERINGS["select"] = lambda L, op: L.op(
    "Gather", [L.get(op.args["x"]), L.scalar_dim(op.args["index"])], {"axis": op.args["dim"]}, hint=op.result.name
)
LOWERINGS["where"] = lambda L, op: L.op(
    "Where",
    [L.get(op.args["cond"]), L.operand(op.args["x"], op.result.dtype), L.operand(op.args["y"], op.result.dtype)],
    hint=op.result.name,
)


def _arange(L: Lowering, op: Op) -> ir.Value:
    start, stop, step = op.args["start"], op.args["stop"], op.args["step"]
    if stop is None:
        start, stop = Dim.of(0), start
    step = Dim.of(1) if step is None else step
    return L.op("Range", [L.scalar_dim(start), L.scalar_dim(stop), L.scalar_dim(step)], hint=op.result.name)


def _fill(L: Lowering, op: Op, value) -> ir.Value:
    dtype = op.args["dtype"]
    fill = ir.tensor(np.array([value], dtype=np_dtype(dtype)))
    return L.op("ConstantOfShape", [L.shape(op.args["shape"])], {"value": fill}, hint=op.result.name)


LOWERINGS["arange"] = _arange
LOWERINGS["full"] = lambda L, op: _fill(L, op, op.args["value"])
LOWERINGS["zeros"] = lambda L, op: _fill(L, op, 0)
LOWERINGS["ones"] = lambda L, op: _fill(L, op, 1)


def _min_value(L: Lowering, op: Op) -> ir.Value:
    dt = np_dtype(op.args["dtype"])
    import ml_dtypes

    info = ml_dtypes.finfo(dt) if op.args["dtype"].name == "bf16" else np.finfo(dt)
    return L.op("Identity", [L.const(np.array(info.min, dtype=dt), "min_value")], hint=op.result.name)


LOWERINGS["min_value"] = _min_value


def _cache_write(L: Lowering, op: Op) -> ir.Value:
    """`ScatterND` of `new` [B, H, S, D] into `cache` [R, H, P, D] at index triples
    (rows[b], h, positions[b] + s) [B, H, S, 3]. The index triples of one step are made once
    (shared by the key and value caches)."""
    cache, rows, positions, new = (op.args[k] for k in ("cache", "rows", "positions", "new"))
    b, h, s, _ = new.dims
    key = ("cache_index", id(rows), id(positions), h.key(), s.key())
    if key not in L.dim_cache:
        i64 = lambda a: L.const(np.array(a, dtype=np.int64), "axes")  # noqa: E731
        full = L.shape([b, h, s, Dim.of(1)])
        r = L.op("Unsqueeze", [L.get(rows), i64([1, 2, 3])], hint="row_index")  # [B, 1, 1, 1]
        r = L.op("Expand", [r, full], hint="row_index")
        heads = L.op("Range", [L.scalar_dim(Dim.of(0)), L.scalar_dim(h), L.scalar_dim(Dim.of(1))], hint="head_index")
        heads = L.op("Expand", [L.op("Unsqueeze", [heads, i64([0, 2, 3])], hint="head_index"), full], hint="head_index")
        steps = L.op("Range", [L.scalar_dim(Dim.of(0)), L.scalar_dim(s), L.scalar_dim(Dim.of(1))], hint="step")
        pos = L.op(
            "Add",
            [
                L.op("Unsqueeze", [L.get(positions), i64([1])], hint="position_index"),
                L.op("Unsqueeze", [steps, i64([0])]),
            ],
            hint="position_index",
        )  # [B, S]
        pos = L.op(
            "Expand", [L.op("Unsqueeze", [pos, i64([1, 3])], hint="position_index"), full], hint="position_index"
        )
        index = L.op("Concat", [r, heads, pos], {"axis": -1}, hint="cache_index")
        index.dtype, index.shape = ir.DataType.INT64, ir_shape([b, h, s, Dim.of(3)])
        L.dim_cache[key] = index
    return L.op("ScatterND", [L.get(cache), L.dim_cache[key], L.get(new)], hint=op.result.name)


LOWERINGS["cache_write"] = _cache_write


def _const(L: Lowering, op: Op) -> ir.Value:
    return L.op("Identity", [L.const(np.asarray(op.attrs["value"]), op.result.name or "c")], hint=op.result.name)


LOWERINGS["const"] = _const


# ----------------------------------------------------------------------------- native composites


def _layer_norm(L: Lowering, op: Op) -> ir.Value:
    x, w = op.args["x"], op.args["weight"]
    return L.op(
        "LayerNormalization",
        [L.get(x), L.get(w)],
        {"axis": -1, "epsilon": float(op.args["eps"]), "stash_type": 1},
        hint=op.result.name,
    )


NATIVE: dict[str, tuple[tuple[str, ...], Lower]] = {
    "softmax": (NUMERICS, lambda L, op: L.op("Softmax", [L.get(op.args["x"])], {"axis": -1}, hint=op.result.name)),
    "gelu": (NUMERICS, lambda L, op: L.op("Gelu", [L.get(op.args["x"])], {"approximate": "none"}, hint="gelu")),
    "gelu_tanh": (("fast",), lambda L, op: L.op("Gelu", [L.get(op.args["x"])], {"approximate": "tanh"}, hint="gelu")),
    "layer_norm": (NUMERICS, _layer_norm),
}


# ----------------------------------------------------------------------------- whole entries


def lower_entry(
    program: Program,
    name: str,
    params: dict[str, np.ndarray] | str | None = None,
    numerics: str = "equivalent",
) -> ir.Model:
    """Entry `name` of `program` as an ONNX model (see the module docstring). `params`: the
    parameters' values by checkpoint name (initializers), or "inputs" (graph inputs), or None
    (zero-filled initializers of the right shapes, as a placeholder)."""
    if numerics not in NUMERICS:
        raise LoweringError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    if name not in program.entries:
        raise LoweringError(f"no entry `{name}` (entries: {', '.join(program.entries)})")
    g = program.entries[name]
    L = Lowering(numerics)
    inputs: list[ir.Value] = []
    for v in g.inputs:
        iv = ir.Value(name=L.fresh(v.name))
        set_type(iv, v)
        L.values[id(v)] = iv
        inputs.append(iv)
    for dim, (i, axis) in g.dim_sources.items():
        L.dim_sources[dim] = L.op("Shape", [inputs[i]], {"start": axis, "end": axis + 1}, hint=dim)
    used_params = {op.attrs["path"] for op in _all_ops(g) if op.name == "param"}
    used_state = {op.attrs["path"] for op in _all_ops(g) if op.name == "state"}
    initializers: list[ir.Value] = []
    for spec in program.params:
        if spec.path not in used_params:
            continue
        pv = ir.Value(name=spec.path)
        pv.dtype, pv.shape = ONNX_DTYPES[spec.type.dtype.name], ir.Shape(spec.shape)
        L.names.add(spec.path)
        if params == "inputs":
            inputs.append(pv)
        else:
            array = params.get(spec.path) if isinstance(params, dict) else None
            if array is None:
                if isinstance(params, dict):
                    raise LoweringError(f"no value for parameter `{spec.path}`")
                array = np.zeros(spec.shape, dtype=np_dtype(spec.type.dtype))
            if tuple(array.shape) != spec.shape:
                raise LoweringError(f"parameter `{spec.path}` is {list(array.shape)}, the model {list(spec.shape)}")
            pv.const_value = ir.tensor(np.ascontiguousarray(array, dtype=np_dtype(spec.type.dtype)), name=spec.path)
            initializers.append(pv)
        L.param_values[spec.path] = pv
    names = cache_names(program)
    outputs: list[ir.Value] = []
    for spec in program.state:
        if spec.path not in used_state and spec.path not in g.state_updates:
            continue
        sv = ir.Value(name=names[spec.path][0])
        sv.dtype, sv.shape = ONNX_DTYPES[spec.type.dtype.name], ir.Shape(spec.shape)
        L.names.add(sv.name)
        inputs.append(sv)
        L.state_values[spec.path] = sv
    L.graph(g)
    taken = {v.name for v in inputs}
    for i, v in enumerate(g.outputs):
        out_name = _output_name(program, i, v, taken)
        out = L.get(v)
        if out.name in taken or out in inputs or out.producer() is None or out in outputs:
            out = L.op("Identity", [out], like=v)
        out.name = out_name
        taken.add(out_name)
        outputs.append(out)
    for path, v in g.state_updates.items():
        if v.producer is None or v.producer.name != "cache_write":
            raise LoweringError(f"state `{path}` is updated by `{v.producer.name}`; only cache_write writes state")
        out = L.get(v)
        if out.name in taken or out in outputs:
            out = L.op("Identity", [out], like=v)
        out.name = names[path][1]
        outputs.append(out)
    graph = ir.Graph(
        inputs,
        outputs,
        nodes=L.tape.nodes,
        initializers=initializers,
        opset_imports={"": OPSET},
        name=f"{program.model}_{name}",
    )
    return ir.Model(
        graph,
        ir_version=IR_VERSION,
        producer_name="linnet",
        doc_string=f"{program.model} from {program.source}, entry {name}: preset {program.preset or '(defaults)'}, "
        f"dtype {program.dtype.name}, numerics {numerics}, max_batch {program.max_batch}, "
        f"max_positions {program.max_positions}",
    )


def _output_name(program: Program, i: int, v: Value, taken: set[str]) -> str:
    """`logits` for an output as wide as the vocabulary, else `output` (`output_i` of several)."""
    vocab = program.config.get("vocab_size")
    base = "logits" if vocab is not None and v.dims and v.dims[-1].as_int() == vocab else "output"
    base = base if i == 0 else f"{base}_{i}"
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def _all_ops(g: Graph):
    for op in g.ops:
        yield op
        if op.body is not None:
            yield from _all_ops(op.body)


def to_proto(model: ir.Model):
    """The model as an `onnx.ModelProto`."""
    return ir.serde.serialize_model(model)
