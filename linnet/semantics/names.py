"""Names, types and dims: how a name resolves (locals, members, module parameters, the
file's items, the standard library, ops), how type annotations and dims evaluate, and the
did-you-mean of an unknown name."""

from __future__ import annotations

import math

from ..ops import REGISTRY
from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import (
    DTYPES,
    UNKNOWN,
    WORK,
    ConfigT,
    DType,
    DTypeT,
    EllipsisVar,
    FnRefT,
    ScalarT,
    Shape,
    TensorT,
    TupleT,
    Type,
    UnknownT,
    format_type,
)
from ..types.dims import Atom, Dim, DivisionError, const, format_dim, format_division, negative, shown_value, var
from ..types.scalars import ScalarError, arithmetic
from .describe import kind_text, wrapped
from .diagnostics import Fix, Label, SymbolAnchor, symbol
from .resolved import Ref
from .scope import Binding, FnTarget, MemberInfo, Scope
from .suggest import close_to, closest, suggestions

SCALAR_TYPE_NAMES = ("int", "float", "bool", "str")
LOAD_TIME_DIMS = {"max_batch": const("max_batch"), "max_positions": const("max_positions")}
BUILTIN_CONSTANTS = {"pi": math.pi, "inf": math.inf}


_builtin_names_made: tuple[int, frozenset[str]] | None = None  # (how many ops there were, the names then)


def _builtin_names() -> frozenset[str]:
    """The names every scope sees besides its own: ops, dtypes and constants. Made again only when an op was
    registered since (each unknown name of every check asks: the 5 MB document's 17,000 made it anew, ~1 %)."""
    global _builtin_names_made
    if _builtin_names_made is None or _builtin_names_made[0] != len(REGISTRY):
        _builtin_names_made = (len(REGISTRY), frozenset(REGISTRY).union(DTYPES, BUILTIN_CONSTANTS))
    return _builtin_names_made[1]


DIM_OPERATORS = ("+", "-", "*", "/", "//", "%")
NAMES_DEP = "<names>"  # the dependency of a result on the set of top-level names


class Binder:
    """Dim variables, `...` and dtype variables of one signature.

    mode "rigid": a function body is being checked; new names become dim variables.
    mode "pattern": a call is being checked; new names become atoms to solve for.
    After the parameters, `frozen` is set: new names are then errors (in bodies) or unknown
    (at calls, where the callee's own check reports them).
    """

    def __init__(self, mode: str, generics: dict[str, DType] | None = None):
        self.mode = mode
        self.dims: dict[str, Atom] = {}
        # the dim of each of `dims`' atoms, made at its first use: every use of `S` in a signature is this one Dim, its
        # value and atoms computed once
        self.atom_dims: dict[str, Dim] = {}
        self.ellipsis: EllipsisVar | None = None
        self.dtypes: dict[str, DType] = dict(generics or {})
        self.frozen = False
        self.new_dims: list[tuple[str, Atom, A.Name]] = []
        self.introduced: dict[str, A.Name] = {}  # the name node that introduced each of `new_dims`

    def get_ellipsis(self) -> EllipsisVar:
        if self.ellipsis is None:
            self.ellipsis = EllipsisVar()
        return self.ellipsis


