"""What lowering computes with: the values a body's names take (module instances, lists of them,
members, function references), the context of a body (`Context`, `Env`), the frame of the graph being
built, and the helpers the phases of lowering (`lower.py` and its `lower_*.py` modules) share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..semantics.configs import MISSING, ConfigValue
from ..semantics.names import SCALAR_TYPE_NAMES
from ..semantics.resolved import Resolved
from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import DType, ScalarT, TensorT, Type
from ..types.dims import Atom, Dim
from .core import Graph, Value, body_ops


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


def _whole_dims(fn: A.FnDef, args: dict[str, Any]) -> dict[str, Dim]:
    """The dims of `fn`'s tensor arguments (lowered `Value`s in `args`) that its parameter types declare as a
    whole dim variable (`H` of `x: [B, C, H, W]`; dims after a `...` counted from the end), by name."""
    out: dict[str, Dim] = {}
    for p in fn.params:
        v = args.get(p.name.id)
        if not isinstance(v, Value) or not isinstance(p.type, A.TensorType):
            continue
        declared, dims = p.type.dims, list(v.dims)
        if any(isinstance(d, A.EllipsisDim) for d in declared):
            declared = declared[[isinstance(d, A.EllipsisDim) for d in declared].index(True) + 1 :]
            dims = dims[len(dims) - len(declared) :] if len(declared) <= len(dims) else []
        if len(declared) != len(dims):
            continue
        for d, actual in zip(declared, dims):
            if isinstance(d, A.Name):
                out.setdefault(d.id, actual)
    return out


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
