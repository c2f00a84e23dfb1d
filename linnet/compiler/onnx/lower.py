"""Core IR to ONNX, built with onnx-ir (the builder torch's own exporter uses; no hand-written
protobuf). This file imports onnx-ir and numpy, never onnxruntime: lowering needs no runtime.

`lower_entry(program, name, params=...)` gives one `onnx_ir.Model` per entry, from the program
prepared with `PASSES` (`linnet.ir.pipeline`): every call inlined and every loop unrolled (an
ONNX graph is flat), linear layers that share an input fused, composites native where the
passes said so, attention variants recorded by the passes:

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
- a weight the passes fused (`Program.param_transforms`) is a Concat of its members'
  initializers, which ONNX Runtime folds when it makes the session; the graph's parameters
  stay the checkpoint's names;
- a `composite` is lowered by its body (its meaning), except where the passes marked it native
  (`NATIVE`: Softmax, Gelu, LayerNormalization under `equivalent`, and `attention`; under `fast`
  also an f32 `rms_norm` as RMSNormalization). Attention
  batches the G query heads of one KV head (query head h reads KV head h // G, the body's
  `repeat_interleave` routing) instead of
  repeating the keys and values; over the KV cache, decode reads the cache in place
  (`keys_first`) and prefill skips keys after the last attended position (`trim_keys`,
  `prefill_blocks`: exact rewrites the passes found to apply; `_grouped_attention`). A
  one-row cache (max_batch 1) is read without a Gather. `repeat_interleave` itself is
  Unsqueeze + Expand + Reshape, never a Tile.

`UNSUPPORTED` lists registry ops without a lowering, each with its reason (the op test
holds every registry op to one of the two).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import onnx_ir as ir

from linnet.errors import CodegenError
from linnet.ir.core import Graph, Op, Program, Value, body_ops
from linnet.ir.pipeline import PassOptions, prepare
from linnet.ops.rearrange import rearrange_plan
from linnet.types.core import DType
from linnet.types.dims import Dim, format_dim

from . import quantized as Q
from .rotary import native_apply_rope
from .spatial import LOWERINGS as SPATIAL_LOWERINGS

OPSET = 23
IR_VERSION = 11
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
    # quantized weights (`--dtype stored`, see `quantized`): path -> row parts, the param values reading them, and
    # the initializers their packed arrays become
    quantized: dict[str, list] = field(default_factory=dict)
    quantized_values: dict[int, list] = field(default_factory=dict)
    extra_initializers: list[ir.Value] = field(default_factory=list)
    initializer_names: dict[Any, tuple[ir.Value, np.ndarray]] = field(default_factory=dict)
    rotary_caches: dict[Any, tuple[ir.Value, ir.Value, ir.Value]] = field(default_factory=dict)  # `rotary`

    # ----- naming and typing
    def fresh(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint or "t") or "t"
        name, n = base, 0
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    def op(
        self, op_type: str, inputs, attributes=None, hint: str = "", like: Value | None = None, domain: str = ""
    ) -> ir.Value:
        out = self.tape.op(op_type, list(inputs), attributes or None, domain=domain)
        out.name = self.fresh(hint or op_type.lower())
        if like is not None:
            set_type(out, like)
        return out

    def get(self, v: Value) -> ir.Value:
        try:
            return self.values[id(v)]
        except KeyError:
            if id(v) in self.quantized_values:  # a quantized weight read by an op other than linear or take
                parts = self.quantized_values[id(v)]
                rows = [self.initializer(Q.dequantized(w), f"{name}.dequantized") for name, w in parts]
                self.values[id(v)] = rows[0] if len(rows) == 1 else self.op("Concat", rows, {"axis": 0}, hint=v.name)
                return self.values[id(v)]
            raise CodegenError(f"%{v.name} is used before it is defined") from None

    def initializer(self, array: np.ndarray, name: str) -> ir.Value:
        """An initializer holding `array` (no copy), made once per array and shape."""
        key = (id(array), array.shape, array.dtype.str)
        if key not in self.initializer_names:
            v = ir.Value(name=self.fresh(name))
            v.const_value = ir.tensor(array, name=v.name)
            v.dtype, v.shape = v.const_value.dtype, ir.Shape(array.shape)
            self.extra_initializers.append(v)
            self.initializer_names[key] = (v, array)  # the array stays referenced, so its id stays its own
        return self.initializer_names[key][0]

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
                factor = self.dim_atom(atom, d)
                for _ in range(power):
                    term = factor if term is None else self.op("Mul", [term, factor], hint="dim")
            total = term if total is None else self.op("Add", [total, term], hint="dim")
        self.dim_cache[key] = total
        return total

    def dim_atom(self, atom, d: Dim) -> ir.Value:
        """int64[1] holding one atom of `d`: a dim variable read from an input's shape, or a floor
        quotient or remainder (`(H - 8) // 8`, what a convolution's output size leaves) computed
        from its operands, themselves polynomials in the entry's dims. Python's floor semantics
        (ONNX's Div truncates): `n // k` is `(n - n % k) / k`, an exact division, with `Mod`
        (fmod=0) taking the divisor's sign as `%` does. Raises CodegenError for anything else."""
        if atom.name in self.dim_sources:
            return self.dim_sources[atom.name]
        if atom.kind == "min" and atom.args is not None:  # a slice bound clamped to its dim's size
            return self.op("Min", [self.dim(x) for x in atom.args], hint="dim")
        if atom.kind in ("//", "%") and atom.args is not None:
            num, den = (self.dim(x) for x in atom.args)
            rest = self.op("Mod", [num, den], {"fmod": 0}, hint="dim")
            if atom.kind == "%":
                return rest
            return self.op("Div", [self.op("Sub", [num, rest], hint="dim"), den], hint="dim")
        raise CodegenError(f"dim `{format_dim(d)}`: `{atom.name}` is not a dim of the entry's inputs")

    def scalar_dim(self, d: Dim) -> ir.Value:
        n = d.as_int()
        if n is not None:
            return self.const(np.array(n, dtype=np.int64), "dim")
        return self.op("Squeeze", [self.dim(d), self.const(np.array([0], dtype=np.int64), "axes")], hint="dim")

    def reshape(self, x: ir.Value, dims, hint: str) -> ir.Value:
        """`x` reshaped to `dims`. A 0 in Reshape's shape copies the input's dim unless `allowzero` is set, so it is
        set where a dim is a literal 0 (`repeat_interleave(x, 0, dim=1)` came out [0, 4], not [1, 0]); only there, so
        ONNX Runtime's fusions see the Reshape nodes they match everywhere else."""
        zero = any((d if isinstance(d, Dim) else Dim.of(d)).as_int() == 0 for d in dims)
        return self.op("Reshape", [x, self.shape(dims)], {"allowzero": 1} if zero else None, hint=hint)

    def shape(self, dims) -> ir.Value:
        """int64[len(dims)] of a shape."""
        dims = [d if isinstance(d, Dim) else Dim.of(d) for d in dims]
        if all(d.as_int() is not None for d in dims):
            return self.const(np.array([d.as_int() for d in dims], dtype=np.int64), "shape")
        parts = [self.dim(d) for d in dims]
        return self.op("Concat", parts, {"axis": 0}, hint="shape")

    def attended_length(self, mask: Value) -> ir.Value:
        """int64[1]: one past the last key position that some query of `mask` [B, S, T] may
        attend (T when a query attends none: its softmax is uniform over every key). Keys after
        it are masked for every query; skipping them leaves every softmax and every weighted sum
        unchanged (their weights are exact zeros). Made once per mask."""
        key = ("attended", id(mask))
        if key not in self.dim_cache:
            self.dim_cache[key] = self.attended_end(self.attended_per_query(mask), mask.dims[-1].as_int())
        return self.dim_cache[key]

    def attended_per_query(self, mask: Value) -> ir.Value:
        """int64[B, S]: one past the last key each query of `mask` [B, S, T] attends (0 when
        none). Made once per mask."""
        key = ("attended_per_query", id(mask))
        if key not in self.dim_cache:
            t = mask.dims[-1].as_int()
            cols = self.const(np.arange(1, t + 1, dtype=np.int64), "key_index")
            last = self.op("Where", [self.get(mask), cols, self.const(np.array(0, dtype=np.int64), "zero")])
            self.dim_cache[key] = self.op(
                "ReduceMax",
                [last, self.const(np.array([-1], dtype=np.int64), "axes")],
                {"keepdims": 0},
                hint="attended",
            )
        return self.dim_cache[key]

    def attended_end(self, per_query: ir.Value, t: int) -> ir.Value:
        """int64[1]: `attended_length` from `attended_per_query` (or a block of its queries)."""
        i64 = lambda a: self.const(np.array(a, dtype=np.int64), "attended")  # noqa: E731
        length = self.op("ReduceMax", [per_query], {"keepdims": 0}, hint="attended")
        none = self.op("Equal", [self.op("ReduceMin", [per_query], {"keepdims": 0}, hint="attended"), i64(0)])
        length = self.op("Where", [none, i64(t), length], hint="attended")
        length = self.op("Unsqueeze", [length, i64([0])], hint="attended_length")
        length.dtype, length.shape = ir.DataType.INT64, ir.Shape([1])
        return length

    def branch(self, build: Callable[[], ir.Value], name: str) -> ir.Graph:
        """A subgraph (for `If`) of the nodes `build` makes; it may read values of the enclosing
        graph. Constants and cached values made inside stay inside."""
        tape, consts, cache = self.tape, self.consts, self.dim_cache
        self.tape, self.consts, self.dim_cache = ir.tape.Tape(), {}, dict(cache)
        try:
            out = build()
            if out.producer() is None or out.producer() not in self.tape.nodes:
                out = self.op("Identity", [out], hint=name)
            nodes = self.tape.nodes
        finally:
            self.tape, self.consts, self.dim_cache = tape, consts, cache
        return ir.Graph([], [out], nodes=nodes, name=self.fresh(name))

    # ----- graphs
    def graph(self, g: Graph) -> None:
        for op in g.ops:
            self.lower_op(op)

    def lower_op(self, op: Op) -> None:
        if op.name == "composite":
            return self.composite(op)
        if op.name == "param":
            if op.attrs["path"] in self.quantized:
                self.quantized_values[id(op.result)] = self.quantized[op.attrs["path"]]
                return
            self.values[id(op.result)] = self.param_values[op.attrs["path"]]
            return
        if op.name == "state":
            self.values[id(op.result)] = self.state_values[op.attrs["path"]]
            return
        if op.name == "take" and _one_row_cache(op):
            # One cache row (max_batch 1): every valid index is 0, so reading rows is reading the
            # cache itself; no Gather copies it (B <= max_batch = 1, so the shapes agree at run time).
            self.values[id(op.result)] = self.get(op.args["x"])
            return
        lower = LOWERINGS.get(op.name)
        if lower is None:
            raise CodegenError(f"the ONNX backend has no lowering for `{op.name}`")
        out = lower(self, op)
        outs = out if isinstance(out, (list, tuple)) else [out]
        for v, o in zip(op.results, outs):
            set_type(o, v)
            self.values[id(v)] = o

    def composite(self, op: Op) -> None:
        if op.attrs.get("native"):
            out = NATIVE[op.attrs["name"]](self, op)
            if out is not None:  # None: no native form for these operands, the body runs
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
# Inference only (ONNX backends do not train): the identity, as torch.onnx exports F.dropout in eval mode.
LOWERINGS["dropout"] = lambda L, op: L.op("Identity", [L.get(op.args["x"])], hint=op.result.name)


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


def _floor_division(want: str) -> Lower:
    """Python's `//` and `%` (torch.floor_divide, torch.remainder: the remainder has the
    divisor's sign). ONNX's Mod with fmod=0 is that remainder for integers only, and Div
    truncates integers; floats start from the truncated remainder (fmod=1) and correct it
    where its sign differs from the divisor's, as CPython's float_divmod and torch do."""

    def lower(L: Lowering, op: Op) -> ir.Value:
        dtype = _operand_dtype(op)
        x, y = L.operand(op.args["x"], dtype), L.operand(op.args["y"], dtype)
        hint = op.result.name
        if dtype.is_int:
            mod = L.op("Mod", [x, y], {"fmod": 0}, hint=hint)
            return mod if want == "mod" else L.op("Div", [L.op("Sub", [x, mod], hint=hint), y], hint=hint)
        zero = L.operand(0.0, dtype)
        mod = L.op("Mod", [x, y], {"fmod": 1}, hint=hint)
        signs_differ = L.op("Xor", [L.op("Less", [y, zero]), L.op("Less", [mod, zero])])
        fix = L.op("And", [L.op("Not", [L.op("Equal", [mod, zero])]), signs_differ], hint=hint)
        if want == "mod":
            return L.op("Where", [fix, L.op("Add", [mod, y]), mod], hint=hint)
        quotient = L.op("Div", [L.op("Sub", [x, mod]), y])  # an integer up to rounding
        quotient = L.op("Where", [fix, L.op("Sub", [quotient, L.operand(1.0, dtype)]), quotient])
        return L.op("Round", [quotient], hint=hint)

    return lower


LOWERINGS["mod"] = _floor_division("mod")
LOWERINGS["floor_divide"] = _floor_division("floor_divide")


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


def _linear(L: Lowering, op: Op) -> ir.Value:
    x, weight = op.args["x"], op.args["weight"]
    if id(weight) in L.quantized_values:
        return Q.matmul_nbits(L, L.get(x), x.rank, L.quantized_values[id(weight)], op.result.name)
    weight_t = L.op("Transpose", [L.get(weight)], {"perm": [1, 0]}, hint="weight_t")
    return L.op("MatMul", [L.get(x), weight_t], hint=op.result.name)


LOWERINGS["linear"] = _linear
LOWERINGS["reshape"] = lambda L, op: L.reshape(L.get(op.args["x"]), op.args["shape"], hint=op.result.name)


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


def _top_k(L: Lowering, op: Op) -> list[ir.Value]:
    """ONNX TopK over the last axis, largest first; its indices are int64 and equal entries go to the lower index."""
    x, k = L.get(op.args["x"]), L.dim(op.args["k"])
    outs = L.tape.op_multi_out("TopK", [x, k], {"axis": -1, "largest": 1, "sorted": 1}, num_outputs=2)
    for o, v in zip(outs, op.results):
        o.name = L.fresh(v.name)
    return list(outs)


LOWERINGS["top_k"] = _top_k


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
    return L.reshape(e, op.result.dims, hint=op.result.name)


LOWERINGS["repeat_interleave"] = _repeat_interleave


def _rearrange(L: Lowering, op: Op) -> ir.Value:
    x: Value = op.args["x"]
    expanded, perm, out = rearrange_plan(list(x.dims), op.args["pattern"], dict(op.args["sizes"]))
    cur = L.get(x)
    if [d.key() for d in expanded] != [d.key() for d in x.dims]:
        cur = L.reshape(cur, expanded, hint="rearrange")
    if perm != list(range(len(perm))):
        cur = L.op("Transpose", [cur], {"perm": list(perm)}, hint="rearrange")
    permuted = [expanded[i] for i in perm]
    if [d.key() for d in out] != [d.key() for d in permuted]:
        cur = L.reshape(cur, out, hint="rearrange")
    if cur is L.get(x):
        cur = L.op("Identity", [cur], hint=op.result.name)
    return cur


LOWERINGS["rearrange"] = _rearrange


def _take(L: Lowering, op: Op) -> ir.Value:
    x, indices = op.args["x"], op.args["indices"]
    parts = L.quantized_values.get(id(x))
    if parts is not None and len(parts) == 1 and op.args["dim"] % x.rank == 0:
        name, w = parts[0]
        return Q.gather_block_quantized(L, L.get(indices), indices.rank, name, w, op.result.name)
    return L.op("Gather", [L.get(x), L.get(indices)], {"axis": op.args["dim"]}, hint=op.result.name)


LOWERINGS["take"] = _take


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
LOWERINGS["tensor"] = lambda L, op: L.op(
    "Identity",
    [L.const(np.array(op.args["values"], dtype=np.float64).astype(np_dtype(op.args["dtype"])), "tensor")],
    hint=op.result.name,
)
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
LOWERINGS.update(SPATIAL_LOWERINGS)  # convolutions, pooling, padding, resampling (spatial.py)


# ----------------------------------------------------------------------------- native composites


def _layer_norm(L: Lowering, op: Op) -> ir.Value:
    x, w = op.args["x"], op.args["weight"]
    return L.op(
        "LayerNormalization",
        [L.get(x), L.get(w)],
        {"axis": -1, "epsilon": float(op.args["eps"]), "stash_type": 1},
        hint=op.result.name,
    )


def _rms_norm(L: Lowering, op: Op) -> ir.Value | None:
    """`rms_norm` of f32 as ONNX's RMSNormalization (opset 23; `fast` only: one node for the body's six, the same
    formula, x / sqrt(mean(x ** 2) + eps) * weight, summed in its own order); None for other dtypes, whose casts
    the body spells out. ONNX Runtime runs it with the kernel of its own SimplifiedLayerNormalization (the same
    bits and time here, 576 wide, 1 and 512 rows), which sits in the default domain without an ONNX schema, so a
    file holding it failed `onnx.checker`."""
    x, w = op.args["x"], op.args["weight"]
    if x.dtype.name != "f32" or w.dtype.name != "f32":
        return None
    attributes = {"axis": -1, "epsilon": float(op.args["eps"]), "stash_type": 1}
    return L.op("RMSNormalization", [L.get(x), L.get(w)], attributes, hint=op.result.name)


# Attention over a static key length (the KV cache's max_positions) at least this long skips the
# keys after the last attended position in prefill (see `Lowering.attended_length`).
TRIM_MIN_KEYS = 64
# Prefill of at least this many query rows splits them into PREFILL_BLOCKS blocks, each over the keys
# up to its own last attended position (`_grouped_attention`'s `prefill_blocks`).
PREFILL_BLOCK_MIN_ROWS = 128
PREFILL_BLOCKS = 4
# Decode attends the keys up to the last attended position, sliced out, while they are at most this share of
# the cache (`_grouped_attention`'s `decode`); above it, the whole cache in place.
DECODE_TRIM_FILL = 0.5


def _dims(dims) -> list:
    return [d.as_int() if d.as_int() is not None else format_dim(d) for d in dims]


def _typed(x: ir.Value, shape, dtype) -> ir.Value:
    x.dtype, x.shape = dtype, ir.Shape(shape)
    return x


def _mask_bias(L: Lowering, mask: ir.Value, dt: DType, key) -> ir.Value:
    """[B, 1, S, T]: 0 where `mask` holds, the dtype's minimum elsewhere (made once per mask).
    `scores + bias` equals `where(mask, scores, min)` exactly in f32 and bf16 for |scores| below
    half the spacing of floats at the minimum (2**103 in f32): x + 0 = x, and min + x rounds to
    min. ONNX Runtime's broadcast Add is several times faster than its broadcast Where."""
    key = ("mask_bias", key, dt.name)
    if key not in L.dim_cache:
        zero = L.const(np.array(0, dtype=np_dtype(dt)), "zero")
        bias = L.op("Where", [mask, zero, _lowest(L, dt)], hint="mask_bias")
        bias = L.op("Unsqueeze", [bias, L.const(np.array([1], dtype=np.int64), "axes")], hint="mask_bias")
        L.dim_cache[key] = bias
    return L.dim_cache[key]


def _lowest(L: Lowering, dt: DType) -> ir.Value:
    if dt.name == "bf16":
        import ml_dtypes

        return L.const(np.array(ml_dtypes.finfo(ml_dtypes.bfloat16).min, dtype=ml_dtypes.bfloat16), "min_value")
    return L.const(np.array(np.finfo(np_dtype(dt)).min, dtype=np_dtype(dt)), "min_value")


def _grouped_attention(L: Lowering, op: Op) -> ir.Value:
    """The body of `attention` (matmul, scale, mask with the dtype's minimum, softmax, upcast
    to f32 when asked, matmul) with the G query heads of one KV head batched together: q
    [B, Hkv * G, S, D] is viewed as [B, Hkv, G * S, D] (query head h = kv * G + g reads KV head
    h // G, repeat-interleave's routing) and multiplied by that KV head's keys, instead of
    repeating the keys and values G times (transformers' `repeat_kv`). The same dot products.

    Exact rewrites, value for value: a power-of-two scale multiplies q before the matmul
    (scaling by 2**k is exact, so every dot product is the scaled one); in f32 and bf16 the mask
    is an added bias (see `_mask_bias`). Over the KV cache (a static key length), decode (S = 1)
    computes K @ q^T, which reads the cache where it lies, and prefill (S > 1) first drops the
    keys after the last attended position (their weights are exact zeros; see
    `Lowering.attended_length`); a prefill of at least PREFILL_BLOCK_MIN_ROWS rows does so per
    block of query rows (`prefill_blocks`). With a symbolic S, `If`s pick one per step."""
    q, k, v, mask = (op.args[n] for n in ("q", "k", "v", "mask"))
    t, s = k.dims[2], q.dims[2]
    dt = q.dtype
    i64 = lambda a: L.const(np.array(a, dtype=np.int64), "attn")  # noqa: E731
    odt = ONNX_DTYPES[dt.name]
    b_dim = _dims(q.dims)[0]
    scale = float(op.args["scale"])
    variant = op.attrs.get("variant", {})
    qv = L.get(q)
    if variant.get("scale_queries"):
        qv = _typed(L.op("Mul", [qv, L.operand(scale, dt)], hint="q_scaled"), _dims(q.dims), ONNX_DTYPES[dt.name])
        scale = None
    use_bias = dt.name in ("f32", "bf16")
    # Skipping keys is worth its slices from TRIM_MIN_KEYS keys on (the passes said it is exact).
    cached = (variant.get("trim_keys") or variant.get("keys_first")) and t.as_int() >= TRIM_MIN_KEYS
    full_mask = L.get(mask)
    full = (full_mask if not use_bias else _mask_bias(L, full_mask, dt, id(mask)), L.get(k), L.get(v), _dims([t])[0])
    if not cached:
        return _attention_body(L, op, qv, full, scale, use_bias, keys_first=False)
    end = L.attended_length(mask)
    start, axis = i64([0]), i64([2])
    t_att = L.fresh("T_attended")
    trimmed_mask = _typed(
        L.op("Slice", [full_mask, start, end, axis], hint="mask"), _dims(mask.dims[:2]) + [t_att], ir.DataType.BOOL
    )
    trimmed_mask = trimmed_mask if not use_bias else _mask_bias(L, trimmed_mask, dt, ("trimmed", id(mask)))

    def keys_up_to(end: ir.Value, t_att: str) -> tuple[ir.Value, ir.Value]:
        return tuple(  # type: ignore[return-value]
            _typed(
                L.op("Slice", [L.get(x), start, end, axis], hint=hint),
                _dims(x.dims[:2]) + [t_att, _dims(x.dims)[3]],
                odt,
            )
            for x, hint in ((k, "keys"), (v, "values"))
        )

    def prefill():
        kv, vv = keys_up_to(end, t_att)
        return _attention_body(L, op, qv, (trimmed_mask, kv, vv, t_att), scale, use_bias, keys_first=False)

    def prefill_blocks():
        """The query rows in PREFILL_BLOCKS blocks, each over the keys up to its own last attended
        position: under a causal mask the early rows' scores after their own position are exact
        zeros too, so about 3/8 of the scores are never computed (4 blocks). Each block's mask is
        a slice of the whole mask's (made once per step)."""
        s_len = L.dim(s)
        n = blocks or PREFILL_BLOCKS
        size = L.op("Div", [L.op("Add", [s_len, i64([n - 1])], hint="block_rows"), i64([n])], hint="block_rows")
        bounds = [start] + [L.op("Mul", [size, i64([j])], hint="block_bound") for j in range(1, n)] + [s_len]
        per_query = L.attended_per_query(mask)
        outs = []
        for j in range(n):
            rows, t_j = L.fresh("S_block"), L.fresh("T_attended")
            a, b = bounds[j], bounds[j + 1]
            q_j = _typed(
                L.op("Slice", [qv, a, b, axis], hint="q_block"), _dims(q.dims[:2]) + [rows, _dims(q.dims)[3]], odt
            )
            end_j = L.attended_end(L.op("Slice", [per_query, a, b, i64([1])], hint="attended"), t.as_int())
            # rows a:b and keys 0:end_j of the bias [B, 1, S, T] (f32, bf16) or of the mask [B, S, T]
            window = [L.op("Concat", [a, start], {"axis": 0}), L.op("Concat", [b, end_j], {"axis": 0})]
            axes, shape, mdt = ([2, 3], [b_dim, 1], odt) if use_bias else ([1, 2], [b_dim], ir.DataType.BOOL)
            mask_j = _typed(L.op("Slice", [full[0], *window, i64(axes)], hint="mask_block"), shape + [rows, t_j], mdt)
            kv, vv = keys_up_to(end_j, t_j)
            outs.append(
                _attention_body(L, op, q_j, (mask_j, kv, vv, t_j), scale, use_bias, keys_first=False, rows=rows)
            )
        return _typed(L.op("Concat", outs, {"axis": 2}, hint="attention"), _dims(q.dims), odt)

    def decode_in_place():
        return _attention_body(L, op, qv, full, scale, use_bias, keys_first=bool(variant.get("keys_first")))

    def decode_trimmed():
        kv, vv = keys_up_to(end, t_att)
        return _attention_body(L, op, qv, (trimmed_mask, kv, vv, t_att), scale, use_bias, keys_first=True)

    def decode():
        """Decode reads the cache in place while it is mostly full; while at most DECODE_TRIM_FILL of it is
        attended, the keys up to the last attended position are sliced out first (a copy of those, then
        scores over them only: SmolLM2 stored `fast`, 128-208 of 2048 positions filled, a step 32.8 -> 24.0 ms,
        A/B in one process, where 640 positions in place take 25.3; with 512-572 of 640 filled the copy costs
        about 5 %, hence the threshold). Same values: the skipped keys' weights are exact zeros."""
        if not variant.get("keys_first"):
            return decode_in_place()
        limit = L.const(np.array([int(t.as_int() * DECODE_TRIM_FILL)], dtype=np.int64), "trim_fill")
        mostly_empty = L.op("LessOrEqual", [end, limit], hint="cache_mostly_empty")
        branches = {
            "then_branch": L.branch(decode_trimmed, "decode_trimmed"),
            "else_branch": L.branch(decode_in_place, "decode_in_place"),
        }
        return L.op("If", [mostly_empty], branches, hint="decode_attention")

    blocks = variant.get("prefill_blocks")
    if s.as_int() is not None:
        if s.as_int() == 1:
            return decode()
        return prefill_blocks() if blocks and s.as_int() >= PREFILL_BLOCK_MIN_ROWS else prefill()
    any_prefill = L.branch(prefill, "prefill_attention")
    long_prefill = L.branch(prefill_blocks if blocks else prefill, "prefill_attention_blocks")
    cond_key, long_key = ("is_decode", s.key()), ("is_long_prefill", s.key())
    if cond_key not in L.dim_cache:
        L.dim_cache[cond_key] = L.op(
            "Equal", [L.scalar_dim(s), L.const(np.array(1, dtype=np.int64), "one")], hint="is_decode"
        )
        min_rows = L.const(np.array(PREFILL_BLOCK_MIN_ROWS, dtype=np.int64), "rows")
        L.dim_cache[long_key] = L.op("GreaterOrEqual", [L.scalar_dim(s), min_rows], hint="is_long_prefill")

    def prefill_by_length():
        return L.op(
            "If", [L.dim_cache[long_key]], {"then_branch": long_prefill, "else_branch": any_prefill}, hint="prefill"
        )

    then_graph = L.branch(decode, "decode_attention")
    else_graph = L.branch(prefill_by_length, "prefill_attention")
    out = L.op("If", [L.dim_cache[cond_key]], {"then_branch": then_graph, "else_branch": else_graph}, hint="attention")
    return out


def _attention_body(
    L: Lowering, op: Op, qv: ir.Value, kvm, scale, use_bias: bool, keys_first: bool, rows: str | None = None
) -> ir.Value:
    """scores = (q @ k^T) [* scale], masked, softmax (in f32 when `upcast`), @ v, grouped.
    `keys_first`: scores^T = k @ q^T, then transposed (reads the keys in place; for decode).
    `rows`: the name of the query-row dim when `qv` is a block of the op's rows."""
    q, k = op.args["q"], op.args["k"]
    maskv, kv, vv, t_dim = kvm
    h, hkv = q.dims[1].as_int(), k.dims[1].as_int()
    g = h // hkv
    dt = q.dtype
    odt = ONNX_DTYPES[dt.name]
    b, _, s, d = _dims(q.dims)
    s = rows or s
    i64 = lambda a: L.const(np.array(a, dtype=np.int64), "attn")  # noqa: E731
    if g > 1:
        qv = _typed(L.op("Reshape", [qv, i64([0, hkv, -1, 0])], hint="q_grouped"), [b, hkv, None, d], odt)
    if keys_first:
        q_t = _typed(L.op("Transpose", [qv], {"perm": [0, 1, 3, 2]}, hint="q_t"), [b, hkv, d, None], odt)
        scores = _typed(L.op("MatMul", [kv, q_t], hint="scores_t"), [None, hkv, t_dim, None], odt)
        scores = L.op("Transpose", [scores], {"perm": [0, 1, 3, 2]}, hint="scores")
    else:
        keys_t = L.op("Transpose", [kv], {"perm": [0, 1, 3, 2]}, hint="keys_t")
        scores = L.op("MatMul", [qv, keys_t], hint="scores")
    scores = _typed(scores, [b, hkv, None, t_dim], odt)
    if g > 1:
        scores = L.op("Reshape", [scores, i64([0, h, -1, 0])], hint="scores")
    scores = _typed(scores, [b, h, s, t_dim], odt)
    if scale is not None:
        scores = _typed(L.op("Mul", [scores, L.operand(scale, dt)], hint="scores"), [b, h, s, t_dim], odt)
    if use_bias:
        masked = L.op("Add", [scores, maskv], hint="masked")
    else:
        mask4 = L.op("Unsqueeze", [maskv, i64([1])], hint="mask")
        masked = L.op("Where", [mask4, scores, _lowest(L, dt)], hint="masked")
    masked = _typed(masked, [b, h, s, t_dim], odt)
    if op.args.get("upcast", True) and dt.name != "f32":
        up = L.op("Cast", [masked], {"to": ir.DataType.FLOAT}, hint="masked")
        probs = L.op("Softmax", [up], {"axis": -1}, hint="probs")
        probs = L.op("Cast", [probs], {"to": odt}, hint="probs")
    else:
        probs = L.op("Softmax", [masked], {"axis": -1}, hint="probs")
    probs = _typed(probs, [b, h, s, t_dim], odt)
    if g > 1:
        probs = _typed(L.op("Reshape", [probs, i64([0, hkv, -1, 0])], hint="probs_grouped"), [b, hkv, None, t_dim], odt)
    out = L.op("MatMul", [probs, vv], hint="attention")
    if g > 1:
        out = L.op("Reshape", [_typed(out, [b, hkv, None, d], odt), i64([0, h, -1, 0])], hint="attention")
    return _typed(out, [b, h, s, d], odt)


NATIVE: dict[str, Lower] = {
    "attention": _grouped_attention,
    "apply_rope": native_apply_rope,
    "softmax": lambda L, op: L.op("Softmax", [L.get(op.args["x"])], {"axis": -1}, hint=op.result.name),
    "gelu": lambda L, op: L.op("Gelu", [L.get(op.args["x"])], {"approximate": "none"}, hint="gelu"),
    "gelu_tanh": lambda L, op: L.op("Gelu", [L.get(op.args["x"])], {"approximate": "tanh"}, hint="gelu"),
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
}

# What the passes do for this backend: every call inlined and every loop unrolled (an ONNX graph is
# flat), one MatMul per group of linear layers sharing an input (its weight a Concat of the
# members' initializers, which ONNX Runtime folds when it makes the session), composites native
# under these numerics, and the attention variants `_grouped_attention` can emit.
PASSES = PassOptions(
    flatten=True,
    fuse_linear_weights=True,
    native={
        "attention": NUMERICS,
        "apply_rope": ("fast",),  # ORT's RotaryEmbedding may round otherwise (rotary.py)
        "softmax": NUMERICS,
        "gelu": NUMERICS,
        "gelu_tanh": ("fast",),
        "layer_norm": NUMERICS,
        "rms_norm": ("fast",),
    },
    attention=("scale_queries", "trim_keys", "keys_first", "prefill_blocks"),
)


# ----------------------------------------------------------------------------- whole entries


def lower_entry(
    program: Program,
    name: str,
    params: dict[str, np.ndarray] | str | None = None,
    numerics: str = "equivalent",
    passes: PassOptions = PASSES,
) -> ir.Model:
    """Entry `name` of `program` as an ONNX model (see the module docstring). The program is
    flattened and prepared with `passes` first (`PASSES`; tests ask for composites' bodies).
    `params`: the parameters' values by checkpoint name (initializers), or "inputs" (graph
    inputs), or None (zero-filled initializers of the right shapes, as a placeholder). A weight
    the passes fused (with initializers only) is a Concat of its members."""
    if numerics not in NUMERICS:
        raise CodegenError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    if name not in program.entries:
        raise CodegenError(f"no entry `{name}` (entries: {', '.join(program.entries)})")
    # With weights as graph inputs a fused weight would be concatenated at every run: not fused.
    passes = replace(passes, flatten=True, fuse_linear_weights=passes.fuse_linear_weights and params != "inputs")
    prepared = prepare(program, passes, numerics)
    g = prepared.entries[name]
    L = Lowering(numerics)
    inputs: list[ir.Value] = []
    for v in g.inputs:
        iv = ir.Value(name=L.fresh(v.name))
        set_type(iv, v)
        L.values[id(v)] = iv
        inputs.append(iv)
    for dim, (i, axis) in g.dim_sources.items():
        L.dim_sources[dim] = L.op("Shape", [inputs[i]], {"start": axis, "end": axis + 1}, hint=dim)
    read = {op.attrs["path"] for op in body_ops(g) if op.name == "param"}
    used_state = {op.attrs["path"] for op in body_ops(g) if op.name == "state"}
    fused = {t.key: t for t in prepared.param_transforms if t.key in read}
    used_params = read | {s for t in fused.values() for s in t.sources}
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
                    raise CodegenError(f"no value for parameter `{spec.path}`")
                array = np.zeros(spec.shape, dtype=np_dtype(spec.type.dtype))
            if tuple(array.shape) != spec.shape:
                raise CodegenError(f"parameter `{spec.path}` is {list(array.shape)}, the model {list(spec.shape)}")
            if Q.is_quantized(array):
                L.quantized[spec.path] = [(spec.path, Q.pack_weight(array, numerics))]
                L.param_values[spec.path] = pv
                continue
            pv.const_value = ir.tensor(np.ascontiguousarray(array, dtype=np_dtype(spec.type.dtype)), name=spec.path)
            initializers.append(pv)
        L.param_values[spec.path] = pv
    for key, t in fused.items():
        if all(s in L.quantized for s in t.sources) and t.axis == 0:
            L.quantized[key] = Q.concat_rows([part for s in t.sources for part in L.quantized[s]])
            continue
        for s in t.sources:  # a quantized member among plain ones: that member dequantized
            if s in L.quantized:
                pv = L.param_values[s]
                pv.const_value = ir.tensor(Q.dequantized(L.quantized.pop(s)[0][1]), name=s)
                initializers.append(pv)
        out = L.op("Concat", [L.param_values[s] for s in t.sources], {"axis": t.axis}, hint=key)
        L.param_values[key] = out
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
    taken = {v.name for v in inputs}
    out_names = []
    for i, v in enumerate(g.outputs):
        out_names.append(_output_name(program, i, v, taken))
        taken.add(out_names[-1])
    # the outputs' names are reserved before the body is named, so that no intermediate value
    # takes one (a local called `logits` in a router, say)
    L.names |= taken | {names[path][1] for path in g.state_updates}
    L.graph(g)
    for v, out_name in zip(g.outputs, out_names):
        out = L.get(v)
        if out.name in taken or out in inputs or out.producer() is None or out in outputs:
            out = L.op("Identity", [out], like=v)
        out.name = out_name
        outputs.append(out)
    for path, v in g.state_updates.items():
        if v.producer is None or v.producer.name != "cache_write":
            where = f"{v.producer.origin}: " if v.producer.origin else ""
            raise CodegenError(
                f"{where}state `{path}` is assigned (by `{v.producer.name}`): the ONNX backend updates state "
                "only through cache_write (its present output shares the past input's buffer); run this model on "
                "the torch or jax backend"
            )
        out = L.get(v)
        if out.name in taken or out in outputs:
            out = L.op("Identity", [out], like=v)
        out.name = names[path][1]
        outputs.append(out)
    contrib = L.extra_initializers or any(node.domain == Q.MS_DOMAIN for node in L.tape.nodes)
    opsets = {"": OPSET} | ({Q.MS_DOMAIN: 1} if contrib else {})
    graph = ir.Graph(
        inputs,
        outputs,
        nodes=L.tape.nodes,
        initializers=initializers + L.extra_initializers,
        opset_imports=opsets,
        name=f"{program.model}_{name}",
    )
    model = ir.Model(
        graph,
        ir_version=IR_VERSION,
        producer_name="linnet",
        doc_string=f"{program.model} from {program.source}, entry {name}: preset {program.preset or '(defaults)'}, "
        f"dtype {program.dtype.name}, numerics {numerics}, max_batch {program.max_batch}, "
        f"max_positions {program.max_positions}",
    )
    return model


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


def _one_row_cache(op: Op) -> bool:
    """`take(cache, rows, dim=0)` of a cache with one row (max_batch 1)."""
    x = op.args["x"]
    if op.args["dim"] % x.rank != 0 or x.dims[0].as_int() != 1 or x.producer is None:
        return False
    return x.producer.name in ("state", "cache_write") and op.result.dims[1:] == x.dims[1:]


def to_proto(model: ir.Model):
    """The model as an `onnx.ModelProto`."""
    return ir.serde.serialize_model(model)
