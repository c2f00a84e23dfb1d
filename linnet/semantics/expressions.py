"""Expressions: operators, compile-time folding of scalars, attributes, indexing, and the
compile-time `if`."""

from __future__ import annotations

import re

from ..ops import OPERATORS, REGISTRY, OpDef, OpError
from ..syntax import ast as A
from ..types.core import (
    NONE,
    UNIT,
    UNKNOWN,
    ConfigT,
    DTypeT,
    ListT,
    ModuleListT,
    ModuleT,
    NoneT,
    ScalarT,
    Shape,
    TensorT,
    TupleT,
    Type,
    UnknownT,
    format_shape,
    format_type,
)
from ..types.dims import Dim, format_dim, shown_value
from ..types.scalars import ScalarError, arithmetic, compare
from .branches import equalities, merged, permuted
from .configs import ConfigValue
from .describe import (
    cond_key,
    dotted,
    dtype_text,
    kind_text,
    number,
    tail_node,
    types_equal,
)
from .diagnostics import Fix, Label, symbol
from .scope import Instance, Scope
from .suggest import closest

# The names in a bound as written or as valued (`c.k`, `N`): where they are the same, the value only orders them.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


class ExpressionsMixin:
    """Expression typing for `ItemChecker`."""

    def expr(self, e, scope: Scope) -> Type:
        # the commonest kinds first, by exact type, without `_expr`'s call (whose chain tests five literal kinds
        # before a name): a check evaluates ~90 expressions a function
        kind = type(e)
        if kind is A.Name:
            t = self.name_value(e, scope)
        elif kind is A.Attr:
            t = self.attr(e, scope)
        elif kind is A.Call:
            t = self.call(e, scope)
        else:
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

    def attr(self, e: A.Attr, scope: Scope, base: Type | None = None) -> Type:
        """`a.b`: a config field, a member of a module instance, a tensor's `dtype`; `base` is `a`'s type when
        the caller has it already."""
        base = self.expr(e.value, scope) if base is None else base
        name = e.name.id
        if isinstance(base, UnknownT):
            return UNKNOWN
        if isinstance(base, ConfigT):
            cv: ConfigValue = base.value
            fdef = cv.field_def(name)
            if fdef is None and name in cv.poisoned:
                return UNKNOWN  # declared on a line that did not parse
            if fdef is None:
                hint = closest(name, list(cv.values))
                self.report(
                    "L102",
                    f"config `{cv.type_name}` has no field `{name}`" + (f"; did you mean `{hint}`?" if hint else ""),
                    e.name,
                    fixes=self._fix(e.name, hint),
                    labels=[Label(symbol(cv.item), "config declared here")],
                )
                return UNKNOWN
            self.ref(e.name, symbol(cv.item, name))
            self.resolve(e.name, "config_field", node=fdef, item=cv.item, value=cv)
            self.result.deps.setdefault((cv.item.source.path, cv.item.name), cv.item.interface)
            prefix = dotted(e.value)
            return cv.field_type(name, f"{prefix}.{name}" if prefix else name)
        if isinstance(base, NoneT):
            self.report(
                "L406",
                f"`{dotted(e.value) or 'this value'}` is `none` here, so it has no `{name}`",
                e.name,
                notes=["guard the use with `if ... != none { ... }`"],
            )
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
                self.report(
                    "L102",
                    f"`{inst.module.name.id}` has no member `{name}`" + (f"; did you mean `{hint}`?" if hint else ""),
                    e.name,
                    fixes=self._fix(e.name, hint),
                )
                return UNKNOWN
            self.ref(e.name, symbol(inst.item, "member", name))
            self.resolve(e.name, "member", node=info.node, item=inst.item, value=info.kind)
            if info.present is False:
                self.report(
                    "L108",
                    f"`{inst.module.name.id}.{name}` exists only when {info.cond_text}, which is false here",
                    e.name,
                )
                return UNKNOWN
            if info.conditions:
                self.report("L108", f"`{name}` exists only when {info.cond_text} in `{inst.module.name.id}`", e.name)
                return UNKNOWN
            return info.type
        if isinstance(base, ModuleListT):
            self.report("L102", f"a list of submodules has no member `{name}`; iterate with `for`", e.name)
            return UNKNOWN
        self.report("L102", f"{kind_text(base)} has no field `{name}`", e.name)
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
                self.report("L107", f"`-` needs a number, got {kind_text(t)}", e)
                return UNKNOWN
            if t.kind != "bool":
                self.report("L107", f"`not` needs a bool, got {kind_text(t)}", e)
                return UNKNOWN
            return ScalarT("bool", (not t.value) if t.value is not None else None)
        return self.apply_op(REGISTRY[op_name], {"x": (t, e.operand)}, e, op_symbol="-" if op_name == "neg" else "not")

    def fold(self, e: A.BinOp, op: str, a: ScalarT, b: ScalarT) -> Type:
        """Compile-time arithmetic on scalars. `/` between ints is exact division."""
        if op in ("and", "or"):
            if a.kind != "bool" or b.kind != "bool":
                self.report("L107", f"`{op}` needs bools, got {kind_text(a)} and {kind_text(b)}", e)
                return UNKNOWN
            if a.value is not None and b.value is not None:
                return ScalarT("bool", (a.value and b.value) if op == "and" else (a.value or b.value))
            if op == "and" and (a.value is False or b.value is False):
                return ScalarT("bool", False)
            if op == "or" and (a.value is True or b.value is True):
                return ScalarT("bool", True)
            return ScalarT("bool", None)
        if a.kind not in ("int", "float") or b.kind not in ("int", "float"):
            self.report("L107", f"`{op}` needs numbers, got {kind_text(a)} and {kind_text(b)}", e)
            return UNKNOWN
        if op == "@":
            self.report("L107", "`@` needs tensors", e)
            return UNKNOWN
        return self.fold_arithmetic(e, op, a, b)

    def fold_arithmetic(self, node, op: str, a: ScalarT, b: ScalarT) -> ScalarT:
        """`a op b` on compile-time numbers, with the one scalar semantics of configs, bodies
        and lowering (`types/scalars.py`): ints stay exact (and symbolic), `/` of ints is
        exact division (L206), `//` and `%` floor, a zero divisor or a non-finite float is L408."""
        kind = "int" if a.kind == b.kind == "int" else "float"
        if a.value is None or b.value is None:
            return ScalarT(kind, None)
        try:
            value = arithmetic(op, a.value, b.value)
        except ScalarError as err:
            if err.kind == "inexact":
                self.division_error(node, a.value, b.value, err.division)
            else:
                self.report("L408", err.message, node)
            return ScalarT(kind, None)
        if value is None:
            return ScalarT(kind, None)
        if isinstance(value, float):
            return ScalarT("float", value)
        return ScalarT("int", value if isinstance(value, Dim) else Dim.of(value))

    def fold_compare(self, e: A.Compare, a: Type, b: Type) -> Type:
        if isinstance(a, (NoneT, ConfigT)) or isinstance(b, (NoneT, ConfigT)):
            if e.op not in ("==", "!="):
                self.report("L107", f"`{e.op}` cannot compare {kind_text(a)} and {kind_text(b)}", e)
                return UNKNOWN
            same = (
                isinstance(a, NoneT)
                and isinstance(b, NoneT)
                or (isinstance(a, ConfigT) and isinstance(b, ConfigT) and a.value is b.value)
            )
            if isinstance(a, ScalarT) or isinstance(b, ScalarT):
                same = False
            return ScalarT("bool", same if e.op == "==" else not same)
        for s, other, node in ((a, b, e.right), (b, a, e.left)):
            if (
                s.kind == "str"
                and s.literals
                and other.kind == "str"
                and other.value is not None
                and other.value not in s.literals
            ):
                hint = closest(other.value, list(s.literals))
                self.report(
                    "L401",
                    f"this is never true: the value is one of {', '.join(chr(34) + v + chr(34) for v in s.literals)}"
                    + (f'; did you mean "{hint}"?' if hint else ""),
                    node,
                    fixes=[Fix(f'replace with "{hint}"', [(self.anchor(node), f'"{hint}"')])] if hint else [],
                )
                return ScalarT("bool", None)
        kinds = {a.kind, b.kind}
        if len(kinds) > 1 and kinds != {"int", "float"}:
            self.report("L107", f"cannot compare {kind_text(a)} and {kind_text(b)}", e)
            return UNKNOWN
        if a.value is None or b.value is None:
            return ScalarT("bool", None)
        return ScalarT("bool", compare(e.op, a.value, b.value))

    def if_expr(self, e: A.IfExpr, scope: Scope) -> Type:
        c = self.expr(e.cond, scope)
        cond = self.compile_time_bool(c, e.cond)
        key = cond_key(e.cond, self.item.text)
        then_t: Type | None = None
        else_t: Type | None = None
        unsure = int(cond is None)  # either branch may run: what they assign is not known after
        self.unsure += unsure
        try:
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
        finally:
            self.unsure -= unsure
        if e.orelse is None:
            return UNIT
        if cond is True:
            return then_t
        if cond is False:
            return else_t
        if isinstance(then_t, UnknownT) or isinstance(else_t, UnknownT):
            return UNKNOWN
        if types_equal(then_t, else_t):
            pass
        elif permuted(then_t, else_t):
            self.branches_differ(e, then_t, else_t, "hold the same dims in another order")
            return UNKNOWN
        elif value := merged(then_t, else_t, *(equalities(e.cond, h, self.result.types.get) for h in (True, False))):
            return value
        else:
            self.branches_differ(e, then_t, else_t, "differ")
            return UNKNOWN
        if isinstance(then_t, ScalarT) and not _same_value(then_t.value, else_t.value):
            return ScalarT(then_t.kind, None)  # `if flag { 2 } else { 4 }`: which one is not known
        return then_t

    def branches_differ(self, e: A.IfExpr, then_t: Type, else_t: Type, how: str) -> None:
        """L306 on an `if` whose branches' types cannot be one (`how`: "differ", or what is wrong with them)."""
        orelse = tail_node(e.orelse) if isinstance(e.orelse, A.Block) else e.orelse
        self.report(
            "L306",
            f"the branches of `if` {how}: {format_type(then_t)} and {format_type(else_t)}",
            e,
            labels=[
                Label(self.anchor(tail_node(e.then)), format_type(then_t)),
                Label(self.anchor(orelse), format_type(else_t)),
            ],
            notes=["one branch transposes what the other does not; a condition chooses sizes, not a layout"]
            if how != "differ"
            else [],
        )

    def compile_time_bool(self, t: Type, node) -> bool | None:
        if isinstance(t, UnknownT):
            return None
        if isinstance(t, ScalarT) and t.kind == "bool":
            return t.value
        if isinstance(t, TensorT):
            self.report(
                "L405",
                "the condition of `if` must be known at compile time; this is a tensor",
                node,
                label=format_type(t),
                notes=["for a per-element choice use `where(cond, a, b)`"],
            )
            return None
        self.report("L405", f"the condition of `if` must be a compile-time bool, got {kind_text(t)}", node)
        return None

    def index(self, e: A.Index, scope: Scope) -> Type:
        base = self.expr(e.value, scope)
        if isinstance(base, ModuleListT):
            if len(e.items) == 1 and not isinstance(e.items[0], (A.Slice, A.EllipsisLit)):
                t = self.expr(e.items[0], scope)
                i = number(t) if isinstance(t, ScalarT) and t.kind == "int" else None
                n = base.count.as_int() if base.count is not None else None
                if i is not None and n is not None and not -n <= i < n:
                    self.report("L212", f"index {i} is out of range for a list of {n} submodules", e.items[0])
                    return UNKNOWN
                if i is not None and n is not None and base.element is not None:
                    element = base.at(i % n)  # an element that received its index
                    return ModuleT(element) if element is not None else UNKNOWN
                return ModuleT(base.instance)
        if isinstance(base, UnknownT):
            for item in e.items:
                if not isinstance(item, (A.Slice, A.EllipsisLit)):
                    self.expr(item, scope)
            return UNKNOWN
        if isinstance(base, ListT):
            return self.list_element(e, base, scope)
        if not isinstance(base, TensorT):
            self.report("L107", f"only tensors can be indexed, got {kind_text(base)}", e.value)
            return UNKNOWN
        ell = [i for i, it in enumerate(e.items) if isinstance(it, A.EllipsisLit)]
        if len(ell) > 1:
            self.report("L208", "an index has at most one `...`", e.items[ell[1]])
            return UNKNOWN
        pre = e.items[: ell[0]] if ell else e.items
        post = e.items[ell[0] + 1 :] if ell else []
        shape = base.shape
        n = len(shape.dims)
        if shape.prefix is not None and pre:
            self.report(
                "L208",
                f"indexing leading dims of {format_shape(shape)}, whose `...` has unknown rank",
                e,
                notes=["index from the end: `x[..., i]`"],
            )
            return UNKNOWN
        if len(pre) + len(post) > n:
            self.report("L208", f"{len(pre) + len(post)} indices for {format_shape(shape)} of rank {n}", e)
            return UNKNOWN
        out_pre: list = []
        out_post: list = []
        prefix = shape.prefix
        for items, dims, out in ((pre, shape.dims[: len(pre)], out_pre), (post, shape.dims[n - len(post) :], out_post)):
            for it, d in zip(items, dims):
                one = TensorT(base.dtype, Shape((d,)))
                if isinstance(it, A.Slice):
                    start = self.int_arg(it.start, scope) if it.start is not None else None
                    stop = self.int_arg(it.stop, scope) if it.stop is not None else None
                    if it.start is None and it.stop is None:
                        out.append(d)
                        continue
                    values = {"x": one, "dim": 0, "start": start or Dim.of(0), "stop": stop}
                    r = self.run_rule(REGISTRY["slice"], values | self.slice_as_written(it, start, stop), it)
                    out.extend(r.dims if isinstance(r, Shape) else [None])
                    continue
                t = self.expr(it, scope)
                if isinstance(t, ScalarT) and t.kind == "int":
                    self.run_rule(REGISTRY["select"], {"x": one, "dim": 0, "index": t.value}, it)
                    continue
                if isinstance(t, TensorT):
                    if not t.dtype.is_int:
                        self.report("L303", f"tensor indices must be integers, got {dtype_text(t.dtype)}", it)
                        return UNKNOWN
                    if t.shape.prefix is not None:
                        self.report("L208", "tensor indices with `...` are not supported", it)
                        return UNKNOWN
                    out.extend(t.shape.dims)
                    continue
                if not isinstance(t, UnknownT):
                    self.report("L107", f"an index is an int, a slice or an integer tensor, got {kind_text(t)}", it)
                return UNKNOWN
        middle = shape.dims[len(pre) : n - len(post)]
        return TensorT(base.dtype, Shape(tuple(out_pre) + tuple(middle) + tuple(out_post), prefix))

    def list_element(self, e: A.Index, base: ListT, scope: Scope) -> Type:
        """`c.short_factor[i]`: an element of a list-valued config field, by a known int."""
        if len(e.items) != 1 or isinstance(e.items[0], (A.Slice, A.EllipsisLit)):
            self.report("L107", "a list is indexed by one compile-time int", e)
            return UNKNOWN
        t = self.expr(e.items[0], scope)
        if isinstance(t, ScalarT) and t.kind == "int" and number(t) is None:
            # an int parameter (a function's `i: int`, checked once for all its values): the
            # element's type without its value; lowering knows `i` and checks the range (L212)
            return _element_type(base)
        i = number(t) if isinstance(t, ScalarT) and t.kind == "int" else None
        if i is None:
            if not isinstance(t, UnknownT):
                self.report("L107", f"a list index is a known compile-time int, got {kind_text(t)}", e.items[0])
            return UNKNOWN
        n = len(base.items)
        if not -n <= i < n:
            self.report("L212", f"index {i} is out of range for a list of {n}", e.items[0])
            return UNKNOWN
        return base.items[i]

    def slice_as_written(self, s: A.Slice, start: Dim | None, stop: Dim | None) -> dict[str, str]:
        """What the slice rule's messages quote of `s` (L212): its text (`:k`, `0:5`) and the values of the bounds
        written as names or expressions (`k = 2`), which only explain it; not a value that names what the text
        does, which only orders it otherwise (`1 - K` is `-K + 1`)."""
        bounds = (s.start, s.stop)
        source = self.item.text
        texts = [" ".join(source[b.span.start : b.span.end].split()) if b is not None else "" for b in bounds]
        values = []
        for text, bound in zip(texts, (start, stop)):
            value = format_dim(shown_value(bound)) if bound is not None else text
            if set(_NAME.findall(text)) != set(_NAME.findall(value)):
                values.append(f"{text} = {value}")
        return {"written": ":".join(texts), "written_values": ", ".join(values)}

    def int_arg(self, e, scope: Scope) -> Dim | None:
        t = self.expr(e, scope)
        if isinstance(t, ScalarT) and t.kind == "int":
            return t.value
        if not isinstance(t, UnknownT):
            self.report("L107", f"a slice bound is a compile-time int, got {kind_text(t)}", e)
        return None

    def run_rule(self, op: OpDef, values: dict, node) -> Shape | None:
        try:
            return op.shape_rule(values)
        except OpError as err:
            self.report(err.code, err.message, node, notes=err.notes)
            return None


def _element_type(base: ListT) -> Type:
    """The type of any element of a list of compile-time scalars, its value unknown."""
    kinds = {t.kind if isinstance(t, ScalarT) else None for t in base.items}
    if len(kinds) != 1 or None in kinds:
        return UNKNOWN
    return ScalarT(kinds.pop())


def _same_value(a, b) -> bool:
    """Whether two compile-time values are known and equal (dims by value)."""
    if a is None or b is None:
        return False
    if isinstance(a, Dim) and isinstance(b, Dim):
        return a.same(b)
    return type(a) is type(b) and a == b
