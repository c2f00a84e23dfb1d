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

from dataclasses import dataclass, field
from typing import Any, Callable

from ..syntax import ast as A
from ..syntax.ast import Span
from ..syntax.items import Item
from ..types.core import (
    UNIT,
    UNKNOWN,
    WORK,
    ConfigT,
    DType,
    ModuleListT,
    ModuleT,
    NoneT,
    ScalarT,
    Shape,
    TensorT,
    TupleT,
    Type,
    UnitT,
    UnknownT,
    dtype_var,
    format_shape,
    format_type,
)
from ..types.dims import Dim, const
from . import fn_reuse
from .calls import CallsMixin
from .configs import ConfigEvaluator
from .counted import count_through
from .describe import (
    binding_kind,
    dtype_text,
    has_error_stmt,
    kind_text,
    shape_pair,
    shapes_equal,
    tail_node,
)
from .diagnostics import Finding, Label, LocalAnchor, SymbolAnchor, symbol
from .expressions import ExpressionsMixin
from .members import MembersMixin
from .names import NAMES_DEP, SCALAR_TYPE_NAMES, Binder, NamesMixin
from .resolved import CallInfo, Ref, Resolved
from .scope import Binding, Instance, MemberInfo, Members, Scope

__all__ = ["NAMES_DEP", "CheckContext", "ItemChecker", "ItemResult"]

# Why a declared type does not match a slice's `min(...)`, and what says that a dim holds what it slices.
_CLAMPED_NOTE = (
    "a slice takes what the dim has, as numpy and torch do: `x[:, :4]` of [B, S] is [B, min(4, S)], `x[:, 4:]` is "
    "[B, S - min(4, S)]; a parameter type that has the rows says so (`x: [B, 4 + E]`)"
)

EXPRESSION_KEYWORDS = {"true", "false", "none", "not", "and", "or", "if", "else", "let", "for", "in"}


class CheckContext:
    """What every item check of one analysis shares: name lookup (`lookup(name, site)`: the
    item that `name` names in the file of item `site`, imports.Globals), config evaluation,
    and caches of module instances' members."""

    def __init__(
        self,
        lookup: Callable[[str, Item | None], Item | None],
        evaluator: ConfigEvaluator,
        previous: "CheckContext | None" = None,
    ):
        self.lookup = lookup
        self.evaluator = evaluator
        self.computing: set = set()  # instances whose members are being evaluated
        # Members of module instances and callee signatures depend only on the items'
        # interfaces and the config values: `previous` (the last analysis's context, when
        # those are unchanged) lends its caches, so a body edit does not recompute them.
        self.members_cache: dict[Any, Members] = previous.members_cache if previous else {}
        self.signatures: dict[Any, Any] = previous.signatures if previous else {}
        # The first error of a standard-library function's body checked with one call's values, by callee,
        # instance and argument types (`specialize.py`); not lent: its keys hold the callers' atoms.
        self.specialized: dict[Any, Any] = {}
        # The calls among them that checked clean, keyed by their sizes' values alone (`specialize.sizes_key`): lent,
        # as the standard library's bodies never change and these keys hold no caller's atom.
        self.specialized_clean: dict[Any, bool] = previous.specialized_clean if previous else {}
        # The same for the `follow` check of the root model (`instances.py`), which follows calls into user modules:
        # lent, each entry with the items its checks read, dropped when one is replaced (`program._prune_caches`); and
        # the dim variables that check's signatures made, by name node, so that its keys hold the same atoms.
        self.followed: dict[Any, Any] = previous.followed if previous else {}
        self.follow_atoms: dict[Any, Any] = previous.follow_atoms if previous else {}
        self.following: list[set] = []  # the items read by each `follow` check under way, innermost last
        # Whether a standard-library function's body could fail with concrete sizes, by function (`specialize.py`).
        self.size_dependent: dict[Any, bool] = {}
        # Whether an instance holds modules that differ, by instance key (`specialize.worth_following`).
        self.varies: dict[Any, bool] = {}
        # The keys of both caches by each item whose replacement leaves them stale (an instance's module, a callee's
        # item): an edit drops its items' entries without reading the rest (`program._prune_caches`).
        self.cache_keys: dict[Item, list[tuple[str, Any]]] = previous.cache_keys if previous else {}

    def remember(self, cache: str, key, *items: Item | None) -> None:
        """Index the entry `key` of `cache` ("members" or "signatures") under `items`: it is dropped when one of
        them is replaced."""
        for item in dict.fromkeys(items):
            if item is not None:
                self.cache_keys.setdefault(item, []).append((cache, key))


