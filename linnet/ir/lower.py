"""Lowering: the checked program of a root model, under one concrete config, to Core IR.

The checker decides what the program means; lowering substitutes values and emits ops. The
checker's resolved form (`semantics/resolved.py`, `Analysis.resolved`) says what each name
use refers to and how each call binds: its callee, every parameter's argument or default,
converted to the parameter's kind, and the callee's dims and dtypes solved at the call.
Lowering reads it and never looks a name up, matches an argument or solves a signature
itself. What it computes is what only a concrete instance knows: the checker checks a module
once for all its instances (and a function once for all its calls), so its values are
symbolic in the module's int parameters and the function's parameters and dim variables;
lowering substitutes the instance's and the call's values for those atoms (`Context.subst`),
picks the branch of a compile-time `if`, and computes the scalars the checker could not know
(a module's float parameter, say) with the one scalar semantics (`types/scalars.py`).

The program keeps its structure: each module method and Linnet function called becomes a
function of the program (`Program.functions`), specialised for its receiver's class
(`Program.modules`: the modules of one kind with one set of arguments) and for its
arguments' types and compile-time values, so thirty identical decoder layers share one
function; a parameter read is a `param` op named by its path relative to the receiver
(`q_proj.weight`); `for layer in layers` over identical submodules is one `loop` op whose
body has the item as receiver (`layers.{i0}.`). Calls of standard-library functions marked
`@composite` become `composite` ops. Only the entries' dims (`B`, `S`, one atom each for the
whole program) stay symbolic.

What cannot be a function is inlined, as before: a call whose arguments include lists of
tensors or modules, or whose callee returns something other than tensors.

Lowering runs after a clean check; what the checker guarantees (names resolve, shapes agree,
conditions are compile-time) is assumed, and a violation raises `LoweringError` naming the
source position rather than producing a wrong graph.

`Lowering` (here: the entry points, and emitting ops into the graph being built) joins the phases,
one module each: `lower_context.py` (the resolved form in an instance and at a call, values
substituted), `lower_members.py` (module classes, members, parameter and state reads),
`lower_exprs.py` (statements and expressions), `lower_calls.py` (calls, specialised functions,
composites, loops); `lower_values.py` holds the values they compute with and their shared helpers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..ops import REQUIRED, OpDef, OpError
from ..semantics.configs import ConfigValue
from ..semantics.program import Analysis
from ..semantics.resolved import Resolved
from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import DType, TensorT
from ..types.dims import Atom, Dim, var
from ..types.scalars import ScalarError
from .core import Graph, ModuleClass, Op, TensorSpec, Value, format_tensor_type
from .lower_calls import CallsMixin
from .lower_context import ContextMixin
from .lower_exprs import ExprsMixin
from .lower_members import ModulesMixin
from .lower_values import (
    Context,
    Env,
    Frame,
    LoweringError,
    ModInst,
    ModList,
    ParamMember,
    StateMember,
    _number,
    _values,
    dim_sources_of,
    is_composite,
    unbound_dim,
)


@dataclass
class Lowering(ContextMixin, ModulesMixin, ExprsMixin, CallsMixin):
    """Lowers entries of a root model. `analysis` is the clean analysis of its file (what the
    checker resolved: `Analysis.resolved`); `configs` binds the model's config parameters by
    config type name; `dtype` is the working dtype."""

    analysis: Analysis
    model: Item
    configs: dict[str, ConfigValue]
    dtype: DType
    max_batch: int
    max_positions: int
    params: dict[str, TensorSpec] = field(default_factory=dict)
    state: dict[str, TensorSpec] = field(default_factory=dict)
    functions: dict[str, Graph] = field(default_factory=dict)
    modules: dict[str, ModuleClass] = field(default_factory=dict)
    frame: Frame | None = None
    _depth: int = 0
    _specialised: dict[Any, Graph | None] = field(default_factory=dict)  # specialisation key -> function
    _dim_atoms: dict[str, Atom] = field(default_factory=dict)  # the program's dim variables
    _class_keys: dict[Any, str] = field(default_factory=dict)
    _loop_depth: int = 0
    _item: Item | None = None  # the item whose source is being lowered (for positions)
    _resolved: dict[Any, Resolved] = field(default_factory=dict)  # (item, config values) -> its check
    _module_substs: dict[Any, dict[Atom, Dim]] = field(default_factory=dict)
    _dim_vars: dict[Any, dict[str, Atom]] = field(default_factory=dict)

    # The current frame's parts, as the lowering of expressions uses them.
    @property
    def graph(self) -> Graph:
        return self.frame.graph

    @property
    def _param_values(self) -> dict[str, Value]:
        return self.frame.param_values

    @property
    def _state_values(self) -> dict[str, Value]:
        return self.frame.state_values

    # ----- entry points
    def root(self) -> ModInst:
        mdef: A.ModuleDef = self.model.ast
        args = {}
        for p in mdef.params:
            tname = p.type.name.id
            if tname not in self.configs:
                raise LoweringError(f"no value for config `{tname}` of model `{mdef.name.id}`")
            args[p.name.id] = self.configs[tname]
        return ModInst(self.model, args, "")

    def collect_tensors(self, inst: ModInst) -> None:
        """Every parameter and state tensor of the tree (absolute checkpoint paths), in
        declaration order, and the module classes of the tree."""
        self.module_class(inst)
        for m in self.members(inst).values():
            if isinstance(m, ParamMember):
                self.param_spec(m)
            elif isinstance(m, StateMember):
                self.state_spec(m)
            elif isinstance(m, ModInst):
                self.collect_tensors(m)
            elif isinstance(m, ModList):
                for sub in self.list_items(m):
                    self.collect_tensors(sub)

    def lower_entry(self, root: ModInst, fn: A.FnDef) -> Graph:
        graph = Graph(fn.name.id, [], kind="entry", qualname=f"{root.mdef.name.id}.{fn.name.id}")
        graph.receiver = self.module_class(root)
        graph.origin = self._origin_in(root.item, fn.name)
        self.frame = Frame(graph)
        self._item = root.item
        ctx = self.instance_context(root)
        # The entry's dim variables are the program's (one atom per name: `B`, `S`).
        subst = dict(ctx.subst)
        for p in fn.params:
            if not isinstance(p.type, A.TensorType):
                raise LoweringError(self.where(root.item, p) + f"entry parameter `{p.name.id}` must be a tensor")
            for d in p.type.dims:
                if isinstance(d, A.EllipsisDim):
                    raise LoweringError(self.where(root.item, d) + "entry parameters have a known rank (no `...`)")
            for node in A.walk(p.type):
                ref = ctx.res.ref(node) if isinstance(node, A.Name) else None
                if ref is not None and ref.kind == "dim" and ref.value not in subst:
                    subst[ref.value] = Dim.atom(self._dim_atoms.setdefault(ref.value.name, var(ref.value.name)))
        env = Env(dataclasses.replace(ctx, subst=subst))
        for p in fn.params:
            env.vars[p.name] = self.input(self.concrete_type(env.ctx, p.type), p.name.id)
        result = self.block(fn.body, env.child())
        outs = result if isinstance(result, tuple) else (result,)
        for o in outs:
            if not isinstance(o, Value):
                raise LoweringError(self.where(root.item, fn.name) + "an entry returns tensors")
        self.check_returns(env.ctx, fn, list(outs), root.item)
        self.finish(graph, list(outs), root.item, fn.name)
        self.frame = None
        return graph

    def check_returns(self, ctx: Context, fn: A.FnDef, outs: list[Value], item: Item) -> None:
        """The results of an entry or a called function against its declared return type under
        this config (`ctx`, the callee's context at a call): where the checker could not know a
        size (a slice by a count a loop computes, the branches of an `if` on a parameter of a
        generic module), the lowered program is the first to see it, and a mismatch is an error,
        not a silently different output. Types with `...` are not compared. Raises
        LoweringError at the return type."""
        if fn.ret is None or not all(isinstance(o, Value) for o in outs):
            return
        declared = fn.ret.items if isinstance(fn.ret, A.TupleType) else [fn.ret]
        if len(declared) != len(outs):
            return  # the checker reports an arity mismatch
        for t, o in zip(declared, outs):
            if not isinstance(t, A.TensorType):
                continue
            try:
                want = self.concrete_type(ctx, t)
            except LoweringError:
                continue
            same = (
                want.dtype == o.dtype
                and len(want.shape.dims) == len(o.dims)
                and all(a.same(b) for a, b in zip(want.shape.dims, o.dims))
            )
            if not same:
                raise LoweringError(
                    self.where(item, t) + f"`{fn.name.id}` returns {format_tensor_type(o.type)} under this config, "
                    f"but declares {format_tensor_type(want)}"
                )

    def input(self, t: TensorT, name: str) -> Value:
        """A new input of the current graph."""
        v = Value(t, name)
        self.graph.inputs.append(v)
        self.frame.defined.add(id(v))
        return v

    def finish(self, graph: Graph, outs: list[Value], item: Item, node) -> None:
        """Set a lowered graph's outputs, state updates and dim sources, and name its values."""
        graph.outputs = outs
        for path, v in self._state_values.items():
            if v.producer is not None and v.producer.name != "state":
                graph.state_updates[path] = v
        self.bind_dims(graph, item, node)
        graph.name_values()

    def bind_dims(self, graph: Graph, item: Item, node) -> None:
        """`graph.dim_vars`/`dim_sources`: each dim variable its ops use, read from the first
        input axis that is exactly that variable. Raises LoweringError when none is."""
        name = unbound_dim(graph)
        if name is not None:
            raise LoweringError(
                self.where(item, node) + f"the dim `{name}` is used here but no tensor argument has it as a dim"
            )
        for name, source in dim_sources_of(graph).items():
            graph.dim_vars.append(name)
            graph.dim_sources[name] = source

    # ----- emitting ops into the current graph
    def emit(self, name: str, args: dict, types: list[TensorT], hint: str = "", node=None, **attrs) -> list[Value]:
        args = {k: self.local(v) for k, v in args.items()}
        op = Op(name, args, [], attrs)
        op.results = [Value(t, hint, op) for t in types]
        if node is not None and self._item is not None:
            op.origin = self._origin(node)
        self.graph.ops.append(op)
        self.frame.defined.update(id(r) for r in op.results)
        return op.results

    def local(self, v):
        """`v` as the current graph sees it: a value of an enclosing graph (a loop body's free
        variable) is captured as an input of the body; lists are mapped item by item."""
        if isinstance(v, Value):
            return self._capture(self.frame, v)
        if isinstance(v, list):
            return [self.local(x) for x in v]
        return v

    def _capture(self, frame: Frame, v: Value) -> Value:
        if id(v) in frame.defined or frame.parent is None:
            return v
        inner = frame.captures.get(id(v))
        if inner is None:
            outer = self._capture(frame.parent, v)
            inner = Value(v.type, v.name or v.hint)
            frame.graph.inputs.append(inner)
            frame.defined.add(id(inner))
            frame.captures[id(v)] = inner
            frame.captured.append(outer)
        return inner

    def _origin(self, node) -> str:
        return self._origin_in(self._item, node)

    def _origin_in(self, item: Item, node) -> str:
        line = item.resolve(node.span).start.line
        path = item.source.path.rsplit("/", 1)[-1]
        return f"{path}:{line}"

    def apply(self, op: OpDef, args: dict, node, hint: str = "") -> Any:
        """Apply a registry op to converted arguments: fold scalars, else emit."""
        if op.name == "cast" and isinstance(args.get("x"), Value) and args["x"].dtype == args.get("dtype"):
            return args["x"]  # a cast to the dtype it has is the identity
        operands = [args[p.name] for p in op.params if p.kind == "operand" and p.name in args]
        if op.fold is not None and operands and not any(isinstance(a, Value) for a in operands):
            return self.fold(op, operands, node)
        values = {
            k: (v.type if isinstance(v, Value) else [x.type for x in v] if _values(v) else v) for k, v in args.items()
        }
        for p in op.params:
            if p.name not in values:
                values[p.name] = p.default if p.default is not REQUIRED else None
                args.setdefault(p.name, values[p.name])
        try:
            dtype = op.dtype_rule(values)
            shape = op.shape_rule(values)
        except OpError as err:
            raise LoweringError(self.where(self._item, node) + f"{op.name}: {err.message}") from err
        if isinstance(shape, list):
            dts = dtype if isinstance(dtype, list) else [dtype] * len(shape)
            types = [TensorT(d, s) for d, s in zip(dts, shape)]
            return tuple(self.emit(op.name, args, types, hint, node))
        return self.emit(op.name, args, [TensorT(dtype, shape)], hint, node)[0]

    def fold(self, op: OpDef, operands: list, node):
        nums = [_number(a) for a in operands]
        try:
            v = op.fold(*nums)  # an operator's op folds with the one scalar semantics
        except ScalarError as err:
            raise LoweringError(self.where(self._item, node) + err.message) from err
        if isinstance(v, bool):
            return v
        if all(isinstance(a, Dim) for a in operands) and isinstance(v, int):
            return Dim.of(v)
        return float(v)

    # ----- messages
    def where(self, item: Item | None, node) -> str:
        if item is None or node is None or not hasattr(node, "span"):
            return ""
        loc = item.resolve(node.span)
        return f"{item.source.path}:{loc.start.line}:{loc.start.column}: "


__all__ = ["Lowering", "LoweringError", "is_composite"]
