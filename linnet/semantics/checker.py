"""The shape and dtype checker: infers a type for every expression of one item.

One `ItemChecker` checks one item under one binding of its config parameters (the config
values of one scenario). Modules are checked generically: parameters that are not configs
(`in_features: int`, `use_bias: bool`) stay symbolic, so `Linear` is checked once for every
size; a compile-time `if` whose condition is not known checks both branches. Calls
instantiate the callee's signature and unify it with the arguments (`unify.py`).

No cascades: a value whose type is unknown after an error is `UNKNOWN` and accepted
everywhere; an unknown dim is `None` and matches anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..ops import OPERATORS, REGISTRY, REQUIRED, OpDef, OpError
from ..syntax import ast as A
from ..syntax.ast import Span
from ..syntax.items import Item
from .configs import MISSING, ConfigEvaluator, ConfigValue
from .diagnostics import Finding, Fix, Label, LocalAnchor, SymbolAnchor
from .dims import Atom, Dim, DivisionError, const, divide, format_dim, var
from .scope import Binding, FnTarget, Instance, MemberInfo, Members, Scope, type_key
from .suggest import closest, suggestions
from .types import (
    BOOL, DTYPES, NONE, UNIT, UNKNOWN, WORK, ConfigT, DType, DTypeT, EllipsisVar, FnRefT, ListT,
    ModuleListT, ModuleT, NoneT, ScalarT, Shape, TensorT, TupleT, Type, UnitT, UnknownT, dtype_var,
    format_shape, format_type,
)
from .unify import Unifier, substitute, substitute_shape

SCALAR_TYPE_NAMES = ("int", "float", "bool", "str")
LOAD_TIME_DIMS = {"max_batch": const("max_batch"), "max_positions": const("max_positions")}
BUILTIN_CONSTANTS = {"pi": math.pi, "inf": math.inf}
KNOWN_ATTRIBUTES = {"name", "weights"}
NAMES_DEP = "<names>"  # the dependency of a result on the set of top-level names


class CheckContext:
    """What every item check of one analysis shares: name lookup across the file and the
    standard library, config evaluation, and caches of module instances' members."""

    def __init__(self, lookup: Callable[[str], Item | None], evaluator: ConfigEvaluator,
                 previous: "CheckContext | None" = None):
        self.lookup = lookup
        self.evaluator = evaluator
        self.computing: set = set()  # instances whose members are being evaluated
        # Members of module instances and callee signatures depend only on the items'
        # interfaces and the config values: `previous` (the last analysis's context, when
        # those are unchanged) lends its caches, so a body edit does not recompute them.
        self.members_cache: dict[Any, Members] = previous.members_cache if previous else {}
        self.signatures: dict[Any, Any] = previous.signatures if previous else {}


@dataclass
class ItemResult:
    """What checking one item under one binding found."""

    findings: list[Finding] = field(default_factory=list)
    types: dict[A.Node, Type] = field(default_factory=dict)
    refs: list[tuple[Span, Any]] = field(default_factory=list)
    deps: dict[str, str | None] = field(default_factory=dict)
    world: Any = None  # the analysis's world key when last known valid (program.Document)


class _Binder:
    """Dim variables, `...` and dtype variables of one signature.

    mode "rigid": a function body is being checked; new names become dim variables.
    mode "pattern": a call is being checked; new names become atoms to solve for.
    After the parameters, `frozen` is set: new names are then errors (in bodies) or unknown
    (at calls, where the callee's own check reports them).
    """

    def __init__(self, mode: str, generics: dict[str, DType] | None = None):
        self.mode = mode
        self.dims: dict[str, Atom] = {}
        self.ellipsis: EllipsisVar | None = None
        self.dtypes: dict[str, DType] = dict(generics or {})
        self.frozen = False
        self.new_dims: list[tuple[str, Atom, A.Name]] = []

    def get_ellipsis(self) -> EllipsisVar:
        if self.ellipsis is None:
            self.ellipsis = EllipsisVar()
        return self.ellipsis


def _cond_key(e: A.Node, text: str) -> tuple[str, bool]:
    polarity = True
    while isinstance(e, A.Not):
        polarity = not polarity
        e = e.operand
    return " ".join(text[e.span.start:e.span.end].split()), polarity


