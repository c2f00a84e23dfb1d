"""Unification of a callee's parameter types with the argument types at a call.

The callee's signature is evaluated with a fresh "pattern" atom for each of its dim
variables (and a pattern for its `...` and its dtype variables). Each argument dim gives an
equation `pattern == actual`; equations with one unknown that appears linearly are solved by
exact division (`Hkv * G == 32` with `Hkv = 5` fails: 32 is not divisible by 5, which is how
GQA head counts that don't divide are caught at the call site), the rest are compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..types.core import DType, EllipsisVar, Shape, format_shape
from ..types.dims import Atom, Dim, DivisionError, const, format_dim, nonnegative, shown_value, solve_linear


def substitute(d: Dim | None, mapping: dict[Atom, Dim | None]) -> Dim | None:
    """Replace atoms by dims (inside floor divisions too); None (unknown) if any replaced atom
    is unknown."""
    if d is None:
        return None
    if not mapping:
        return d
    used = d.atoms() & mapping.keys()
    if not used:
        return d
    if any(mapping[a] is None for a in used):
        return None
    return d.substitute({a: mapping[a] for a in used})


def substitute_shape(
    shape: Shape, mapping: dict[Atom, Dim | None], prefixes: dict[EllipsisVar, tuple[EllipsisVar | None, tuple]]
) -> Shape:
    dims = tuple(substitute(d, mapping) for d in shape.dims)
    if shape.prefix is not None and shape.prefix in prefixes:
        pvar, pdims = prefixes[shape.prefix]
        return Shape(tuple(pdims) + dims, pvar)
    return Shape(dims, shape.prefix)


@dataclass(slots=True)
class Mismatch:
    """One failed equation. kind: "differ" (a dim is not what the signature says),
    "divide" (solving for a variable needs an inexact division), "negative" (it solves a variable
    to a number below 0), "infer" (a variable appears nowhere alone). `dim` is the dim's index in the
    argument's shape (negative under `...`)."""

    arg: int
    dim: int | None
    kind: str
    pattern: Dim | None = None
    expected: Dim | None = None
    actual: Dim | None = None
    reason: str = ""

    @property
    def code(self) -> str:
        return {"differ": "L203", "divide": "L206", "negative": "L213", "infer": "L209"}[self.kind]