@dataclass
class ItemResult:
    """What checking one item under one binding found."""

    findings: list[Finding] = field(default_factory=list)
    types: dict[A.Node, Type] = field(default_factory=dict)
    refs: list[tuple[Span, Any]] = field(default_factory=list)
    # (file, name) -> the interface of the item the name found there (None: nothing)
    deps: dict[tuple[str, str], str | None] = field(default_factory=dict)
    world: Any = None  # the analysis's world key when last known valid (program.Document)
    # (caller, callee, span) of fn calls; caller and callee are (file, *symbol path)
    calls: list[tuple[tuple, tuple, Span]] = field(default_factory=list)
    names: dict[A.Name, Ref] = field(default_factory=dict)  # what each name use refers to (resolved.py)
    call_info: dict[A.Call, CallInfo] = field(default_factory=dict)  # how each call binds (resolved.py)
    # A module's check in parts: its parameters and members, each function, the rest (`fn_reuse.Segment`); an edit
    # inside one function body re-checks that function only (`fn_reuse.recheck_body`). None: not in parts.
    segments: list | None = None

    @property
    def resolved(self) -> Resolved:
        """This result in resolved form: names, calls and types (`resolved.Resolved`)."""
        parts = {s.fn: s for s in self.segments if s.fn is not None} if self.segments else None
        return Resolved(self.names, self.call_info, self.types, parts=parts)


