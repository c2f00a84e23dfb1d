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
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from ..ops import OPERATORS, REGISTRY, REQUIRED, OpDef, OpError
from ..semantics.attributes import quantized_attribute
from ..semantics.configs import MISSING, ConfigValue
from ..semantics.names import LOAD_TIME_DIMS, SCALAR_TYPE_NAMES
from ..semantics.program import Analysis
from ..semantics.resolved import Arg, CallInfo, Resolved
from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import WORK, ConfigT, DType, NoneT, ScalarT, TensorT, TupleT, Type
from ..types.dims import Atom, Dim, DivisionError, divide, floor_divide, remainder, var
from ..types.scalars import CONVERSIONS, ScalarError, arithmetic, compare
from .core import (
    LOOP_INDEX,
    Graph,
    ModuleClass,
    Op,
    TensorSpec,
    Value,
    body_ops,
    format_tensor_type,
    shift_indices,
    tensor_type,
)

# A floor quotient's or remainder's atom, recomputed from its operands when they get values.
_DIVISIONS = {"//": floor_divide, "%": remainder}


class LoweringError(Exception):
    """The program cannot be lowered under this config; the message names the source position."""


# ----------------------------------------------------------------------------- runtime values


@dataclass(eq=False)
class ModInst:
    """A module instance: its item, argument values (by parameter name: a `Dim` for an int,
    a float, bool or str, a `ConfigValue` or None for a config) and checkpoint path prefix."""

    item: Item
    args: dict[str, Any]
    path: str
    members: dict[str, Any] | None = None
    context: "Context | None" = None  # what its module's resolved form means in it
    _spec: tuple | None = None

    @property
    def mdef(self) -> A.ModuleDef:
        return self.item.ast

    @property
    def spec(self) -> tuple:
        """Its arguments as a key: equal for equal values."""
        if self._spec is None:
            self._spec = tuple((k, _spec_key(v)) for k, v in self.args.items())
        return self._spec


@dataclass(eq=False)
class ModList:
    """`layers: [Block(c); n]`: `count` instances of one constructor call; with `index` (the
    checker's atom of `i` in `[Block(c, i) for i in range(n)]`), item `k` is the call with
    `i = k`."""

    owner: ModInst
    ctor: A.Call
    count: int
    path: str
    index: Atom | None = None
    _items: list | None = None


@dataclass(eq=False)
class FnRef:
    item: Item
    fn: A.FnDef
    inst: ModInst | None


@dataclass(eq=False)
class ParamMember:
    path: str
    decl: A.FieldDecl
    owner: ModInst


@dataclass(eq=False)
class StateMember:
    path: str
    decl: A.StateDecl
    owner: ModInst


UNIT = ()
_UNKNOWN = object()  # a compile-time value the checker did not know


@dataclass(eq=False)
class Context:
    """What the checker's resolved form of one body means where it is being lowered.

    item: the item whose source the body is (its positions, and whose check `res` is).
    res: that check, under the config values of this instance (and call).
    inst: the module instance the body belongs to (members and module parameters), or None.
    subst: the checker's atoms and their values here: the module's int parameters, a
      function's int parameters and dim variables (solved at the call), the load-time dims.
    dtypes: a function's generic dtype variables, by name, and their dtypes at the call."""

    item: Item
    res: Resolved
    inst: ModInst | None
    subst: dict[Atom, Dim]
    dtypes: dict[str, DType] = field(default_factory=dict)


class Env:
    """The values of a body's locals, parameters and loop variables, by the node that defines
    each (the checker's `Ref.node`), block by block; `ctx` says what its other names mean."""

    def __init__(self, ctx: Context | None = None, parent: "Env | None" = None):
        self.parent = parent
        self.ctx = ctx if ctx is not None else parent.ctx
        self.vars: dict[A.Name, Any] = {}

    @property
    def inst(self) -> ModInst | None:
        return self.ctx.inst

    @property
    def item(self) -> Item:
        return self.ctx.item

    def child(self) -> "Env":
        return Env(None, self)

    def lookup(self, node: A.Name):
        e = self
        while e is not None:
            if node in e.vars:
                return True, e.vars[node]
            e = e.parent
        return False, None

    def assign(self, node: A.Name, value) -> bool:
        e = self
        while e is not None:
            if node in e.vars:
                e.vars[node] = value
                return True
            e = e.parent
        return False


# ----------------------------------------------------------------------------- the lowering


@dataclass
class Frame:
    """What lowering one graph keeps: the graph, the
    parameter and state values read or written so far (by path relative to the graph's
    receiver), and, for a loop body, the values it captures from the enclosing graph."""

    graph: Graph
    param_values: dict[str, Value] = field(default_factory=dict)
    state_values: dict[str, Value] = field(default_factory=dict)
    defined: set[int] = field(default_factory=set)
    parent: "Frame | None" = None
    captures: dict[int, Value] = field(default_factory=dict)  # outer value id -> body input
    captured: list[Value] = field(default_factory=list)  # outer values, in body input order


