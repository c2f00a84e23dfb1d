"""The value of an `if` whose condition is not known where it is checked (a parameter of a generic module or
function: `if in_channels != out_channels`, `if scale == 2`), when its branches are tensors of one dtype and rank
whose dims differ (docs/language.md section 7, "`if` is compile-time").

Each instance takes one branch, so a dim of the value is `then`'s where the condition holds and `else`'s where it
does not. Where the condition itself makes the two equal, the value has that dim whichever branch runs: `if
in_channels != out_channels { shortcut(x) } else { x }` is `[B, out_channels, H, W]`, since `x` is taken only when
`in_channels == out_channels`. The equalities a condition gives are read from `==` (where it holds), `!=` (where
it does not), through `and`, `or` and `not`, between compile-time ints. Other differing dims are a size choice
that only the instance decides (`if scale == 2 { up(h) } else { h }`): unknown here, computed and checked against
the declared types by lowering. Two branches whose dims are the same ones in another order are not a size choice
but a layout the instance would decide (one branch transposes, the other does not): `permuted` finds them, for
error L306.
"""

from __future__ import annotations

from typing import Callable

from ..syntax import ast as A
from ..types.core import ScalarT, Shape, TensorT, TupleT, Type
from ..types.dims import Atom, Dim
from .describe import types_equal

Facts = dict[Atom, Dim]


def equalities(cond: A.Expr, holds: bool, type_of: Callable[[A.Node], Type | None]) -> Facts:
    """The int equalities that follow from `cond` being `holds` (true or false), as atom -> dim substitutions:
    `a == b` true, or `a != b` false, gives `a -> b` (an atom of `a - b` with coefficient 1 or -1, solved);
    `p and q` true and `p or q` false give both sides' equalities; `not p` flips. Nothing else gives any."""
    if isinstance(cond, A.Not):
        return equalities(cond.operand, not holds, type_of)
    if isinstance(cond, A.BinOp) and (cond.op, holds) in (("and", True), ("or", False)):
        facts = equalities(cond.left, holds, type_of)
        facts.update(equalities(cond.right, holds, type_of))
        return facts
    if isinstance(cond, A.Compare) and (cond.op, holds) in (("==", True), ("!=", False)):
        a, b = type_of(cond.left), type_of(cond.right)
        if isinstance(a, ScalarT) and isinstance(b, ScalarT) and a.kind == b.kind == "int":
            if isinstance(a.value, Dim) and isinstance(b.value, Dim):
                return _solve(a.value - b.value)
    return {}


def _solve(zero: Dim) -> Facts:
    """`zero == 0` solved for one of its atoms that stands alone with coefficient 1 or -1 (`a - b`: a -> b)."""
    for mono, coeff in zero.terms:
        if len(mono) == 1 and mono[0][1] == 1 and coeff in (1, -1):
            atom = mono[0][0]
            if atom.kind not in ("const", "var") or atom.value is not None:
                continue
            rest = zero - Dim._raw({mono: coeff})
            if atom in rest.atoms():
                continue
            return {atom: rest * Dim.of(-coeff)}
    return {}


def merged(a: Type, b: Type, then_facts: Facts, else_facts: Facts) -> Type | None:
    """The type of the `if` whose branches have types `a` (then) and `b` (else): tensors (or tuples of tensors) of
    one dtype and rank whose dims differ. A dim is `a`'s where the else branch's facts make `b`'s equal to it,
    `b`'s where the then branch's facts make `a`'s equal to `b`'s, else unknown (None). None when the branches
    are not such a pair."""
    if isinstance(a, TupleT) and isinstance(b, TupleT) and len(a.items) == len(b.items):
        items = [x if types_equal(x, y) else merged(x, y, then_facts, else_facts) for x, y in zip(a.items, b.items)]
        return None if any(m is None for m in items) else TupleT(tuple(items))
    if not _same_layout(a, b):
        return None
    dims = tuple(_merged_dim(x, y, then_facts, else_facts) for x, y in zip(a.shape.dims, b.shape.dims))
    return TensorT(a.dtype, Shape(dims, a.shape.prefix))


def _merged_dim(x: Dim | None, y: Dim | None, then_facts: Facts, else_facts: Facts) -> Dim | None:
    if x is None or y is None:
        return None
    if x.same(y):
        return x
    if else_facts and x.substitute(else_facts).same(y.substitute(else_facts)):
        return x  # where the else branch runs, its dim is the then branch's
    if then_facts and x.substitute(then_facts).same(y.substitute(then_facts)):
        return y
    return None


def permuted(a: Type, b: Type) -> bool:
    """Whether two branch types hold the same dims, some in another order (`[B, S, H, D]` and `[B, H, S, D]`):
    one branch transposes what the other does not."""
    if isinstance(a, TupleT) and isinstance(b, TupleT) and len(a.items) == len(b.items):
        return any(permuted(x, y) for x, y in zip(a.items, b.items))
    if not _same_layout(a, b):
        return False
    differ = [(x, y) for x, y in zip(a.shape.dims, b.shape.dims) if x is None or y is None or not x.same(y)]
    if not differ or any(x is None or y is None for x, y in differ):
        return False
    rest = [y for _, y in differ]
    for x, _ in differ:
        match = next((i for i, y in enumerate(rest) if x.same(y)), None)
        if match is None:
            return False
        rest.pop(match)
    return True


def _same_layout(a: Type, b: Type) -> bool:
    """Tensors of one dtype, rank and leading `...`."""
    if not (isinstance(a, TensorT) and isinstance(b, TensorT)) or a.dtype != b.dtype:
        return False
    if (a.shape.prefix is None) != (b.shape.prefix is None) or len(a.shape) != len(b.shape):
        return False
    return a.shape.prefix is None or a.shape.prefix is b.shape.prefix
