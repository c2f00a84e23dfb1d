"""Calls: argument matching, primitive ops through the registry, and calls to Linnet
functions, whose signatures are unified with the arguments (`unify.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ops import REGISTRY, REQUIRED, OpDef, OpError
from ..ops.registry import UnknownNumber
from ..syntax import ast as A
from ..syntax.ast import Span
from ..syntax.items import Item
from ..types.core import (
    UNIT,
    UNKNOWN,
    WORK,
    DTypeT,
    FnRefT,
    ListT,
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
from ..types.scalars import ARITHMETIC, CONVERSIONS, finite_float, to_int
from . import fn_values, specialize
from .describe import dotted, kind_text, number
from .diagnostics import Fix, Label, LocalAnchor, SymbolAnchor, symbol
from .names import Binder
from .resolved import Arg, CallInfo
from .scope import Binding, FnTarget, Instance, Scope, type_key
from .suggest import closest
from .unify import Unifier, substitute_shape

_FAILED = object()


def _is_submodule(members, name: str) -> bool:
    """Whether `name` is a submodule member (not a method) of an instance with these members."""
    info = members.by_name.get(name)
    return info is not None and info.kind == "submodule"


class CallsMixin:
    """Call checking for `ItemChecker`."""

    def call(self, e: A.Call, scope: Scope) -> Type:
        func = e.func
        if isinstance(func, A.Name):
            b = self.lookup_value(func.id, scope)
            if b is None and func.id in CONVERSIONS and self.global_item(func.id) is None:
                return self.call_conversion(e, scope)
            if b is None and func.id in REGISTRY and self.global_item(func.id) is None:
                self.ref(func, None)
                self.resolve(func, "op", value=REGISTRY[func.id])
                return self.call_op(REGISTRY[func.id], e, scope)
            target = self.expr(func, scope)
        elif isinstance(func, A.Attr):
            base = self.expr(func.value, scope)
            if isinstance(base, ModuleT) and _is_submodule(self.members(base.instance, report=False), func.name.id):
                # `layer.SelfAttention.q(x)`: a submodule of a submodule, called (its `forward`)
                target = self.attr(func, scope, base)
                self.record(func, target)
            elif isinstance(base, ModuleT):
                inst: Instance = base.instance
                fn = self.find_method(inst, func.name, report=True)
                if fn is None:
                    self.eval_args(e.args, scope)
                    return UNKNOWN
                self.ref(func.name, symbol(inst.item, "fn", func.name.id))
                self.resolve(func.name, "member", node=fn, item=inst.item, value="fn")
                target = FnRefT(FnTarget(inst.item, fn, inst))
                self.record(func, target)
                return self.call_fn(target.target, e, scope, kind="method", receiver=func.value)
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
            return self.call_fn(FnTarget(inst.item, fn, inst), e, scope, kind="forward", receiver=func)
        if isinstance(target, FnRefT):
            t = target.target
            if isinstance(t, OpDef):
                return self.call_op(t, e, scope)
            if isinstance(t, FnTarget):
                return self.call_fn(t, e, scope)
            if isinstance(t, Item):
                self.report(
                    "L111",
                    f"`{t.name}` is a module: declare it as a member (`name: {t.name}(...)`) and call the member",
                    func,
                )
                self.eval_args(e.args, scope)
                return UNKNOWN
        self.report("L106", f"{kind_text(target)} is not callable", func, label=format_type(target))
        self.eval_args(e.args, scope)
        return UNKNOWN

    def call_conversion(self, e: A.Call, scope: Scope) -> Type:
        """`int(x)` or `len(xs)` on a compile-time value (types/scalars.py CONVERSIONS): an int,
        folded where the argument is known. On tensors, `cast` converts."""
        name = e.func.id
        self.ref(e.func, None)
        self.resolve(e.func, "conversion", value=CONVERSIONS[name])
        args = self.eval_args(e.args, scope)
        info = self.result.call_info[e] = CallInfo("conversion", name, None, scalar=True)
        if len(e.args) != 1 or e.args[0].name is not None:
            self.report("L106", f"`{name}` takes one argument", e)
            return UNKNOWN
        t, node = args[0], e.args[0].value
        info.args = {"x": Arg("x", node, t)}
        if isinstance(t, UnknownT):
            return UNKNOWN
        if name == "len":
            if isinstance(t, ListT):
                info.folded = Dim.of(len(t.items))
                return ScalarT("int", info.folded)
            self.report("L107", f"`len` takes a list (a `list[...]` config field), got {kind_text(t)}", node)
            return UNKNOWN
        if isinstance(t, ScalarT) and t.kind in ("int", "float"):
            if t.value is None:
                return ScalarT("int", None)
            info.folded = to_int(t.value)
            return ScalarT("int", info.folded if isinstance(info.folded, Dim) else Dim.of(info.folded))
        hint = "; convert a tensor with `cast(x, i64)`" if isinstance(t, TensorT) else ""
        self.report("L107", f"`int` converts a compile-time number, got {kind_text(t)}{hint}", node)
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
            self.report(
                "L102",
                f"`{inst.module.name.id}` has no method `{name.id}`" + (f"; did you mean `{hint}`?" if hint else ""),
                name,
                fixes=self._fix(name, hint),
            )
        return None

    def eval_args(self, args: list[A.Arg], scope: Scope) -> list[Type]:
        return [self.expr(a.value, scope) for a in args]

    def match_args(
        self,
        names: list[str],
        has_default: dict[str, bool],
        args: list[A.Arg],
        callee: str,
        call: A.Node,
        scope: Scope,
        extra_kwargs: bool = False,
        owner_path: tuple | None = None,
        owner_file: str = "",
    ) -> dict[str, A.Arg] | None:
        """Match positional and keyword arguments to parameter names (arity errors). Keyword
        names refer to the callee's parameters, `owner_path` in file `owner_file`."""
        matched: dict[str, A.Arg] = {}
        positional = [a for a in args if a.name is None]
        keywords = [a for a in args if a.name is not None]
        ok = True
        if keywords and args.index(keywords[0]) < len(positional):
            self.report("L111", "positional arguments come before keyword arguments", keywords[0])
            return None
        if len(positional) > len(names):
            self.report(
                "L103",
                f"{callee} takes {len(names)} argument{'s' if len(names) != 1 else ''}, got {len(positional)}",
                positional[len(names)],
                notes=[f"parameters: {', '.join(names) or 'none'}"],
            )
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
                self.report(
                    "L104",
                    f"{callee} has no parameter `{k}`" + (f"; did you mean `{hint}`?" if hint else ""),
                    a.name,
                    fixes=self._fix(a.name, hint),
                    notes=[f"parameters: {', '.join(names)}"],
                )
                ok = False
            else:
                matched[k] = a
                if owner_path is not None:
                    self.ref(a.name, SymbolAnchor(owner_path + (k,), owner_file))
        missing = [n for n in names if n not in matched and not has_default.get(n)]
        if missing:
            self.report(
                "L103",
                f"{callee} is missing {', '.join(f'`{m}`' for m in missing)}",
                call,
                notes=[f"parameters: {', '.join(names)}"],
            )
            ok = False
        if not ok:
            for a in args:
                if a.value not in self.result.types:
                    self.expr(a.value, scope)  # arguments are still checked (and hover knows them)
            return None
        if extra_kwargs:
            matched["**"] = extras  # type: ignore[assignment]
        return matched

    def call_op(self, op: OpDef, e: A.Call, scope: Scope) -> Type:
        names = [p.name for p in op.params if p.kind != "sizes"]
        defaults = {p.name: p.default is not REQUIRED for p in op.params}
        takes_sizes = any(p.kind == "sizes" for p in op.params)
        # Positional scalars only: fold (`sqrt(c.head_dim)`).
        arg_types = {id(a): self.expr(a.value, scope) for a in e.args}
        if (
            op.fold is not None
            and e.args
            and all(isinstance(arg_types[id(a)], ScalarT) for a in e.args)
            and all(a.name is None for a in e.args)
        ):
            folded = self.fold_op(op, [arg_types[id(a)] for a in e.args], e)
            info = CallInfo("op", op, None, folded=folded.value if isinstance(folded, ScalarT) else None, scalar=True)
            info.args = {p: Arg(p, a.value, arg_types[id(a)]) for p, a in zip(names, e.args)}
            self.result.call_info[e] = info
            return folded
        info = self.result.call_info[e] = CallInfo("op", op, None)
        matched = self.match_args(names, defaults, e.args, f"`{op.name}`", e, scope, extra_kwargs=takes_sizes)
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
        return self.apply_op(op, values, e, info=info)

    def fold_op(self, op: OpDef, args: list[ScalarT], e) -> Type:
        nums = [number(a) for a in args]
        if any(a.kind not in ("int", "float") for a in args):
            self.report("L107", f"`{op.name}` needs numbers or tensors", e)
            return UNKNOWN
        if op.operator in ARITHMETIC and len(args) == 2:
            return self.fold_arithmetic(e, op.operator, *args)  # `mod(a, b)` is `a % b`
        if any(n is None for n in nums):
            return ScalarT("float", None)
        try:
            v = op.fold(*nums)
        except (ValueError, OverflowError, ZeroDivisionError, TypeError):
            v = None
        if isinstance(v, bool):
            return ScalarT("bool", v)
        if all(a.kind == "int" for a in args) and isinstance(v, int):
            return ScalarT("int", Dim.of(v))
        value = finite_float(v) if v is not None else None
        if value is None:
            self.report("L408", f"`{op.name}` has no finite real value for {', '.join(map(str, nums))}", e)
            return ScalarT("float", None)
        return ScalarT("float", value)

    def apply_op(self, op: OpDef, args: dict, e, op_symbol: str | None = None, info: CallInfo | None = None) -> Type:
        """Convert arguments to the op's kinds, then run its dtype and shape rules. `info`
        (a call's CallInfo) receives the arguments as converted."""
        values: dict[str, Any] = {}
        nodes: dict[str, A.Node] = {}
        try:
            return self._apply_op(op, args, e, op_symbol, values, nodes, info)
        finally:
            if info is not None:
                info.args = {
                    p.name: Arg(p.name, nodes.get(p.name), values[p.name])
                    for p in op.params
                    if p.kind != "sizes" and p.name in values
                }

    def _apply_op(self, op: OpDef, args: dict, e, op_symbol, values: dict, nodes: dict, info) -> Type:
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
                        self.report("L107", f"size `{k}` of {what} is a compile-time int, got {kind_text(t)}", node)
                        return UNKNOWN
                    sizes[k] = t.value
                    if info is not None:
                        info.sizes[k] = Arg(k, node, t.value)
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
        if op.fold is not None and all(
            not isinstance(values[p.name], TensorT) for p in op.params if p.kind == "operand"
        ):
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
        for s_ in shape if isinstance(shape, list) else [shape]:
            negative = [d for d in s_.dims if d is not None and (d.as_int() or 0) < 0]
            if negative:
                self.report("L213", f"`{op.name}` would make a dim of {negative[0].as_int()}: dims are sizes", e)
                return UNKNOWN
        if isinstance(shape, list):
            dts = dtype if isinstance(dtype, list) else [dtype] * len(shape)
            return TupleT(tuple(TensorT(d, s) for d, s in zip(dts, shape)))
        return TensorT(dtype, shape)

    def op_error(self, err: OpError, e, nodes: dict, values: dict) -> None:
        node = nodes.get(err.arg, e) if err.arg else e
        span = node.span
        if err.inner is not None and isinstance(node, A.StrLit):
            raw = self.item.text[node.span.start : node.span.end]
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
        labels += self.atom_labels(list(err.dims))
        fixes = [fix for arg, dtype in err.casts.items() if (fix := self.cast_fix(nodes.get(arg), dtype, nodes))]
        self.report(err.code, err.message, span, labels=labels, notes=err.notes, fixes=fixes)

    def cast_fix(self, node, dtype, nodes: dict) -> Fix | None:
        """`x` -> `cast(x, f32)`; for the working dtype, `cast(x, other.dtype)` after the
        other operand when it is a name."""
        if node is None:
            return None
        text = self.item.text[node.span.start : node.span.end]
        target = dtype.name
        if dtype is WORK:
            others = [n for n in nodes.values() if n is not node and isinstance(n, (A.Name, A.Attr))]
            if not others:
                return None
            target = f"{self.item.text[others[0].span.start : others[0].span.end]}.dtype"
        return Fix(f"cast `{text}` to {target}", [(self.anchor(node), f"cast({text}, {target})")])

    def def_labels(self, node) -> list[Label]:
        """Where a value named in an error was declared, for a fault that may originate there:
        the `let` that bound a local, the declaration of a member or a parameter, the submodule
        a field is read from (`up.weight`: `up: Linear(...)`)."""
        if isinstance(node, A.Name):
            for name, b in reversed(self.fn_locals):
                if name == node.id and isinstance(b.anchor, LocalAnchor) and b.anchor.span != node.span:
                    return [Label(b.anchor, f"`{name}` is {format_type(b.type)} from here")]
            anchor = self._declaration(node)
            if anchor is None or not _is_member(anchor):
                return []
            t = self.result.types.get(node)
            shown = f" {format_type(t)}" if isinstance(t, TensorT) else ""
            return [Label(anchor, f"`{node.id}` is declared{shown} here")]
        if isinstance(node, A.Attr):
            base = node.value
            while isinstance(base, A.Attr):
                base = base.value
            anchor = self._declaration(base) if isinstance(base, A.Name) else None
            t = self.result.types.get(node)
            written = dotted(node)
            if anchor is None or written is None or not _is_member(anchor):
                return []
            if isinstance(t, TensorT):
                return [Label(anchor, f"`{written}` is {format_type(t)}: `{base.id}` is declared here")]
            return [Label(anchor, f"`{base.id}` is declared here")]
        return []

    def _declaration(self, name: A.Name) -> SymbolAnchor | None:
        """The member or parameter a name use resolved to (its reference), if any."""
        for span, target in reversed(self.result.refs):
            if span == name.span and isinstance(target, SymbolAnchor) and len(target.path) > 2:
                return target
        return None

    def convert(self, kind: str, t: Type, node, name: str, what: str):
        """An op argument in the form its rules expect, or _FAILED (reported)."""
        if kind == "tensor":
            if isinstance(t, TensorT):
                return t
            self.report("L107", f"`{name}` of {what} is a tensor, got {kind_text(t)}", node, label=format_type(t))
            return _FAILED
        if kind == "operand":
            if isinstance(t, TensorT):
                return t
            if isinstance(t, ScalarT) and t.kind in ("int", "float", "bool"):
                if t.value is None:  # not known here: its kind still decides the dtype
                    return 0.0 if t.kind == "float" else UnknownNumber(t.kind)
                return t.value
            self.report("L107", f"`{name}` of {what} is a tensor or a number, got {kind_text(t)}", node)
            return _FAILED
        if kind == "tensors":
            items = t.items if isinstance(t, (ListT, TupleT)) else None
            if items is None or not all(isinstance(i, (TensorT, UnknownT)) for i in items):
                self.report("L107", f"`{name}` of {what} is a list of tensors `[a, b]`, got {kind_text(t)}", node)
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
            self.report(
                "L107", f"`{name}` of {what} is a compile-time int, got {kind_text(t)}", node, label=format_type(t)
            )
            return _FAILED
        if kind in ("window", "padding"):
            # an int, a list of ints (one per spatial dim), or for padding "same" / "valid"
            if isinstance(t, ScalarT) and t.kind == "int":
                return t.value
            if kind == "padding" and isinstance(t, ScalarT) and t.kind == "str":
                if t.value in ("same", "valid"):
                    return t.value
                self.report(
                    "L107", f'`{name}` of {what} is an int, a list of ints, "same" or "valid", got "{t.value}"', node
                )
                return _FAILED
            if isinstance(t, (ListT, TupleT)):
                return self.convert("ints", t, node, name, what)
            written = 'an int, a list of ints, "same" or "valid"' if kind == "padding" else "an int or a list of ints"
            self.report("L107", f"`{name}` of {what} is {written}, got {kind_text(t)}", node, label=format_type(t))
            return _FAILED
        if kind in ("ints", "indices"):
            items = t.items if isinstance(t, (ListT, TupleT)) else None
            if items is None:
                self.report("L107", f"`{name}` of {what} is a list of ints `[B, S, 4]`, got {kind_text(t)}", node)
                return _FAILED
            out = []
            for i in items:
                if isinstance(i, UnknownT):
                    out.append(None)
                    continue
                if not (isinstance(i, ScalarT) and i.kind == "int"):
                    self.report("L107", f"`{name}` of {what} is a list of ints, got an element {kind_text(i)}", node)
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
        if kind == "numbers":
            items = t.items if isinstance(t, (ListT, TupleT)) else None
            if items is None or not all(isinstance(i, ScalarT) and i.kind in ("int", "float") for i in items):
                self.report("L107", f"`{name}` of {what} is a list of compile-time numbers, got {kind_text(t)}", node)
                return _FAILED
            values = [number(i) for i in items]
            if any(v is None for v in values):
                self.report("L405", f"`{name}` of {what} must be known at compile time", node)
                return _FAILED
            return values
        if kind == "bool":
            if isinstance(t, ScalarT) and t.kind == "bool":
                if t.value is None:
                    self.report("L405", f"`{name}` of {what} must be known at compile time", node)
                    return _FAILED
                return t.value
            self.report("L107", f"`{name}` of {what} is a bool, got {kind_text(t)}", node)
            return _FAILED
        if kind == "float":
            if isinstance(t, ScalarT) and t.kind in ("int", "float", "bool"):
                return number(t) if t.kind != "bool" else t.value
            self.report("L107", f"`{name}` of {what} is a number, got {kind_text(t)}", node)
            return _FAILED
        if kind == "str":
            if isinstance(t, ScalarT) and t.kind == "str" and t.value is not None:
                return t.value
            self.report("L107", f"`{name}` of {what} is a string literal, got {kind_text(t)}", node)
            return _FAILED
        if kind == "dtype":
            if isinstance(t, DTypeT):
                return t.dtype
            self.report("L107", f"`{name}` of {what} is a dtype (`f32`, `x.dtype`), got {kind_text(t)}", node)
            return _FAILED
        raise AssertionError(kind)

    def call_fn(
        self, target: FnTarget, e: A.Call, scope: Scope, kind: str = "fn", receiver: A.Expr | None = None
    ) -> Type:
        """Check a call to a Linnet function: unify arguments with its signature. `kind` and
        `receiver` say how it was called (resolved.CallInfo)."""
        fn = target.fn
        inst = target.instance
        if kind == "fn" and inst is not None:
            kind = "method"  # a method called by its name inside its module: on the same instance
        info = self.result.call_info[e] = CallInfo(kind, fn, target.item, receiver=receiver)
        owner = (inst.module.name.id, "fn", fn.name.id) if inst is not None else (fn.name.id,)
        written = dotted(e.func)
        callee = f"`{written}`" if written else f"`{fn.name.id}`"
        names = [p.name.id for p in fn.params]
        defaults = {p.name.id: p.default is not None for p in fn.params}
        arg_types = {id(a): self.expr(a.value, scope) for a in e.args}
        findings_before = len(self.result.findings)
        owner_file = target.item.source.path
        matched = self.match_args(
            names, defaults, e.args, callee, e, scope, owner_path=owner + ("param",), owner_file=owner_file
        )
        if target.item is not self.item:
            self.result.deps.setdefault((owner_file, target.item.name), target.item.interface)
        if self.current_fn is not None and not target.item.is_std:  # the standard library calls no user code
            self.result.calls.append((self.current_fn, (owner_file,) + owner, e.func.span))
        if matched is None:
            return UNKNOWN
        sig_scope = Scope(self.module_scope(inst) if inst is not None else self.global_scope(), "fn")
        call = _FnCall(target, e, callee, owner, owner_file, matched, arg_types, sig_scope, info)
        # Compile-time parameters first (checked per call): tensor types may use them.
        tensor_params = [p for p in fn.params if isinstance(p.type, (A.TensorType, A.TupleType))]
        compile_time = self._compile_time_args(call, tensor_params)
        sig = self.signature(target, tensor_params, compile_time, sig_scope)
        if sig.errors:
            first = sig.errors[0]
            self.report(
                first.code,
                f"{callee} cannot take these arguments: {first.message}",
                e,
                labels=[Label(first.anchor, "required here")],
            )
            return UNKNOWN
        unifier = Unifier(set(sig.patterns), set(sig.dtype_patterns))
        unknown_arg = self._unify_tensor_args(call, tensor_params, sig.params, unifier)
        unifier.shown = [
            d
            for a in matched.values()
            for t in [arg_types.get(id(a))]
            if isinstance(t, TensorT)
            for d in t.shape.dims
            if d is not None
        ]
        unifier.solve()
        self._report_unsolved(call, tensor_params, sig.params, unifier)
        for p in tensor_params:
            given = matched.get(p.name.id)
            info.args[p.name.id] = Arg(
                p.name.id, given.value if given else None, arg_types[id(given)] if given else UNKNOWN
            )
        info.args = {p.name.id: info.args[p.name.id] for p in fn.params}  # declaration order
        info.dims = {a.name: unifier.solved.get(a) for a in sig.ordered_patterns}
        info.dtypes = {d.name: unifier.dtypes.get(d) for d in sig.dtype_patterns}
        if len(self.result.findings) > findings_before or unknown_arg:
            return UNKNOWN  # the call is wrong, or its input unknown: what it returns would only cascade
        returned = _substitute_type(sig.ret, unifier, unifier.shown)
        if self._report_specialized(call, compile_time, returned) or self._report_negative_return(call, returned):
            return UNKNOWN
        if fn_values.lacks_value(returned):
            # the call is what its body would be in its place (fn_values.py: a size a method returns, a branch a
            # predicate chooses, a rate, sizes returned as a tuple)
            value = fn_values.value_at(self, call.target, self._call_args(call, compile_time), call.info.dims)
            if value is not None:
                return value
            if getattr(fn.ret, "optional", False):
                return UNKNOWN  # `-> int?` without a value may be none: neither `int` (`w == none` false) nor none
        return returned

    def _call_args(self, call: "_FnCall", compile_time: dict[str, Type]) -> dict[str, Type]:
        """Each parameter of the callee (by name) bound to its value at this call: the compile-time ones as
        checked, a tensor to its argument's type (UNKNOWN when not given)."""
        return {
            p.name.id: compile_time[p.name.id]
            if p.name.id in compile_time
            else call.arg_types[id(call.matched[p.name.id])]
            if p.name.id in call.matched
            else UNKNOWN
            for p in call.target.fn.params
        }

    def _report_specialized(self, call: "_FnCall", compile_time: dict[str, Type], returned: Type) -> bool:
        """Report the first error of a standard-library callee's body checked with this call's values
        (`specialize.py`: a `Conv2d` whose window does not fit this input), at the call, the callee's line
        labelled; the same for a method of the caller's own module given a known int or bool
        (`specialize.same_item_call`: unet's `layer(..., 8)` indexing `resnets[i]`). Returns whether it reported."""
        own = specialize.same_item_call(self, call.target, compile_time) or (
            self.follow is not None
            and call.target.item.source is self.follow
            and specialize.worth_following(self, call.target, compile_time, call.info.dims)
        )
        if not call.target.item.is_std and not own:
            return False
        args = self._call_args(call, compile_time)
        found = specialize.first_error_at(self, call.target, args, call.info.dims, returned)
        if found is None:
            return False
        self.report(
            found.code,
            f"{call.callee} with {'these arguments' if own else 'these sizes'}: {found.message}",
            call.node,
            labels=[Label(found.anchor, "fails here")] + list(found.labels),
            notes=list(found.notes),
        )
        return True

    def _report_negative_return(self, call: "_FnCall", returned: Type) -> bool:
        """Report (L213) a dim the callee would return that is negative under this call's values: a callee
        checked for every size (`Conv2d.forward`'s `(H - kernel_size) // stride + 1`) is wrong for these sizes
        (a 16-wide window over 8 rows), as an op that would make such a dim is (`apply_op`); lowering refuses
        it. Returns whether it reported."""
        items = returned.items if isinstance(returned, TupleT) else (returned,)
        for t in items:
            if not isinstance(t, TensorT):
                continue
            for i, d in enumerate(t.shape.dims):
                n = d.as_int() if d is not None else None
                if n is None or n >= 0:
                    continue
                self.report(
                    "L213",
                    f"{call.callee} would return a dim of {n} (dim {i} of {format_shape(t.shape, concrete=True)}): "
                    "dims are sizes",
                    call.node,
                    labels=[Label(SymbolAnchor(call.owner, call.owner_file), f"declared {format_type(t)} here")],
                    notes=["the callee was checked for every size: these sizes make its return type negative"],
                )
                return True
        return False

    def _compile_time_args(self, call: "_FnCall", tensor_params: list[A.Param]) -> dict[str, Type]:
        """The call's compile-time arguments (every parameter but the tensor ones), each checked against its
        parameter and bound in the signature's scope, by name; recorded in the call's `CallInfo`."""
        target, e, matched, sig_scope = call.target, call.node, call.matched, call.sig_scope
        compile_time: dict[str, Type] = {}
        for p in target.fn.params:
            if p in tensor_params:
                continue
            if p.name.id in matched:
                arg = matched[p.name.id]
                t, node = call.arg_types[id(arg)], arg.value
            else:
                t, node = self.silent_expr(p.default, sig_scope, target.item), e
            checked = self.check_compile_time_arg(p, t, node, call.callee, target.item)
            compile_time[p.name.id] = checked if checked is not None else UNKNOWN
            given = matched.get(p.name.id)
            call.info.args[p.name.id] = Arg(
                p.name.id, given.value if given else None, compile_time[p.name.id], None if given else p.default
            )
            sig_scope.bind(p.name.id, Binding(compile_time[p.name.id], "param"))
        return compile_time

    def _unify_tensor_args(
        self, call: "_FnCall", tensor_params: list[A.Param], pattern_types: list, unifier: Unifier
    ) -> bool:
        """Unify each tensor argument's dtype and shape with its parameter's pattern, reporting what cannot
        match (L107, L304, L203). Returns whether an argument's type is unknown."""
        callee = call.callee
        unknown_arg = False
        for i, p in enumerate(tensor_params):
            pattern = pattern_types[i]
            if p.name.id not in call.matched:
                continue
            arg = call.matched[p.name.id]
            actual = call.arg_types[id(arg)]
            if isinstance(actual, UnknownT):
                unknown_arg = True
                continue
            if not isinstance(pattern, TensorT):
                continue
            if not isinstance(actual, TensorT):
                self.report(
                    "L107",
                    f"`{p.name.id}` of {callee} is a tensor {format_type(pattern)}, got {kind_text(actual)}",
                    arg.value,
                    label=format_type(actual),
                )
                continue
            param_anchor = SymbolAnchor(call.owner + ("param", p.name.id), call.owner_file)
            msg = unifier.unify_dtype(pattern.dtype, actual.dtype, i)
            if msg is not None:
                self.report(
                    "L304",
                    f"argument `{p.name.id}` of {callee}: {msg}",
                    arg.value,
                    label=format_type(actual),
                    labels=[Label(param_anchor, "parameter declared here")],
                    notes=[f"consider `cast({dotted(arg.value) or 'x'}, {pattern.dtype.name})`"]
                    if not pattern.dtype.var and pattern.dtype is not WORK
                    else [],
                )
            msg = unifier.unify_shape(pattern.shape, actual.shape, i)
            if msg is not None:
                self.report(
                    "L203",
                    f"argument `{p.name.id}` of {callee}: {msg}",
                    arg.value,
                    label=format_type(actual),
                    labels=[Label(param_anchor, f"declared {format_type(pattern)} here")],
                )
        return unknown_arg

    def _report_unsolved(
        self, call: "_FnCall", tensor_params: list[A.Param], pattern_types: list, unifier: Unifier
    ) -> None:
        """Report each error of the solved unifier at its argument: a dim that differs from what the other
        arguments fix, one that does not divide, one that cannot be inferred."""
        callee = call.callee
        tensor_names = [p.name.id for p in tensor_params]
        for err in unifier.errors:
            p = tensor_params[err.arg]
            arg = call.matched[p.name.id]
            actual = call.arg_types[id(arg)]
            written = self._pattern_text(p, call.sig_scope, call.target.item)
            param_anchor = SymbolAnchor(call.owner + ("param", p.name.id), call.owner_file)
            labels = [Label(param_anchor, f"declared `{p.name.id}: {written}` here")]
            labels += self.def_labels(arg.value) + self.def_labels(call.node.func)
            sources = [err.actual, err.expected] + [
                unifier.sources.get(a) for a in (err.pattern.atoms() if err.pattern else ())
            ]
            labels += self.atom_labels(sources)
            a = format_dim(shown_value(err.actual)) if err.actual is not None else "?"
            if err.kind == "differ":
                expected = pattern_types[err.arg]
                shown = format_shape(substitute_shape(expected.shape, unifier.solved, unifier.prefixes), concrete=True)
                bound = unifier.bindings_text(err.pattern, tensor_names, parens=False)
                message = (
                    f"argument `{p.name.id}` of {callee} is {format_shape(actual.shape, concrete=True)}, "
                    f"expected {shown} (dim {err.dim}: {a} vs {format_dim(shown_value(err.expected))}"
                    + (f"; {bound})" if bound else ")")
                )
            elif err.kind == "divide":
                bound = unifier.bindings_text(err.pattern, tensor_names)
                message = (
                    f"argument `{p.name.id}` of {callee}: dim {err.dim} is {a}, but must be "
                    f"{format_dim(err.pattern)}" + (f" with {bound}" if bound else "") + f": {err.reason}"
                )
            elif err.kind == "negative":
                message = (
                    f"argument `{p.name.id}` of {callee}: dim {err.dim} is {a}, but must be {format_dim(err.pattern)}: "
                    f"{err.reason}, and dims are sizes"
                )
            else:
                message = (
                    f"argument `{p.name.id}` of {callee}: cannot infer "
                    f"{', '.join(sorted({x.name for x in err.pattern.atoms() if x in unifier.patterns}))} "
                    f"from dim {err.dim} ({format_dim(err.pattern)} = {a})"
                )
            notes = _moved_dim_note(err, actual.shape) if err.kind == "differ" else []
            if err.kind == "negative" and err.actual is not None and err.actual.as_int() is None:
                notes = [_lower_bound_note(err, actual.shape, written)]
            self.report(
                err.code, message, arg.value, label=format_type(actual, concrete=True), labels=labels, notes=notes
            )

    def signature(
        self, target: FnTarget, tensor_params: list[A.Param], compile_time: dict[str, Type], sig_scope: Scope
    ) -> "_Signature":
        """A callee's parameter and return types with pattern atoms for its dim variables,
        cached per callee, instance and compile-time argument values."""
        inst = target.instance
        key = (
            target.fn,
            inst.key() if inst is not None else None,
            tuple((k, type_key(v)) for k, v in compile_time.items()),
        )
        sig = self.ctx.signatures.get(key)
        if sig is None:
            generics = self.generics(target.fn, report=False)
            binder = Binder("pattern", generics)
            sub = type(self)(self.ctx, target.item, {})
            params = [sub.eval_type(p.type, sig_scope, binder) for p in tensor_params]
            binder.frozen = True
            ret = sub.eval_type(target.fn.ret, sig_scope, binder) if target.fn.ret is not None else UNIT
            # Errors here depend on this call's values (the callee's own check did not know them):
            # `n / 2` in a return type when `n` is 7.
            errors = [f for f in sub.result.findings if f.code[1] in "24"]
            patterns = frozenset(binder.dims.values())
            sig = _Signature(
                params,
                ret,
                patterns,
                frozenset(generics.values()),
                dict(sub.result.deps),
                errors,
                tuple(sorted(patterns, key=lambda a: a.uid)),
            )
            self.ctx.signatures[key] = sig
            self.ctx.remember("signatures", key, target.item, inst.item if inst is not None else None)
        for k, v in sig.deps.items():
            self.result.deps.setdefault(k, v)
        return sig

    def _pattern_text(self, p: A.Param, scope: Scope, item: Item) -> str:
        return " ".join(item.text[p.type.span.start : p.type.span.end].split())