@dataclass
class Lowering:
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
        """The entry's results against its declared return type under this config: where the
        checker could not know a size (a slice by a count a loop computes), the lowered
        program is the first to see it, and a mismatch is an error, not a silently different
        output. Raises LoweringError at the return type."""
        if fn.ret is None:
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
            same = want.dtype == o.dtype and [d.key() for d in want.shape.dims] == [d.key() for d in o.dims]
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

    # ----- the checker's resolved form, in an instance and at a call
    def resolved(self, item: Item, config: dict[str, Any], node=None) -> Resolved:
        """The check of `item` whose config parameters hold `config` (name -> ConfigValue or
        None). Raises LoweringError when that check (made now: an imported module under this
        file's config) has errors."""
        key = (item, tuple((k, _spec_key(v)) for k, v in config.items()))
        res = self._resolved.get(key)
        if res is None:
            res = self.analysis.resolved(item, config=config)
            if res is None:
                raise LoweringError(self.where(self._item, node) + f"`{item.name}` was not checked")
            if res.errors:
                d = res.errors[0]
                start = d.location.start
                raise LoweringError(
                    f"{d.location.path}:{start.line}:{start.column}: error[{d.code}]: {d.message} "
                    f"(`{item.name}` under this config)"
                )
            self._resolved[key] = res
        return res

    def instance_context(self, inst: ModInst) -> Context:
        """What the resolved form of `inst`'s module means in `inst`: its check under the
        instance's config values, its int parameters' atoms bound to the instance's values."""
        if inst.context is None:
            res = self.resolved(inst.item, _config_args(inst.mdef.params, inst.args))
            inst.context = Context(inst.item, res, inst, self.module_subst(res, inst))
        return inst.context

    def module_subst(self, res: Resolved, inst: ModInst) -> dict[Atom, Dim]:
        """The atoms of a module's int parameters in check `res`, bound to `inst`'s values, and
        the load-time dims. Shared by the instances of one class: do not modify."""
        key = (id(res), inst.spec)
        subst = self._module_substs.get(key)
        if subst is None:
            subst = self.load_dims()
            for p in inst.mdef.params:
                atom = _param_atom(res, p)
                if atom is not None and isinstance(inst.args.get(p.name.id), Dim):
                    subst[atom] = inst.args[p.name.id]
            self._module_substs[key] = subst
        return subst

    def call_context(self, ref: FnRef, info: CallInfo, args: dict[str, Any], caller: Context, e: A.Call) -> Context:
        """What the resolved form of the function `ref` means at the call `e`: its check under
        the config arguments (a method's: its module's check, its own config parameters
        bound there too), its int parameters' atoms bound to `args`, its dim variables to the
        dims the checker solved at the call (in the caller's terms, substituted here)."""
        fn = ref.fn
        config = _config_args(fn.params, args)
        if ref.inst is not None:
            module_config = _config_args(ref.inst.mdef.params, ref.inst.args)
            if config.keys() & module_config.keys():
                raise LoweringError(
                    self.where(caller.item, e)
                    + f"a config parameter of `{fn.name.id}` has the name of one of its module"
                )
            if config:
                res = self.resolved(ref.item, module_config | config, e)
                subst = dict(self.module_subst(res, ref.inst))
            else:
                base = self.instance_context(ref.inst)
                res, subst = base.res, dict(base.subst)
        else:
            res = self.resolved(ref.item, config, e)
            subst = self.load_dims()
        for p in fn.params:
            atom = _param_atom(res, p)
            if atom is not None and isinstance(args.get(p.name.id), Dim):
                subst[atom] = args[p.name.id]
        for name, atom in self.dim_vars(res, fn).items():
            solved = info.dims.get(name)
            if solved is None:
                raise LoweringError(
                    self.where(caller.item, e)
                    + f"the dim `{name}` of `{fn.name.id}` is not known at this call where it was checked"
                )
            subst[atom] = self.concrete_dim(caller, solved, e)
        dtypes = {name: self.concrete_dtype(caller, d, e) for name, d in info.dtypes.items() if d is not None}
        return Context(ref.item, res, ref.inst, subst, dtypes)

    def load_dims(self) -> dict[Atom, Dim]:
        """The load-time dims' atoms (`max_batch`, `max_positions`) and their values."""
        return {
            LOAD_TIME_DIMS["max_batch"]: Dim.of(self.max_batch),
            LOAD_TIME_DIMS["max_positions"]: Dim.of(self.max_positions),
        }

    def dim_vars(self, res: Resolved, fn: A.FnDef) -> dict[str, Atom]:
        """A function's dim variables in check `res`, by name (those its parameter types bind)."""
        key = (id(res), id(fn))
        found = self._dim_vars.get(key)
        if found is None:
            found = {}
            for p in fn.params:
                for node in A.walk(p.type):
                    ref = res.ref(node) if isinstance(node, A.Name) else None
                    if ref is not None and ref.kind == "dim":
                        found.setdefault(ref.value.name, ref.value)
            self._dim_vars[key] = found
        return found

    # ----- substituting values into what the checker computed
    def concrete_dim(self, ctx: Context, d: Dim, node=None) -> Dim:
        """`d` (a dim as the checker computed it) with this context's values substituted:
        a number, or a polynomial in the program's dim variables. Raises LoweringError for an
        atom that has no value here (a config field without a default) or a quotient that is
        not exact with these values."""
        d = d.val  # config values substituted (cached on the dim)
        terms = d.terms
        if not terms or not terms[0][0]:
            return d  # a number
        result = Dim.of(0)
        for mono, coeff in terms:
            if coeff == 1 and len(mono) == 1 and mono[0][1] == 1:
                term = self._atom_value(ctx, mono[0][0], node)
            else:
                term = Dim.of(coeff)
                for atom, power in mono:
                    term = term * self._atom_value(ctx, atom, node) ** power
            result = result + term if result.terms else term
        return result

    def _atom_value(self, ctx: Context, a: Atom, node) -> Dim:
        value = ctx.subst.get(a)
        if value is not None:
            return value
        if a.args is not None:  # a floor quotient or remainder: of its operands' values
            num, den = (self.concrete_dim(ctx, x, node) for x in a.args)
            found = _DIVISIONS[a.kind](num, den)
        elif a.kind == "quot" and a.value is None:  # an exact quotient of unknown values
            num, den = (self.concrete_dim(ctx, x, node) for x in a.quot)
            found = divide(num, den)
        elif a.value is not None:  # a config field's value, a quotient's
            return self.concrete_dim(ctx, a.value, node)
        elif a in self._dim_atoms.values():
            return Dim.atom(a)
        else:
            raise LoweringError(self.where(ctx.item, node) + f"`{a.name}` has no value here")
        if isinstance(found, DivisionError):
            raise LoweringError(self.where(ctx.item, node) + f"`{a.name}` has no value here: {found.reason}")
        return found

    def concrete_dtype(self, ctx: Context, dtype: DType, node=None) -> DType:
        """A dtype as the checker saw it, here: the working dtype for `work`, a generic dtype
        variable's dtype at the call."""
        if dtype == WORK:
            return self.dtype
        if dtype.var:
            found = ctx.dtypes.get(dtype.name)
            if found is None:
                raise LoweringError(self.where(ctx.item, node) + f"the dtype `{dtype.name}` is not known here")
            return found
        return dtype

    def concrete_type(self, ctx: Context, node: A.Node) -> TensorT:
        """The tensor type the checker gave the annotation `node` (a member's, an entry
        parameter's), here."""
        t = ctx.res.types.get(node)
        if not isinstance(t, TensorT) or t.shape.prefix is not None or any(d is None for d in t.shape.dims):
            raise LoweringError(self.where(ctx.item, node) + "this type is not known where it was checked")
        dims = [self.concrete_dim(ctx, d, node) for d in t.shape.dims]
        return tensor_type(self.concrete_dtype(ctx, t.dtype, node), dims)

    def static_value(self, ctx: Context, t: Type, node=None):
        """The compile-time value the checker gave an argument (its converted type), here;
        `_UNKNOWN` when the checker did not know it (a module's float parameter)."""
        if isinstance(t, ConfigT):
            return t.value
        if isinstance(t, NoneT):
            return None
        if isinstance(t, ScalarT) and t.value is not None:
            return self.concrete_dim(ctx, t.value, node) if isinstance(t.value, Dim) else t.value
        return _UNKNOWN

    # ----- module classes
    def module_class(self, inst: ModInst) -> str:
        """The key of `inst`'s class in `modules` (registered, with its children, on first use):
        the module's name, suffixed when another set of arguments came first."""
        spec = (id(inst.item), inst.spec)
        key = self._class_keys.get(spec)
        if key is not None:
            return key
        name = inst.mdef.name.id
        key, n = name, 1
        while key in self.modules:
            n += 1
            key = f"{name}_{n}"
        self._class_keys[spec] = key
        cls = ModuleClass(key, name, self._origin_in(inst.item, inst.mdef.name), std=inst.item.is_std)
        self.modules[key] = cls
        rel = ModInst(inst.item, inst.args, "", _spec=inst.spec)
        saved, saved_item = self.frame, self._item
        self.frame, self._item = Frame(Graph("", [])), inst.item
        try:
            for name_, m in self.members(rel).items():
                if isinstance(m, ParamMember):
                    cls.params[m.path] = self.member_type(m)
                elif isinstance(m, StateMember):
                    cls.state[m.path] = self.member_type(m)
                elif isinstance(m, ModInst):
                    cls.children[name_] = (self.module_class(m), None)
                elif isinstance(m, ModList):
                    items = self.list_items(m)
                    keys = [self.module_class(x) for x in items]
                    if len(set(keys)) == 1:
                        cls.children[name_] = (keys[0], m.count)
                    elif keys:  # items of different classes: a class whose children are `0`, `1`...
                        cls.children[name_] = (self.items_class(cls, name_, keys), None)
        finally:
            self.frame, self._item = saved, saved_item
        return key

    def items_class(self, owner: ModuleClass, name: str, keys: list[str]) -> str:
        """The class of a list whose items are of different classes (they received their
        index): no tensors or methods of its own, item `i` its child `i`, so paths stay
        `layers.3.attn...` (torch: an `nn.Module` whose submodules are named `0`, `1`...)."""
        key, n = f"{owner.key}_{name}", 1
        while key in self.modules:
            n += 1
            key = f"{owner.key}_{name}_{n}"
        cls = ModuleClass(key, key, owner.origin)
        cls.children = {str(i): (k, None) for i, k in enumerate(keys)}
        self.modules[key] = cls
        return key

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

    # ----- members
    def members(self, inst: ModInst) -> dict[str, Any]:
        """The members of a concrete instance, by name: its member `if`s decided by its values."""
        if inst.members is not None:
            return inst.members
        out: dict[str, Any] = {}
        self._members(inst, inst.mdef.members, self.module_env(inst), out)
        inst.members = out
        return out

    def _members(self, inst: ModInst, members: list, env: Env, out: dict) -> None:
        saved = self._item
        self._item = inst.item
        try:
            for m in members:
                if isinstance(m, A.MemberIf):
                    cond = self.expr(m.cond, env)
                    if not isinstance(cond, bool):
                        raise LoweringError(self.where(inst.item, m.cond) + "a member condition must be a known bool")
                    self._members(inst, m.then if cond else m.orelse, env, out)
                elif isinstance(m, A.FieldDecl):
                    seg = _checkpoint_name(m)
                    path = f"{inst.path}{seg}"
                    if m.kind == "param":
                        out[m.name.id] = ParamMember(path, m, inst)
                    elif m.kind == "submodule":
                        out[m.name.id] = self.instantiate(m.ctor, env, path + ".")
                    else:
                        count = self.expr(m.count, env)
                        n = count.as_int() if isinstance(count, Dim) else None
                        if n is None:
                            raise LoweringError(self.where(inst.item, m.count) + "a list length must be a known int")
                        out[m.name.id] = ModList(inst, m.ctor, n, path, self.list_index(env.ctx, m))
                elif isinstance(m, A.StateDecl):
                    out[m.name.id] = StateMember(f"{inst.path}{m.name.id}", m, inst)
                elif isinstance(m, A.FnDef):
                    out[m.name.id] = FnRef(inst.item, m, inst)
        finally:
            self._item = saved

    def member(self, inst: ModInst, name: str, node) -> Any:
        """The member `name` of a concrete instance (the checker resolved the use to it)."""
        m = self.members(inst).get(name)
        if m is None:
            raise LoweringError(self.where(self._item, node) + f"`{inst.mdef.name.id}` has no member `{name}` here")
        return m

    def list_index(self, ctx: Context, m: A.FieldDecl) -> Atom | None:
        """The atom the checker bound a list's element index to (None without an index)."""
        if m.index is None:
            return None
        t = ctx.res.types.get(m.index)
        atoms = t.value.atoms() if isinstance(t, ScalarT) and isinstance(t.value, Dim) else ()
        if len(atoms) != 1:
            raise LoweringError(self.where(ctx.item, m.index) + "this list index was not checked")
        return next(iter(atoms))

    def list_items(self, ml: ModList) -> list[ModInst]:
        if ml._items is None:
            env = self.module_env(ml.owner)
            saved = self._item
            self._item = ml.owner.item
            try:
                ml._items = [
                    self.instantiate(ml.ctor, self.item_env(ml, env, i), f"{ml.path}.{i}.") for i in range(ml.count)
                ]
            finally:
                self._item = saved
        return ml._items

    def item_env(self, ml: ModList, env: Env, i: int) -> Env:
        """Where item `i`'s constructor call is evaluated: the owner's, the index bound to `i`."""
        if ml.index is None:
            return env
        return Env(dataclasses.replace(env.ctx, subst={**env.ctx.subst, ml.index: Dim.of(i)}))

    def module_env(self, inst: ModInst) -> Env:
        return Env(self.instance_context(inst))

    def instantiate(self, ctor: A.Call, env: Env, path: str) -> ModInst:
        """The submodule a constructor call makes, its arguments as the checker bound them
        (`CallInfo` "module"), with the owner's values substituted."""
        info = env.ctx.res.call(ctor)
        if info is None or info.kind != "module":
            raise LoweringError(self.where(env.item, ctor) + "this submodule was not checked")
        args, unknown = self.static_args(info, env.ctx, ctor)
        if unknown:
            # what the checker could not know (a float parameter of the owner) is computed
            # here: an argument in the owner, a default in the module, after the known ones
            inst = ModInst(info.item, args, "")
            callee = self.module_env(inst)
            for p, arg in unknown:
                value = self.expr(arg.node, env) if arg.node is not None else self.expr(arg.default, callee)
                args[p.name.id] = _as_kind(value, arg.value)
            args = {p.name.id: args[p.name.id] for p in info.callee.params}  # declaration order
        return ModInst(info.item, args, path)

    def static_args(self, info: CallInfo, ctx: Context, node) -> tuple[dict[str, Any], list[tuple[A.Param, Arg]]]:
        """The compile-time arguments of a call of a Linnet module or function, by parameter
        name, as the checker converted them (in the caller's terms, substituted here), and
        the (parameter, argument) pairs whose value the checker did not know."""
        params = info.callee.params
        args: dict[str, Any] = {}
        unknown = []
        for p, (name, arg) in zip(params, info.args.items()):
            if isinstance(arg.value, (TensorT, TupleT)):
                continue
            value = self.static_value(ctx, arg.value, node)
            if value is _UNKNOWN:
                unknown.append((p, arg))
            else:
                args[name] = value
        return args, unknown

    def member_type(self, m: "ParamMember | StateMember") -> TensorT:
        """The concrete type of a parameter or state member: the checker's, in its instance."""
        return self.concrete_type(self.instance_context(m.owner), m.decl.type)

    def param_spec(self, m: ParamMember) -> TensorSpec:
        """The program's parameter at `m`'s (absolute) path."""
        spec = self.params.get(m.path)
        if spec is None:
            spec = self.params[m.path] = TensorSpec(m.path, self.member_type(m), "param", quantized_attribute(m.decl))
        return spec

    def state_spec(self, m: StateMember) -> TensorSpec:
        """The program's state tensor at `m`'s (absolute) path."""
        spec = self.state.get(m.path)
        if spec is None:
            spec = self.state[m.path] = TensorSpec(m.path, self.member_type(m), "state")
        return spec

    def member_value(self, m, node=None):
        """A member's value in the current graph: a parameter or state tensor is read once per
        graph (by its path relative to the receiver), other members are themselves."""
        if isinstance(m, ParamMember):
            v = self._param_values.get(m.path)
            if v is None:
                v = self._param_values[m.path] = self._read("param", m)
            return v
        if isinstance(m, StateMember):
            v = self._state_values.get(m.path)
            if v is None:
                if m.path in self._loop_writes():
                    raise LoweringError(
                        self.where(self._item, node)
                        + f"state `{m.path}` is read after a loop that writes it; read it in the loop"
                    )
                v = self._state_values[m.path] = self._read("state", m)
            return v
        return m

    def _loop_writes(self) -> set[str]:
        """State paths a loop of the current graph wrote, with every index substituted."""
        out: set[str] = set()
        for op in self.graph.ops:
            if op.name == "loop":
                for w in op.writes:
                    out |= {w.replace(op.attrs["index"], str(i)) for i in range(op.attrs["count"])}
        return out

    def _read(self, kind: str, m) -> Value:
        op = Op(kind, {}, [], {"path": m.path})
        op.results = [Value(self.member_type(m), _hint_from_path(m.path), op)]
        self.graph.ops.append(op)
        self.frame.defined.add(id(op.result))
        return op.result

    # ----- statements and blocks
    def block(self, b: A.Block, env: Env):
        value = UNIT
        for i, s in enumerate(b.stmts):
            last = i == len(b.stmts) - 1
            if isinstance(s, A.ExprStmt):
                v = self.expr(s.expr, env)
                value = v if last else UNIT
            else:
                self.stmt(s, env)
                value = UNIT
        return value

    def stmt(self, s, env: Env) -> None:
        if isinstance(s, A.Let):
            v = self.expr(s.value, env)
            if s.is_tuple:
                if not isinstance(v, tuple) or len(v) != len(s.targets):
                    raise LoweringError(self.where(env.item, s) + "cannot unpack this value")
                for t, x in zip(s.targets, v):
                    env.vars[t] = _named(x, t.id)
            else:
                env.vars[s.targets[0]] = _named(v, s.targets[0].id)
        elif isinstance(s, A.Assign):
            v = self.expr(s.value, env)
            ref = self.ref(s.target, env)
            if ref.kind == "local" and env.assign(ref.node, _named(v, s.target.id)):
                return
            m = self.member(env.inst, s.target.id, s.target) if ref.kind == "member" else None
            if isinstance(m, StateMember):
                if not isinstance(v, Value):
                    raise LoweringError(self.where(env.item, s) + "state is assigned a tensor")
                self.state_spec(m)
                self._state_values[m.path] = _named(v, s.target.id)
                return
            raise LoweringError(self.where(env.item, s.target) + f"cannot assign `{s.target.id}`")
        elif isinstance(s, A.For):
            seq = self.expr(s.iter, env)
            if not isinstance(seq, ModList):
                raise LoweringError(self.where(env.item, s.iter) + "`for` iterates over a list of submodules")
            self.loop(s, seq, env)
        elif isinstance(s, A.ErrorStmt):
            raise LoweringError(self.where(env.item, s) + "this statement did not parse")
        else:
            raise LoweringError(self.where(env.item, s) + "unsupported statement")

    # ----- expressions
    def expr(self, e, env: Env):
        self._depth += 1
        try:
            return self._expr(e, env)
        finally:
            self._depth -= 1

    def _expr(self, e, env: Env):
        if isinstance(e, A.IntLit):
            return Dim.of(e.value)
        if isinstance(e, A.FloatLit):
            return float(e.value)
        if isinstance(e, A.StrLit):
            return e.value
        if isinstance(e, A.BoolLit):
            return e.value
        if isinstance(e, A.NoneLit):
            return None
        if isinstance(e, A.Name):
            return self.name(e, env)
        if isinstance(e, A.Attr):
            return self.attr(e, env)
        if isinstance(e, A.Call):
            return self.call(e, env)
        if isinstance(e, A.BinOp):
            return self.binop(e, env)
        if isinstance(e, A.Compare):
            return self.compare(e, env)
        if isinstance(e, A.Neg):
            v = self.expr(e.operand, env)
            if isinstance(v, Value):
                return self.apply(REGISTRY["neg"], {"x": v}, e)
            return -v
        if isinstance(e, A.Not):
            v = self.expr(e.operand, env)
            if isinstance(v, Value):
                return self.apply(REGISTRY["logical_not"], {"x": v}, e)
            return not v
        if isinstance(e, A.Index):
            return self.index(e, env)
        if isinstance(e, A.TupleLit):
            return tuple(self.expr(i, env) for i in e.items)
        if isinstance(e, A.ListLit):
            return [self.expr(i, env) for i in e.items]
        if isinstance(e, A.IfExpr):
            cond = self.expr(e.cond, env)
            if not isinstance(cond, bool):
                raise LoweringError(self.where(env.item, e.cond) + "the condition of `if` must be a known bool")
            if cond:
                return self.block(e.then, env.child())
            if e.orelse is None:
                return UNIT
            if isinstance(e.orelse, A.Block):
                return self.block(e.orelse, env.child())
            return self.expr(e.orelse, env)
        raise LoweringError(self.where(env.item, e) + "unsupported expression")

    def ref(self, e: A.Name, env: Env):
        """What the checker resolved the name `e` to (`resolved.Ref`)."""
        ref = env.ctx.res.ref(e)
        if ref is None:
            raise LoweringError(self.where(env.item, e) + f"`{e.id}` was not resolved by the checker")
        return ref

    def name(self, e: A.Name, env: Env):
        """The value of a name use, as the checker resolved it, in this instance and call."""
        ref = self.ref(e, env)
        kind = ref.kind
        if kind in ("local", "param", "loop"):
            found, v = env.lookup(ref.node)
            if not found:
                raise LoweringError(self.where(env.item, e) + f"`{e.id}` has no value here")
            return v
        if kind in ("dim", "load_dim"):
            return self.concrete_dim(env.ctx, Dim.atom(ref.value), e)
        if kind == "module_param":
            return env.inst.args[ref.node.id]
        if kind == "member":
            return self.member_value(self.member(env.inst, ref.node.name.id, e), e)
        if kind == "fn":
            return FnRef(ref.item, ref.node, None)
        if kind in ("op", "dtype", "constant"):
            return ref.value
        if kind == "dtype_var":
            return self.concrete_dtype(env.ctx, ref.value, e)
        raise LoweringError(self.where(env.item, e) + f"`{e.id}` is a {kind}, not a value")

    def attr(self, e: A.Attr, env: Env):
        """`a.b`: a field of a config value or a member of a module instance (as the checker
        resolved `b`), or a tensor's dtype, read from the concrete value of `a`."""
        base = self.expr(e.value, env)
        name = e.name.id
        if isinstance(base, Value) and name == "dtype":
            return base.dtype
        ref = self.ref(e.name, env)
        if ref.kind == "config_field" and isinstance(base, ConfigValue):
            v = base.values.get(name, MISSING)
            if v is MISSING:
                raise LoweringError(self.where(env.item, e) + f"config field `{name}` has no value")
            return _config_scalar(v)
        if ref.kind == "member" and isinstance(base, ModInst):
            return self.member_value(self.member(base, name, e), e)
        raise LoweringError(self.where(env.item, e) + f"no field `{name}` here")

    def binop(self, e: A.BinOp, env: Env):
        a = self.expr(e.left, env)
        if e.op in ("and", "or") and isinstance(a, bool):
            if a is (e.op == "or"):
                return a
        b = self.expr(e.right, env)
        if isinstance(a, Value) or isinstance(b, Value):
            return self.apply(REGISTRY[OPERATORS[e.op]], {"x": a, "y": b}, e)
        return self.scalar_binop(e.op, a, b, e, env)

    def scalar_binop(self, op: str, a, b, e, env: Env):
        """Compile-time arithmetic: the one scalar semantics of configs and the checker
        (`types/scalars.py`)."""
        if op in ("and", "or"):
            return (a and b) if op == "and" else (a or b)
        try:
            value = arithmetic(op, a, b)
        except ScalarError as err:
            raise LoweringError(self.where(env.item, e) + err.message) from err
        if value is None:
            raise LoweringError(self.where(env.item, e) + f"`{op}` has no value known at compile time here")
        return Dim.of(value) if isinstance(value, int) else value

    def compare(self, e: A.Compare, env: Env):
        a = self.expr(e.left, env)
        b = self.expr(e.right, env)
        if isinstance(a, Value) or isinstance(b, Value):
            return self.apply(REGISTRY[OPERATORS[e.op]], {"x": a, "y": b}, e)
        if a is None or b is None or isinstance(a, ConfigValue) or isinstance(b, ConfigValue):
            same = a is b
            return same if e.op == "==" else not same
        result = compare(e.op, a, b)
        if result is None:
            raise LoweringError(self.where(env.item, e) + f"`{e.op}` of symbolic dims is not known at compile time")
        return result

    def index(self, e: A.Index, env: Env):
        base = self.expr(e.value, env)
        if isinstance(base, ModList):
            i = self.expr(e.items[0], env)
            return self.list_items(base)[_number(i)]
        if isinstance(base, list):  # a `list[...]` config field, indexed by a compile-time int
            i = _number(self.expr(e.items[0], env))
            if not -len(base) <= i < len(base):  # an int parameter's value, which the checker did not know
                raise LoweringError(
                    self.where(env.item, e.items[0]) + f"index {i} is out of range for a list of {len(base)}"
                )
            return _config_scalar(base[i])
        if not isinstance(base, Value):
            raise LoweringError(self.where(env.item, e) + "only tensors can be indexed")
        ell = [i for i, it in enumerate(e.items) if isinstance(it, A.EllipsisLit)]
        pre = e.items[: ell[0]] if ell else e.items
        post = e.items[ell[0] + 1 :] if ell else []
        n = base.rank
        steps = [(i, it) for i, it in enumerate(pre)] + [(n - len(post) + j, it) for j, it in enumerate(post)]
        x = base
        for pos, it in sorted(steps, key=lambda s: -s[0]):
            if isinstance(it, A.Slice):
                if it.start is None and it.stop is None:
                    continue
                start = self.expr(it.start, env) if it.start is not None else Dim.of(0)
                stop = self.expr(it.stop, env) if it.stop is not None else None
                x = self.apply(REGISTRY["slice"], {"x": x, "dim": pos, "start": start, "stop": stop}, it)
                continue
            v = self.expr(it, env)
            if isinstance(v, Value):
                x = self.apply(REGISTRY["take"], {"x": x, "indices": v, "dim": pos}, it)
            else:
                x = self.apply(REGISTRY["select"], {"x": x, "dim": pos, "index": v}, it)
        return x

    # ----- calls
    def call(self, e: A.Call, env: Env):
        """A call, bound as the checker bound it (`CallInfo`): an op, a function, or a method
        of the concrete instance its receiver evaluates to."""
        info = env.ctx.res.call(e)
        if info is None:
            raise LoweringError(self.where(env.item, e) + "this call was not checked")
        if info.kind == "conversion":  # `int(x)`, `len(xs)`: the one definition, types/scalars.py
            value = CONVERSIONS[info.callee](_number(self.expr(e.args[0].value, env)))
            return Dim.of(value) if isinstance(value, int) else value
        if info.kind == "op":
            return self.call_op(info, e, env)
        if info.kind == "fn":
            return self.call_fn(FnRef(info.item, info.callee, None), info, e, env)
        if info.kind in ("method", "forward"):
            receiver = env.inst if info.receiver is None else self.expr(info.receiver, env)
            if not isinstance(receiver, ModInst):
                raise LoweringError(self.where(env.item, e.func) + "this is not a module instance")
            # the instance's own method of that name: its member `if`s are decided here
            method = self.member(receiver, info.callee.name.id, e.func)
            if not isinstance(method, FnRef):
                raise LoweringError(self.where(env.item, e.func) + f"`{info.callee.name.id}` is not a method here")
            return self.call_fn(method, info, e, env)
        raise LoweringError(self.where(env.item, e) + "a module is constructed only as a member")

    def call_op(self, info: CallInfo, e: A.Call, env: Env):
        """An op call: tensor operands and dtypes evaluated here, the other arguments the
        checker converted (with this instance's values), or computed here when it could not."""
        op: OpDef = info.callee
        if info.scalar:  # applied to compile-time numbers
            return self.fold(op, [self.expr(a.value, env) for a in e.args], e)
        args: dict[str, Any] = {}
        for p in op.params:
            if p.kind == "sizes":
                args[p.name] = {k: self.concrete_dim(env.ctx, a.value, e) for k, a in info.sizes.items()}
                continue
            arg = info.args.get(p.name)
            if arg is None:
                continue
            if arg.node is None:  # the op's default
                args[p.name] = arg.value
            elif p.kind in ("operand", "tensor", "tensors", "dtype"):
                args[p.name] = self.expr(arg.node, env)
            else:
                args[p.name] = self.op_constant(p.kind, arg, env)
        return self.apply(op, args, e)

    def op_constant(self, kind: str, arg: Arg, env: Env):
        """A compile-time argument of an op of kind `kind` ("int", "index", "float", ...) as
        the checker converted it, in this instance; computed here where it was not known."""
        value = arg.value
        if kind in ("window", "padding"):  # an int, a list of ints, or a padding's "same" / "valid"
            if isinstance(value, str):
                return value
            kind = "ints" if isinstance(value, list) else "int"
        if kind in ("int", "ints"):
            items = value if kind == "ints" else [value]
            unknown = any(x is None for x in items) and not isinstance(env.ctx.res.types.get(arg.node), NoneT)
            if not unknown:
                found = [self.concrete_dim(env.ctx, x, arg.node) if isinstance(x, Dim) else x for x in items]
                return found if kind == "ints" else found[0]
        elif value is not None:
            return value  # an index, a bool, a str: known where it was checked, or the check failed
        computed = self.expr(arg.node, env)
        if kind == "float" and isinstance(computed, Dim):
            return float(_number(computed))
        return computed

    def call_fn(self, ref: FnRef, info: CallInfo, e: A.Call, env: Env):
        fn = ref.fn
        caller = env.ctx
        args, unknown = self.static_args(info, caller, e)
        # arguments in the order they are written (their ops come in that order), then defaults
        order = sorted((a for a in info.args if info.args[a].node is not None), key=lambda a: info.args[a].node.span)
        order += [a for a in info.args if info.args[a].node is None]
        for name in order:
            arg = info.args[name]
            if isinstance(arg.value, (TensorT, TupleT)):
                if arg.node is None:
                    raise LoweringError(self.where(env.item, e) + f"`{name}` of `{fn.name.id}` has no argument")
                args[name] = self.expr(arg.node, env)
        if self._depth > 5000:
            raise LoweringError(self.where(env.item, e) + "calls nest too deeply")
        ctx = self.call_context(ref, info, args, caller, e)
        if unknown:
            # what the checker could not know where it checked the call (a float parameter
            # of the caller) is computed here: an argument in the caller, a default in the callee
            callee = Env(ctx)
            callee.vars.update({p.name: args[p.name.id] for p in fn.params if p.name.id in args})
            for p, arg in unknown:
                value = self.expr(arg.node, env) if arg.node is not None else self.expr(arg.default, callee)
                args[p.name.id] = callee.vars[p.name] = _as_kind(value, arg.value)
                atom = _param_atom(ctx.res, p)
                if atom is not None and isinstance(args[p.name.id], Dim):
                    ctx.subst[atom] = args[p.name.id]
        saved = self._item
        origin = self._origin(e) if saved is not None else ""
        self._item = ref.item
        try:
            if ref.item.is_std and is_composite(fn) and ref.inst is None:
                return self.composite(fn, ctx, {a: args[a] for a in order}, origin)
            args = {p.name.id: args[p.name.id] for p in fn.params}  # declaration order
            graph = self.specialise(ref, ctx, args)
            if graph is None:  # not a function of tensors, or of dims it cannot read: in place
                callee = Env(ctx)
                callee.vars.update({p.name: args[p.name.id] for p in fn.params})
                return self.block(fn.body, callee.child())
        finally:
            self._item = saved
        return self.emit_call(graph, ref, args, e)

    def specialise(self, ref: FnRef, ctx: Context, args: dict[str, Any]) -> Graph | None:
        """The function of `Program.functions` that runs `ref` on arguments like `args`
        (lowered on first use, in context `ctx`), or None when the call must be evaluated in
        place: an argument that is a list of tensors or a module, a result that is not
        tensors, or a graph whose shapes use a dim variable that no argument's shape has as a
        whole dim (called with `[E, B * S, n]`: `B` and `S` could not be read in it)."""
        fn = ref.fn
        try:
            static = tuple((k, _spec_key(v)) for k, v in args.items() if not isinstance(v, Value))
        except _Unspecialisable:
            return None
        tensors = tuple((k, _type_key(v.type)) for k, v in args.items() if isinstance(v, Value))
        receiver = self.module_class(ref.inst) if ref.inst is not None else None
        key = (id(fn), receiver, tensors, static)
        if key in self._specialised:
            return self._specialised[key]
        name = f"{self.modules[receiver].name}.{fn.name.id}" if receiver is not None else fn.name.id
        graph = Graph(name, [], kind="method" if receiver is not None else "function", qualname=name)
        graph.receiver, graph.origin = receiver, self._origin_in(ref.item, fn.name)
        header = " ".join(ref.item.text[fn.name.span.start : fn.body.span.start].split())
        graph.signature = re.sub(r",?\s*\)", ")", re.sub(r"\(\s+", "(", header))
        rel = ModInst(ref.inst.item, ref.inst.args, "", _spec=ref.inst.spec) if ref.inst is not None else None
        saved, depth = self.frame, self._loop_depth
        self.frame, self._loop_depth = Frame(graph), 0
        try:
            callee = Env(dataclasses.replace(ctx, inst=rel))  # members read relative to the receiver
            for p in fn.params:
                v = args[p.name.id]
                callee.vars[p.name] = self.input(v.type, p.name.id) if isinstance(v, Value) else v
            result = self.block(fn.body, callee.child())
            outs = list(result) if isinstance(result, tuple) else [result]
            if not outs or not all(isinstance(o, Value) for o in outs):
                self._specialised[key] = None
                return None
            graph.outputs = outs
            if unbound_dim(graph) is not None:
                # an argument's dim is a product or sum of the caller's (`B * S` through
                # `...`), so its shapes use `B` and `S`, which no argument's shape has as a
                # whole dim to read them from: lowered in the caller, where they are known
                self._specialised[key] = None
                return None
            self.finish(graph, outs, ref.item, fn.name)
        finally:
            self.frame, self._loop_depth = saved, depth
        graph.name = _fresh_key(self.functions, _identifier_path(name))
        self.functions[graph.name] = graph
        self._specialised[key] = graph
        return graph

    def emit_call(self, graph: Graph, ref: FnRef, args: dict[str, Any], e: A.Call):
        """A `call` of `graph` with the tensor arguments of `args`; the callee's state writes,
        prefixed with its receiver, become the caller's (their new values follow the outputs)."""
        prefix = ref.inst.path if ref.inst is not None else None
        shift = lambda w: shift_indices(w, self._loop_depth)  # noqa: E731
        writes = [(prefix or "") + shift(w) for w in sorted(graph.written_state())]
        updates = [(prefix or "") + w for w in graph.state_updates]
        op_args = {p.name.id: args[p.name.id] for p in ref.fn.params if isinstance(args[p.name.id], Value)}
        types = [o.type for o in graph.outputs] + [v.type for v in graph.state_updates.values()]
        attrs = {"fn": graph.name, "receiver": prefix, "writes": writes, "updates": updates}
        # named after the submodule called (`mlp`), else the function (`apply_rope`)
        member = (prefix or "").rstrip(".").rsplit(".", 1)[-1]
        hint = member if member.isidentifier() else ref.fn.name.id
        results = self.emit("call", op_args, types, hint, e, **attrs)
        results[0].producer.callee = graph
        outs = results[: len(graph.outputs)]
        for path, v in zip(updates, results[len(graph.outputs) :]):
            v.name = v.hint = _hint_from_path(path)
            self._state_values[path] = v
        return outs[0] if len(outs) == 1 else tuple(outs)

    def composite(self, fn: A.FnDef, ctx: Context, args: dict[str, Any], origin: str):
        """Lower a std function as a `composite` op whose body is its decomposition."""
        tensor_args = {k: v for k, v in args.items() if isinstance(v, Value)}
        attrs = {k: v for k, v in args.items() if not isinstance(v, Value)}
        body = Graph(f"composite:{fn.name.id}", [], kind="composite", qualname=fn.name.id)
        body.origin = self._origin_in(self._item, fn.name)
        params = {p.name.id: p.name for p in fn.params}
        inner_env = Env(ctx)
        inner_env.vars.update({params[k]: v for k, v in attrs.items()})
        saved = self.frame
        self.frame = Frame(body)
        try:
            for k, v in tensor_args.items():
                inner_env.vars[params[k]] = self.input(v.type, k)
            result = self.block(fn.body, inner_env.child())
        finally:
            self.frame = saved
        outs = result if isinstance(result, tuple) else (result,)
        body.outputs = list(outs)
        op = Op("composite", {k: self.local(v) for k, v in tensor_args.items()} | attrs, [], {"name": fn.name.id}, body)
        op.results = [Value(o.type, fn.name.id, op) for o in outs]
        op.origin = origin  # the call site, in the caller's file
        self.graph.ops.append(op)
        self.frame.defined.update(id(r) for r in op.results)
        return op.results[0] if len(op.results) == 1 else tuple(op.results)

    # ----- loops
    def loop(self, s: A.For, ml: "ModList", env: Env) -> None:
        """`for x in list { ... }` over a list of submodules as one `loop` op: the body is
        lowered once, with the item `{list}.{iN}.` as receiver prefix, the outer locals it
        assigns as loop-carried values and the outer values it reads as captured inputs.
        Unrolled instead when a carried value is not a tensor or changes type."""
        carried = []  # (the local's defining node, its value before the loop)
        for target in _assigned(s.body):
            ref = self.ref(target, env)
            if ref.kind != "local" or any(node is ref.node for node, _ in carried):
                continue
            found, v = env.lookup(ref.node)
            if found and isinstance(v, Value):
                carried.append((ref.node, v))
            elif found:
                return self.unrolled(s, ml, env)
        if ml.index is not None:  # items that receive their index are different modules
            return self.unrolled(s, ml, env)
        if ml.count == 0:
            return None
        index = LOOP_INDEX % self._loop_depth
        saved_item = self._item
        self._item = ml.owner.item
        try:
            item = self.instantiate(ml.ctor, self.module_env(ml.owner), f"{ml.path}.{index}.")
        finally:
            self._item = saved_item
        body = Graph(f"{s.var.id} in {ml.path}", [], kind="loop", qualname=s.var.id, receiver=self.graph.receiver)
        parent = self.frame
        frame = Frame(body, parent=parent)
        self.frame = frame
        self._loop_depth += 1
        try:
            inner = env.child()
            for node, v in carried:
                inner.vars[node] = self.input(v.type, node.id)
            inner.vars[s.var] = item
            self.block(s.body, inner.child())
            outs = [self.local(inner.vars[node]) for node, _ in carried]
            body.outputs = outs
            for path, v in frame.state_values.items():
                if v.producer is not None and v.producer.name != "state":
                    body.state_updates[path] = v
        finally:
            self.frame = parent
            self._loop_depth -= 1
        if any(_type_key(o.type) != _type_key(v.type) for o, (_, v) in zip(outs, carried)):
            return self.unrolled(s, ml, env)
        attrs = {
            "list": ml.path,
            "count": ml.count,
            "index": index,
            "var": s.var.id,
            "writes": sorted(body.written_state()),
        }
        results = self.emit(
            "loop",
            {"carried": [v for _, v in carried], "captured": frame.captured},
            [v.type for _, v in carried],
            "",
            s,
            **attrs,
        )
        loop_op = self.graph.ops[-1]
        loop_op.body = body
        for (node, _), r in zip(carried, results):
            r.name = r.hint = node.id
            env.assign(node, r)
        return None

    def unrolled(self, s: A.For, ml: "ModList", env: Env) -> None:
        """The loop's body once per item, in place."""
        for x in self.list_items(ml):
            inner = env.child()
            inner.vars[s.var] = x
            self.block(s.body, inner)

    # ----- messages
    def where(self, item: Item | None, node) -> str:
        if item is None or node is None or not hasattr(node, "span"):
            return ""
        loc = item.resolve(node.span)
        return f"{item.source.path}:{loc.start.line}:{loc.start.column}: "