class NamesMixin:
    """Name resolution and type evaluation for `ItemChecker`."""

    def global_item(self, name: str, site: Item | None = None) -> Item | None:
        """The top-level item that `name` names where `site` (default: the item being checked)
        is defined: its file's items and imports, then the standard library."""
        site = site if site is not None else self.item
        item = self.ctx.lookup(name, site)
        self.result.deps[(site.source.path, name)] = item.interface if item is not None else None
        return item

    def failed_import(self, name: str) -> bool:
        """Whether `name` was to come from an import that failed (reported on the import)."""
        is_failed = getattr(self.ctx.lookup, "is_failed", None)
        return is_failed is not None and is_failed(name, self.item)

    def unknown_type_name(self, node: A.Name, scope: Scope) -> None:
        item = self.global_item(node.id)
        if item is not None:
            self.report("L107", f"`{node.id}` is a {item.kind}, not a type", node)
            return
        if self.failed_import(node.id):
            return
        candidates = list(SCALAR_TYPE_NAMES) + [i for i in self._global_names() if self._is_config(i)]
        hint = closest(node.id, candidates)
        self.report(
            "L101",
            f"unknown type `{node.id}`" + (f"; did you mean `{hint}`?" if hint else ""),
            node,
            fixes=self._fix(node, hint),
        )

    def _global_names(self) -> list[str]:
        """All top-level names (for suggestions); the result then depends on the set of names."""
        names = getattr(self.ctx.lookup, "names", None)
        if names is None:
            return []
        found = list(names(self.item))
        self.result.deps[(self.item.source.path, NAMES_DEP)] = self.ctx.lookup.names_key(self.item)
        return found

    def _global_suggestions(self, name: str) -> list[str]:
        """The best suggestions for `name` among the top-level names and the built-in ones (ops, dtypes,
        constants); the result then depends on the set of names."""
        index = getattr(self.ctx.lookup, "name_index", None)
        if index is None:
            return suggestions(name, set(self._global_names()) | _builtin_names(), 3)
        self.result.deps[(self.item.source.path, NAMES_DEP)] = self.ctx.lookup.names_key(self.item)
        return index(self.item).best(name, _builtin_names(), 3)

    def _is_config(self, name: str) -> bool:
        item = self.global_item(name)
        return item is not None and item.kind == "config"

    def _fix(self, node, hint):
        if not hint:
            return []
        return [Fix(f"replace with `{hint}`", [(self.anchor(node), hint)])]

    def eval_type(self, t: A.Type, scope: Scope, binder: Binder | None) -> Type:
        if isinstance(t, A.TensorType):
            dtype = self.eval_dtype_name(t.dtype, scope, binder) if t.dtype is not None else WORK
            dims: list[Dim | None] = []
            prefix = None
            for i, d in enumerate(t.dims):
                if isinstance(d, A.EllipsisDim):
                    if i != 0:
                        self.report("L208", "`...` stands for leading dims: it must come first", d)
                        continue
                    if binder is None:
                        self.report("L111", "`...` is only allowed in function signatures", d)
                        return UNKNOWN
                    if binder.frozen and binder.ellipsis is None:
                        self.report("L101", "`...` is not bound by any parameter of this function", d)
                        return UNKNOWN
                    prefix = binder.get_ellipsis()
                    continue
                dims.append(self.eval_dim(d, scope, binder))
            for d, node in zip(dims, [x for x in t.dims if not isinstance(x, A.EllipsisDim)]):
                if d is not None:
                    self._refuse_negative_dim(d, node)
            result = TensorT(dtype if dtype is not None else WORK, Shape(tuple(dims), prefix))
            return self.record(t, result)
        if isinstance(t, A.TupleType):
            return TupleT(tuple(self.eval_type(i, scope, binder) for i in t.items))
        if isinstance(t, A.NamedType):
            name = t.name.id
            if name in SCALAR_TYPE_NAMES:
                return ScalarT(name, None)
            item = self.global_item(name)
            if item is not None and item.kind == "config":
                self.ref(t.name, symbol(item))
                cv = self.ctx.evaluator.defaults(item)
                return ConfigT(cv) if cv is not None else UNKNOWN
            self.unknown_type_name(t.name, scope)
            return UNKNOWN
        if isinstance(t, A.LiteralType):
            return ScalarT(t.kind, None, tuple(s.value for s in t.values) if t.kind == "str" else None)
        return UNKNOWN

    def _refuse_negative_dim(self, d: Dim, node: A.Node) -> None:
        """Report (L213) a declared dim that no tensor can have: a negative number (`4 - 5`), or one negative for
        every size of its dim variables (`0 - A`, `-A - 1`). A dim of int parameters or config fields without a
        value is left to the values each instance or preset gives them (`-k` is 0 where `k` is); a sign merely
        unknown (`N - K`) is the declaration's claim, which the body's type is checked against."""
        n = d.as_int()
        if n is not None:
            if n < 0:
                shown = format_dim(d) if format_dim(d) == str(n) else f"{format_dim(d)} = {n}"
                self.report("L213", f"dims are sizes: {shown} is negative", node, labels=self.atom_labels([d]))
            return
        atoms = d.val.atoms()
        if any(a.kind == "const" for a in atoms) or not negative(d):
            return
        names = sorted({a.name for a in atoms if a.kind == "var"})
        every = " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " and " + names[-1]
        shown = format_dim(d)
        self.report(
            "L213", f"dims are sizes: {shown} is negative for every {every}", node, labels=self.atom_labels([d])
        )

    def eval_dtype_name(self, node: A.Name, scope: Scope, binder: Binder | None) -> DType | None:
        name = node.id
        if name in DTYPES:
            return DTYPES[name]
        if binder is not None and name in binder.dtypes:
            return binder.dtypes[name]
        candidates = list(DTYPES) + (list(binder.dtypes) if binder is not None else [])
        hint = closest(name, candidates)
        self.report(
            "L101",
            f"unknown dtype `{name}`"
            + (f"; did you mean `{hint}`?" if hint else "")
            + ("" if hint else "; generic dtypes are declared as `fn name<T: float>(...)`"),
            node,
            fixes=self._fix(node, hint),
        )
        return None

    def dim_var(self, e: A.Name):
        """A new dim variable for `e`, where a signature first names it; in the `follow` check (instances.py) the
        one the last such check of this node made, so that the calls it follows have the same values as then and
        their checks are found in `CheckContext.followed`."""
        if self.follow is None:
            return var(e.id)
        atoms = self.ctx.follow_atoms
        if e not in atoms:
            atoms[e] = var(e.id)
        return atoms[e]

    def eval_dim(self, e: A.Expr, scope: Scope, binder: Binder | None) -> Dim | None:
        """A dim expression: int literals, dim variables, int config fields and module
        parameters, and + - * / // % over them (`/` exact, `//` and `%` floor)."""
        if isinstance(e, A.IntLit):
            return Dim.of(e.value)
        if isinstance(e, A.Name):
            if binder is not None and e.id in binder.dims:
                b = scope.lookup(e.id)
                if b is not None:
                    b.uses += 1
                    self.ref(e, b.anchor)
                atom = binder.dims[e.id]
                d = binder.atom_dims.get(e.id)
                if d is None:
                    d = binder.atom_dims[e.id] = Dim.atom(atom)
                self.resolve(e, "dim", node=binder.introduced.get(e.id), item=self.item, value=atom)
                self.record(e, ScalarT("int", d))
                return d
            b = self.lookup_value(e.id, scope)
            if b is None:
                if binder is not None and not binder.frozen:
                    atom = self.dim_var(e)
                    binder.dims[e.id] = atom
                    binder.new_dims.append((e.id, atom, e))
                    binder.introduced[e.id] = e
                    d = binder.atom_dims[e.id] = Dim.atom(atom)
                    self.resolve(e, "dim", node=e, item=self.item, value=atom)
                    self.record(e, ScalarT("int", d))
                    return d
                if binder is not None and binder.mode == "pattern":
                    return None
                self.unknown_name(e, scope, dim=True)
                return None
            t = self.use_binding(e, b)
            return self._dim_of(t, e)
        if isinstance(e, A.Attr):
            t = self.expr(e, scope)
            return self._dim_of(t, e)
        if isinstance(e, A.Neg):
            d = self.eval_dim(e.operand, scope, binder)
            return -d if d is not None else None
        if isinstance(e, A.BinOp) and e.op in DIM_OPERATORS:
            a = self.eval_dim(e.left, scope, binder)
            b = self.eval_dim(e.right, scope, binder)
            if a is None or b is None:
                return None
            try:
                return arithmetic(e.op, a, b)
            except ScalarError as err:
                if err.kind == "inexact":
                    self.division_error(e, a, b, err.division)
                else:
                    self.report("L408", err.message, e)
                return None
        self.report(
            "L107",
            "a dim is an int: a literal, a dim variable, an int config field or parameter, or + - * / // % of those",
            e,
        )
        return None

    def _dim_of(self, t: Type, node) -> Dim | None:
        if isinstance(t, ScalarT) and t.kind == "int":
            return t.value
        if isinstance(t, UnknownT):
            return None
        self.report("L107", f"a dim must be an int, got {kind_text(t)}", node, label=format_type(t))
        return None

    def division_error(self, e: A.BinOp, a: Dim, b: Dim, err: DivisionError) -> None:
        labels = self.atom_labels([a, b])
        self.report(
            "L206",
            f"{format_division(a, b)} is not exact: {err.reason}",
            e,
            label=format_division(shown_value(a), shown_value(b)),
            labels=labels,
            notes=[]
            if "provably" not in err.reason
            else ["in a signature, write the multiple instead: `[H * D]` binds D by exact division"],
        )

    def atom_labels(self, dims: list[Dim | None]) -> list[Label]:
        """Labels at the preset fields, or the config defaults, that gave the dims their
        values (`inter` = 1536): a fault may originate in a config value."""
        out, seen = [], set()
        for d in dims:
            if d is None:
                continue
            for a in sorted(d.atoms(), key=lambda x: x.uid):
                origin = a.origin
                if not isinstance(origin, SymbolAnchor):
                    continue
                anchor_item = getattr(self.ctx.lookup, "anchor_item", None)
                owner = anchor_item(origin) if anchor_item is not None else self.global_item(origin.path[0])
                if owner is None or owner.kind not in ("preset", "config"):
                    continue
                if origin.path not in seen and a.value is not None:
                    seen.add(origin.path)
                    out.append(Label(origin, f"`{origin.path[-1]}` = {format_dim(a.value.val)}"))
        return out

    def lookup_value(self, name: str, scope: Scope) -> Binding | None:
        """Locals and parameters, then members of the current module, then module
        parameters, load-time dims and the file's items."""
        b = scope.lookup_in_fn(name)
        if b is not None:
            return b
        inst = getattr(self._module_scope(scope), "instance", None)
        if inst is not None:
            members = inst.members if inst.members is not None else self.members(inst, report=False)
            info = members.by_name.get(name)
            if info is not None:
                kind = "fn" if info.kind == "fn" else "member"
                return Binding(info, "member", symbol(inst.item, kind, name), info.node, item=inst.item)
            if name in members.poisoned:
                return Binding(UNKNOWN, "poisoned")
        b = scope.lookup(name)
        if b is not None:
            return b
        return None

    def _module_scope(self, scope: Scope) -> Scope | None:
        s = scope
        while s is not None:
            if s.kind == "module":
                return s
            s = s.parent
        return None

    def use_binding(self, node: A.Name, b: Binding) -> Type:
        b.uses += 1
        self.ref(node, b.anchor)
        self.resolve_binding(node, b)
        if b.kind == "member":
            return self.member_value(b.type, node)
        return b.type

    def resolve(self, use: A.Name, kind: str, node: A.Node | None = None, item=None, value=None) -> None:
        """Record what the name `use` refers to (`resolved.Ref`)."""
        self.result.names[use] = Ref(kind, use.id, node, item, value)

    def resolve_binding(self, node: A.Name, b: Binding) -> None:
        if b.kind == "member":
            self.resolve(node, "member", node=b.node, item=b.item, value=b.type.kind)
        elif b.kind == "dim" and b.node is None:
            self.resolve(node, "load_dim", value=_atom_of(b.type))
        elif b.kind in ("dim", "module_param"):
            self.resolve(node, b.kind, node=b.node, item=self.item, value=_atom_of(b.type))
        elif b.kind in ("local", "loop", "param"):
            self.resolve(node, b.kind, node=b.node, item=self.item)

    def member_value(self, info: MemberInfo, node: A.Node) -> Type:
        if info.present is False:
            self.report(
                "L108",
                f"`{info.name}` exists only when {info.cond_text}, which is false here",
                node,
                labels=[Label(self._member_anchor(info), "declared under that condition here")],
            )
            return UNKNOWN
        missing = [c for c in info.conditions if c not in self.assumptions]
        if missing:
            self.report(
                "L108",
                f"`{info.name}` exists only when {info.cond_text}",
                node,
                labels=[Label(self._member_anchor(info), "declared under that condition here")],
                notes=[f"consider wrapping this use in `{wrapped(missing)}`"],
            )
            return UNKNOWN
        return info.type

    def _member_anchor(self, info: MemberInfo) -> SymbolAnchor:
        if self.instance is None:
            return SymbolAnchor(("", "member", info.name))
        return symbol(self.instance.item, "member", info.name)

    def name_value(self, e: A.Name, scope: Scope) -> Type:
        b = self.lookup_value(e.id, scope)
        if b is not None:
            return self.use_binding(e, b)
        item = self.global_item(e.id)
        if item is None and e.id in REGISTRY:
            self.resolve(e, "op", value=REGISTRY[e.id])
            return FnRefT(REGISTRY[e.id])
        if item is not None:
            self.ref(e, symbol(item))
            if item.ast is None:
                return UNKNOWN
            if item.kind == "fn":
                self.resolve(e, "fn", node=item.ast, item=item)
                return FnRefT(FnTarget(item, item.ast))
            if item.kind == "module":
                self.resolve(e, "module", node=item.ast, item=item)
                return FnRefT(item)
            self.report("L107", f"`{e.id}` is a {item.kind}, not a value", e)
            return UNKNOWN
        if e.id in DTYPES:
            self.resolve(e, "dtype", value=DTYPES[e.id])
            return DTypeT(DTYPES[e.id])
        binder = getattr(self, "current_binder", None)
        if binder is not None and e.id in binder.dtypes:
            self.resolve(e, "dtype_var", value=binder.dtypes[e.id])
            return DTypeT(binder.dtypes[e.id])
        if e.id in BUILTIN_CONSTANTS:
            self.resolve(e, "constant", value=BUILTIN_CONSTANTS[e.id])
            return ScalarT("float", BUILTIN_CONSTANTS[e.id])
        if self.failed_import(e.id):
            return UNKNOWN
        self.unknown_name(e, scope)
        return UNKNOWN

    def unknown_name(self, e: A.Name, scope: Scope, dim: bool = False) -> None:
        if dim:
            # a dim is an int: suggest only names that are ints where the dim was written
            candidates = {
                n
                for n in scope.all_names()
                if isinstance(getattr(scope.lookup(n), "type", None), ScalarT) and scope.lookup(n).type.kind == "int"
            }
        else:
            candidates = set(scope.all_names())
            inst = getattr(self._module_scope(scope), "instance", None)
            if inst is not None:
                candidates |= set(self.members(inst, report=False).by_name)
            # the top-level and built-in names' best are those of their union's best (one score per candidate)
            candidates |= set(self._global_suggestions(e.id))
        # config fields are reached through the config parameter: offer `c.field`
        config_hints = []
        for name in scope.all_names():
            b = scope.lookup(name)
            if b is not None and isinstance(b.type, ConfigT):
                for f in close_to(e.id, tuple(b.type.value.values)):
                    if (
                        not dim
                        or b.type.value.field_def(f) is not None
                        and getattr(b.type.value.field_def(f).type, "name", None)
                        and b.type.value.field_def(f).type.name.id == "int"
                    ):
                        config_hints.append(f"{name}.{f}")
        found = suggestions(e.id, candidates, 3)
        hints = config_hints[:1] + [h for h in found if h not in config_hints]
        what = "unknown dim" if dim else "unknown name"
        message = f"{what} `{e.id}`"
        if hints:
            message += f"; did you mean `{hints[0]}`?"
        notes = []
        if dim:
            notes.append("dim variables are introduced by the parameter types of a function")
        if len(hints) > 1:
            notes.append("other close names: " + ", ".join(f"`{h}`" for h in hints[1:]))
        self.report(
            "L101",
            message,
            e,
            label="not found in this scope",
            notes=notes,
            fixes=[Fix(f"replace with `{h}`", [(self.anchor(e), h)]) for h in hints],
        )


def _atom_of(t: Type):
    """The atom an int binding stands for (a dim variable, a module's int parameter)."""
    if isinstance(t, ScalarT) and t.kind == "int" and t.value is not None:
        atoms = t.value.atoms()
        if len(atoms) == 1:
            (atom,) = atoms
            if t.value._t == {((atom, 1),): 1}:  # the dim is the atom itself (`Dim.atom(atom)`, without making it)
                return atom
    return None
