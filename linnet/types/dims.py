"""The dim algebra: dims are polynomials with integer coefficients over atoms.

Atoms are either dim variables (`B`, `S`: universally quantified, bound per call by
unification) or named constants (`c.hidden_size`, a module parameter `in_features`, the
load-time `max_positions`) whose value may be known (under a preset) or not. A `Dim` keeps
the form it was written in (`sym`, shown in hover as `c.hidden_size`) and compares by its
value (`val`: constants substituted, so `c.num_attention_heads * c.head_dim` equals `576`
under SmolLM2's preset). Division is exact or refused: `divide` returns a `DivisionError`
naming both sides instead of rounding.

Unknown dims (after an error) are represented by `None` in shapes, never by a Dim: they
match anything, which is what keeps one error from cascading.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Iterable

Monomial = tuple  # tuple[tuple[Atom, int], ...] sorted by atom key

_uid = itertools.count(1)


class Atom:
    """A symbol in a dim polynomial.

    kind: "var" (dim variable bound by a signature), "const" (a named constant, `value` may
    be known) or "quot" (an exact quotient that is not a polynomial in its own right,
    e.g. `c.hidden_size / 2`; shown as written, valued when both sides are known).
    `origin` is an opaque reference to where the value came from (a preset field), used by
    diagnostics to label it.
    """

    __slots__ = ("kind", "name", "uid", "value", "origin", "quot", "_key", "__weakref__")

    def __init__(
        self,
        kind: str,
        name: str,
        value: "Dim | None" = None,
        origin=None,
        uid: int | None = None,
        quot: "tuple[Dim, int] | None" = None,
    ):
        self.kind = kind
        self.name = name
        self.uid = next(_uid) if uid is None else uid
        self.value = value
        self.origin = origin
        self.quot = quot  # (numerator, integer denominator) of a quotient assumed exact
        self._key = self.uid  # creation order: factors print in the order they were written

    def __repr__(self) -> str:
        return self.name

    def __lt__(self, other: "Atom") -> bool:
        return self._key < other._key


def var(name: str) -> Atom:
    return Atom("var", name)


def const(name: str, value: "Dim | int | None" = None, origin=None, uid: int | None = None) -> Atom:
    if isinstance(value, int):
        value = Dim.of(value)
    return Atom("const", name, value, origin, uid)


def new_uid() -> int:
    """A fresh atom id; ids order the factors of a product when it is printed."""
    return next(_uid)


class Dim:
    """An immutable polynomial over atoms with integer coefficients.

    Terms are kept in a dict (monomial -> coefficient, no zeros); comparisons use the dict,
    and the canonical order is computed only to print or hash."""

    __slots__ = ("_t", "_val", "_sorted", "_hash", "_key")

    def __init__(self, terms: dict[Monomial, int] | None = None):
        self._t: dict[Monomial, int] = {m: c for m, c in terms.items() if c} if terms else {}
        self._val: Dim | None = None
        self._sorted = None
        self._hash = None
        self._key = None

    @staticmethod
    def _raw(terms: dict[Monomial, int]) -> "Dim":
        d = Dim.__new__(Dim)
        d._t = terms
        d._val = d._sorted = d._hash = d._key = None
        return d

    # ----- constructors
    @staticmethod
    def of(n: int) -> "Dim":
        d = _SMALL.get(n)
        if d is None:
            d = Dim._raw({(): n} if n else {})
        return d

    @staticmethod
    def atom(a: Atom) -> "Dim":
        return Dim._raw({((a, 1),): 1})

    @property
    def terms(self) -> tuple[tuple[Monomial, int], ...]:
        """The terms in canonical order (highest degree first, then atoms by creation)."""
        if self._sorted is None:
            self._sorted = tuple(sorted(self._t.items(), key=_term_order))
        return self._sorted

    # ----- inspection
    def as_int(self) -> int | None:
        """The integer this dim equals after substituting known constants, else None."""
        t = self.val._t
        if not t:
            return 0
        if len(t) == 1:
            return t.get(())
        return None

    def is_int(self) -> bool:
        return self.as_int() is not None

    def atoms(self) -> set[Atom]:
        return {a for m in self._t for a, _ in m}

    @property
    def val(self) -> "Dim":
        """This dim with every known constant substituted (recursively), and quotients of
        unknown values cancelled where a coefficient is a multiple of the denominator
        (`2 * (h / 2)` is `h`: the quotient was accepted as exact when it was written)."""
        if self._val is None:
            if not any(a.value is not None or a.quot is not None for m in self._t for a, _ in m):
                self._val = self
            else:
                result = Dim()
                for mono, coeff in self._t.items():
                    term = Dim.of(coeff)
                    cancelled = None
                    for a, p in mono:
                        if a.value is None and a.quot is not None and p == 1 and coeff % a.quot[1] == 0:
                            cancelled = a
                            term = Dim.of(coeff // a.quot[1]) * a.quot[0].val
                            break
                    for a, p in mono:
                        if a is cancelled:
                            continue
                        base = a.value.val if a.value is not None else Dim.atom(a)
                        for _ in range(p):
                            term = term * base
                    result = result + term
                self._val = result
        return self._val

    def same(self, other: "Dim") -> bool:
        """Equal values (the comparison the checker uses)."""
        return self.val._t == other.val._t

    def key(self):
        if self._key is None:
            self._key = frozenset(self._t.items())
        return self._key

    # ----- arithmetic
    def __add__(self, other: "Dim") -> "Dim":
        out = dict(self._t)
        for m, c in other._t.items():
            v = out.get(m, 0) + c
            if v:
                out[m] = v
            else:
                out.pop(m, None)
        return Dim._raw(out)

    def __sub__(self, other: "Dim") -> "Dim":
        out = dict(self._t)
        for m, c in other._t.items():
            v = out.get(m, 0) - c
            if v:
                out[m] = v
            else:
                out.pop(m, None)
        return Dim._raw(out)

    def __neg__(self) -> "Dim":
        return Dim._raw({m: -c for m, c in self._t.items()})

    def __mul__(self, other: "Dim") -> "Dim":
        out: dict[Monomial, int] = {}
        for m1, c1 in self._t.items():
            for m2, c2 in other._t.items():
                m = _mono_mul(m1, m2) if m1 and m2 else (m1 or m2)
                v = out.get(m, 0) + c1 * c2
                if v:
                    out[m] = v
                else:
                    out.pop(m, None)
        return Dim._raw(out)

    def __pow__(self, n: int) -> "Dim":
        result = Dim.of(1)
        for _ in range(n):
            result = result * self
        return result

    def __repr__(self) -> str:
        return format_dim(self)

    def __eq__(self, other) -> bool:  # structural (symbolic) equality
        return isinstance(other, Dim) and self._t == other._t

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self.key())
        return self._hash


_SMALL = {n: Dim._raw({(): n} if n else {}) for n in range(-8, 257)}


def _term_order(term):
    mono, _ = term
    return (-sum(p for _, p in mono), [(a.uid, p) for a, p in mono])


def _mono_mul(m1: Monomial, m2: Monomial) -> Monomial:
    powers: dict[Atom, int] = dict(m1)
    for a, p in m2:
        powers[a] = powers.get(a, 0) + p
    return tuple(sorted(powers.items(), key=lambda ap: ap[0]._key))


def _mono_div(m1: Monomial, m2: Monomial) -> Monomial | None:
    powers: dict[Atom, int] = dict(m1)
    for a, p in m2:
        have = powers.get(a, 0)
        if have < p:
            return None
        if have == p:
            del powers[a]
        else:
            powers[a] = have - p
    return tuple(sorted(powers.items(), key=lambda ap: ap[0]._key))


@dataclass(slots=True)
class DivisionError:
    """`numerator / denominator` is not exact (or not provably so)."""

    numerator: Dim
    denominator: Dim
    reason: str


def _poly_div(num: Dim, den: Dim) -> Dim | None:
    """Exact quotient when `den` is a single term dividing every term of `num`."""
    if len(den._t) != 1:
        if num._t == den._t and num._t:
            return Dim.of(1)
        return None
    ((dm, dc),) = den._t.items()
    if dc == 0:
        return None
    out: dict[Monomial, int] = {}
    for m, c in num._t.items():
        if c % dc:
            return None
        q = _mono_div(m, dm)
        if q is None:
            return None
        out[q] = out.get(q, 0) + c // dc
    return Dim(out)


def divide(num: Dim, den: Dim) -> Dim | DivisionError:
    """Exact division. The result keeps a symbolic form (`c.hidden_size / 2`) when the
    written operands don't divide symbolically but their values do."""
    dv = den.val
    if not dv.terms:
        return DivisionError(num, den, "division by zero")
    nv = num.val
    value = _poly_div(nv, dv)
    if value is None:
        n_int, d_int = _int(nv), _int(dv)
        if n_int is not None and d_int is not None:
            return DivisionError(num, den, f"{n_int} is not divisible by {d_int}")
        free = {a for a in nv.atoms() | dv.atoms() if a.kind == "var"}
        if free:
            return DivisionError(num, den, "not provably exact")
        # Only constants of unknown value: keep an opaque quotient.
        return Dim.atom(_quot_atom(num, den, None))
    sym = _poly_div(num, den)
    if sym is not None:
        return sym
    return Dim.atom(_quot_atom(num, den, value))