# ----------------------------------------------------------------------------- helpers


class _Unspecialisable(Exception):
    """A compile-time argument a function cannot be specialised on (a module, a list of tensors)."""


def _spec_key(v) -> Any:
    """A hashable key of a compile-time value, equal for equal values."""
    if isinstance(v, Dim):
        return ("dim", v.key())
    if isinstance(v, float):
        return ("float", repr(v))
    if v is None or isinstance(v, (bool, int, str)):
        return (type(v).__name__, v)
    if isinstance(v, DType):
        return ("dtype", v.name)
    if isinstance(v, ConfigValue):
        return ("config", v.key())
    if v is MISSING:
        return ("missing",)
    if isinstance(v, (list, tuple)) and not any(isinstance(x, Value) for x in v):
        return ("seq", tuple(_spec_key(x) for x in v))
    raise _Unspecialisable()


def _type_key(t: TensorT) -> Any:
    return (t.dtype.name, tuple(d.key() for d in t.shape.dims))


def _fresh_key(taken: dict, name: str) -> str:
    key, n = name, 1
    while key in taken:
        n += 1
        key = f"{name}_{n}"
    return key


def _identifier_path(name: str) -> str:
    """`LlamaAttention.step` as a key usable in IR text and generated code (dots kept)."""
    return "".join(ch if ch.isalnum() or ch in "._" else "_" for ch in name)


