"""Lowering: the checked AST of a root model, under one concrete config, to Core IR.

Lowering evaluates the program the way the checker typed it, with concrete values: config
fields are numbers and compile-time `if`s pick a branch. The program keeps its structure:
each module method and Linnet function called becomes a function of the program
(`Program.functions`), specialised for its receiver's class (`Program.modules`: the modules of
one kind with one set of arguments) and for its arguments' types and compile-time values, so
thirty identical decoder layers share one function; a parameter read is a `param` op named
by its path relative to the receiver (`q_proj.weight`); `for layer in layers` over identical
submodules is one `loop` op whose body has the item as receiver (`layers.{i0}.`). Calls of
standard-library functions named in `COMPOSITES` become `composite` ops. Only the entries'
dims (`B`, `S`, one atom each for the whole program) stay symbolic.

What cannot be a function is inlined, as before: a call whose arguments include lists of
tensors or modules, or whose callee returns something other than tensors.

Lowering runs after a clean check; what the checker guarantees (names resolve, shapes agree,
conditions are compile-time) is assumed, and a violation raises `LoweringError` naming the
source position rather than producing a wrong graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ops import OPERATORS, REGISTRY, REQUIRED, OpDef, OpError
from ..semantics.configs import MISSING, ConfigValue
from ..semantics.names import BUILTIN_CONSTANTS
from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import DTYPES, DType, TensorT
from ..types.dims import Atom, Dim, DivisionError, solve_linear, var
from ..types.scalars import ScalarError, arithmetic, compare
from .core import LOOP_INDEX, Graph, ModuleClass, Op, TensorSpec, Value, tensor_type

# Standard-library functions lowered as `composite` ops: backends may run a native kernel for
# them (ARCHITECTURE.md, "Numerics": `fast` may fuse). The body is always their meaning.
COMPOSITES = frozenset({"softmax", "rms_norm", "layer_norm", "silu", "gelu", "gelu_tanh", "attention"})


class LoweringError(Exception):
    """The program cannot be lowered under this config; the message names the source position."""


# ----------------------------------------------------------------------------- runtime values


@dataclass(eq=False)
class ModInst:
    """A module instance: its item, argument values and checkpoint path prefix."""

    item: Item
    args: dict[str, Any]
    path: str
    members: dict[str, Any] | None = None

    @property
    def mdef(self) -> A.ModuleDef:
        return self.item.ast


@dataclass(eq=False)
class ModList:
    """`layers: [Block(c); n]`: `count` instances of one constructor call."""

    owner: ModInst
    ctor: A.Call
    count: int
    path: str
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


class _Unbound(Exception):
    def __init__(self, name: str):
        self.name = name


class Env:
    """A lexical scope of locals."""

    def __init__(self, parent: "Env | None" = None, inst: ModInst | None = None, item: Item | None = None):
        self.parent = parent
        self.vars: dict[str, Any] = {}
        self.inst = inst if inst is not None or parent is None else parent.inst
        self.item = item if item is not None or parent is None else parent.item

    def lookup(self, name: str):
        e = self
        while e is not None:
            if name in e.vars:
                return True, e.vars[name]
            e = e.parent
        return False, None

    def assign(self, name: str, value) -> bool:
        e = self
        while e is not None:
            if name in e.vars:
                e.vars[name] = value
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
    """Lowers entries of a root model. `globals_(name, site)` finds the item `name` names in
    the file that defines item `site` (its items, its imports, then std: imports.Globals);
    `config` binds the model's config parameters; `dtype` is the working dtype."""

    globals_: Any
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
        fenv = Env(self.module_env(root))
        bound: dict[str, Dim] = {}
        for p in fn.params:
            if not isinstance(p.type, A.TensorType):
                raise LoweringError(self.where(root.item, p) + f"entry parameter `{p.name.id}` must be a tensor")
            dims = []
            for d in p.type.dims:
                if isinstance(d, A.EllipsisDim):
                    raise LoweringError(self.where(root.item, d) + "entry parameters have a known rank (no `...`)")
                if isinstance(d, A.Name) and d.id not in bound and not self._known(d.id, fenv):
                    bound[d.id] = Dim.atom(self._dim_atoms.setdefault(d.id, var(d.id)))
                dims.append(self.dim_expr(d, fenv, bound))
            dtype = self.dtype_of(p.type.dtype, {})
            v = self.input(tensor_type(dtype, dims), p.name.id)
            fenv.vars[p.name.id] = v
        for name, d in bound.items():
            fenv.vars[name] = d
        result = self.block(fn.body, Env(fenv))
        outs = result if isinstance(result, tuple) else (result,)
        for o in outs:
            if not isinstance(o, Value):
                raise LoweringError(self.where(root.item, fn.name) + "an entry returns tensors")
        self.finish(graph, list(outs), root.item, fn.name)
        self.frame = None
        return graph

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
        used: dict[str, Atom] = {}
        for v in _graph_values(graph):
            for d in v.dims:
                for a in d.atoms():
                    if a.kind == "var":
                        used.setdefault(a.name, a)
        for op in _graph_ops(graph):
            for d in _arg_dims(op.args):
                for a in d.atoms():
                    if a.kind == "var":
                        used.setdefault(a.name, a)
        for name, atom in sorted(used.items(), key=lambda kv: kv[1]):
            source = next(
                (
                    (i, axis)
                    for i, v in enumerate(graph.inputs)
                    for axis, d in enumerate(v.dims)
                    if d.key() == Dim.atom(atom).key()
                ),
                None,
            )
            if source is None:
                raise LoweringError(
                    self.where(item, node) + f"the dim `{name}` is used here but no tensor argument has it as a dim"
                )
            graph.dim_vars.append(name)
            graph.dim_sources[name] = source

    def _known(self, name: str, env: Env) -> bool:
        found, _ = env.lookup(name)
        return found or self.config_name(name)

    def config_name(self, name: str) -> bool:
        return name in ("max_batch", "max_positions")

    # ----- module classes
    def module_class(self, inst: ModInst) -> str:
        """The key of `inst`'s class in `modules` (registered, with its children, on first use):
        the module's name, suffixed when another set of arguments came first."""
        spec = (id(inst.item), tuple((k, _spec_key(v)) for k, v in inst.args.items()))
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
        rel = ModInst(inst.item, inst.args, "")
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
                    keys = {self.module_class(x) for x in items}
                    if len(keys) == 1:
                        cls.children[name_] = (keys.pop(), m.count)
        finally:
            self.frame, self._item = saved, saved_item
        return key

    # ----- emitting ops
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
        if inst.members is not None:
            return inst.members
        out: dict[str, Any] = {}
        env = self.module_env(inst)
        self._members(inst, inst.mdef.members, env, out)
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
                        out[m.name.id] = ModList(inst, m.ctor, n, path)
                elif isinstance(m, A.StateDecl):
                    out[m.name.id] = StateMember(f"{inst.path}{m.name.id}", m, inst)
                elif isinstance(m, A.FnDef):
                    out[m.name.id] = FnRef(inst.item, m, inst)
        finally:
            self._item = saved

    def list_items(self, ml: ModList) -> list[ModInst]:
        if ml._items is None:
            env = self.module_env(ml.owner)
            saved = self._item
            self._item = ml.owner.item
            try:
                ml._items = [self.instantiate(ml.ctor, env, f"{ml.path}.{i}.") for i in range(ml.count)]
            finally:
                self._item = saved
        return ml._items

    def module_env(self, inst: ModInst) -> Env:
        env = Env(None, inst, inst.item)
        env.vars.update(inst.args)
        return env

    def instantiate(self, ctor: A.Call, env: Env, path: str) -> ModInst:
        if not isinstance(ctor.func, A.Name):
            raise LoweringError(self.where(env.item, ctor) + "a submodule is built by calling a module by name")
        item = self.globals_(ctor.func.id, env.item)
        if item is None or item.kind != "module":
            raise LoweringError(self.where(env.item, ctor.func) + f"`{ctor.func.id}` is not a module")
        mdef: A.ModuleDef = item.ast
        matched = self.match(mdef.params, ctor.args, env, item)
        args = {}
        for p in mdef.params:
            if p.name.id in matched:
                args[p.name.id] = matched[p.name.id]
            else:
                denv = Env(None, None, item)
                denv.vars.update(args)
                saved = self._item
                self._item = item
                try:
                    args[p.name.id] = self.expr(p.default, denv)
                finally:
                    self._item = saved
        return ModInst(item, args, path)

    def match(self, params: list[A.Param], args: list[A.Arg], env: Env, callee: Item) -> dict[str, Any]:
        """Evaluate call arguments in `env` and match them to parameter names."""
        names = [p.name.id for p in params]
        out: dict[str, Any] = {}
        positional = [a for a in args if a.name is None]
        for name, a in zip(names, positional):
            out[name] = self.expr(a.value, env)
        for a in args:
            if a.name is not None:
                out[a.name.id] = self.expr(a.value, env)
        return out

    def member_type(self, m: "ParamMember | StateMember") -> TensorT:
        """The concrete type of a parameter or state member, from its declaration."""
        env = self.module_env(m.owner)
        saved = self.frame
        self.frame = Frame(Graph("", [])) if saved is None else saved
        item = self._item
        self._item = m.owner.item
        try:
            dims = [self.dim_expr(d, env, {}) for d in m.decl.type.dims]
        finally:
            self._item = item
            self.frame = saved
        return tensor_type(self.dtype_of(m.decl.type.dtype, {}), dims)

    def param_spec(self, m: ParamMember) -> TensorSpec:
        """The program's parameter at `m`'s (absolute) path."""
        spec = self.params.get(m.path)
        if spec is None:
            spec = self.params[m.path] = TensorSpec(m.path, self.member_type(m), "param")
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

    # ----- types and dims
    def dtype_of(self, name: A.Name | None, generics: dict[str, DType]) -> DType:
        if name is None:
            return self.dtype
        if name.id in generics:
            return generics[name.id]
        d = DTYPES.get(name.id)
        if d is None:
            raise LoweringError(f"unknown dtype `{name.id}`")
        return d

    def dim_expr(self, e, env: Env, bound: dict[str, Dim]) -> Dim:
        v = self._dim_eval(e, env, bound)
        if not isinstance(v, Dim):
            raise LoweringError(self.where(env.item, e) + "a dim is a compile-time int")
        return v

    def _dim_eval(self, e, env: Env, bound: dict[str, Dim]):
        """Evaluate a dim expression; names not bound anywhere raise `_Unbound`."""
        if isinstance(e, A.Name):
            if e.id in bound:
                return bound[e.id]
            found, v = env.lookup(e.id)
            if found:
                return v
            if env.inst is not None and e.id in self.members(env.inst):
                return self.members(env.inst)[e.id]
            if e.id == "max_batch":
                return Dim.of(self.max_batch)
            if e.id == "max_positions":
                return Dim.of(self.max_positions)
            raise _Unbound(e.id)
        if isinstance(e, A.IntLit):
            return Dim.of(e.value)
        if isinstance(e, A.BinOp):
            a = self._dim_eval(e.left, env, bound)
            b = self._dim_eval(e.right, env, bound)
            return self.scalar_binop(e.op, a, b, e, env)
        if isinstance(e, A.Neg):
            return -self._dim_eval(e.operand, env, bound)
        return self.expr(e, env)

    def bind_signature(self, fn: A.FnDef, callee_env: Env, args: dict[str, Any], item: Item) -> dict[str, DType]:
        """Bind a callee's dim variables and dtype variables from its tensor arguments."""
        generics = {g.name.id for g in fn.generics}
        dtypes: dict[str, DType] = {}
        bound: dict[str, Dim] = {}
        pairs = []
        for p in fn.params:
            v = args.get(p.name.id)
            if not isinstance(p.type, A.TensorType) or not isinstance(v, Value):
                continue
            if p.type.dtype is not None and p.type.dtype.id in generics:
                dtypes[p.type.dtype.id] = v.dtype
            dims = p.type.dims
            ell = [i for i, d in enumerate(dims) if isinstance(d, A.EllipsisDim)]
            if ell:
                pre, post = dims[: ell[0]], dims[ell[0] + 1 :]
                actual = list(v.dims[: len(pre)]) + (list(v.dims[len(v.dims) - len(post) :]) if post else [])
                pattern = list(pre) + list(post)
            else:
                pattern, actual = list(dims), list(v.dims)
            pairs += list(zip(pattern, actual))
        pending = pairs
        while pending:
            left = []
            for pat, actual in pending:
                try:
                    self._dim_eval(pat, callee_env, bound)
                except _Unbound as u:
                    left.append((pat, actual, u.name))
            progress = False
            still = []
            for pat, actual, name in left:
                if name in bound:
                    still.append((pat, actual))
                    continue
                atom = var("?" + name)
                try:
                    poly = self._dim_eval(pat, callee_env, {**bound, name: Dim.atom(atom)})
                except _Unbound:
                    still.append((pat, actual))
                    continue
                sol = solve_linear(poly, actual, atom)
                if sol is None or isinstance(sol, DivisionError):
                    raise LoweringError(
                        self.where(item, pat) + f"cannot solve `{name}` from a dim of {_show_dim(actual)}"
                    )
                bound[name] = sol
                progress = True
            if not still:
                break
            if not progress:
                pat = still[0][0]
                raise LoweringError(self.where(item, pat) + "cannot infer the dims of this parameter")
            pending = still
        for name, d in bound.items():
            callee_env.vars[name] = d
        return dtypes

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
                    env.vars[t.id] = _named(x, t.id)
            else:
                env.vars[s.targets[0].id] = _named(v, s.targets[0].id)
        elif isinstance(s, A.Assign):
            v = self.expr(s.value, env)
            if env.assign(s.target.id, _named(v, s.target.id)):
                return
            m = self.members(env.inst).get(s.target.id) if env.inst is not None else None
            if isinstance(m, StateMember):
                if not isinstance(v, Value):
                    raise LoweringError(self.where(env.item, s) + "state is assigned a tensor")
                self.state_spec(m)
                self._state_values[m.path] = _named(v, s.target.id)
                return
            raise LoweringError(self.where(env.item, s.target) + f"cannot assign `{s.target.id}`")
        elif isinstance(s, A.For):
            seq = self.expr(s.iter, env)
            if isinstance(seq, ModList):
                self.loop(s, seq, env)
                return
            items = seq
            if not isinstance(items, (list, tuple)):
                raise LoweringError(self.where(env.item, s.iter) + "`for` iterates over a list of submodules")
            for x in items:
                inner = Env(env)
                inner.vars[s.var.id] = x
                self.block(s.body, inner)
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
                return self.block(e.then, Env(env))
            if e.orelse is None:
                return UNIT
            if isinstance(e.orelse, A.Block):
                return self.block(e.orelse, Env(env))
            return self.expr(e.orelse, env)
        raise LoweringError(self.where(env.item, e) + "unsupported expression")

    def name(self, e: A.Name, env: Env):
        found, v = env.lookup(e.id)
        if found:
            return self.member_value(v) if isinstance(v, (ParamMember, StateMember)) else v
        if env.inst is not None:
            members = self.members(env.inst)
            if e.id in members:
                return self.member_value(members[e.id], e)
        if e.id == "max_batch":
            return Dim.of(self.max_batch)
        if e.id == "max_positions":
            return Dim.of(self.max_positions)
        item = self.globals_(e.id, env.item)
        if item is not None:
            if item.kind == "fn":
                return FnRef(item, item.ast, None)
            raise LoweringError(self.where(env.item, e) + f"`{e.id}` is a {item.kind}, not a value")
        if e.id in REGISTRY:
            return REGISTRY[e.id]
        if e.id in DTYPES:
            return DTYPES[e.id]
        if e.id in BUILTIN_CONSTANTS:
            return BUILTIN_CONSTANTS[e.id]
        raise LoweringError(self.where(env.item, e) + f"unknown name `{e.id}`")

    def attr(self, e: A.Attr, env: Env):
        base = self.expr(e.value, env)
        name = e.name.id
        if isinstance(base, ConfigValue):
            v = base.values.get(name, MISSING)
            if v is MISSING:
                raise LoweringError(self.where(env.item, e) + f"config field `{name}` has no value")
            return _config_scalar(v)
        if isinstance(base, Value):
            if name == "dtype":
                return base.dtype
        if isinstance(base, ModInst):
            m = self.members(base).get(name)
            if m is not None:
                return self.member_value(m, e)
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
        func = e.func
        if isinstance(func, A.Attr):
            base = self.expr(func.value, env)
            if isinstance(base, ModInst):
                m = self.members(base).get(func.name.id)
                if not isinstance(m, FnRef):
                    raise LoweringError(self.where(env.item, func) + f"no method `{func.name.id}`")
                return self.call_fn(m, e, env)
            target = self.attr(func, env)
        else:
            target = self.expr(func, env)
        if isinstance(target, ModInst):
            m = self.members(target).get("forward")
            if not isinstance(m, FnRef):
                raise LoweringError(self.where(env.item, func) + "this module has no `forward`")
            return self.call_fn(m, e, env)
        if isinstance(target, OpDef):
            return self.call_op(target, e, env)
        if isinstance(target, FnRef):
            return self.call_fn(target, e, env)
        raise LoweringError(self.where(env.item, func) + "this is not callable")

    def call_op(self, op: OpDef, e: A.Call, env: Env):
        values = [self.expr(a.value, env) for a in e.args]
        if (
            op.fold is not None
            and values
            and all(a.name is None for a in e.args)
            and not any(isinstance(v, Value) for v in values)
        ):
            return self.fold(op, values, e)
        names = [p.name for p in op.params if p.kind != "sizes"]
        args: dict[str, Any] = {}
        sizes: dict[str, Any] = {}
        positional = [v for a, v in zip(e.args, values) if a.name is None]
        for name, v in zip(names, positional):
            args[name] = v
        for a, v in zip(e.args, values):
            if a.name is not None:
                if a.name.id in names:
                    args[a.name.id] = v
                else:
                    sizes[a.name.id] = v
        for p in op.params:
            if p.kind == "sizes":
                args[p.name] = sizes
            elif p.kind == "index" and isinstance(args.get(p.name), Dim):
                args[p.name] = args[p.name].as_int()
            elif p.kind == "indices" and isinstance(args.get(p.name), list):
                args[p.name] = [d.as_int() for d in args[p.name]]
            elif p.kind == "float" and isinstance(args.get(p.name), Dim):
                args[p.name] = float(_number(args[p.name]))
        return self.apply(op, args, e)

    def call_fn(self, ref: FnRef, e: A.Call, env: Env):
        fn = ref.fn
        args = self.match(fn.params, e.args, env, ref.item)
        if self._depth > 5000:
            raise LoweringError(self.where(env.item, e) + "calls nest too deeply")
        base = self.module_env(ref.inst) if ref.inst is not None else Env(None, None, ref.item)
        callee = Env(base, ref.inst, ref.item)
        saved = self._item
        origin = self._origin(e) if saved is not None else ""
        self._item = ref.item
        try:
            for p in fn.params:
                if p.name.id not in args:
                    args[p.name.id] = self.expr(p.default, callee)
                callee.vars[p.name.id] = args[p.name.id]
            if ref.item.is_std and fn.name.id in COMPOSITES and ref.inst is None:
                for g, d in self.bind_signature(fn, callee, args, ref.item).items():
                    callee.vars[g] = d
                return self.composite(fn, callee, args, origin)
            graph = self.specialise(ref, args)
            if graph is None:  # not a function of tensors: evaluated in place
                for g, d in self.bind_signature(fn, callee, args, ref.item).items():
                    callee.vars[g] = d
                return self.block(fn.body, Env(callee))
        finally:
            self._item = saved
        return self.emit_call(graph, ref, args, e)

    def specialise(self, ref: FnRef, args: dict[str, Any]) -> Graph | None:
        """The function of `Program.functions` that runs `ref` on arguments like `args`
        (lowered on first use), or None when the call must be evaluated in place: an argument
        that is a list of tensors or a module, or a result that is not tensors."""
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
        rel = ModInst(ref.inst.item, ref.inst.args, "") if ref.inst is not None else None
        saved, depth = self.frame, self._loop_depth
        self.frame, self._loop_depth = Frame(graph), 0
        try:
            base = self.module_env(rel) if rel is not None else Env(None, None, ref.item)
            callee = Env(base, rel, ref.item)
            for p in fn.params:
                v = args[p.name.id]
                callee.vars[p.name.id] = self.input(v.type, p.name.id) if isinstance(v, Value) else v
            inputs = {p.name.id: callee.vars[p.name.id] for p in fn.params}
            for g, d in self.bind_signature(fn, callee, inputs, ref.item).items():
                callee.vars[g] = d
            result = self.block(fn.body, Env(callee))
            outs = list(result) if isinstance(result, tuple) else [result]
            if not outs or not all(isinstance(o, Value) for o in outs):
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
        shift = lambda w: _shift_indices(w, self._loop_depth)  # noqa: E731
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

    def composite(self, fn: A.FnDef, callee: Env, args: dict[str, Any], origin: str):
        """Lower a std function as a `composite` op whose body is its decomposition."""
        tensor_args = {k: v for k, v in args.items() if isinstance(v, Value)}
        attrs = {k: v for k, v in args.items() if not isinstance(v, Value)}
        body = Graph(f"composite:{fn.name.id}", [], kind="composite", qualname=fn.name.id)
        body.origin = self._origin_in(self._item, fn.name)
        inner_env = Env(callee)
        saved = self.frame
        self.frame = Frame(body)
        try:
            for k, v in tensor_args.items():
                inner_env.vars[k] = self.input(v.type, k)
            result = self.block(fn.body, Env(inner_env))
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
        carried = []
        for name in _assigned_names(s.body):
            found, v = env.lookup(name)
            if found and isinstance(v, Value):
                carried.append((name, v))
            elif found:
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
            inner = Env(env)
            for name, v in carried:
                inner.vars[name] = self.input(v.type, name)
            inner.vars[s.var.id] = item
            self.block(s.body, Env(inner))
            outs = [self.local(inner.vars[name]) for name, _ in carried]
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
        for (name, _), r in zip(carried, results):
            r.name = r.hint = name
            env.assign(name, r)
        return None

    def unrolled(self, s: A.For, ml: "ModList", env: Env) -> None:
        """The loop's body once per item, in place."""
        for x in self.list_items(ml):
            inner = Env(env)
            inner.vars[s.var.id] = x
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
        return ("config", v.type_name, tuple((k, _spec_key(x)) for k, x in v.values.items()))
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


