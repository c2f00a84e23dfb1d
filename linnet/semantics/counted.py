"""The numbers a `for` over a list of known length leaves in the compile-time locals its body assigns.

`let width = 0; for linear in linears { ...; width = width + 16 }` in a module of config parameters only: the loop
body is checked once, for any element, so `width` has no one value in it nor after it, and a size made from it
(`reshape(h, [B, width, 8, 8])` into a GroupNorm of 32 groups) was accepted. Lowering runs the body once per
element and computed 48, which the norm's groups do not divide: the model checked clean and failed to lower. The
model's check that follows instances (`instances.py`) unrolls such a loop, but it does not follow a module of
config parameters only (`specialize.worth_following`: its own check had the same config values).

So where a loop's list has a known length in the item's own check (its config values give it) and its body assigns
a compile-time local from outside the loop, the loop is run again after its generic check, once per element in
order (`ItemChecker.unrolled`), in a checker and scopes of its own: the locals it counts hold, after the loop, the
numbers lowering computes, and the errors only those numbers make (an index past a list's end at the last element)
are added to the item's findings. Nothing else of that run is kept: the types, references and resolved calls of
the body stay its generic check's, which hold for every element.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..syntax import ast as A
from ..types.core import ModuleListT, ScalarT
from .scope import Binding, Scope

if TYPE_CHECKING:
    from .checker import ItemChecker


def count_through(
    checker: "ItemChecker", s: A.For, t: ModuleListT, scope: Scope, counted: list[tuple[Binding, ScalarT]]
) -> None:
    """Run loop `s` over `t` (its list, generic check done) once per element with the locals of `counted` (each
    with its type before the loop) and give them the values they end with (where the loop itself is not under a
    condition or loop not known here); the run's new errors are reported in `checker`. Nothing where the list's
    length or one of its elements is not known."""
    n = t.count.as_int() if t.count is not None else None
    if n is None:
        return
    copies: dict[int, Binding] = {}
    inner = _copied(scope, copies)
    for b, before in counted:
        copies[id(b)].type = before
    sub = type(checker)(checker.ctx, checker.item, checker.binding)
    sub.instance = checker.instance
    sub.current_fn = checker.current_fn
    sub.current_binder = getattr(checker, "current_binder", None)
    sub.assumptions = list(checker.assumptions)
    sub.unsure = checker.unsure
    sub.varying_loops = list(checker.varying_loops)
    sub.counting = True
    if not sub.unrolled(s, t, n, inner):
        return
    checker.bodies_read |= sub.bodies_read
    checker.result.deps.update(sub.result.deps)
    known = {(f.code, _span(f)) for f in checker.result.findings}
    for f in sub.result.findings:
        if f.severity in (None, "error") and (f.code, _span(f)) not in known:
            known.add((f.code, _span(f)))
            checker.result.findings.append(f)
    for b, _ in counted:
        after = copies[id(b)].type
        if b.depth == checker.unsure and isinstance(after, ScalarT) and after.value is not None:
            b.type = after


def _copied(scope: Scope, copies: dict[int, Binding]) -> Scope:
    """A copy of `scope` and its parents up to the function's own scope, each binding copied (by the original's
    id in `copies`), above it the original module scope: what the run assigns leaves the generic check's
    bindings as they are."""
    parent = scope.parent if scope.kind == "fn" or scope.parent is None else _copied(scope.parent, copies)
    out = Scope(parent, scope.kind)
    for name, b in scope.names.items():
        copies[id(b)] = out.names[name] = replace(b)
    return out


def _span(f):
    """Where finding `f` is: its anchor's span (None for an anchor without one)."""
    return getattr(f.anchor, "span", None)