def _assigned(block: A.Block) -> list[A.Name]:
    """The names assigned (`x = ...`, not `let`) anywhere in a block, in order."""
    return [node.target for node in A.walk(block) if isinstance(node, A.Assign)]


def _is_config_param(p: A.Param) -> bool:
    """A parameter whose type is a config (its value picks the check: `Analysis.resolved`)."""
    return isinstance(p.type, A.NamedType) and p.type.name.id not in SCALAR_TYPE_NAMES


def _config_args(params: list[A.Param], args: dict[str, Any]) -> dict[str, Any]:
    return {p.name.id: args[p.name.id] for p in params if _is_config_param(p) and p.name.id in args}


def _param_atom(res: Resolved, p: A.Param) -> Atom | None:
    """The atom an int parameter is in check `res` (a module's or a function's: its values
    are symbolic in it), or None."""
    t = res.types.get(p.name)
    if not (isinstance(t, ScalarT) and t.kind == "int" and isinstance(t.value, Dim)):
        return None
    terms = t.value.terms
    if len(terms) == 1 and terms[0][1] == 1 and len(terms[0][0]) == 1 and terms[0][0][0][1] == 1:
        return terms[0][0][0][0]
    return None


def _as_kind(value, checked: Type):
    """A value computed here, converted as the checker converts an argument of its type (an
    int given for a `float` parameter is a float)."""
    if isinstance(checked, ScalarT) and checked.kind == "float" and isinstance(value, Dim):
        return float(_number(value))
    return value