class ItemChecker:
    """Checks one module or function item under one binding of its config parameters."""

    def __init__(self, ctx: CheckContext, item: Item, binding: dict[str, Type]):
        self.ctx = ctx
        self.item = item
        self.binding = binding
        self.result = ItemResult()
        self.instance: Instance | None = None
        self.members_of_self: Members | None = None
        self.assumptions: list[tuple[str, bool]] = []
        self.fn_locals: list[tuple[str, Binding]] = []
        self.fn_ret_allowed_dims: set[str] = set()

    # ------------------------------------------------------------------ reporting
    def report(self, code: str, message: str, node_or_span, **kw) -> None:
        span = node_or_span if isinstance(node_or_span, Span) else node_or_span.span
        self.result.findings.append(Finding(code, message, LocalAnchor(self.item, span), **kw))

    def anchor(self, node) -> LocalAnchor:
        return LocalAnchor(self.item, node.span if not isinstance(node, Span) else node)

    def ref(self, node: A.Node, target) -> None:
        if target is not None:
            self.result.refs.append((node.span, target))

    def record(self, node: A.Node, t: Type) -> Type:
        self.result.types[node] = t
        return t

    # ------------------------------------------------------------------ globals
    def global_item(self, name: str) -> Item | None:
        item = self.ctx.lookup(name)
        self.result.deps[name] = item.interface if item is not None else None
        return item

    # ------------------------------------------------------------------ entry points
    def run(self) -> ItemResult:
        ast = self.item.ast
        if isinstance(ast, A.ModuleDef):
            self.check_module(ast)
        elif isinstance(ast, A.FnDef):
            if ast.entry:
                self.report("L111", "`entry` marks functions of a `model`", ast.name)
            self.check_fn(ast, None, self.global_scope())
        return self.result

    def global_scope(self) -> Scope:
        return Scope(None, "global")

    def check_module(self, mdef: A.ModuleDef) -> None:
        args: dict[str, Type] = {}
        scope = Scope(self.global_scope(), "module")
        self._check_params_unique(mdef.params)
        for p in mdef.params:
            t = self.param_value(p, scope, generic=True)
            args[p.name.id] = t
            anchor = SymbolAnchor((mdef.name.id, "param", p.name.id))
            scope.bind(p.name.id, Binding(t, "module_param", anchor, p.name))
            self.ref(p.name, anchor)
            self.record(p.name, t)
            if p.default is not None:
                self.expr(p.default, scope)
        self.check_containment(mdef)
        inst = Instance(self.item, args, generic=True)
        self.instance = inst
        members = self.members(inst, report=True)
        self.members_of_self = members
        for info in members.order:
            if info.kind == "fn" and info.present is not False:
                fn = info.node
                saved = self.assumptions
                self.assumptions = list(info.conditions)
                self.check_fn(fn, inst, self.module_scope(inst))
                self.assumptions = saved
            elif info.kind == "fn" and fn_entry_misplaced(info.node, mdef):
                pass
        for info in members.order:
            if info.kind == "fn" and info.node.entry and not mdef.is_model:
                self.report("L111", "`entry` marks functions of a `model`; this is a `module`", info.node.name)

    def check_containment(self, mdef: A.ModuleDef) -> None:
        """A module may not contain itself, directly or through its submodules."""
        def submodules(m: A.ModuleDef):
            for member in _flat_members(m.members):
                if isinstance(member, A.FieldDecl) and member.ctor is not None and isinstance(member.ctor.func, A.Name):
                    yield member, member.ctor.func.id

        for member, name in submodules(mdef):
            path = [mdef.name.id, name]
            stack = [(name, path)]
            seen = set()
            while stack:
                current, chain = stack.pop()
                if current == mdef.name.id:
                    self.report("L111", f"`{mdef.name.id}` contains itself: {' -> '.join(chain)}", member.ctor.func)
                    return
                if current in seen:
                    continue
                seen.add(current)
                item = self.global_item(current)
                if item is None or not isinstance(item.ast, A.ModuleDef):
                    continue
                for _, sub in submodules(item.ast):
                    stack.append((sub, chain + [sub]))

    def param_value(self, p: A.Param, scope: Scope, generic: bool) -> Type:
        """The value a module or function parameter has in its own generic check."""
        t = p.type
        if isinstance(t, A.NamedType):
            name = t.name.id
            if name in SCALAR_TYPE_NAMES:
                if name == "int":
                    return ScalarT("int", Dim.atom(const(p.name.id)))
                return ScalarT(name, None)
            item = self.global_item(name)
            self.ref(t.name, SymbolAnchor((name,)) if item is not None else None)
            if item is None or item.kind != "config":
                self.unknown_type_name(t.name, scope)
                return UNKNOWN
            v = self.binding.get(p.name.id)
            if v is not None:
                return v
            cv = self.ctx.evaluator.defaults(name)
            return ConfigT(cv) if cv is not None else UNKNOWN
        if isinstance(t, A.LiteralType):
            return ScalarT("str", None, tuple(s.value for s in t.values))
        if isinstance(t, A.TensorType):
            self.report("L111", "module parameters are compile-time values; tensors are declared as members", t)
            return UNKNOWN
        self.report("L111", "a tuple type cannot be a parameter type", t)
        return UNKNOWN

    def unknown_type_name(self, node: A.Name, scope: Scope) -> None:
        item = self.global_item(node.id)
        if item is not None:
            self.report("L107", f"`{node.id}` is a {item.kind}, not a type", node)
            return
        candidates = list(SCALAR_TYPE_NAMES) + [i for i in self._global_names() if self._is_config(i)]
        hint = closest(node.id, candidates)
        self.report("L101", f"unknown type `{node.id}`" + (f"; did you mean `{hint}`?" if hint else ""), node,
                    fixes=self._fix(node, hint))

    def _global_names(self) -> list[str]:
        """All top-level names (for suggestions); the result then depends on the set of names."""
        names = getattr(self.ctx.lookup, "names", None)
        if names is None:
            return []
        found = list(names())
        self.result.deps[NAMES_DEP] = self.ctx.lookup.names_key()
        return found

    def _is_config(self, name: str) -> bool:
        item = self.global_item(name)
        return item is not None and item.kind == "config"

    def _fix(self, node, hint):
        if not hint:
            return []
        return [Fix(f"replace with `{hint}`", [(self.anchor(node), hint)])]

    def _check_params_unique(self, params: list[A.Param]) -> None:
        seen: dict[str, A.Param] = {}
        for p in params:
            if p.name.id in seen:
                self.report("L105", f"parameter `{p.name.id}` is declared twice", p.name,
                            labels=[Label(self.anchor(seen[p.name.id].name), "first declared here")])
            seen[p.name.id] = p

    def module_scope(self, inst: Instance) -> Scope:
        """The scope of a module's members and functions: its parameters bound to the
        instance's values, and the load-time dims. Shared: nothing binds into it later."""
        if inst.scope is not None:
            return inst.scope
        scope = Scope(self.global_scope(), "module")
        mdef = inst.module
        for p in mdef.params:
            t = inst.args.get(p.name.id, UNKNOWN)
            scope.bind(p.name.id, Binding(t, "module_param", SymbolAnchor((mdef.name.id, "param", p.name.id)), p.name))
        for name, atom in LOAD_TIME_DIMS.items():
            scope.bind(name, Binding(ScalarT("int", Dim.atom(atom)), "dim", None))
        scope.instance = inst
        inst.scope = scope
        return scope

    # ------------------------------------------------------------------ instances and members
    def instantiate(self, item: Item, args: list[A.Arg], scope: Scope, call: A.Node) -> Instance | None:
        """Bind a module's parameters to a constructor call's arguments."""
        mdef: A.ModuleDef = item.ast
        matched = self.match_args([p.name.id for p in mdef.params],
                                  {p.name.id: p.default is not None for p in mdef.params},
                                  args, f"`{mdef.name.id}`", call, owner_path=(mdef.name.id, "param"))
        if matched is None:
            return None
        callee_scope = Scope(self.global_scope(), "module")
        values: dict[str, Type] = {}
        ok = True
        for p in mdef.params:
            name = p.name.id
            if name in matched:
                arg = matched[name]
                t = self.expr(arg.value, scope)
                node = arg.value
            else:
                t = self.silent_expr(p.default, callee_scope, item)
                node = call
            t = self.check_compile_time_arg(p, t, node, f"`{mdef.name.id}`")
            if t is None:
                ok = False
                t = UNKNOWN
            values[name] = t
            callee_scope.bind(name, Binding(t, "module_param"))
        inst = Instance(item, values)
        if ok:
            members = self.members(inst, report=False)
            for f in members.findings:
                if f.code[1] in "24":
                    self.report(f.code, f"in `{inst.describe()}`: {f.message}", call, notes=f.notes,
                                labels=[Label(f.anchor, "required here")])
                    break
        return inst

    def silent_expr(self, e: A.Expr, scope: Scope, item: Item) -> Type:
        """Evaluate an expression of another item (a callee's default) without recording."""
        sub = ItemChecker(self.ctx, item, {})
        sub.instance = None
        t = sub.expr(e, scope)
        for name, v in sub.result.deps.items():
            self.result.deps.setdefault(name, v)
        return t

    def check_compile_time_arg(self, p: A.Param, t: Type, node, callee: str) -> Type | None:
        """Check a value against a module (or scalar function) parameter's type."""
        if isinstance(t, UnknownT):
            return t
        pt = p.type
        if isinstance(pt, A.LiteralType):
            allowed = [s.value for s in pt.values]
            if not (isinstance(t, ScalarT) and t.kind == "str"):
                self.report("L107", f"`{p.name.id}` of {callee} is a str, got {_kind_text(t)}", node)
                return None
            if t.value is not None and t.value not in allowed:
                self.report("L401", f'`{p.name.id}` of {callee} is one of {", ".join(chr(34) + a + chr(34) for a in allowed)}; '
                            f'got "{t.value}"', node)
                return None
            return ScalarT("str", t.value, tuple(allowed))
        if not isinstance(pt, A.NamedType):
            return t
        name = pt.name.id
        if name in SCALAR_TYPE_NAMES:
            if isinstance(t, ScalarT) and (t.kind == name or (name == "float" and t.kind == "int")):
                if name == "float" and t.kind == "int":
                    iv = t.value.as_int() if t.value is not None else None
                    return ScalarT("float", float(iv) if iv is not None else None)
                return t
            self.report("L107", f"`{p.name.id}` of {callee} is a compile-time {name}, got {_kind_text(t)}", node,
                        label=format_type(t))
            return None
        if isinstance(t, NoneT):
            if pt.optional:
                return t
            self.report("L406", f"`{p.name.id}` of {callee} is a `{name}`, not optional; got `none`", node)
            return None
        if isinstance(t, ConfigT):
            if t.value.type_name != name:
                self.report("L107", f"`{p.name.id}` of {callee} is a `{name}` config, got a `{t.value.type_name}`", node)
                return None
            return t
        self.report("L107", f"`{p.name.id}` of {callee} is a `{name}` config, got {_kind_text(t)}", node)
        return None

    def members(self, inst: Instance, report: bool) -> Members:
        if not report and inst.members is not None:
            return inst.members
        key = inst.key()
        cache = self.ctx.members_cache
        if key in cache and not report:
            inst.members = cache[key]
            return inst.members
        if key in self.ctx.computing:
            return Members()  # asked again while being evaluated (a did-you-mean, a cycle)
        self.ctx.computing.add(key)
        try:
            members = _MemberEvaluator(self, inst).run()
        finally:
            self.ctx.computing.discard(key)
        cache[key] = members
        inst.members = members
        if report:
            self.result.findings.extend(members.findings)
        return members

    # ------------------------------------------------------------------ functions
    def check_fn(self, fn: A.FnDef, inst: Instance | None, parent: Scope) -> None:
        """Check a function's body against its signature (generic in its dim variables)."""
        generics = self.generics(fn, report=True)
        binder = _Binder("rigid", generics)
        scope = Scope(parent, "fn")
        self._check_params_unique(fn.params)
        owner = (inst.module.name.id, "fn", fn.name.id) if inst is not None else (fn.name.id,)
        self.ref(fn.name, SymbolAnchor(owner))
        for p in fn.params:
            t = self.fn_param_type(p, scope, binder)
            anchor = SymbolAnchor(owner + ("param", p.name.id))
            scope.bind(p.name.id, Binding(t, "param", anchor, p.name))
            self.ref(p.name, anchor)
            self.record(p.name, t)
        for name, atom, node in binder.new_dims:
            scope.bind(name, Binding(ScalarT("int", Dim.atom(atom)), "dim", self.anchor(node), node))
            self.ref(node, self.anchor(node))
        binder.frozen = True
        declared = self.eval_type(fn.ret, scope, binder) if fn.ret is not None else None
        saved_locals = self.fn_locals
        self.fn_locals = []
        self.current_binder = binder
        body = self.block(fn.body, Scope(scope, "block"))
        if declared is not None and not isinstance(body, UnknownT):
            if isinstance(body, UnitT):
                if not _has_error_stmt(fn.body):
                    self.report("L204", f"`{fn.name.id}` declares {format_type(declared)} but its body has no value",
                                fn.body, labels=[Label(self.anchor(fn.ret), "declared here")],
                                notes=["the last expression of a block is its value"])
            else:
                self.check_same(body, declared, _tail_node(fn.body), fn.ret, f"`{fn.name.id}` returns",
                                "L204", "L305")
        self._warn_unused()
        self.fn_locals = saved_locals

    def generics(self, fn: A.FnDef, report: bool) -> dict[str, DType]:
        out = {}
        for g in fn.generics:
            kind = g.kind.id if g.kind is not None else "any"
            if kind not in ("float", "int", "any"):
                if report:
                    self.report("L101", f"unknown dtype kind `{kind}`: use `float` or `int`", g.kind)
                kind = "any"
            out[g.name.id] = dtype_var(g.name.id, kind)
        return out

    def fn_param_type(self, p: A.Param, scope: Scope, binder: _Binder) -> Type:
        t = p.type
        if isinstance(t, (A.TensorType, A.TupleType)):
            return self.eval_type(t, scope, binder)
        return self.param_value(p, scope, generic=True)

    def _warn_unused(self) -> None:
        for name, b in self.fn_locals:
            if b.uses == 0 and not name.startswith("_") and not isinstance(b.type, UnknownT):
                self.report("L901", f"`{name}` is never used", b.node, severity="warning",
                            notes=["prefix the name with `_` to keep it deliberately"])

    def check_same(self, actual: Type, declared: Type, actual_node, declared_node, what: str,
                   shape_code: str, dtype_code: str) -> None:
        """Report when `actual` is not the `declared` type (return values, annotations)."""
        if isinstance(actual, UnknownT) or isinstance(declared, UnknownT):
            return
        if isinstance(actual, TensorT) and isinstance(declared, TensorT):
            if actual.dtype != declared.dtype:
                self.report(dtype_code, f"{what} {_dtype_text(actual.dtype)}, declared {_dtype_text(declared.dtype)}",
                            actual_node, label=format_type(actual),
                            labels=[Label(self.anchor(declared_node), "declared here")],
                            notes=[f"consider `cast(..., {declared.dtype.name})`"] if not declared.dtype.var and declared.dtype is not WORK else [])
                return
            if not _shapes_equal(actual.shape, declared.shape):
                self.report(shape_code, f"{what} {_shape_pair(actual.shape, declared.shape)}",
                            actual_node, label=format_type(actual),
                            labels=[Label(self.anchor(declared_node), f"declared {format_type(declared)} here")])
            return
        if isinstance(actual, TupleT) and isinstance(declared, TupleT) and len(actual.items) == len(declared.items):
            for a, d in zip(actual.items, declared.items):
                self.check_same(a, d, actual_node, declared_node, what, shape_code, dtype_code)
            return
        if type(actual) is not type(declared):
            self.report(shape_code, f"{what} {format_type(actual)}, declared {format_type(declared)}", actual_node,
                        labels=[Label(self.anchor(declared_node), "declared here")])

    # ------------------------------------------------------------------ types
    def eval_type(self, t: A.Type, scope: Scope, binder: _Binder | None) -> Type:
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
                self.ref(t.name, SymbolAnchor((name,)))
                cv = self.ctx.evaluator.defaults(name)
                return ConfigT(cv) if cv is not None else UNKNOWN
            self.unknown_type_name(t.name, scope)
            return UNKNOWN
        if isinstance(t, A.LiteralType):
            return ScalarT("str", None, tuple(s.value for s in t.values))
        return UNKNOWN

    def eval_dtype_name(self, node: A.Name, scope: Scope, binder: _Binder | None) -> DType | None:
        name = node.id
        if name in DTYPES:
            return DTYPES[name]
        if binder is not None and name in binder.dtypes:
            return binder.dtypes[name]
        candidates = list(DTYPES) + (list(binder.dtypes) if binder is not None else [])
        hint = closest(name, candidates)
        self.report("L101", f"unknown dtype `{name}`" + (f"; did you mean `{hint}`?" if hint else "") +
                    ("" if hint else "; generic dtypes are declared as `fn name<T: float>(...)`"),
                    node, fixes=self._fix(node, hint))
        return None

    def eval_dim(self, e: A.Expr, scope: Scope, binder: _Binder | None) -> Dim | None:
        """A dim expression: int literals, dim variables, int config fields and module
        parameters, and + - * / over them (division exact)."""
        if isinstance(e, A.IntLit):
            return Dim.of(e.value)
        if isinstance(e, A.Name):
            if binder is not None and e.id in binder.dims:
                b = scope.lookup(e.id)
                if b is not None:
                    b.uses += 1
                    self.ref(e, b.anchor)
                self.record(e, ScalarT("int", Dim.atom(binder.dims[e.id])))
                return Dim.atom(binder.dims[e.id])
            b = self.lookup_value(e.id, scope)
            if b is None:
                if binder is not None and not binder.frozen:
                    atom = var(e.id)
                    binder.dims[e.id] = atom
                    binder.new_dims.append((e.id, atom, e))
                    self.record(e, ScalarT("int", Dim.atom(atom)))
                    return Dim.atom(atom)
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
        if isinstance(e, A.BinOp) and e.op in ("+", "-", "*", "/"):
            a = self.eval_dim(e.left, scope, binder)
            b = self.eval_dim(e.right, scope, binder)
            if a is None or b is None:
                return None
            if e.op == "+":
                return a + b
            if e.op == "-":
                return a - b
            if e.op == "*":
                return a * b
            q = divide(a, b)
            if isinstance(q, DivisionError):
                self.division_error(e, a, b, q)
                return None
            return q
        self.report("L107", "a dim is an int: a literal, a dim variable, an int config field or parameter, "
                    "or + - * / of those", e)
        return None

    def _dim_of(self, t: Type, node) -> Dim | None:
        if isinstance(t, ScalarT) and t.kind == "int":
            return t.value
        if isinstance(t, UnknownT):
            return None
        self.report("L107", f"a dim must be an int, got {_kind_text(t)}", node, label=format_type(t))
        return None

    def division_error(self, e: A.BinOp, a: Dim, b: Dim, err: DivisionError) -> None:
        labels = self.atom_labels([a, b])
        self.report("L206", f"{format_dim(a)} / {format_dim(b)} is not exact: {err.reason}", e,
                    label=f"{format_dim(a.val)} / {format_dim(b.val)}", labels=labels,
                    notes=[] if "provably" not in err.reason else
                    ["in a signature, write the multiple instead: `[H * D]` binds D by exact division"])

    def atom_labels(self, dims: list[Dim | None]) -> list[Label]:
        """Labels at the preset fields that gave the dims their values."""
        out, seen = [], set()
        for d in dims:
            if d is None:
                continue
            for a in sorted(d.atoms(), key=lambda x: x.uid):
                origin = a.origin
                if not isinstance(origin, SymbolAnchor):
                    continue
                owner = self.global_item(origin.path[0])
                if owner is None or owner.kind != "preset":
                    continue
                if origin.path not in seen and a.value is not None:
                    seen.add(origin.path)
                    out.append(Label(origin, f"`{origin.path[-1]}` = {format_dim(a.value.val)}"))
        return out

    # ------------------------------------------------------------------ names
    def lookup_value(self, name: str, scope: Scope) -> Binding | None:
        """Locals and parameters, then members of the current module, then module
        parameters, load-time dims and the file's items."""
        b = scope.lookup_in_fn(name)
        if b is not None:
            return b
        inst = getattr(self._module_scope(scope), "instance", None)
        if inst is not None:
            members = self.members(inst, report=False)
            info = members.by_name.get(name)
            if info is not None:
                kind = "fn" if info.kind == "fn" else "member"
                return Binding(info, "member", SymbolAnchor((inst.module.name.id, kind, name)), info.node)
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
        if b.kind == "member":
            return self.member_value(b.type, node)
        return b.type

    def member_value(self, info: MemberInfo, node: A.Node) -> Type:
        if info.present is False:
            self.report("L108", f"`{info.name}` exists only when {info.cond_text}, which is false here", node,
                        labels=[Label(SymbolAnchor(self._member_path(info)), "declared under that condition here")])
            return UNKNOWN
        missing = [c for c in info.conditions if c not in self.assumptions]
        if missing:
            self.report("L108", f"`{info.name}` exists only when {info.cond_text}", node,
                        labels=[Label(SymbolAnchor(self._member_path(info)), "declared under that condition here")],
                        notes=[f"consider wrapping this use in `if {_cond_text(missing[0])} {{ ... }}`"])
            return UNKNOWN
        return info.type

    def _member_path(self, info: MemberInfo) -> tuple:
        owner = self.instance.module.name.id if self.instance is not None else ""
        return (owner, "member", info.name)

    def name_value(self, e: A.Name, scope: Scope) -> Type:
        b = self.lookup_value(e.id, scope)
        if b is not None:
            return self.use_binding(e, b)
        item = self.global_item(e.id)
        if item is None and e.id in REGISTRY:
            return FnRefT(REGISTRY[e.id])
        if item is not None:
            self.ref(e, SymbolAnchor((e.id,)))
            if item.ast is None:
                return UNKNOWN
            if item.kind == "fn":
                return FnRefT(FnTarget(item, item.ast))
            if item.kind == "module":
                return FnRefT(item)
            self.report("L107", f"`{e.id}` is a {item.kind}, not a value", e)
            return UNKNOWN
        if e.id in DTYPES:
            return DTypeT(DTYPES[e.id])
        binder = getattr(self, "current_binder", None)
        if binder is not None and e.id in binder.dtypes:
            return DTypeT(binder.dtypes[e.id])
        if e.id in BUILTIN_CONSTANTS:
            return ScalarT("float", BUILTIN_CONSTANTS[e.id])
        self.unknown_name(e, scope)
        return UNKNOWN

    def unknown_name(self, e: A.Name, scope: Scope, dim: bool = False) -> None:
        candidates = set(scope.all_names())
        inst = getattr(self._module_scope(scope), "instance", None)
        if inst is not None:
            candidates |= set(self.members(inst, report=False).by_name)
        candidates |= set(self._global_names()) | set(REGISTRY) | set(DTYPES) | set(BUILTIN_CONSTANTS)
        # config fields are reached through the config parameter: offer `c.field`
        config_hints = []
        for name in scope.all_names():
            b = scope.lookup(name)
            if b is not None and isinstance(b.type, ConfigT):
                for f in b.type.value.values:
                    if closest(e.id, [f]) or f == e.id:
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
        self.report("L101", message, e, label="not found in this scope", notes=notes,
                    fixes=[Fix(f"replace with `{h}`", [(self.anchor(e), h)]) for h in hints])

    # ------------------------------------------------------------------ statements
    def block(self, block: A.Block, scope: Scope) -> Type:
        value: Type = UNIT
        n = len(block.stmts)
        for i, s in enumerate(block.stmts):
            last = i == n - 1
            if isinstance(s, A.ExprStmt):
                t = self.expr(s.expr, scope)
                if last:
                    value = t
                elif not isinstance(s.expr, (A.Call, A.IfExpr)) and not isinstance(t, (UnitT, UnknownT)):
                    self.report("L903", "this value is discarded", s.expr, severity="warning",
                                notes=["only the last expression of a block is its value"])
            else:
                self.stmt(s, scope)
                if last:
                    value = UNIT
        if n and isinstance(block.stmts[-1], A.ErrorStmt):
            return UNKNOWN
        return value

    def stmt(self, s, scope: Scope) -> None:
        if isinstance(s, A.Let):
            t = self.expr(s.value, scope)
            if s.annotation is not None:
                binder = getattr(self, "current_binder", None)
                declared = self.eval_type(s.annotation, scope, binder)
                self.check_same(t, declared, s.value, s.annotation, "this value is", "L204", "L305")
            if s.is_tuple:
                items = t.items if isinstance(t, TupleT) else None
                if items is None and not isinstance(t, UnknownT):
                    self.report("L107", f"cannot unpack {format_type(t)} into {len(s.targets)} names", s.value)
                elif items is not None and len(items) != len(s.targets):
                    self.report("L211", f"cannot unpack {len(items)} values into {len(s.targets)} names", s.value)
                    items = None
                for i, target in enumerate(s.targets):
                    self.bind_local(target, items[i] if items is not None else UNKNOWN, scope)
            else:
                self.bind_local(s.targets[0], t, scope)
        elif isinstance(s, A.Assign):
            self.assign(s, scope)
        elif isinstance(s, A.For):
            self.for_loop(s, scope)
        elif isinstance(s, A.ErrorStmt):
            for name in s.bound:
                scope.bind(name, Binding(UNKNOWN, "local", None, None, uses=1))

    def bind_local(self, target: A.Name, t: Type, scope: Scope) -> None:
        previous = scope.lookup_in_fn(target.id)
        if previous is not None and previous.kind in ("local", "param") and not target.id.startswith("_"):
            self.report("L902", f"`{target.id}` shadows an earlier binding", target, severity="warning",
                        labels=[Label(previous.anchor, "first bound here")] if isinstance(previous.anchor, LocalAnchor) else [],
                        notes=[f"to update it, assign: `{target.id} = ...`"])
        b = Binding(t, "local", self.anchor(target), target)
        self.ref(target, b.anchor)
        scope.bind(target.id, b)
        self.fn_locals.append((target.id, b))
        self.record(target, t)

    def assign(self, s: A.Assign, scope: Scope) -> None:
        t = self.expr(s.value, scope)
        b = self.lookup_value(s.target.id, scope)
        if b is None:
            self.unknown_name(s.target, scope)
            return
        if b.kind == "member":
            info: MemberInfo = b.type
            self.ref(s.target, b.anchor)
            if info.kind != "state":
                self.report("L109", f"cannot assign to `{s.target.id}`: only module `state` and `let` locals can be "
                            "assigned", s.target, notes=[f"`{s.target.id}` is a {info.kind}"])
                return
            declared = self.member_value(info, s.target)
            self.record(s.target, declared)
            self.check_assign_type(t, declared, s, "state")
            return
        if b.kind not in ("local",):
            self.report("L109", f"cannot assign to `{s.target.id}`: only module `state` and `let` locals can be "
                        "assigned", s.target, notes=[f"`{s.target.id}` is a {_binding_kind(b.kind)}"])
            return
        self.ref(s.target, b.anchor)
        self.record(s.target, b.type)
        self.check_assign_type(t, b.type, s, "local")

    def check_assign_type(self, t: Type, declared: Type, s: A.Assign, what: str) -> None:
        if isinstance(t, UnknownT) or isinstance(declared, UnknownT):
            return
        if isinstance(t, TensorT) and isinstance(declared, TensorT):
            if t.dtype != declared.dtype:
                self.report("L301" if t.dtype.is_float and declared.dtype.is_float else "L302",
                            f"assignment changes the dtype of `{s.target.id}` from {_dtype_text(declared.dtype)} to "
                            f"{_dtype_text(t.dtype)}", s.value)
            elif not _shapes_equal(t.shape, declared.shape):
                self.report("L210", f"assignment changes the shape of `{s.target.id}` from "
                            f"{format_shape(declared.shape)} to {format_shape(t.shape)}", s.value,
                            label=format_type(t),
                            notes=["a loop-carried value and module state keep one shape; use a new `let`"])
            return
        if type(t) is not type(declared):
            self.report("L210", f"assignment changes `{s.target.id}` from {format_type(declared)} to {format_type(t)}",
                        s.value)

    def for_loop(self, s: A.For, scope: Scope) -> None:
        t = self.expr(s.iter, scope)
        inner = Scope(scope, "block")
        if isinstance(t, ModuleListT):
            elem: Type = ModuleT(t.instance)
        elif isinstance(t, UnknownT):
            elem = UNKNOWN
        else:
            self.report("L107", f"`for` iterates over a list of submodules, got {_kind_text(t)}", s.iter,
                        label=format_type(t))
            elem = UNKNOWN
        b = Binding(elem, "loop", self.anchor(s.var), s.var, uses=1)
        self.ref(s.var, b.anchor)
        inner.bind(s.var.id, b)
        self.record(s.var, elem)
        self.block(s.body, inner)

    # ------------------------------------------------------------------ expressions
    def expr(self, e, scope: Scope) -> Type:
        t = self._expr(e, scope)
        self.result.types[e] = t
        return t

    def _expr(self, e, scope: Scope) -> Type:
        if isinstance(e, A.IntLit):
            return ScalarT("int", Dim.of(e.value))
        if isinstance(e, A.FloatLit):
            return ScalarT("float", e.value)
        if isinstance(e, A.StrLit):
            return ScalarT("str", e.value)
        if isinstance(e, A.BoolLit):
            return ScalarT("bool", e.value)
        if isinstance(e, A.NoneLit):
            return NONE
        if isinstance(e, A.Name):
            return self.name_value(e, scope)
        if isinstance(e, A.Attr):
            return self.attr(e, scope)
        if isinstance(e, A.Call):
            return self.call(e, scope)
        if isinstance(e, A.BinOp):
            return self.binop(e, scope)
        if isinstance(e, A.Compare):
            return self.compare(e, scope)
        if isinstance(e, A.Neg):
            return self.unary(e, "neg", scope)
        if isinstance(e, A.Not):
            return self.unary(e, "logical_not", scope)
        if isinstance(e, A.Index):
            return self.index(e, scope)
        if isinstance(e, A.TupleLit):
            return TupleT(tuple(self.expr(i, scope) for i in e.items))
        if isinstance(e, A.ListLit):
            return ListT(tuple(self.expr(i, scope) for i in e.items))
        if isinstance(e, A.IfExpr):
            return self.if_expr(e, scope)
        if isinstance(e, A.RecordLit):
            self.report("L111", "record literals are config values: use them in presets and config defaults", e)
            return UNKNOWN
        self.report("L111", "this expression is not allowed here", e)
        return UNKNOWN

    def attr(self, e: A.Attr, scope: Scope) -> Type:
        base = self.expr(e.value, scope)
        name = e.name.id
        if isinstance(base, UnknownT):
            return UNKNOWN
        if isinstance(base, ConfigT):
            cv: ConfigValue = base.value
            fdef = cv.field_def(name)
            if fdef is None:
                hint = closest(name, list(cv.values))
                self.report("L102", f"config `{cv.type_name}` has no field `{name}`" +
                            (f"; did you mean `{hint}`?" if hint else ""), e.name, fixes=self._fix(e.name, hint),
                            labels=[Label(SymbolAnchor((cv.type_name,)), "config declared here")])
                return UNKNOWN
            self.ref(e.name, SymbolAnchor((cv.type_name, name)))
            self.result.deps.setdefault(cv.type_name, cv.item.interface)
            prefix = _dotted(e.value)
            return cv.field_type(name, f"{prefix}.{name}" if prefix else name)
        if isinstance(base, NoneT):
            self.report("L406", f"`{_dotted(e.value) or 'this value'}` is `none` here, so it has no `{name}`", e.name,
                        notes=["guard the use with `if ... != none { ... }`"])
            return UNKNOWN
        if isinstance(base, TensorT):
            if name == "dtype":
                return DTypeT(base.dtype)
            self.report("L102", f"tensors have no field `{name}`; the only one is `dtype`", e.name)
            return UNKNOWN
        if isinstance(base, ModuleT):
            inst: Instance = base.instance
            members = self.members(inst, report=False)
            info = members.by_name.get(name)
            if info is None:
                if name in members.poisoned:
                    return UNKNOWN
                hint = closest(name, list(members.by_name))
                self.report("L102", f"`{inst.module.name.id}` has no member `{name}`" +
                            (f"; did you mean `{hint}`?" if hint else ""), e.name, fixes=self._fix(e.name, hint))
                return UNKNOWN
            self.ref(e.name, SymbolAnchor((inst.module.name.id, "member", name)))
            if info.present is False:
                self.report("L108", f"`{inst.module.name.id}.{name}` exists only when {info.cond_text}, which is "
                            "false here", e.name)
                return UNKNOWN
            if info.conditions:
                self.report("L108", f"`{name}` exists only when {info.cond_text} in `{inst.module.name.id}`", e.name)
                return UNKNOWN
            return info.type
        if isinstance(base, ModuleListT):
            self.report("L102", f"a list of submodules has no member `{name}`; iterate with `for`", e.name)
            return UNKNOWN
        self.report("L102", f"{_kind_text(base)} has no field `{name}`", e.name)
        return UNKNOWN

    def binop(self, e: A.BinOp, scope: Scope) -> Type:
        a = self.expr(e.left, scope)
        if e.op in ("and", "or") and isinstance(a, ScalarT) and a.kind == "bool" and a.value is (e.op == "or"):
            return ScalarT("bool", a.value)  # compile-time short circuit: the right side is not used
        b = self.expr(e.right, scope)
        if isinstance(a, UnknownT) or isinstance(b, UnknownT):
            return UNKNOWN
        if isinstance(a, ScalarT) and isinstance(b, ScalarT):
            return self.fold(e, e.op, a, b)
        op = REGISTRY[OPERATORS[e.op]]
        return self.apply_op(op, {"x": (a, e.left), "y": (b, e.right)}, e, op_symbol=e.op)

    def compare(self, e: A.Compare, scope: Scope) -> Type:
        a = self.expr(e.left, scope)
        b = self.expr(e.right, scope)
        if isinstance(a, UnknownT) or isinstance(b, UnknownT):
            return UNKNOWN
        if isinstance(a, (ScalarT, NoneT, ConfigT)) and isinstance(b, (ScalarT, NoneT, ConfigT)):
            return self.fold_compare(e, a, b)
        op = REGISTRY[OPERATORS[e.op]]
        return self.apply_op(op, {"x": (a, e.left), "y": (b, e.right)}, e, op_symbol=e.op)

    def unary(self, e, op_name: str, scope: Scope) -> Type:
        t = self.expr(e.operand, scope)
        if isinstance(t, UnknownT):
            return UNKNOWN
        if isinstance(t, ScalarT):
            if op_name == "neg":
                if t.kind == "int":
                    return ScalarT("int", -t.value if t.value is not None else None)
                if t.kind == "float":
                    return ScalarT("float", -t.value if t.value is not None else None)
                self.report("L107", f"`-` needs a number, got {_kind_text(t)}", e)
                return UNKNOWN
            if t.kind != "bool":
                self.report("L107", f"`not` needs a bool, got {_kind_text(t)}", e)
                return UNKNOWN
            return ScalarT("bool", (not t.value) if t.value is not None else None)
        return self.apply_op(REGISTRY[op_name], {"x": (t, e.operand)}, e, op_symbol="-" if op_name == "neg" else "not")

    def fold(self, e: A.BinOp, op: str, a: ScalarT, b: ScalarT) -> Type:
        """Compile-time arithmetic on scalars. `/` between ints is exact division."""
        if op in ("and", "or"):
            if a.kind != "bool" or b.kind != "bool":
                self.report("L107", f"`{op}` needs bools, got {_kind_text(a)} and {_kind_text(b)}", e)
                return UNKNOWN
            if a.value is not None and b.value is not None:
                return ScalarT("bool", (a.value and b.value) if op == "and" else (a.value or b.value))
            if op == "and" and (a.value is False or b.value is False):
                return ScalarT("bool", False)
            if op == "or" and (a.value is True or b.value is True):
                return ScalarT("bool", True)
            return ScalarT("bool", None)
        if a.kind not in ("int", "float") or b.kind not in ("int", "float"):
            self.report("L107", f"`{op}` needs numbers, got {_kind_text(a)} and {_kind_text(b)}", e)
            return UNKNOWN
        if op == "@":
            self.report("L107", "`@` needs tensors", e)
            return UNKNOWN
        if a.kind == "int" and b.kind == "int" and op in ("+", "-", "*", "/") and a.value is not None and b.value is not None:
            if op == "+":
                return ScalarT("int", a.value + b.value)
            if op == "-":
                return ScalarT("int", a.value - b.value)
            if op == "*":
                return ScalarT("int", a.value * b.value)
            q = divide(a.value, b.value)
            if isinstance(q, DivisionError):
                self.division_error(e, a.value, b.value, q)
                return ScalarT("int", None)
            return ScalarT("int", q)
        x, y = _number(a), _number(b)
        if a.kind == "int" and b.kind == "int":
            if op == "%" and x is not None and y is not None and y != 0:
                return ScalarT("int", Dim.of(x % y))
            if op == "**" and x is not None and y is not None and y >= 0:
                return ScalarT("int", Dim.of(x ** y))
            if op in ("%", "**") and (y is None or y >= 0):
                return ScalarT("int", None)
        if x is None or y is None:
            return ScalarT("float", None)
        try:
            value = {"+": x + y, "-": x - y, "*": x * y}.get(op)
            if value is None:
                value = x / y if op in ("/",) else (x ** y if op == "**" else math.fmod(x, y))
        except (ZeroDivisionError, OverflowError, ValueError):
            self.report("L206", f"`{op}` of {x} and {y} has no value", e)
            return ScalarT("float", None)
        return ScalarT("float", float(value))

    def fold_compare(self, e: A.Compare, a: Type, b: Type) -> Type:
        if isinstance(a, (NoneT, ConfigT)) or isinstance(b, (NoneT, ConfigT)):
            if e.op not in ("==", "!="):
                self.report("L107", f"`{e.op}` cannot compare {_kind_text(a)} and {_kind_text(b)}", e)
                return UNKNOWN
            same = isinstance(a, NoneT) and isinstance(b, NoneT) or (
                isinstance(a, ConfigT) and isinstance(b, ConfigT) and a.value is b.value)
            if isinstance(a, ScalarT) or isinstance(b, ScalarT):
                same = False
            return ScalarT("bool", same if e.op == "==" else not same)
        for s, other, node in ((a, b, e.right), (b, a, e.left)):
            if s.kind == "str" and s.literals and other.kind == "str" and other.value is not None \
                    and other.value not in s.literals:
                hint = closest(other.value, list(s.literals))
                self.report("L401", f'this is never true: the value is one of {", ".join(chr(34) + v + chr(34) for v in s.literals)}'
                            + (f'; did you mean "{hint}"?' if hint else ""), node,
                            fixes=[Fix(f'replace with "{hint}"', [(self.anchor(node), f'"{hint}"')])] if hint else [])
                return ScalarT("bool", None)
        kinds = {a.kind, b.kind}
        if len(kinds) > 1 and kinds != {"int", "float"}:
            self.report("L107", f"cannot compare {_kind_text(a)} and {_kind_text(b)}", e)
            return UNKNOWN
        if a.kind == "int" and b.kind == "int" and a.value is not None and b.value is not None and e.op in ("==", "!="):
            if a.value.same(b.value):
                return ScalarT("bool", e.op == "==")
            diff = (a.value - b.value).as_int()
            if diff is not None:
                return ScalarT("bool", e.op == "!=")
            return ScalarT("bool", None)
        x = _number(a) if a.kind in ("int", "float") else a.value
        y = _number(b) if b.kind in ("int", "float") else b.value
        if x is None or y is None:
            return ScalarT("bool", None)
        return ScalarT("bool", {"==": x == y, "!=": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[e.op])

    def if_expr(self, e: A.IfExpr, scope: Scope) -> Type:
        c = self.expr(e.cond, scope)
        cond = self.compile_time_bool(c, e.cond)
        key = _cond_key(e.cond, self.item.text)
        then_t: Type | None = None
        else_t: Type | None = None
        if cond is not False:
            self.assumptions.append(key)
            then_t = self.block(e.then, Scope(scope, "block"))
            self.assumptions.pop()
        if cond is not True and e.orelse is not None:
            self.assumptions.append((key[0], not key[1]))
            if isinstance(e.orelse, A.Block):
                else_t = self.block(e.orelse, Scope(scope, "block"))
            else:
                else_t = self.expr(e.orelse, scope)
            self.assumptions.pop()
        if e.orelse is None:
            return UNIT
        if cond is True:
            return then_t
        if cond is False:
            return else_t
        if isinstance(then_t, UnknownT) or isinstance(else_t, UnknownT):
            return UNKNOWN
        if not _types_equal(then_t, else_t):
            self.report("L306", f"the branches of `if` differ: {format_type(then_t)} and {format_type(else_t)}", e,
                        labels=[Label(self.anchor(_tail_node(e.then)), format_type(then_t)),
                                Label(self.anchor(_tail_node(e.orelse) if isinstance(e.orelse, A.Block) else e.orelse),
                                      format_type(else_t))])
            return UNKNOWN
        return then_t

    def compile_time_bool(self, t: Type, node) -> bool | None:
        if isinstance(t, UnknownT):
            return None
        if isinstance(t, ScalarT) and t.kind == "bool":
            return t.value
        if isinstance(t, TensorT):
            self.report("L405", "the condition of `if` must be known at compile time; this is a tensor", node,
                        label=format_type(t), notes=["for a per-element choice use `where(cond, a, b)`"])
            return None
        self.report("L405", f"the condition of `if` must be a compile-time bool, got {_kind_text(t)}", node)
        return None

    def index(self, e: A.Index, scope: Scope) -> Type:
        base = self.expr(e.value, scope)
        if isinstance(base, ModuleListT):
            if len(e.items) == 1 and not isinstance(e.items[0], (A.Slice, A.EllipsisLit)):
                self.expr(e.items[0], scope)
                return ModuleT(base.instance)
        if isinstance(base, UnknownT):
            for item in e.items:
                if not isinstance(item, (A.Slice, A.EllipsisLit)):
                    self.expr(item, scope)
            return UNKNOWN
        if not isinstance(base, TensorT):
            self.report("L107", f"only tensors can be indexed, got {_kind_text(base)}", e.value)
            return UNKNOWN
        ell = [i for i, it in enumerate(e.items) if isinstance(it, A.EllipsisLit)]
        if len(ell) > 1:
            self.report("L208", "an index has at most one `...`", e.items[ell[1]])
            return UNKNOWN
        pre = e.items[: ell[0]] if ell else e.items
        post = e.items[ell[0] + 1:] if ell else []
        shape = base.shape
        n = len(shape.dims)
        if shape.prefix is not None and pre:
            self.report("L208", f"indexing leading dims of {format_shape(shape)}, whose `...` has unknown rank", e,
                        notes=["index from the end: `x[..., i]`"])
            return UNKNOWN
        if len(pre) + len(post) > n:
            self.report("L208", f"{len(pre) + len(post)} indices for {format_shape(shape)} of rank {n}", e)
            return UNKNOWN
        out_pre: list = []
        out_post: list = []
        prefix = shape.prefix
        for items, dims, out in ((pre, shape.dims[: len(pre)], out_pre),
                                 (post, shape.dims[n - len(post):], out_post)):
            for it, d in zip(items, dims):
                one = TensorT(base.dtype, Shape((d,)))
                if isinstance(it, A.Slice):
                    start = self.int_arg(it.start, scope) if it.start is not None else None
                    stop = self.int_arg(it.stop, scope) if it.stop is not None else None
                    if it.start is None and it.stop is None:
                        out.append(d)
                        continue
                    r = self.run_rule(REGISTRY["slice"], {"x": one, "dim": 0, "start": start or Dim.of(0), "stop": stop}, it)
                    out.extend(r.dims if isinstance(r, Shape) else [None])
                    continue
                t = self.expr(it, scope)
                if isinstance(t, ScalarT) and t.kind == "int":
                    self.run_rule(REGISTRY["select"], {"x": one, "dim": 0, "index": t.value}, it)
                    continue
                if isinstance(t, TensorT):
                    if not t.dtype.is_int:
                        self.report("L303", f"tensor indices must be integers, got {_dtype_text(t.dtype)}", it)
                        return UNKNOWN
                    if t.shape.prefix is not None:
                        self.report("L208", "tensor indices with `...` are not supported", it)
                        return UNKNOWN
                    out.extend(t.shape.dims)
                    continue
                if not isinstance(t, UnknownT):
                    self.report("L107", f"an index is an int, a slice or an integer tensor, got {_kind_text(t)}", it)
                return UNKNOWN
        middle = shape.dims[len(pre): n - len(post)]
        return TensorT(base.dtype, Shape(tuple(out_pre) + tuple(middle) + tuple(out_post), prefix))

    def int_arg(self, e, scope: Scope) -> Dim | None:
        t = self.expr(e, scope)
        if isinstance(t, ScalarT) and t.kind == "int":
            return t.value
        if not isinstance(t, UnknownT):
            self.report("L107", f"a slice bound is a compile-time int, got {_kind_text(t)}", e)
        return None

    def run_rule(self, op: OpDef, values: dict, node) -> Shape | None:
        try:
            return op.shape_rule(values)
        except OpError as err:
            self.report(err.code, err.message, node, notes=err.notes)
            return None

    # ------------------------------------------------------------------ calls
    def call(self, e: A.Call, scope: Scope) -> Type:
        func = e.func
        if isinstance(func, A.Name):
            b = self.lookup_value(func.id, scope)
            if b is None and func.id in REGISTRY and self.global_item(func.id) is None:
                self.ref(func, None)
                return self.call_op(REGISTRY[func.id], e, scope)
            target = self.expr(func, scope)
        elif isinstance(func, A.Attr):
            base = self.expr(func.value, scope)
            if isinstance(base, ModuleT):
                inst: Instance = base.instance
                fn = self.find_method(inst, func.name, report=True)
                if fn is None:
                    self.eval_args(e.args, scope)
                    return UNKNOWN
                self.ref(func.name, SymbolAnchor((inst.module.name.id, "fn", func.name.id)))
                target = FnRefT(FnTarget(inst.item, fn, inst))
                self.record(func, target)
            else:
                target = self.attr(func, scope) if not isinstance(base, UnknownT) else UNKNOWN
                self.record(func, target)
        else:
            target = self.expr(func, scope)
        if isinstance(target, UnknownT):
            self.eval_args(e.args, scope)
            return UNKNOWN
        if isinstance(target, ModuleT):
            inst = target.instance
            fn = self.find_method(inst, A.Name(func.span, "forward"), report=False)
            if fn is None:
                self.report("L106", f"`{inst.module.name.id}` has no `forward`; call a method: `x.name(...)`", func)
                self.eval_args(e.args, scope)
                return UNKNOWN
            return self.call_fn(FnTarget(inst.item, fn, inst), e, scope)
        if isinstance(target, FnRefT):
            t = target.target
            if isinstance(t, OpDef):
                return self.call_op(t, e, scope)
            if isinstance(t, FnTarget):
                return self.call_fn(t, e, scope)
            if isinstance(t, Item):
                self.report("L111", f"`{t.name}` is a module: declare it as a member (`name: {t.name}(...)`) and "
                            "call the member", func)
                self.eval_args(e.args, scope)
                return UNKNOWN
        self.report("L106", f"{_kind_text(target)} is not callable", func, label=format_type(target))
        self.eval_args(e.args, scope)
        return UNKNOWN

    def find_method(self, inst: Instance, name: A.Name, report: bool) -> A.FnDef | None:
        members = self.members(inst, report=False)
        info = members.by_name.get(name.id)
        if info is not None and info.kind == "fn":
            if info.present is False:
                if report:
                    self.report("L108", f"`{inst.module.name.id}.{name.id}` exists only when {info.cond_text}", name)
                return None
            return info.node
        if report and name.id not in members.poisoned:
            methods = [m.name for m in members.order if m.kind == "fn"]
            hint = closest(name.id, methods)
            self.report("L102", f"`{inst.module.name.id}` has no method `{name.id}`" +
                        (f"; did you mean `{hint}`?" if hint else ""), name, fixes=self._fix(name, hint))
        return None

    def eval_args(self, args: list[A.Arg], scope: Scope) -> list[Type]:
        return [self.expr(a.value, scope) for a in args]

    def match_args(self, names: list[str], has_default: dict[str, bool], args: list[A.Arg], callee: str,
                   call: A.Node, extra_kwargs: bool = False, owner_path: tuple | None = None) -> dict[str, A.Arg] | None:
        """Match positional and keyword arguments to parameter names (arity errors)."""
        matched: dict[str, A.Arg] = {}
        positional = [a for a in args if a.name is None]
        keywords = [a for a in args if a.name is not None]
        ok = True
        if keywords and args.index(keywords[0]) < len(positional):
            self.report("L111", "positional arguments come before keyword arguments", keywords[0])
            return None
        if len(positional) > len(names):
            self.report("L103", f"{callee} takes {len(names)} argument{'s' if len(names) != 1 else ''}, "
                        f"got {len(positional)}", positional[len(names)],
                        notes=[f"parameters: {', '.join(names) or 'none'}"])
            ok = False
        for name, a in zip(names, positional):
            matched[name] = a
        extras = {}
        for a in keywords:
            k = a.name.id
            if k in matched:
                self.report("L111", f"`{k}` is given twice", a.name)
                ok = False
            elif k not in names:
                if extra_kwargs:
                    extras[k] = a
                    continue
                hint = closest(k, [n for n in names if n not in matched])
                self.report("L104", f"{callee} has no parameter `{k}`" + (f"; did you mean `{hint}`?" if hint else ""),
                            a.name, fixes=self._fix(a.name, hint), notes=[f"parameters: {', '.join(names)}"])
                ok = False
            else:
                matched[k] = a
                if owner_path is not None:
                    self.ref(a.name, SymbolAnchor(owner_path + (k,)))
        missing = [n for n in names if n not in matched and not has_default.get(n)]
        if missing:
            self.report("L103", f"{callee} is missing {', '.join(f'`{m}`' for m in missing)}", call,
                        notes=[f"parameters: {', '.join(names)}"])
            ok = False
        if not ok:
            for a in args:
                if a.value not in self.result.types:
                    self.expr(a.value, Scope(None))  # keep hover alive; errors here are not news
            return None
        if extra_kwargs:
            matched["**"] = extras  # type: ignore[assignment]
        return matched

    def call_op(self, op: OpDef, e: A.Call, scope: Scope) -> Type:
        names = [p.name for p in op.params if p.kind != "sizes"]
        defaults = {p.name: p.default is not REQUIRED for p in op.params}
        takes_sizes = any(p.kind == "sizes" for p in op.params)
        for a in e.args:
            if a.value not in self.result.types:
                pass
        # Positional scalars only: fold (`sqrt(c.head_dim)`).
        arg_types = {id(a): self.expr(a.value, scope) for a in e.args}
        if op.fold is not None and e.args and all(isinstance(arg_types[id(a)], ScalarT) for a in e.args) and \
                all(a.name is None for a in e.args):
            return self.fold_op(op, [arg_types[id(a)] for a in e.args], e)
        matched = self.match_args(names, defaults, e.args, f"`{op.name}`", e, extra_kwargs=takes_sizes)
        if matched is None:
            return UNKNOWN
        values: dict[str, tuple[Type, A.Node]] = {}
        for p in op.params:
            if p.kind == "sizes":
                values[p.name] = {k: (arg_types[id(a)], a.value) for k, a in matched.get("**", {}).items()}
                continue
            if p.name in matched:
                a = matched[p.name]
                values[p.name] = (arg_types[id(a)], a.value)
        return self.apply_op(op, values, e)

    def fold_op(self, op: OpDef, args: list[ScalarT], e) -> Type:
        nums = [_number(a) for a in args]
        if any(a.kind not in ("int", "float") for a in args):
            self.report("L107", f"`{op.name}` needs numbers or tensors", e)
            return UNKNOWN
        if any(n is None for n in nums):
            return ScalarT("float", None)
        try:
            v = op.fold(*nums)
        except (ValueError, OverflowError, ZeroDivisionError, TypeError):
            self.report("L107", f"`{op.name}` has no value for {', '.join(map(str, nums))}", e)
            return ScalarT("float", None)
        if all(a.kind == "int" for a in args) and isinstance(v, int) and not isinstance(v, bool):
            return ScalarT("int", Dim.of(v))
        if isinstance(v, bool):
            return ScalarT("bool", v)
        return ScalarT("float", float(v))

    def apply_op(self, op: OpDef, args: dict, e, op_symbol: str | None = None) -> Type:
        """Convert arguments to the op's kinds, then run its dtype and shape rules."""
        values: dict[str, Any] = {}
        nodes: dict[str, A.Node] = {}
        what = f"`{op_symbol}`" if op_symbol else f"`{op.name}`"
        for p in op.params:
            if p.name not in args:
                if p.default is REQUIRED:
                    return UNKNOWN
                values[p.name] = p.default
                continue
            if p.kind == "sizes":
                sizes = {}
                for k, (t, node) in args[p.name].items():
                    nodes[k] = node
                    if isinstance(t, UnknownT):
                        return UNKNOWN
                    if not (isinstance(t, ScalarT) and t.kind == "int"):
                        self.report("L107", f"size `{k}` of {what} is a compile-time int, got {_kind_text(t)}", node)
                        return UNKNOWN
                    sizes[k] = t.value
                values[p.name] = sizes
                continue
            t, node = args[p.name]
            nodes[p.name] = node
            if isinstance(t, UnknownT):
                return UNKNOWN
            v = self.convert(p.kind, t, node, p.name, what)
            if v is _FAILED:
                return UNKNOWN
            values[p.name] = v
        if op.fold is not None and all(not isinstance(values[p.name], TensorT) for p in op.params if p.kind == "operand"):
            if any(p.kind == "operand" for p in op.params):
                return self.fold_op(op, [args[p.name][0] for p in op.params if p.kind == "operand"], e)
        try:
            dtype = op.dtype_rule(values)
        except OpError as err:
            self.op_error(err, e, nodes, values)
            return UNKNOWN
        try:
            shape = op.shape_rule(values)
        except OpError as err:
            self.op_error(err, e, nodes, values)
            return UNKNOWN
        if isinstance(shape, list):
            dts = dtype if isinstance(dtype, list) else [dtype] * len(shape)
            return TupleT(tuple(TensorT(d, s) for d, s in zip(dts, shape)))
        return TensorT(dtype, shape)

    def op_error(self, err: OpError, e, nodes: dict, values: dict) -> None:
        node = nodes.get(err.arg, e) if err.arg else e
        span = node.span
        if err.inner is not None and isinstance(node, A.StrLit):
            raw = self.item.text[node.span.start:node.span.end]
            if "\\" not in raw:
                span = Span(node.span.start + 1 + err.inner[0], node.span.start + 1 + err.inner[1])
        labels = []
        for arg, text in err.arg_labels.items():
            n = nodes.get(arg)
            if n is None:
                continue
            labels.append(Label(self.anchor(n), text))
            labels += self.def_labels(n)
        if err.code in ("L206", "L205"):
            dims = []
            for v in values.values():
                if isinstance(v, TensorT):
                    dims += list(v.shape.dims)
                elif isinstance(v, dict):
                    dims += list(v.values())
            labels += self.atom_labels(dims)
        self.report(err.code, err.message, span, labels=labels, notes=err.notes)

    def def_labels(self, node) -> list[Label]:
        """Where a local named in an error got its value."""
        if isinstance(node, A.Name):
            for name, b in reversed(self.fn_locals):
                if name == node.id and isinstance(b.anchor, LocalAnchor) and b.anchor.span != node.span:
                    return [Label(b.anchor, f"`{name}` is {format_type(b.type)} from here")]
        return []

    def convert(self, kind: str, t: Type, node, name: str, what: str):
        """An op argument in the form its rules expect, or _FAILED (reported)."""
        if kind == "tensor":
            if isinstance(t, TensorT):
                return t
            self.report("L107", f"`{name}` of {what} is a tensor, got {_kind_text(t)}", node, label=format_type(t))
            return _FAILED
        if kind == "operand":
            if isinstance(t, TensorT):
                return t
            if isinstance(t, ScalarT) and t.kind in ("int", "float", "bool"):
                return t.value if t.kind != "float" else (t.value if t.value is not None else 0.0)
            self.report("L107", f"`{name}` of {what} is a tensor or a number, got {_kind_text(t)}", node)
            return _FAILED
        if kind == "tensors":
            items = t.items if isinstance(t, (ListT, TupleT)) else None
            if items is None or not all(isinstance(i, (TensorT, UnknownT)) for i in items):
                self.report("L107", f"`{name}` of {what} is a list of tensors `[a, b]`, got {_kind_text(t)}", node)
                return _FAILED
            if any(isinstance(i, UnknownT) for i in items):
                return _FAILED
            return list(items)
        if kind in ("int", "index"):
            if isinstance(t, ScalarT) and t.kind == "int":
                if kind == "index":
                    v = t.value.as_int() if t.value is not None else None
                    if v is None:
                        self.report("L107", f"`{name}` of {what} is a dim index and must be a known constant", node)
                        return _FAILED
                    return v
                return t.value
            if isinstance(t, NoneT) and kind == "int":
                return None
            self.report("L107", f"`{name}` of {what} is a compile-time int, got {_kind_text(t)}", node,
                        label=format_type(t))
            return _FAILED
        if kind in ("ints", "indices"):
            items = t.items if isinstance(t, (ListT, TupleT)) else None
            if items is None:
                self.report("L107", f"`{name}` of {what} is a list of ints `[B, S, 4]`, got {_kind_text(t)}", node)
                return _FAILED
            out = []
            for i in items:
                if isinstance(i, UnknownT):
                    out.append(None)
                    continue
                if not (isinstance(i, ScalarT) and i.kind == "int"):
                    self.report("L107", f"`{name}` of {what} is a list of ints, got an element {_kind_text(i)}", node)
                    return _FAILED
                if kind == "indices":
                    v = i.value.as_int() if i.value is not None else None
                    if v is None:
                        self.report("L107", f"`{name}` of {what} needs known constants", node)
                        return _FAILED
                    out.append(v)
                else:
                    out.append(i.value)
            return out
        if kind == "bool":
            if isinstance(t, ScalarT) and t.kind == "bool":
                if t.value is None:
                    self.report("L405", f"`{name}` of {what} must be known at compile time", node)
                    return _FAILED
                return t.value
            self.report("L107", f"`{name}` of {what} is a bool, got {_kind_text(t)}", node)
            return _FAILED
        if kind == "float":
            if isinstance(t, ScalarT) and t.kind in ("int", "float", "bool"):
                return _number(t) if t.kind != "bool" else t.value
            self.report("L107", f"`{name}` of {what} is a number, got {_kind_text(t)}", node)
            return _FAILED
        if kind == "str":
            if isinstance(t, ScalarT) and t.kind == "str" and t.value is not None:
                return t.value
            self.report("L107", f"`{name}` of {what} is a string literal, got {_kind_text(t)}", node)
            return _FAILED
        if kind == "dtype":
            if isinstance(t, DTypeT):
                return t.dtype
            self.report("L107", f"`{name}` of {what} is a dtype (`f32`, `x.dtype`), got {_kind_text(t)}", node)
            return _FAILED
        raise AssertionError(kind)

    def call_fn(self, target: FnTarget, e: A.Call, scope: Scope) -> Type:
        """Check a call to a Linnet function: unify arguments with its signature."""
        fn = target.fn
        inst = target.instance
        owner = (inst.module.name.id, "fn", fn.name.id) if inst is not None else (fn.name.id,)
        written = _dotted(e.func)
        callee = f"`{written}`" if written else f"`{fn.name.id}`"
        names = [p.name.id for p in fn.params]
        defaults = {p.name.id: p.default is not None for p in fn.params}
        arg_types = {id(a): self.expr(a.value, scope) for a in e.args}
        findings_before = len(self.result.findings)
        matched = self.match_args(names, defaults, e.args, callee, e, owner_path=owner + ("param",))
        if target.item is not self.item:
            self.result.deps.setdefault(target.item.name, target.item.interface)
        if matched is None:
            return UNKNOWN
        sig_scope = Scope(self.module_scope(inst) if inst is not None else self.global_scope(), "fn")
        # Compile-time parameters first (checked per call): tensor types may use them.
        tensor_params = [p for p in fn.params if isinstance(p.type, (A.TensorType, A.TupleType))]
        compile_time: dict[str, Type] = {}
        for p in fn.params:
            if p in tensor_params:
                continue
            if p.name.id in matched:
                arg = matched[p.name.id]
                t, node = arg_types[id(arg)], arg.value
            else:
                t, node = self.silent_expr(p.default, sig_scope, target.item), e
            checked = self.check_compile_time_arg(p, t, node, callee)
            compile_time[p.name.id] = checked if checked is not None else UNKNOWN
            sig_scope.bind(p.name.id, Binding(compile_time[p.name.id], "param"))
        sig = self.signature(target, tensor_params, compile_time, sig_scope)
        pattern_types = sig.params
        unifier = Unifier(set(sig.patterns), set(sig.dtype_patterns))
        unknown_arg = False
        for i, p in enumerate(tensor_params):
            pattern = pattern_types[i]
            if p.name.id not in matched:
                continue
            arg = matched[p.name.id]
            actual = arg_types[id(arg)]
            if isinstance(actual, UnknownT):
                unknown_arg = True
                continue
            if not isinstance(pattern, TensorT):
                continue
            if not isinstance(actual, TensorT):
                self.report("L107", f"`{p.name.id}` of {callee} is a tensor {format_type(pattern)}, got {_kind_text(actual)}",
                            arg.value, label=format_type(actual))
                continue
            msg = unifier.unify_dtype(pattern.dtype, actual.dtype, i)
            if msg is not None:
                self.report("L304", f"argument `{p.name.id}` of {callee}: {msg}", arg.value, label=format_type(actual),
                            labels=[Label(SymbolAnchor(owner + ("param", p.name.id)), "parameter declared here")],
                            notes=[f"consider `cast({_dotted(arg.value) or 'x'}, {pattern.dtype.name})`"]
                            if not pattern.dtype.var and pattern.dtype is not WORK else [])
            msg = unifier.unify_shape(pattern.shape, actual.shape, i)
            if msg is not None:
                self.report("L203", f"argument `{p.name.id}` of {callee}: {msg}", arg.value, label=format_type(actual),
                            labels=[Label(SymbolAnchor(owner + ("param", p.name.id)), f"declared {format_type(pattern)} here")])
        unifier.shown = [d for a in matched.values() for t in [arg_types.get(id(a))]
                         if isinstance(t, TensorT) for d in t.shape.dims if d is not None]
        unifier.solve()
        tensor_names = [p.name.id for p in tensor_params]
        for err in unifier.errors:
            p = tensor_params[err.arg]
            arg = matched[p.name.id]
            actual = arg_types[id(arg)]
            written = self._pattern_text(p, sig_scope, target.item)
            labels = [Label(SymbolAnchor(owner + ("param", p.name.id)), f"declared `{p.name.id}: {written}` here")]
            labels += self.def_labels(arg.value)
            sources = [err.actual] + [unifier.sources.get(a) for a in (err.pattern.atoms() if err.pattern else ())]
            labels += self.atom_labels(sources)
            a = format_dim(err.actual.val) if err.actual is not None else "?"
            if err.kind == "differ":
                expected = pattern_types[err.arg]
                shown = format_shape(substitute_shape(expected.shape, unifier.solved, unifier.prefixes), concrete=True)
                message = (f"argument `{p.name.id}` of {callee} is {format_shape(actual.shape, concrete=True)}, "
                           f"expected {shown} (dim {err.dim}: {a} vs {format_dim(err.expected.val)})")
            elif err.kind == "divide":
                bound = unifier.bindings_text(err.pattern, tensor_names)
                message = (f"argument `{p.name.id}` of {callee}: dim {err.dim} is {a}, but must be "
                           f"{format_dim(err.pattern)}" + (f" with {bound}" if bound else "") + f": {err.reason}")
            else:
                message = (f"argument `{p.name.id}` of {callee}: cannot infer "
                           f"{', '.join(sorted({x.name for x in err.pattern.atoms() if x in unifier.patterns}))} "
                           f"from dim {err.dim} ({format_dim(err.pattern)} = {a})")
            self.report(err.code, message, arg.value, label=format_type(actual, concrete=True), labels=labels)
        if len(self.result.findings) > findings_before or unknown_arg:
            return UNKNOWN  # the call is wrong, or its input unknown: what it returns would only cascade
        return _substitute_type(sig.ret, unifier, unifier.shown)

    def signature(self, target: FnTarget, tensor_params: list[A.Param], compile_time: dict[str, Type],
                  sig_scope: Scope) -> "_Signature":
        """A callee's parameter and return types with pattern atoms for its dim variables,
        cached per callee, instance and compile-time argument values."""
        inst = target.instance
        key = (target.fn, inst.key() if inst is not None else None,
               tuple((k, type_key(v)) for k, v in compile_time.items()))
        sig = self.ctx.signatures.get(key)
        if sig is None:
            generics = self.generics(target.fn, report=False)
            binder = _Binder("pattern", generics)
            sub = ItemChecker(self.ctx, target.item, {})
            params = [sub.eval_type(p.type, sig_scope, binder) for p in tensor_params]
            binder.frozen = True
            ret = sub.eval_type(target.fn.ret, sig_scope, binder) if target.fn.ret is not None else UNIT
            sig = _Signature(params, ret, frozenset(binder.dims.values()), frozenset(generics.values()),
                             dict(sub.result.deps))
            self.ctx.signatures[key] = sig
        for k, v in sig.deps.items():
            self.result.deps.setdefault(k, v)
        return sig

    def _pattern_text(self, p: A.Param, scope: Scope, item: Item) -> str:
        return " ".join(item.text[p.type.span.start:p.type.span.end].split())


_FAILED = object()


@dataclass(frozen=True)
class _Signature:
    params: list
    ret: Type
    patterns: frozenset
    dtype_patterns: frozenset
    deps: dict


def fn_entry_misplaced(fn, mdef) -> bool:
    return False


def _substitute_type(t: Type, u: Unifier, shown: list[Dim] | None = None) -> Type:
    """The callee's return type in the caller's terms. Dims that were solved for are shown
    as the argument dim of the same value when there is one (`c.num_attention_heads`, not
    `c.num_key_value_heads * (c.num_attention_heads / 4)`)."""
    if isinstance(t, TensorT):
        dtype = u.dtypes.get(t.dtype, t.dtype)
        if dtype.var and dtype in u.dtype_patterns:
            dtype = t.dtype
        shape = substitute_shape(t.shape, u.solved, u.prefixes)
        if shown:
            dims = []
            for orig, d in zip((None,) * (len(shape.dims) - len(t.shape.dims)) + t.shape.dims, shape.dims):
                if d is not None and orig is not None and orig.atoms() & u.patterns:
                    d = next((a for a in shown if a.same(d)), d)
                dims.append(d)
            shape = Shape(tuple(dims), shape.prefix)
        return TensorT(dtype, shape)
    if isinstance(t, TupleT):
        return TupleT(tuple(_substitute_type(i, u, shown) for i in t.items))
    return t


def _number(t: ScalarT):
    if t.kind == "int":
        return t.value.as_int() if t.value is not None else None
    return t.value


def _kind_text(t: Type) -> str:
    if isinstance(t, TensorT):
        return f"a tensor {format_type(t)}"
    if isinstance(t, ScalarT):
        return {"int": "an int", "float": "a float", "bool": "a bool", "str": "a str"}[t.kind]
    if isinstance(t, ModuleT):
        return f"the module `{t.instance.module.name.id}`"
    if isinstance(t, ModuleListT):
        return "a list of submodules"
    if isinstance(t, ConfigT):
        return f"a `{t.value.type_name}` config"
    if isinstance(t, NoneT):
        return "`none`"
    if isinstance(t, DTypeT):
        return "a dtype"
    if isinstance(t, FnRefT):
        return "a function"
    if isinstance(t, TupleT):
        return "a tuple"
    if isinstance(t, ListT):
        return "a list"
    if isinstance(t, UnitT):
        return "nothing"
    return "a value"


def _dtype_text(d: DType) -> str:
    from ..ops.registry import describe_dtype

    return describe_dtype(d)


def _binding_kind(kind: str) -> str:
    return {"param": "function parameter", "dim": "dim variable", "loop": "loop variable",
            "module_param": "module parameter"}.get(kind, kind)


def _dotted(e) -> str | None:
    if isinstance(e, A.Name):
        return e.id
    if isinstance(e, A.Attr):
        base = _dotted(e.value)
        return f"{base}.{e.name.id}" if base else None
    return None


def _shapes_equal(a: Shape, b: Shape) -> bool:
    if (a.prefix is None) != (b.prefix is None) or len(a.dims) != len(b.dims):
        return False
    if a.prefix is not None and a.prefix is not b.prefix:
        return False
    return all(x is None or y is None or x.same(y) for x, y in zip(a.dims, b.dims))


def _types_equal(a: Type, b: Type) -> bool:
    if isinstance(a, TensorT) and isinstance(b, TensorT):
        return a.dtype == b.dtype and _shapes_equal(a.shape, b.shape)
    if isinstance(a, TupleT) and isinstance(b, TupleT):
        return len(a.items) == len(b.items) and all(_types_equal(x, y) for x, y in zip(a.items, b.items))
    if isinstance(a, ScalarT) and isinstance(b, ScalarT):
        return a.kind == b.kind
    return type(a) is type(b)


def _shape_pair(actual: Shape, declared: Shape) -> str:
    text = f"{format_shape(actual)}, declared {format_shape(declared)}"
    conc_a, conc_d = format_shape(actual, True), format_shape(declared, True)
    if (conc_a, conc_d) != (format_shape(actual), format_shape(declared)):
        text += f" ({conc_a} vs {conc_d})"
    return text


def _tail_node(block: A.Block):
    if block.stmts and isinstance(block.stmts[-1], A.ExprStmt):
        return block.stmts[-1].expr
    return block


def _has_error_stmt(block: A.Block) -> bool:
    return any(isinstance(n, A.ErrorStmt) for n in A.walk(block))


def _cond_text(key: tuple[str, bool]) -> str:
    text, polarity = key
    return text if polarity else f"not {text}"


class _MemberEvaluator:
    """Evaluates the member declarations of one module instance."""

    def __init__(self, checker: ItemChecker, inst: Instance):
        self.outer = checker
        self.inst = inst
        # findings land in a private checker anchored at the module's own item
        self.c = ItemChecker(checker.ctx, inst.item, {})
        self.c.instance = inst
        self.members = Members()
        self.scope = checker.module_scope(inst)

    def run(self) -> Members:
        self.walk(self.inst.module.members, True, ())
        self.members.findings = self.c.result.findings
        if self.inst.generic:
            self.outer.result.types.update(self.c.result.types)
            self.outer.result.refs.extend(self.c.result.refs)
        for k, v in self.c.result.deps.items():
            self.outer.result.deps.setdefault(k, v)
        return self.members

    def walk(self, members: list, present: bool | None, conditions: tuple) -> None:
        for m in members:
            if isinstance(m, A.MemberIf):
                t = self.c.expr(m.cond, self.scope)
                cond = self.c.compile_time_bool(t, m.cond)
                key = _cond_key(m.cond, self.inst.item.text)
                text = " ".join(self.inst.item.text[m.cond.span.start:m.cond.span.end].split())
                for branch, pol in ((m.then, True), (m.orelse, False)):
                    if cond is None:
                        sub_present = present
                        sub_cond = conditions + ((key[0], key[1] if pol else not key[1]),)
                    else:
                        sub_present = present if cond == pol else False
                        sub_cond = conditions
                    self.cond_text = f"`{text}`" if pol else f"`not ({text})`" if " " in text else f"`not {text}`"
                    self.walk(branch, sub_present, sub_cond)
                continue
            if isinstance(m, A.ErrorStmt):
                self.members.poisoned.update(m.bound)
                continue
            info = self.member(m)
            if info is None:
                continue
            self.c.ref(m.name, SymbolAnchor((self.inst.module.name.id, "fn" if info.kind == "fn" else "member", info.name)))
            info.present = present
            info.conditions = conditions
            info.cond_text = getattr(self, "cond_text", "")
            prev = self.members.by_name.get(info.name)
            if prev is not None and (prev.present is not False and present is not False) and not _exclusive(prev, info):
                self.c.report("L105", f"`{info.name}` is declared twice in `{self.inst.module.name.id}`", m.name,
                              labels=[Label(self.c.anchor(prev.node.name), "first declared here")])
                continue
            if prev is not None and prev.present is not False and present is False:
                continue
            self.members.by_name[info.name] = info
            self.members.order.append(info)

    def member(self, m) -> MemberInfo | None:
        c = self.c
        for attr in getattr(m, "attributes", []):
            if attr.name.id not in KNOWN_ATTRIBUTES or (attr.name.id == "weights"):
                c.report("L111", f"unknown attribute `@{attr.name.id}` here" if attr.name.id not in KNOWN_ATTRIBUTES
                         else "`@weights` names a preset's default weights; it belongs on a `preset`", attr.name)
        checkpoint = _name_attribute(c, m)
        if isinstance(m, A.FnDef):
            return MemberInfo(m.name.id, "fn", m, FnRefT(FnTarget(self.inst.item, m, self.inst)),
                              checkpoint_name=None)
        if isinstance(m, A.StateDecl):
            t = c.eval_type(m.type, self.scope, None)
            c.record(m.name, t)
            return MemberInfo(m.name.id, "state", m, t)
        if isinstance(m, A.FieldDecl):
            if m.kind == "param":
                t = c.eval_type(m.type, self.scope, None)
                if isinstance(t, TensorT) and any(
                        a.kind == "var" or a.name in LOAD_TIME_DIMS for d in t.shape.dims if d is not None
                        for a in d.atoms()):
                    c.report("L111", "parameter shapes are fixed when the model is loaded: load-time dims belong "
                             "to `state`", m.type)
                c.record(m.name, t)
                return MemberInfo(m.name.id, "param", m, t, checkpoint_name=checkpoint)
            ctor = m.ctor
            item = c.global_item(ctor.func.id) if isinstance(ctor.func, A.Name) else None
            if item is None:
                c.unknown_name(ctor.func, self.scope)
                c.eval_args(ctor.args, self.scope)
                return MemberInfo(m.name.id, "submodule" if m.kind == "submodule" else "list", m, UNKNOWN)
            c.ref(ctor.func, SymbolAnchor((item.name,)))
            if item.kind != "module" or item.ast is None:
                if item.ast is not None:
                    c.report("L107", f"`{item.name}` is a {item.kind}, not a module", ctor.func)
                return MemberInfo(m.name.id, "submodule", m, UNKNOWN)
            inst = c.instantiate(item, ctor.args, self.scope, ctor)
            if inst is None:
                return MemberInfo(m.name.id, "submodule", m, UNKNOWN)
            if m.kind == "submodule":
                t = ModuleT(inst)
                c.record(m.name, t)
                return MemberInfo(m.name.id, "submodule", m, t, checkpoint_name=checkpoint)
            count_t = c.expr(m.count, self.scope)
            count = count_t.value if isinstance(count_t, ScalarT) and count_t.kind == "int" else None
            if not isinstance(count_t, (UnknownT,)) and not (isinstance(count_t, ScalarT) and count_t.kind == "int"):
                c.report("L107", f"the length of a submodule list is a compile-time int, got {_kind_text(count_t)}", m.count)
            t = ModuleListT(inst, count)
            c.record(m.name, t)
            return MemberInfo(m.name.id, "list", m, t, checkpoint_name=checkpoint)
        return None


def _flat_members(members):
    for m in members:
        if isinstance(m, A.MemberIf):
            yield from _flat_members(m.then)
            yield from _flat_members(m.orelse)
        else:
            yield m


def _exclusive(a: MemberInfo, b: MemberInfo) -> bool:
    """Two members under opposite conditions (`if x { a } else { a }`) don't clash."""
    for ca in a.conditions:
        for cb in b.conditions:
            if ca[0] == cb[0] and ca[1] != cb[1]:
                return True
    return False


def _name_attribute(c: ItemChecker, m) -> str | None:
    for attr in getattr(m, "attributes", []):
        if attr.name.id == "name":
            if len(attr.args) == 1 and isinstance(attr.args[0].value, A.StrLit):
                return attr.args[0].value.value
            c.report("L111", '`@name` takes one string: the checkpoint name of this member (`@name("LayerNorm")`)', attr)
    return None