@dataclass(slots=True)
class Unifier:
    """Solves the dim and dtype variables of one call."""

    patterns: set[Atom]
    dtype_patterns: set[DType] = field(default_factory=set)
    ellipsis: EllipsisVar | None = None
    solved: dict[Atom, Dim | None] = field(default_factory=dict)
    dtypes: dict[DType, DType] = field(default_factory=dict)
    prefixes: dict[EllipsisVar, tuple[EllipsisVar | None, tuple]] = field(default_factory=dict)
    pending: list[tuple[Dim, Dim | None, int, int]] = field(default_factory=list)
    errors: list[Mismatch] = field(default_factory=list)
    origins: dict[Atom, int] = field(default_factory=dict)  # which argument fixed each variable
    shown: list[Dim] = field(default_factory=list)  # the arguments' dims, to display results with
    sources: dict[Atom, Dim] = field(default_factory=dict)  # the argument dim each variable was solved from

    def unify_dtype(self, pattern: DType, actual: DType, arg: int) -> str | None:
        """Returns an error message, or None when `actual` fits `pattern`."""
        if pattern in self.dtype_patterns:
            bound = self.dtypes.get(pattern)
            if bound is None:
                if pattern.kind != "any" and actual.kind != pattern.kind:
                    return f"dtype variable {pattern.name} is a {pattern.kind} dtype, got {_dt(actual)}"
                self.dtypes[pattern] = actual
                return None
            pattern = bound
        if pattern != actual:
            return f"expected {_dt(pattern)}, got {_dt(actual)}"
        return None

    def unify_shape(self, pattern: Shape, actual: Shape, arg: int) -> str | None:
        """Queue the dim equations of one argument; returns a rank error message or None."""
        if pattern.prefix is not None:
            n = len(pattern.dims)
            if len(actual.dims) < n:
                if actual.prefix is not None:
                    return (
                        f"rank of {format_shape(actual)} is not known to be at least {n} "
                        f"(expected {format_shape(pattern)})"
                    )
                return f"rank {len(actual.dims)} is too small for {format_shape(pattern)}"
            head = (actual.prefix, tuple(actual.dims[: len(actual.dims) - n]))
            tail = actual.dims[len(actual.dims) - n :]
            first = len(actual.dims) - n if actual.prefix is None else -n
            if pattern.prefix in self.prefixes:
                have = self.prefixes[pattern.prefix]
                if (
                    have[0] is not head[0]
                    or len(have[1]) != len(head[1])
                    or not all(a is None or b is None or a.same(b) for a, b in zip(have[1], head[1]))
                ):
                    return (
                        f"`...` was bound to {_prefix_text(have)} by an earlier argument, "
                        f"here it is {_prefix_text(head)}"
                    )
            else:
                self.prefixes[pattern.prefix] = head
        else:
            if actual.prefix is not None:
                return (
                    f"expected rank {len(pattern.dims)} ({format_shape(pattern)}), got {format_shape(actual)} "
                    "of unknown rank"
                )
            if len(actual.dims) != len(pattern.dims):
                return (
                    f"expected rank {len(pattern.dims)} ({format_shape(pattern)}), got rank "
                    f"{len(actual.dims)} ({format_shape(actual)})"
                )
            tail = actual.dims
            first = 0
        for i, (p, a) in enumerate(zip(pattern.dims, tail)):
            if p is None:
                continue
            self.pending.append((p, a, arg, first + i))
        return None

    def solve(self) -> None:
        """Solve queued equations; unsolvable ones become `errors`."""
        progress = True
        while progress and self.pending:
            progress = False
            rest = []
            for p, a, arg, dim in self.pending:
                ps = substitute(p, self.solved)
                if ps is None:
                    progress = True
                    continue
                unknown = [x for x in ps.val.atoms() if x in self.patterns and x not in self.solved]
                if not unknown:
                    progress = True
                    if a is not None and not ps.same(a):
                        self.errors.append(Mismatch(arg, dim, "differ", p, ps, a))
                    continue
                if len(unknown) == 1:
                    if a is None:
                        self.solved[unknown[0]] = None
                        progress = True
                        continue
                    sol = solve_linear(ps, a, unknown[0])
                    if sol is None:
                        rest.append((p, a, arg, dim))
                        continue
                    progress = True
                    self.origins[unknown[0]] = arg
                    if isinstance(sol, DivisionError):
                        self.errors.append(Mismatch(arg, dim, "divide", p, ps, a, sol.reason))
                        self.solved[unknown[0]] = None
                        continue
                    self.solved[unknown[0]] = sol
                    self.sources[unknown[0]] = a
                    n = sol.as_int()
                    if n is not None and n < 0:  # `x: [B, 4 + E]` given 2 columns: no E is a size
                        self.errors.append(Mismatch(arg, dim, "negative", p, ps, a, f"{unknown[0].name} would be {n}"))
                    elif n is None and not _a_size(sol, ps, a, unknown[0]):  # `S` columns: maybe fewer than 4
                        why = f"{unknown[0].name} would be {format_dim(shown_value(sol))}, {_when_negative(sol, a)}"
                        self.errors.append(Mismatch(arg, dim, "negative", p, ps, a, why))
                    continue
                rest.append((p, a, arg, dim))
            self.pending = rest
        for p, a, arg, dim in self.pending:
            self.errors.append(Mismatch(arg, dim, "infer", p, substitute(p, self.solved), a))
            for x in p.atoms():
                if x in self.patterns and x not in self.solved:
                    self.solved[x] = None
        self.pending = []

    def bindings_text(self, pattern: Dim, names: list[str], parens: bool = True) -> str:
        """`Hkv = 5 (from `k`)` for the solved variables of `pattern` (without parentheses:
        `Hkv = 5 from `k``)."""
        parts = []
        for a in sorted(pattern.atoms(), key=lambda x: x.uid):
            if a in self.patterns and self.solved.get(a) is not None:
                origin = self.origins.get(a)
                src = ""
                if origin is not None and origin < len(names):
                    src = f" (from `{names[origin]}`)" if parens else f" from `{names[origin]}`"
                parts.append(f"{a.name} = {format_dim(shown_value(self.solved[a]))}{src}")
        return ", ".join(parts)


def _a_size(sol: Dim, pattern: Dim, actual: Dim, unknown: Atom) -> bool:
    """Whether a variable solved to `sol` (from `pattern == actual`) is a size for every size of the caller's dim
    variables (`E` of `4 + E` given `4 + F`, or given `2 * S + 2`). A solution of int parameters or config fields
    only is left to the values each instance or preset gives them (a negative one is L213 there), and one that
    holds no more than the argument's dim (`E` of `[B, E]`) is the size the argument has. Else the argument's dim is
    taken as any size (`A`): `1 + E` given `S - 1` is `A - 1`, negative where the argument has no column."""
    if sol is actual or not any(x.kind == "var" for x in sol.val.atoms()) or nonnegative(sol):
        return True
    alt = solve_linear(pattern, Dim.atom(const("A")), unknown)
    return isinstance(alt, Dim) and nonnegative(alt)


def _when_negative(sol: Dim, actual: Dim) -> str:
    """When a solution that is not provably a size is negative: `negative where S is less than 4` for `S - 4`."""
    k = (actual - sol).as_int()
    if k is None or k <= 0:
        return "which may be negative"
    shown = format_dim(shown_value(actual))
    return f"negative where {shown if len(actual.terms) == 1 else f'`{shown}`'} is less than {k}"


def _dt(d: DType) -> str:
    from ..ops.registry import describe_dtype

    return describe_dtype(d)


def _prefix_text(prefix) -> str:
    var, dims = prefix
    parts = (["..."] if var is not None else []) + [format_dim(shown_value(d)) if d is not None else "?" for d in dims]
    return "[" + ", ".join(parts) + "]"
