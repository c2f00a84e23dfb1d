"""The int, bool or float a user function returns, evaluated at a call whose arguments are known.

A function's signature says `-> int` and nothing of the value, so `reshape(x, [B, width(), 8, 8])` had a dim the
checker did not know: a model could check clean and fail in lowering, which computes `width()` (48 channels in
GroupNorm's 32 groups; unet's `skip(i)`). So a call of an int-returning function whose compile-time arguments all
have a value (a number, or a symbolic size such as a module's `out_channels`) checks the callee's body with them
bound, as `specialize.first_error_at` does, and takes the body's value when the body checks clean and has one: the
call is then what the body would be written in its place. The same for a function returning a bool (`fn
has_window(c: C) -> bool { c.window != none }`): an `if` on its call checked both branches, the one that cannot
run under a preset too (`c.window` is `none` there: a false error), and took an unknown size from the one that
runs (a size choice that lowering then refused against the declared type). And for one returning a float: a rate
it computes (`dropout(x, doubled_rate())`) had no value, so an op's range (`p` in [0, 1)) went unchecked.

Any function's: the body of one that returns an int, a bool or a float is part of its item's interface
(`syntax.items.shows_body`), so a caller's check, which depends on its callees' interfaces only, is made again when
that body changes (an edit there is not spliced into the module either: `syntax.splice`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..syntax import ast as A
from ..syntax.items import VALUE_RETURNS
from ..types.core import ScalarT, TensorT, Type
from .specialize import arg_key, checked_body, followed, once

if TYPE_CHECKING:
    from .checker import ItemChecker
    from .scope import FnTarget


def value_at(checker: "ItemChecker", target: "FnTarget", args: dict[str, Type], dims: dict) -> ScalarT | None:
    """The int, bool or float `target` returns at a call with `args` (every parameter, by name) and its dim variables
    solved to `dims`: `ScalarT(kind, value)` when its body, checked with them, is clean and has a value of the
    declared kind; None when an argument has no value, or the body has none."""
    fn = target.fn
    if fn.body is None:
        return None
    keys = []
    for name, t in args.items():
        key = arg_key(t)  # (None for a tensor with an unknown dim, or an unknown type)
        if key is None or (isinstance(t, ScalarT) and t.value is None):
            return None
        if not isinstance(t, TensorT) and key[0] in ("unknown", "other"):
            return None
        keys.append((name, key))
    if any(d is None for d in dims.values()):
        return None
    inst = target.instance
    key = (
        "value",
        fn,
        inst.key() if inst is not None else None,
        tuple(keys),
        tuple((n, d.key()) for n, d in dims.items()),
    )
    if checker.follow is not None:
        return followed(checker, target.item, key, lambda: _body_value(checker, target, args, dims))
    return once(checker, key, lambda: _body_value(checker, target, args, dims))


def _body_value(checker: "ItemChecker", target: "FnTarget", args: dict[str, Type], dims: dict) -> ScalarT | None:
    """The int, bool or float value of `target`'s body checked with `args` and `dims`; None when it has an error or
    no value."""
    sub, body = checked_body(checker, target, args, dims)
    if any(f.severity in (None, "error") for f in sub.result.findings):
        return None
    declared = target.fn.ret.name.id if isinstance(target.fn.ret, A.NamedType) else None
    if isinstance(body, ScalarT) and body.kind == declared in VALUE_RETURNS and body.value is not None:
        return ScalarT(body.kind, body.value)
    return None