def _shift_indices(path: str, by: int) -> str:
    """A callee's loop placeholders (`{i0}`) renumbered past the caller's `by` enclosing loops."""
    if not by or "{" not in path:
        return path
    import re

    return re.sub(r"\{i(\d+)\}", lambda m: LOOP_INDEX % (int(m.group(1)) + by), path)


def _assigned_names(block: A.Block) -> list[str]:
    """Names assigned (`x = ...`, not `let`) anywhere in a block, in order, once each."""
    out: list[str] = []

    def visit(node) -> None:
        if isinstance(node, A.Assign) and node.target.id not in out:
            out.append(node.target.id)
        for child in _children(node):
            visit(child)

    visit(block)
    return out


def _children(node):
    if isinstance(node, list):
        return node
    if not hasattr(node, "__dataclass_fields__"):
        return []
    out = []
    for name in node.__dataclass_fields__:
        v = getattr(node, name, None)
        if isinstance(v, list):
            out.extend(x for x in v if hasattr(x, "__dataclass_fields__"))
        elif hasattr(v, "__dataclass_fields__") and not isinstance(v, A.Span):
            out.append(v)
    return out


def _graph_ops(g: Graph):
    """The ops of `g` and of its composites' and loops' bodies."""
    for op in g.ops:
        yield op
        if op.body is not None:
            yield from _graph_ops(op.body)


def _graph_values(g: Graph):
    yield from g.inputs
    for op in _graph_ops(g):
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


__all__ = ["Lowering", "LoweringError", "COMPOSITES"]