def used_dim_atoms(graph: Graph) -> list[Atom]:
    """The dim variables `graph`'s values and op arguments use, in atom order."""
    used: dict[str, Atom] = {}
    for v in _graph_values(graph):
        for d in v.dims:
            for a in d.atoms():
                if a.kind == "var":
                    used.setdefault(a.name, a)
    for op in body_ops(graph):
        for d in _arg_dims(op.args):
            for a in d.atoms():
                if a.kind == "var":
                    used.setdefault(a.name, a)
    return sorted(used.values())


def _dim_source(graph: Graph, atom: Atom) -> tuple[int, int] | None:
    """(input index, axis) of the first input axis that is exactly `atom`, or None."""
    key = Dim.atom(atom).key()
    return next(
        ((i, axis) for i, v in enumerate(graph.inputs) for axis, d in enumerate(v.dims) if d.key() == key),
        None,
    )


def unbound_dim(graph: Graph) -> str | None:
    """The first dim variable `graph` uses that no input axis is exactly (a `B` whose inputs
    only carry `B * S`), or None when every one can be read from an input's shape."""
    return next((a.name for a in used_dim_atoms(graph) if _dim_source(graph, a) is None), None)


def dim_sources_of(graph: Graph) -> dict[str, tuple[int, int]]:
    """Each dim variable `graph` uses -> (input index, axis) it is read from."""
    return {a.name: _dim_source(graph, a) for a in used_dim_atoms(graph)}


