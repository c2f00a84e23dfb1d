"""Standard-library functions checked again at each call, with the call's sizes.

A module of the standard library is checked once for every size: `Conv2d(in_channels, out_channels,
kernel_size)` keeps `kernel_size` and the input's `H` symbolic, so its `conv2d` cannot know whether the window
fits. Lowering runs the same op rules with the instance's numbers, and a window of 16 over 8 rows fails there,
after `linnet check` said nothing. So a call into the standard library checks the callee's body once more with
this call's values bound (the instance's parameters, the argument types, the solved dim variables): each op's own
rule (`linnet.ops`) reports what these sizes break, and the call reports it, located at the call with the
callee's line as a label.

Only the standard library: its bodies never change, so a caller's findings still depend only on what it can see
of its callees (their interfaces, `syntax.items.interface_key`); a user's module keeps being checked generically.
The bodies are small (one op, or a few), each checked once per callee, instance and argument types
(`CheckContext.specialized`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..types.core import ScalarT, TensorT, Type, UnitT, UnknownT
from .describe import tail_node
from .diagnostics import Finding
from .scope import Binding, Scope, type_key

if TYPE_CHECKING:
    from .checker import ItemChecker
    from .scope import FnTarget


def _arg_key(t: Type):
    """A hashable key for an argument's type: a tensor by its dtype and its dims as written; None where one is
    not known (no specialised check then)."""
    if isinstance(t, TensorT):
        if t.shape.prefix is not None or any(d is None for d in t.shape.dims):
            return None
        return ("tensor", t.dtype, tuple(d.key() for d in t.shape.dims))
    if isinstance(t, UnknownT):
        return None
    return type_key(t)


def first_error_at(
    checker: "ItemChecker", target: "FnTarget", args: dict[str, Type], dims: dict, returned: Type
) -> Finding | None:
    """The first error of `target`'s body (a standard-library function) checked with the parameters bound to
    `args` (by name), its dim variables to `dims` (name -> Dim, solved at the call) and its result compared with
    `returned` (the return type at the call); None when it checks clean or cannot be specialised."""
    fn = target.fn
    if not target.item.is_std or fn.body is None:
        return None
    keys = [_arg_key(t) for t in args.values()]
    if any(k is None for k in keys) or any(d is None for d in dims.values()):
        return None
    inst = target.instance
    key = (
        fn,
        inst.key() if inst is not None else None,
        tuple(zip(args, keys)),
        tuple((n, d.key()) for n, d in dims.items()),
    )
    cache = checker.ctx.specialized
    if key in cache:
        return cache[key]
    cache[key] = None  # a recursive call of the same function with the same values: no second check
    sub = type(checker)(checker.ctx, target.item, {})
    sub.instance = inst
    scope = Scope(sub.module_scope(inst) if inst is not None else sub.global_scope(), "fn")
    for name, t in args.items():
        scope.bind(name, Binding(t, "param"))
    for name, d in dims.items():
        scope.bind(name, Binding(ScalarT("int", d), "dim"))
    sub.current_binder = None
    body = sub.block(fn.body, Scope(scope, "block"))
    if fn.ret is not None and not isinstance(body, (UnknownT, UnitT)):
        what = f"`{fn.name.id}` returns"
        sub.check_same(body, returned, tail_node(fn.body), fn.ret, what, "L204", "L305")
    found = next((f for f in sub.result.findings if f.severity in (None, "error")), None)
    cache[key] = found
    return found