_QUOTIENTS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def _quot_atom(num: Dim, den: Dim, value: Dim | None) -> Atom:
    """One atom per written quotient, so `n / 2` equals `n / 2` wherever it is written."""
    key = (num.key(), den.key(), value.key() if value is not None else None)
    atom = _QUOTIENTS.get(key)
    if atom is None:
        d = _int(den.val)
        atom = Atom("quot", _quot_name(num, den), value=value, quot=(num, d) if d else None)
        _QUOTIENTS[key] = atom
    return atom


def _int(d: Dim) -> int | None:
    if not d._t:
        return 0
    if len(d._t) == 1:
        return d._t.get(())
    return None


def _quot_name(num: Dim, den: Dim) -> str:
    def wrap(d: Dim) -> str:
        s = format_dim(d)
        return f"({s})" if len(d.terms) > 1 or (d.terms and len(d.terms[0][0]) + (d.terms[0][1] != 1) > 1) else s

    return f"{wrap(num)} / {wrap(den)}"


def format_dim(d: Dim | None) -> str:
    """Render a dim in Linnet notation: `B`, `576`, `2 * S + 1`, `c.hidden_size / 2`."""
    if d is None:
        return "?"
    if not d.terms:
        return "0"
    parts = []
    for i, (mono, coeff) in enumerate(d.terms):
        factors = []
        for a, p in mono:
            name = f"({a.name})" if a.kind == "quot" and len(mono) + (abs(coeff) != 1) > 1 else a.name
            factors.extend([name] * p)
        mag = abs(coeff)
        if not factors:
            body = str(mag)
        elif mag == 1:
            body = " * ".join(factors)
        else:
            body = " * ".join([str(mag)] + factors)
        if i == 0:
            parts.append(("-" if coeff < 0 else "") + body)
        else:
            parts.append(("- " if coeff < 0 else "+ ") + body)
    return " ".join(parts)


def solve_linear(pattern: Dim, target: Dim, unknown: Atom) -> Dim | DivisionError | None:
    """Solve `pattern == target` for `unknown` when `pattern` is `k * unknown + rest` with no
    other occurrence of `unknown`. Returns None when `pattern` is not of that form."""
    k = Dim()
    rest: dict[Monomial, int] = {}
    for mono, coeff in pattern.val.terms:
        powers = dict(mono)
        p = powers.get(unknown, 0)
        if p == 0:
            rest[mono] = rest.get(mono, 0) + coeff
        elif p == 1:
            del powers[unknown]
            m = tuple(sorted(powers.items(), key=lambda ap: ap[0]._key))
            k = k + Dim({m: coeff})
        else:
            return None
    if not k.terms:
        return None
    return divide(target - Dim(rest), k)


def product(dims: Iterable[Dim | None]) -> Dim | None:
    result = Dim.of(1)
    for d in dims:
        if d is None:
            return None
        result = result * d
    return result