def _graph_values(g: Graph):
    yield from g.inputs
    for op in body_ops(g):
        yield from op.results


def _arg_dims(args: dict):
    for v in args.values():
        if isinstance(v, Dim):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, Dim))
        elif isinstance(v, dict):
            yield from (x for x in v.values() if isinstance(x, Dim))


def _values(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Value) for x in v)


def _number(v):
    if isinstance(v, Dim):
        n = v.as_int()
        if n is None:
            raise LoweringError(f"a symbolic dim ({_show_dim(v)}) is used as a number")
        return n
    return v


def _show_dim(d: Dim) -> str:
    from ..types.dims import format_dim

    return format_dim(d)


def _config_scalar(v):
    if isinstance(v, bool) or v is None or isinstance(v, (str, float, ConfigValue)):
        return v
    if isinstance(v, int):
        return Dim.of(v)
    return v


def _named(v, name: str):
    """Name a value after the local it is bound to (inputs, parameters and state keep theirs)."""
    if isinstance(v, Value) and v.producer is not None and v.producer.name not in ("param", "state"):
        v.name = v.hint = name
    return v


def _hint_from_path(path: str) -> str:
    """A short readable name for a parameter: `model.layers.3.self_attn.q_proj.weight` -> `l3_q_proj`."""
    parts = path.split(".")
    layer = next((p for p in reversed(parts) if p.isdigit()), None)
    names = [p for p in parts if not p.isdigit()]
    name = names[-1]
    if name in ("weight", "bias") and len(names) > 1:
        name = names[-2] + ("_bias" if name == "bias" else "")
    return f"l{layer}_{name}" if layer is not None else name


def _checkpoint_name(m: A.FieldDecl) -> str:
    for attr in m.attributes:
        if attr.name.id == "name" and attr.args and isinstance(attr.args[0].value, A.StrLit):
            return attr.args[0].value.value
    return m.name.id


def is_composite(fn: A.FnDef) -> bool:
    """Whether a standard-library function is marked `@composite`: lowered as a `composite` op,
    which backends may run as a native kernel (ARCHITECTURE.md, "Numerics": `fast` may fuse);
    its body is always its meaning."""
    return any(a.name.id == "composite" for a in fn.attributes)


__all__ = ["Lowering", "LoweringError", "is_composite"]
