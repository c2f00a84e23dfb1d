"""Ops an ONNX Runtime provider has no kernel for in the model's dtype: refused under
`equivalent` numerics, computed in f32 under `fast` (`upcast`).

`upcast(model, dtype, provider, numerics)` walks the lowered model, If branches included, and
finds the nodes that compute in `dtype` (a float input or output of that dtype) while `provider`
lacks a kernel for their op type in it (`kernels.KERNELS`, measured). Under `equivalent` it raises
`MissingKernels`, naming each op type and one node of it: computing them in f32 would change the
arithmetic. Under `fast` it rewrites each such node to run in f32 and returns a note saying so:

- a float input of `dtype` is read through a Cast to f32 (one Cast per value and scope, shared by
  its consumers); an output of `dtype` becomes f32, and a Cast back to `dtype` feeds whatever
  still reads `dtype` (graph outputs keep their names and dtypes);
- values stay f32 between upcast nodes: an upcast node reads its producer's f32 output directly,
  and a data-movement op (Reshape, Transpose, Split, ...) whose `dtype` inputs all have an f32
  version moves the f32 values instead. So a bf16 model on ONNX Runtime's CPU computes in f32
  throughout, rounding to bf16 only where the graph casts explicitly, where it reads weights and
  the KV cache, and at its outputs;
- weights stay `dtype` initializers, read through a Cast; ONNX Runtime's constant folding (on at
  every optimisation level) computes those Casts once when the session is made, so a step
  multiplies by f32 copies of the weights and never casts them. The KV cache stays in `dtype`:
  ScatterND moves bf16 and the cache is read through a Cast.

Casts the pass made and nothing reads are removed. The model keeps its interface: inputs,
outputs, cache and initializers are those the lowering gave. Imports onnx-ir only.
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from linnet.errors import CodegenError

from .kernels import MEASURED_WITH, lacking
from .lower import ONNX_DTYPES, Lowering

# Ops that only move, select or reshape elements: exact in any dtype, so under `fast` they move
# f32 values where their inputs already have f32 versions (input 0 holds the data; the other
# inputs are shapes, axes or indices, except Concat's, which are all data).
MOVES = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Split", "Slice", "Concat", "Expand"})
BOOL_OUT = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "IsNaN"})
INT64_OUT = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "NonZero"})


class MissingKernels(CodegenError):
    """The provider has no kernel for some ops in the model's dtype, and `equivalent` numerics
    may not compute them in another dtype. `ops`: op type -> one node computing it."""

    def __init__(self, message: str, ops: dict[str, str]):
        super().__init__(message)
        self.ops = ops


def upcast(model: ir.Model, dtype: str, provider: str, numerics: str, entry: str | None = None) -> list[str]:
    """Make `model` runnable on `provider` in `dtype` (see the module docstring); returns notes
    (naming `entry`, when given). Raises MissingKernels under `equivalent` when some op has no
    `dtype` kernel there. Does nothing for a provider or dtype the kernel table does not cover."""
    if dtype not in ONNX_DTYPES or lacking(provider, dtype, "Cast") is None:
        return []
    missing = [(g, n) for g, n in nodes_computing_in(model, dtype) if lacking(provider, dtype, n.op_type)]
    if not missing:
        return []
    counts = Counter(n.op_type for _, n in missing)
    where = f"entry `{entry}`" if entry else "this model"
    kinds = ", ".join(f"{op} ×{k}" for op, k in counts.most_common())
    if numerics != "fast":
        examples = {}
        for _, n in missing:
            examples.setdefault(n.op_type, _node_label(n))
        listed = ", ".join(f"{op} (e.g. {name})" for op, name in examples.items())
        raise MissingKernels(
            f"{provider} ({MEASURED_WITH}) has no {dtype} kernel for {len(examples)} op type(s) of {where}: "
            f"{listed}. `equivalent` numerics computes every op in {dtype}; `--numerics fast` computes these "
            "in f32 (upcast) and says so",
            examples,
        )
    types = _infer_dtypes(model.graph, {})
    _Rewrite(model.graph, ONNX_DTYPES[dtype], types, {id(n) for _, n in missing}).run()
    return [
        f"numerics fast: {len(missing)} ops of {where} without {provider} {dtype} kernels ({kinds}) "
        f"run in f32 (upcast); values stay f32 between them, weights and the KV cache stay {dtype}"
    ]


# ----------------------------------------------------------------------------- dtypes


def nodes_computing_in(model: ir.Model, dtype: str) -> list[tuple[ir.Graph, ir.Node]]:
    """(graph, node) of every node, If branches included, that runs a kernel on `dtype` values
    (a float input or output of that dtype; dtypes the lowering left unset are inferred)."""
    target = ONNX_DTYPES[dtype]
    types = _infer_dtypes(model.graph, {})
    return [(g, n) for g, n in _walk(model.graph) if _computes_in(n, target, types)]


def _walk(graph: ir.Graph):
    """(graph, node) for every node, subgraphs (If branches) included, in order."""
    for node in ir.traversal.RecursiveGraphIterator(graph):
        yield node.graph, node


def _subgraphs(node: ir.Node) -> list[ir.Graph]:
    out = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            out.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            out.extend(attr.value)
    return out


def _infer_dtypes(graph: ir.Graph, types: dict[int, ir.DataType]) -> dict[int, ir.DataType]:
    """Value (by id) -> dtype, from the dtypes the lowering set and, where it set none, the op's
    rule (a Cast's `to`, a comparison's bool, Shape's int64, ...; else its data input's)."""

    def dt(v: ir.Value | None):
        if v is None:
            return None
        return v.dtype if v.dtype is not None else types.get(id(v))

    for v in list(graph.inputs) + list(graph.initializers.values()):
        if v.dtype is not None:
            types[id(v)] = v.dtype
    for node in graph:
        for sub in _subgraphs(node):
            _infer_dtypes(sub, types)
        op = node.op_type
        for i, out in enumerate(node.outputs):
            if out.dtype is not None:
                types[id(out)] = out.dtype
                continue
            if op == "Cast":
                t = ir.DataType(node.attributes["to"].as_int())
            elif op in BOOL_OUT:
                t = ir.DataType.BOOL
            elif op in INT64_OUT:
                t = ir.DataType.INT64
            elif op in ("Constant", "ConstantOfShape") and "value" in node.attributes:
                t = node.attributes["value"].as_tensor().dtype
            elif op == "ConstantOfShape":
                t = ir.DataType.FLOAT
            elif op == "If":
                t = dt(_subgraphs(node)[0].outputs[i])
            elif op == "Where":
                t = dt(node.inputs[1]) or dt(node.inputs[2])
            else:
                t = next((dt(x) for x in node.inputs if dt(x) is not None), None)
            if t is not None:
                types[id(out)] = t
    return types


def _computes_in(node: ir.Node, target: ir.DataType, types) -> bool:
    """Whether `node` runs a kernel on `target` values (a Cast converts; an If runs its branches)."""
    if node.op_type in ("If", "Loop", "Scan"):
        return False
    values = [v for v in node.inputs if v is not None] + list(node.outputs)
    return any(types.get(id(v), v.dtype) == target for v in values)


def _node_label(node: ir.Node) -> str:
    return node.name or (node.outputs[0].name if node.outputs and node.outputs[0].name else node.op_type)


# ----------------------------------------------------------------------------- the rewrite


class _Rewrite:
    def __init__(self, graph: ir.Graph, target: ir.DataType, types, upcast_ids: set[int]):
        self.graph = graph
        self.target = target
        self.types = types
        self.upcast_ids = upcast_ids
        self.made: list[tuple[ir.Graph, ir.Node]] = []  # Casts this pass added
        self.naming = Lowering()  # its `fresh` makes the names unique
        self.naming.names = {v.name for g, n in _walk(graph) for v in n.outputs if v.name}
        self.naming.names |= {v.name for v in graph.inputs if v.name} | set(graph.initializers)
        self.fresh = self.naming.fresh

    def run(self) -> None:
        self.graph_pass(self.graph, {})
        self.prune()

    def dt(self, v: ir.Value | None):
        return None if v is None else self.types.get(id(v), v.dtype)

    def cast(self, graph: ir.Graph, x: ir.Value, to: ir.DataType, name: str) -> ir.Node:
        node = ir.node("Cast", [x], {"to": to}, name=name)
        out = node.outputs[0]
        out.dtype, out.shape = to, x.shape
        self.types[id(out)] = to
        self.made.append((graph, node))
        return node

    def graph_pass(self, graph: ir.Graph, f32: dict[int, ir.Value]) -> None:
        """Rewrite `graph`'s nodes in order; `f32` maps a `target` value (by id) to its f32
        version visible in this scope (a branch starts from its parent's map at the If)."""
        for node in list(graph):
            for sub in _subgraphs(node):
                self.graph_pass(sub, dict(f32))
            moves = (
                node.op_type in MOVES
                and id(node) not in self.upcast_ids
                and self.data_inputs(node)
                and all(id(x) in f32 for x in self.data_inputs(node))
            )
            if id(node) not in self.upcast_ids and not moves:
                continue
            for i, x in enumerate(node.inputs):
                if x is not None and self.dt(x) == self.target:
                    node.replace_input_with(i, self.to_f32(graph, node, x, f32))
            for out in node.outputs:
                if self.dt(out) == self.target:
                    self.widen(graph, node, out, f32)

    def data_inputs(self, node: ir.Node) -> list[ir.Value]:
        inputs = node.inputs if node.op_type == "Concat" else node.inputs[:1]
        return [x for x in inputs if x is not None and self.dt(x) == self.target]

    def to_f32(self, graph: ir.Graph, before: ir.Node, x: ir.Value, f32: dict[int, ir.Value]) -> ir.Value:
        if id(x) not in f32:
            cast = self.cast(graph, x, ir.DataType.FLOAT, name=self.fresh(f"{x.name or 'value'}_to_f32"))
            cast.outputs[0].name = cast.name
            graph.insert_before(before, cast)
            f32[id(x)] = cast.outputs[0]
        return f32[id(x)]

    def widen(self, graph: ir.Graph, node: ir.Node, out: ir.Value, f32: dict[int, ir.Value]) -> None:
        """`out` (of `node`) becomes f32; its readers read a Cast of it back to the target dtype."""
        uses = list(out.uses())
        name = out.name
        out.name = self.fresh(f"{name or 'value'}_f32")
        out.dtype = ir.DataType.FLOAT
        self.types[id(out)] = ir.DataType.FLOAT
        back = self.cast(graph, out, self.target, name=self.fresh(f"{out.name}_back"))
        narrow = back.outputs[0]
        graph.insert_after(node, back)
        for user, i in uses:
            user.replace_input_with(i, narrow)
        for k, o in enumerate(graph.outputs):
            if o is out:
                graph.outputs[k] = narrow
        narrow.name = name if name is not None else self.fresh("value")
        f32[id(narrow)] = out

    def prune(self) -> None:
        """Remove the Casts this pass made that nothing reads (repeatedly: a Cast back to the
        target whose only reader was a removed Cast)."""
        changed = True
        while changed:
            changed = False
            for graph, node in list(self.made):
                out = node.outputs[0]
                if not out.uses() and not out.is_graph_output() and node.graph is graph:
                    graph.remove(node, safe=True)
                    self.made.remove((graph, node))
                    changed = True