class ItemChecker(NamesMixin, MembersMixin, ExpressionsMixin, CallsMixin):
    """Checks one module or function item under one binding of its config parameters.

    The checking is spread over mixins by concern: names and types (`names.py`), instances
    and members (`members.py`), expressions (`expressions.py`), calls (`calls.py`); this class
    holds the entry points, functions and statements.
    """

    def __init__(self, ctx: CheckContext, item: Item, binding: dict[str, Type], result: ItemResult | None = None):
        self.ctx = ctx
        self.item = item
        self.binding = binding
        self.result = result if result is not None else ItemResult()
        self.instance: Instance | None = None
        self.assumptions: list[tuple[str, bool]] = []
        # How many `for` bodies and branches of an `if` whose condition is not known enclose
        # the code being checked: a compile-time local assigned there has no one value after.
        self.unsure = 0
        # The `unsure` depths of the enclosing `for` loops over lists whose elements receive their index (and so
        # may differ): a local from outside such a loop may change shape there (see `check_assign_type`).
        self.varying_loops: list[int] = []
        self.varied = False  # whether such a local changed shape in the loop body being checked
        self.fn_locals: list[tuple[str, Binding]] = []
        self.current_fn: tuple | None = None  # the file and symbol path of the function being checked
        # The root model's source when calls into its file's modules are checked again with their instances'
        # values and each element of an indexed list is looped over by itself (`instances.py`: the model's check
        # under a preset, as lowering runs it); None in an item's own check, which is generic.
        self.follow: Any = None
        self.unrolled_loops = 0  # how many loops `unrolled` encloses the code being checked
        # Whether this checker runs a loop once per element to count its compile-time locals (`counted.py`): the
        # loops in it are unrolled too.
        self.counting = False
        # The functions of this item whose bodies the check read at a call (`specialize.checked_body`: a method
        # given known values, or one whose int result is evaluated): `fn_reuse` checks the reader again when one
        # of them is edited.
        self.bodies_read: set[A.FnDef] = set()

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
            t = self.param_value(p, scope)
            args[p.name.id] = t
            anchor = symbol(self.item, "param", p.name.id)
            scope.bind(p.name.id, Binding(t, "module_param", anchor, p.name))
            self.ref(p.name, anchor)
            self.record(p.name, t)
            if p.default is not None:
                self.expr(p.default, scope)
        self.check_containment(mdef)
        inst = Instance(self.item, args, generic=True)
        self.instance = inst
        members = self.members(inst, report=True)
        parts = fn_reuse.Parts(self.result)
        for info in members.order:
            if info.kind == "fn" and info.present is not False:
                with parts.segment(self, info.node):
                    self.check_method(info, inst)
        parts.close()
        for info in members.order:
            if info.kind == "fn" and info.node.entry and not mdef.is_model:
                self.report("L111", "`entry` marks functions of a `model`; this is a `module`", info.node.name)

    def check_method(self, info: MemberInfo, inst: Instance) -> None:
        """Check the function member `info` of the module instance `inst` (the conditions of the `if`s around
        it assumed)."""
        saved = self.assumptions
        self.assumptions = list(info.conditions)
        self.check_fn(info.node, inst, self.module_scope(inst))
        self.assumptions = saved

    def param_value(self, p: A.Param, scope: Scope) -> Type:
        """The value a module or function parameter has in its own generic check."""
        t = p.type
        if isinstance(t, A.NamedType):
            name = t.name.id
            if name in SCALAR_TYPE_NAMES:
                if name == "int":
                    return ScalarT("int", Dim.atom(const(p.name.id)))
                return ScalarT(name, None)
            item = self.global_item(name)
            self.ref(t.name, symbol(item) if item is not None else None)
            if item is None or item.kind != "config":
                self.unknown_type_name(t.name, scope)
                return UNKNOWN
            v = self.binding.get(p.name.id)
            if v is not None:
                return v
            cv = self.ctx.evaluator.defaults(item)
            return ConfigT(cv) if cv is not None else UNKNOWN
        if isinstance(t, A.LiteralType):
            return ScalarT(t.kind, None, tuple(s.value for s in t.values) if t.kind == "str" else None)
        if isinstance(t, A.TensorType):
            self.report("L111", "module parameters are compile-time values; tensors are declared as members", t)
            return UNKNOWN
        self.report("L111", "a tuple type cannot be a parameter type", t)
        return UNKNOWN

    def _check_params_unique(self, params: list[A.Param]) -> None:
        seen: dict[str, A.Param] = {}
        for p in params:
            self.check_bindable(p.name)
            if p.name.id in seen:
                self.report(
                    "L105",
                    f"parameter `{p.name.id}` is declared twice",
                    p.name,
                    labels=[Label(self.anchor(seen[p.name.id].name), "first declared here")],
                )
            seen[p.name.id] = p

    def check_fn(self, fn: A.FnDef, inst: Instance | None, parent: Scope) -> None:
        """Check a function's body against its signature (generic in its dim variables)."""
        generics = self.generics(fn, report=True)
        binder = Binder("rigid", generics)
        scope = Scope(parent, "fn")
        self._check_params_unique(fn.params)
        owner = (inst.module.name.id, "fn", fn.name.id) if inst is not None else (fn.name.id,)
        self.current_fn = (self.item.source.path,) + owner
        self.ref(fn.name, SymbolAnchor(owner, self.item.source.path))
        # compile-time parameters first, as at a call: a tensor type may use one declared after
        # it (`fn split_heads(x: [B, S, heads * D], heads: int)`)
        tensors_last = sorted(fn.params, key=lambda p: isinstance(p.type, (A.TensorType, A.TupleType)))
        for p in tensors_last:
            t = self.fn_param_type(p, scope, binder)
            anchor = SymbolAnchor(owner + ("param", p.name.id), self.item.source.path)
            scope.bind(p.name.id, Binding(t, "param", anchor, p.name))
            self.ref(p.name, anchor)
            self.record(p.name, t)
        for name, atom, node in binder.new_dims:
            scope.bind(name, Binding(ScalarT("int", Dim.atom(atom)), "dim", self.anchor(node), node))
            self.ref(node, self.anchor(node))
        binder.frozen = True
        for p in fn.params:
            if p.default is not None:
                # resolved here, generic in the parameters (a call binds its value: CallInfo)
                self.expr(p.default, scope)
        declared = self.eval_type(fn.ret, scope, binder) if fn.ret is not None else None
        saved_locals = self.fn_locals
        self.fn_locals = []
        self.current_binder = binder
        body = self.block(fn.body, Scope(scope, "block"))
        if declared is not None and not isinstance(body, UnknownT):
            if isinstance(body, UnitT):
                tail = fn.body.stmts[-1] if fn.body.stmts else None
                if isinstance(tail, A.ExprStmt):
                    self.report(
                        "L204",
                        f"`{fn.name.id}` declares {format_type(declared)} but its last expression has no value",
                        tail.expr,
                        labels=[Label(self.anchor(fn.ret), "declared here")],
                        notes=["a call of a function without `->` has no value"]
                        if isinstance(tail.expr, A.Call)
                        else [],
                    )
                elif not has_error_stmt(fn.body):
                    self.report(
                        "L204",
                        f"`{fn.name.id}` declares {format_type(declared)} but its body has no value",
                        fn.body,
                        labels=[Label(self.anchor(fn.ret), "declared here")],
                        notes=["the last expression of a block is its value"],
                    )
            elif not (isinstance(body, NoneT) and getattr(fn.ret, "optional", False)):  # `-> int?` may give none
                self.check_same(body, declared, tail_node(fn.body), fn.ret, f"`{fn.name.id}` returns", "L204", "L305")
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

    def fn_param_type(self, p: A.Param, scope: Scope, binder: Binder) -> Type:
        t = p.type
        if isinstance(t, (A.TensorType, A.TupleType)):
            return self.eval_type(t, scope, binder)
        return self.param_value(p, scope)

    def _warn_unused(self) -> None:
        for name, b in self.fn_locals:
            if b.uses == 0 and not name.startswith("_") and not isinstance(b.type, UnknownT):
                self.report(
                    "L901",
                    f"`{name}` is never used",
                    b.node,
                    severity="warning",
                    notes=["prefix the name with `_` to keep it deliberately"],
                )

    def check_same(
        self, actual: Type, declared: Type, actual_node, declared_node, what: str, shape_code: str, dtype_code: str
    ) -> None:
        """Report when `actual` is not the `declared` type (return values, annotations)."""
        if isinstance(actual, UnknownT) or isinstance(declared, UnknownT):
            return
        if isinstance(actual, TensorT) and isinstance(declared, TensorT):
            if actual.dtype != declared.dtype:
                self.report(
                    dtype_code,
                    f"{what} {dtype_text(actual.dtype)}, declared {dtype_text(declared.dtype)}",
                    actual_node,
                    label=format_type(actual),
                    labels=[Label(self.anchor(declared_node), "declared here")],
                    notes=[f"consider `cast(..., {declared.dtype.name})`"]
                    if not declared.dtype.var and declared.dtype is not WORK
                    else [],
                )
                return
            if not shapes_equal(actual.shape, declared.shape):
                clamped = any(a.kind == "min" for d in actual.shape.dims if d is not None for a in d.atoms())
                self.report(
                    shape_code,
                    f"{what} {shape_pair(actual.shape, declared.shape)}",
                    actual_node,
                    label=format_type(actual),
                    labels=[Label(self.anchor(declared_node), f"declared {format_type(declared)} here")],
                    notes=[_CLAMPED_NOTE] if clamped else [],
                )
            return
        if isinstance(actual, TupleT) and isinstance(declared, TupleT) and len(actual.items) == len(declared.items):
            for a, d in zip(actual.items, declared.items):
                self.check_same(a, d, actual_node, declared_node, what, shape_code, dtype_code)
            return
        if type(actual) is not type(declared):
            self.report(
                shape_code,
                f"{what} {format_type(actual)}, declared {format_type(declared)}",
                actual_node,
                labels=[Label(self.anchor(declared_node), "declared here")],
            )

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
                    self.report(
                        "L903",
                        "this value is discarded",
                        s.expr,
                        severity="warning",
                        notes=["only the last expression of a block is its value"],
                    )
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
            for name in s.used:  # what the broken text reads is not "never used"
                if (b := scope.lookup_in_fn(name)) is not None:
                    b.uses += 1
            for name in s.bound:
                scope.bind(name, Binding(UNKNOWN, "local", None, None, uses=1))

    def check_bindable(self, name: A.Name) -> None:
        """Words that are keywords inside expressions cannot name a binding: no use could
        reach it (`let true = ...`)."""
        if name.id in EXPRESSION_KEYWORDS:
            self.report("L111", f"`{name.id}` is a keyword: it cannot name a binding", name)

    def bind_local(self, target: A.Name, t: Type, scope: Scope) -> None:
        self.check_bindable(target)
        previous = scope.lookup_in_fn(target.id)
        if previous is not None and previous.kind in ("local", "param") and not target.id.startswith("_"):
            self.report(
                "L902",
                f"`{target.id}` shadows an earlier binding",
                target,
                severity="warning",
                labels=[Label(previous.anchor, "first bound here")] if isinstance(previous.anchor, LocalAnchor) else [],
                notes=[f"to update it, assign: `{target.id} = ...`"],
            )
        b = Binding(
            t, "local", self.anchor(target), target, uses=int(target.id in EXPRESSION_KEYWORDS), depth=self.unsure
        )
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
        self.resolve_binding(s.target, b)
        if b.kind == "member":
            info: MemberInfo = b.type
            self.ref(s.target, b.anchor)
            if info.kind != "state":
                self.report(
                    "L109",
                    f"cannot assign to `{s.target.id}`: only module `state` and `let` locals can be assigned",
                    s.target,
                    notes=[f"`{s.target.id}` is a {info.kind}"],
                )
                return
            declared = self.member_value(info, s.target)
            self.record(s.target, declared)
            self.check_assign_type(t, declared, s, "state")
            return
        if b.kind not in ("local",):
            self.report(
                "L109",
                f"cannot assign to `{s.target.id}`: only module `state` and `let` locals can be assigned",
                s.target,
                notes=[f"`{s.target.id}` is a {binding_kind(b.kind)}"],
            )
            return
        self.ref(s.target, b.anchor)
        self.record(s.target, b.type)
        if self.unrolled_loops and _same_rank(t, b.type):
            # each element in turn, as lowering runs them: the local takes each one's size (the item's own check
            # reported a local that changes shape in one run of a body)
            b.type = t
            return
        if any(b.depth < depth for depth in self.varying_loops) and isinstance(t, TensorT):
            varied = self.varied_type(t, b.type)
            if varied is not b.type and varied.shape.dims != b.type.shape.dims:
                b.type, self.varied = varied, True
        self.check_assign_type(t, b.type, s, "local")
        if isinstance(b.type, ScalarT):
            # A compile-time local holds what was assigned last; uses after an assignment in a
            # loop or under a condition not known here see no one value (lowering computes it).
            b.type = t if isinstance(t, ScalarT) and self.unsure == b.depth else ScalarT(b.type.kind, None)

    def varied_type(self, t: TensorT, declared: Type) -> Type:
        """The type of a local from outside a loop over elements that differ (`[Block(c, i) for i in range(n)]`)
        that the loop's body assigns `t`: each element may give the local a size of its own (a VAE's up blocks
        double the image and change its channels), which the body, checked once for a symbolic index, cannot
        know. The dims where `t` and `declared` differ become unknown, for the rest of the function; lowering,
        which unrolls such a loop, computes every size and checks the entry's result against its declared type.
        The rank, the `...` and the dtype still must not change (`check_assign_type` reports those)."""
        if not isinstance(declared, TensorT) or t.dtype != declared.dtype:
            return declared
        if (t.shape.prefix is None) != (declared.shape.prefix is None) or len(t.shape) != len(declared.shape):
            return declared
        dims = tuple(
            a if a is not None and b is not None and a.same(b) else None
            for a, b in zip(declared.shape.dims, t.shape.dims)
        )
        if dims == declared.shape.dims:
            return declared
        return TensorT(declared.dtype, Shape(dims, declared.shape.prefix))

    def check_assign_type(self, t: Type, declared: Type, s: A.Assign, what: str) -> None:
        if isinstance(t, UnknownT) or isinstance(declared, UnknownT):
            return
        if isinstance(t, TensorT) and isinstance(declared, TensorT):
            if t.dtype != declared.dtype:
                self.report(
                    "L301" if t.dtype.is_float and declared.dtype.is_float else "L302",
                    f"assignment changes the dtype of `{s.target.id}` from {dtype_text(declared.dtype)} to "
                    f"{dtype_text(t.dtype)}",
                    s.value,
                )
            elif not shapes_equal(t.shape, declared.shape):
                self.report(
                    "L210",
                    f"assignment changes the shape of `{s.target.id}` from "
                    f"{format_shape(declared.shape)} to {format_shape(t.shape)}",
                    s.value,
                    label=format_type(t),
                    notes=["a loop-carried value and module state keep one shape; use a new `let`"],
                )
            return
        if type(t) is not type(declared):
            self.report(
                "L210", f"assignment changes `{s.target.id}` from {format_type(declared)} to {format_type(t)}", s.value
            )

    def unrolled(self, s: A.For, t: ModuleListT, n: int, scope: Scope) -> bool:
        """Check the body of `for block in blocks` once per element, in order, each bound to its own instance
        (`follow`: lowering unrolls the loop so); False when an element is not known."""
        elements = [t.at(k) for k in range(n)] if t.element is not None else [t.instance] * n
        if any(e is None for e in elements):
            return False
        # Not `unsure`: the body runs once per element in order, so a compile-time local holds each value lowering
        # computes (`k = k + 1`), and a tensor local each element's size.
        self.unrolled_loops += 1
        try:
            for element in elements:
                b = Binding(ModuleT(element), "loop", self.anchor(s.var), s.var, uses=1)
                inner = Scope(scope, "block")
                inner.bind(s.var.id, b)
                self.block(s.body, inner)
        finally:
            self.unrolled_loops -= 1
        return True

    def for_loop(self, s: A.For, scope: Scope) -> None:
        t = self.expr(s.iter, scope)
        if (self.follow is not None or self.counting) and isinstance(t, ModuleListT) and t.count is not None:
            n = t.count.as_int()
            if n is not None and self.unrolled(s, t, n, scope):
                return
        if isinstance(t, ModuleListT):
            elem: Type = ModuleT(t.instance)
        elif isinstance(t, UnknownT):
            elem = UNKNOWN
        else:
            self.report(
                "L107", f"`for` iterates over a list of submodules, got {kind_text(t)}", s.iter, label=format_type(t)
            )
            elem = UNKNOWN
        b = Binding(elem, "loop", self.anchor(s.var), s.var, uses=1)
        self.ref(s.var, b.anchor)
        self.record(s.var, elem)
        # The body runs once per item: a compile-time local it assigns has no one value in it.
        counted: dict[int, tuple[Binding, ScalarT]] = {}
        for node in A.walk(s.body):
            if isinstance(node, A.Assign):
                outer = scope.lookup_in_fn(node.target.id)
                if outer is not None and outer.kind == "local" and isinstance(outer.type, ScalarT):
                    counted.setdefault(id(outer), (outer, outer.type))
                    outer.type = ScalarT(outer.type.kind, None)
        varying = isinstance(t, ModuleListT) and t.index is not None
        marks = (len(self.result.findings), len(self.result.refs), len(self.result.calls), len(self.fn_locals))
        varied, self.varied = self.varied, False
        self.unsure += 1
        if varying:
            self.varying_loops.append(self.unsure)
        try:
            inner = Scope(scope, "block")
            inner.bind(s.var.id, b)
            self.block(s.body, inner)
            if self.varied:
                # An element gave a local from outside a new size (`varied_type`): the body is checked again
                # with those dims unknown from its start, as every element but the first sees them, so that
                # what it found and the dims it solved at calls hold for every element.
                del self.result.findings[marks[0] :], self.result.refs[marks[1] :], self.result.calls[marks[2] :]
                del self.fn_locals[marks[3] :]
                inner = Scope(scope, "block")
                inner.bind(s.var.id, b)
                self.block(s.body, inner)
        finally:
            self.unsure -= 1
            if varying:
                self.varying_loops.pop()
            self.varied = varied or self.varied
        if counted and isinstance(t, ModuleListT):
            # after it, each holds what lowering computes where the list's length is known (`counted.py`)
            count_through(self, s, t, scope, list(counted.values()))


def _same_rank(t: Type, declared: Type) -> bool:
    """Whether `t` may replace a local of type `declared` in an unrolled loop: tensors of one dtype and rank."""
    if not isinstance(t, TensorT) or not isinstance(declared, TensorT) or t.dtype != declared.dtype:
        return False
    return t.shape.prefix is None and declared.shape.prefix is None and len(t.shape) == len(declared.shape)
