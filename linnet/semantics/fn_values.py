"""The int, bool, float, str or tuple of them a user function returns, evaluated at a call whose arguments are known.

A function's signature says `-> int` and nothing of the value, so `reshape(x, [B, width(), 8, 8])` had a dim the
checker did not know: a model could check clean and fail in lowering, which computes `width()` (48 channels in
GroupNorm's 32 groups; unet's `skip(i)`). So a call of an int-returning function whose compile-time arguments all
have a value (a number, or a symbolic size such as a module's `out_channels`) checks the callee's body with them
bound, as `specialize.first_error_at` does, and takes the body's value when the body checks clean and has one: the
call is then what the body would be written in its place. The same for a function returning a bool (`fn
has_window(c: C) -> bool { c.window != none }`): an `if` on its call checked both branches, the one that cannot
run under a preset too (`c.window` is `none` there: a false error), and took an unknown size from the one that
runs (a size choice that lowering then refused against the declared type). And for one returning a float: a rate
it computes (`dropout(x, doubled_rate())`) had no value, so an op's range (`p` in [0, 1)) went unchecked. And for
one returning a tuple of those values (`fn sizes() -> (int, int) { (c.ch, 8) }`, tuples of tuples too): `let (w,
h) = sizes()` gave two sizes without a value, so `GroupNorm(32, w)` at 48 channels checked clean. An argument may
be a tuple of known values too (`first((c.ch, 8))`). And for one returning a `str` (`fn mode() -> "wide" |
"narrow" { c.mode }`): `if mode() == "wide"` checked both branches and took an unknown size from the one that runs.

Any function's: the body of one that returns an int, a bool, a float, a str or a tuple of them is part of its item's
interface (`syntax.items.shows_body`), so a caller's check, which depends on its callees' interfaces only, is made
again when that body changes (an edit there is not spliced into the module either: `syntax.splice`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..syntax import ast as A
from ..syntax.items import VALUE_RETURNS
from ..types.core import NONE, NoneT, ScalarT, TensorT, TupleT, Type
from .specialize import arg_key, checked_body, followed, once

if TYPE_CHECKING:
    from .checker import ItemChecker
    from .scope import FnTarget


def lacks_value(returned: Type) -> bool:
    """Whether `returned`, a call's return type from the callee's signature, is an int, a bool, a float, a str or a
    tuple of them with some part not known: what `value_at` may find in the callee's body."""
    if isinstance(returned, ScalarT):
        return returned.kind in VALUE_RETURNS and returned.value is None
    if not isinstance(returned, TupleT) or not returned.items:
        return False
    return all(_holds_values(t) for t in returned.items) and any(lacks_value(t) for t in returned.items)


def _holds_values(t: Type) -> bool:
    """Whether `t` is an int, a bool, a float, a str or a tuple of them, known or not."""
    if isinstance(t, ScalarT):
        return t.kind in VALUE_RETURNS
    return isinstance(t, TupleT) and bool(t.items) and all(_holds_values(i) for i in t.items)


def value_at(
    checker: "ItemChecker", target: "FnTarget", args: dict[str, Type], dims: dict
) -> ScalarT | TupleT | NoneT | None:
    """The int, bool, float or str (or tuple of them) `target` returns at a call with `args` (every parameter, by name)
    and its dim variables solved to `dims`: `ScalarT(kind, value)` (a `TupleT` of them) when its body, checked with
    them, is clean and has a value of the declared type in every part; None when an argument has no value, or the
    body has none."""
    fn = target.fn
    if fn.body is None:
        return None
    keys = [(name, _known_key(t)) for name, t in args.items()]
    if any(key is None for _, key in keys) or any(d is None for d in dims.values()):
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


def _known_key(t: Type):
    """A hashable key for an argument whose value is known: a tensor with known dims, a number, a config, or a tuple
    of them (`first((c.ch, 8))`); None when a part has no value."""
    if isinstance(t, TupleT):
        keys = tuple(_known_key(i) for i in t.items)
        return None if any(k is None for k in keys) else ("tuple", keys)
    key = arg_key(t)  # (None for a tensor with an unknown dim, or an unknown type)
    if key is None or (isinstance(t, ScalarT) and t.value is None):
        return None
    if not isinstance(t, TensorT) and key[0] in ("unknown", "other"):
        return None
    return key


def _body_value(
    checker: "ItemChecker", target: "FnTarget", args: dict[str, Type], dims: dict
) -> ScalarT | TupleT | NoneT | None:
    """The int, bool, float or str value (or tuple of them) of `target`'s body checked with `args` and `dims`; None when
    it has an error or no value in some part."""
    sub, body = checked_body(checker, target, args, dims)
    if any(f.severity in (None, "error") for f in sub.result.findings):
        return None
    return _declared_value(body, target.fn.ret)


def _declared_value(body: Type, declared: A.Node | None) -> ScalarT | TupleT | NoneT | None:
    """`body`'s value as the declared return type has it (each part of a tuple in turn; `none` where the type is
    optional, `-> int?`); None when a part has no value or is not of the declared kind."""
    if isinstance(declared, (A.NamedType, A.LiteralType)):
        if isinstance(body, NoneT) and declared.optional:
            return NONE  # `-> int?` returning a config field left `none`
        kind = declared.name.id if isinstance(declared, A.NamedType) else declared.kind
        if isinstance(body, ScalarT) and body.kind == kind in VALUE_RETURNS and body.value is not None:
            return ScalarT(body.kind, body.value)
        return None
    if not isinstance(declared, A.TupleType) or not isinstance(body, TupleT) or len(body.items) != len(declared.items):
        return None
    parts = [_declared_value(b, d) for b, d in zip(body.items, declared.items)]
    return TupleT(tuple(parts)) if all(p is not None for p in parts) else None