def _is_member(anchor: SymbolAnchor) -> bool:
    return anchor.path[1] == "member"


# _FnCall and _Signature are made once per call (and per uncached callee): plain slotted dataclasses, since a frozen
# one's __init__ sets each field through object.__setattr__. Nothing changes them after they are made.
@dataclass(slots=True)
class _FnCall:
    """A call of a Linnet function being checked, once its arguments are matched: `callee` as the call
    writes it (for messages), `owner` the callee's symbol path in `owner_file`, `matched` the argument of
    each parameter given one, `arg_types` each argument's type (by `id` of its `A.Arg`), `sig_scope` the
    scope of the callee's signature, `info` the call's resolved form being filled in."""

    target: FnTarget
    node: A.Call
    callee: str
    owner: tuple
    owner_file: str
    matched: dict
    arg_types: dict
    sig_scope: Scope
    info: CallInfo


@dataclass(slots=True)
class _Signature:
    params: list
    ret: Type
    patterns: frozenset
    dtype_patterns: frozenset
    deps: dict
    errors: list
    ordered_patterns: tuple  # `patterns` by id (the order of `CallInfo.dims`), sorted once, not at each call


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


def _moved_dim_note(err, shape: Shape) -> list[str]:
    """A note when the size dim `err.dim` should have sits at one other dim of the argument: its
    dims are likely in another order (a channels-last image given to a channels-first layer)."""
    if err.expected is None or err.dim is None or shape.prefix is not None:
        return []
    here = err.dim % len(shape.dims)
    at = [i for i, d in enumerate(shape.dims) if d is not None and d.same(err.expected) and i != here]
    if len(at) != 1:
        return []
    size = format_dim(shown_value(err.expected))
    hint = ' (channels-last? consider `rearrange(x, "b h w c -> b c h w")`)' if here == 1 and at[0] == 3 else ""
    return [f"the argument has {size} at dim {at[0]}, not {here}: its dims may be in another order{hint}"]


def _lower_bound_note(err, shape: Shape, written: str) -> str:
    """How a caller says that a dim holds what a parameter pattern needs (`x: [B, 4 + E]` given `[B, S]`): with the
    same pattern where the dim is declared (`written`, the parameter's type as written, where it has no `...`),
    since a dim variable alone may be any size."""
    dims = [format_dim(shown_value(d)) if d is not None else "?" for d in shape.dims]
    given = "[" + ", ".join((["..."] if shape.prefix is not None else []) + dims) + "]"
    wanted = written
    if "..." in written and err.dim is not None and -len(dims) <= err.dim < len(dims):
        dims[err.dim] = format_dim(err.pattern)
        wanted = "[" + ", ".join((["..."] if shape.prefix is not None else []) + dims) + "]"
    return (
        f"consider declaring the dim as the parameter does where it comes from ({wanted} for {given}): a dim variable "
        "alone may be any size"
    )
