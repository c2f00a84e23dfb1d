"""The dim algebra: dims are polynomials with integer coefficients over atoms.

Atoms are either dim variables (`B`, `S`: universally quantified, bound per call by
unification) or named constants (`c.hidden_size`, a module parameter `in_features`, the
load-time `max_positions`) whose value may be known (under a preset) or not. A `Dim` keeps
the form it was written in (`sym`, shown in hover as `c.hidden_size`) and compares by its
value (`val`: constants substituted, so `c.num_attention_heads * c.head_dim` equals `576`
under SmolLM2's preset). `/` is exact or refused: `divide` returns a `DivisionError` naming
both sides instead of rounding. Floor division, its remainder and ceil division
(`floor_divide`, `remainder`, `ceil_divide`: Python's `//`, `%` and `-(-a // b)`) are symbolic
too, so a convolution's output size `(H + 2 * p - k) // s + 1` is a dim: kept as written,
valued once its atoms are known, and compared through a canonical form in which the terms the
divisor divides are taken out (`(2 * a + r) // 2` is `a + r // 2`).

Printing never depends on other documents: factors are ordered by atom creation, and atoms
are created (and shared) per analysis of one document (semantics/configs.py).

Unknown dims (after an error) are represented by `None` in shapes, never by a Dim: they
match anything, which is what keeps one error from cascading.
"""

from __future__ import annotations

import decimal
import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Iterable

Monomial = tuple  # tuple[tuple[Atom, int], ...] sorted by atom key

_uid = itertools.count(1)


class Atom:
    """A symbol in a dim polynomial.

    kind: "var" (dim variable bound by a signature), "const" (a named constant, `value` may
    be known), "quot" (an exact quotient that is not a polynomial in its own right,
    e.g. `c.hidden_size / 2`; shown as written, valued when both sides are known), or one of
    `DIVISIONS` ("//", "%": a floor quotient or remainder, `args` its operands as written,
    `value` its canonical form, None when it is canonical itself).
    `origin` is an opaque reference to where the value came from (a preset field), used by
    diagnostics to label it. `alias`: the atom this one stands for when its value is not known (a
    config field written two ways, `c.d` and `cfg.d`: each prints as written, both are `alias` in
    `val`). `_key` orders the factors of a product when it is printed: an atom's id (the order atoms
    were made in), a written division's derived from its operands' (`derived_key`).
    """

    __slots__ = ("kind", "name", "uid", "value", "origin", "quot", "args", "alias", "_key", "__weakref__")

    def __init__(
        self,
        kind: str,
        name: str,
        value: "Dim | None" = None,
        origin=None,
        uid: int | None = None,
        quot: "tuple[Dim, Dim] | None" = None,
        args: "tuple[Dim, Dim] | None" = None,
    ):
        self.kind = kind
        self.name = name
        self.uid = next(_uid) if uid is None else uid
        self.value = value
        self.origin = origin
        self.quot = quot  # (numerator, denominator) of a quotient assumed exact
        self.args = args  # (numerator, denominator) of a floor quotient or remainder
        self.alias: Atom | None = None
        self._key = self.uid << _KEY_BITS  # creation order: factors print in the order they were written

    def __repr__(self) -> str:
        return self.name

    def __lt__(self, other: "Atom") -> bool:
        return self._key < other._key


# An atom's `_key` is its id shifted by this many bits; the room below orders the atoms made with one id (a config
# field's ways of writing it) or after one (a written division of it: `derived_key`).
_KEY_BITS = 64


def derived_key(key: int, text: str) -> int:
    """A sort key just after `key` (an atom's `_key`), the same in every process and run for the same `text`: the
    atoms that stand for `text` (a field written so, a division of operands so written) then print in one order
    whichever check made them first."""
    return key + 1 + (_fnv1a_64(text.encode("utf-8")) >> 2)


def _fnv1a_64(data: bytes) -> int:
    """The 64-bit FNV-1a hash of `data` (Fowler, Noll, Vo; http://www.isthe.com/chongo/tech/comp/fnv/): stable
    across processes, unlike `hash`, and without importing hashlib, which the language server's start leaves out
    (tests/lsp/test_startup.py)."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


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

    __slots__ = ("_t", "_val", "_sorted", "_hash", "_key", "_atoms")

    def __init__(self, terms: dict[Monomial, int] | None = None):
        self._t: dict[Monomial, int] = {m: c for m, c in terms.items() if c} if terms else {}
        self._val: Dim | None = None
        self._sorted = None
        self._hash = None
        self._key = None
        self._atoms: frozenset[Atom] | None = None

    @staticmethod
    def _raw(terms: dict[Monomial, int]) -> "Dim":
        d = Dim.__new__(Dim)
        d._t = terms
        d._val = d._sorted = d._hash = d._key = d._atoms = None
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
        v = self._val  # `val` computed before (the common case), without the property's call
        t = (v if v is not None else self.val)._t
        if not t:
            return 0
        if len(t) == 1:
            return t.get(())
        return None

    def is_int(self) -> bool:
        return self.as_int() is not None

    def atoms(self) -> frozenset[Atom]:
        """Every atom this dim is made of, those inside a written quotient or floor division
        included (`(H - 1) // 2` holds `H`). Computed once (a dim is immutable): the checker asks for it on
        every substitution."""
        if self._atoms is None:
            self._atoms = frozenset(self._collect_atoms())
        return self._atoms

    def _collect_atoms(self) -> set[Atom]:
        out: set[Atom] = set()
        for m in self._t:
            for a, _ in m:
                if a not in out:
                    out.add(a)
                    if a.args is not None:
                        out |= a.args[0].atoms() | a.args[1].atoms()
                    elif a.quot is not None:
                        out |= a.quot[0].atoms() | a.quot[1].atoms()
        return out

    def substitute(self, mapping: "dict[Atom, Dim]") -> "Dim":
        """This dim with atoms replaced by dims (`mapping`), inside floor divisions and
        remainders too (they are recomputed, and fold when their operands become known)."""
        if not mapping or not (self.atoms() & mapping.keys()):
            return self
        result = Dim()
        for mono, coeff in self._t.items():
            term = Dim.of(coeff)
            for a, p in mono:
                if a in mapping:
                    rep = mapping[a]
                elif a.args is not None and (a.args[0].atoms() | a.args[1].atoms()) & mapping.keys():
                    num, den = (x.substitute(mapping) for x in a.args)
                    rep = _ARG_FUNCTIONS[a.kind](num, den)
                    if isinstance(rep, DivisionError):
                        rep = Dim.atom(_division_atom(a.kind, num, den, None))
                else:
                    rep = Dim.atom(a)
                term = term * rep**p
            result = result + term
        return result

    @property
    def val(self) -> "Dim":
        """This dim with every known constant substituted (recursively), and quotients of
        unknown values cancelled where the rest of their term is a multiple of the
        denominator (`2 * (h / 2)` is `h`, `c.heads * (c.hidden / c.heads)` is `c.hidden`:
        the quotient was accepted as exact when it was written)."""
        if self._val is None:
            if len(self._t) == 1:
                # one atom to the power one (a config field, `c.hidden_size`: the checker asks each dim of every
                # tensor type it writes whether it is negative): its value's own, computed once per value
                ((mono, coeff),) = self._t.items()
                if coeff == 1 and len(mono) == 1 and mono[0][1] == 1:
                    a = mono[0][0]
                    if a.value is not None:
                        self._val = a.value.val
                        return self._val
                    if a.alias is not None:
                        self._val = Dim.atom(a.alias)
                        return self._val
            if not any(a.value is not None or a.quot is not None or a.alias is not None for m in self._t for a, _ in m):
                self._val = self
            else:
                result = Dim()
                for mono, coeff in self._t.items():
                    term = _cancel_quotient(mono, coeff)
                    if term is None:
                        term = Dim.of(coeff)
                        quotient = False  # an atom's value holds a quotient of unknowns
                        for a, p in mono:
                            if a.value is not None:
                                base = a.value.val
                                quotient = quotient or any(_unknown_quotient(m) for m in base._t)
                            else:
                                base = Dim.atom(a.alias if a.alias is not None else a)
                            term = term * base**p
                        if quotient:  # a field derived from unknown ones (`c.heads * c.head_dim` is `c.hidden`)
                            term = _cancel_quotients(term)
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
        if len(other._t) == 1 and () in other._t:  # by a constant (`val` and `__pow__` start from one): scale
            return self._scaled(other._t[()])
        if len(self._t) == 1 and () in self._t:
            return other._scaled(self._t[()])
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

    def _scaled(self, c: int) -> "Dim":
        """This dim times the integer `c` (not zero: a constant dim has no zero term)."""
        if c == 1:
            return self  # immutable: shared, with its cached value
        return Dim._raw({m: c * k for m, k in self._t.items()})

    def __pow__(self, n: int) -> "Dim":
        if n == 1:  # almost every power in `val` and `substitute`
            return self
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


def _cancel_quotient(mono: Monomial, coeff: int) -> Dim | None:
    """The value of the term `coeff * mono` when it holds a quotient of unknown value whose
    denominator divides the rest of the term: `rest / den * num`; else None."""
    for a, p in mono:
        if a.value is None and a.quot is not None and p == 1:
            num, den = a.quot
            rest = Dim._raw({tuple(x for x in mono if x[0] is not a): coeff}).val
            q = _poly_div(rest, den.val)
            if q is not None:
                return q * num.val
    return None


def _unknown_quotient(mono: Monomial) -> bool:
    """Whether `mono` holds a quotient of unknown value (what `_cancel_quotient` cancels)."""
    return any(a.value is None and a.quot is not None for a, _ in mono)


def _cancel_quotients(d: Dim) -> Dim:
    """`d` (a value: no known constants left) with each term's quotient of unknown value cancelled where the rest of
    the term is a multiple of its denominator (`_cancel_quotient`)."""
    result = Dim()
    for mono, coeff in d._t.items():
        term = _cancel_quotient(mono, coeff) if _unknown_quotient(mono) else None
        result = result + (term if term is not None else Dim._raw({mono: coeff}))
    return result


def _term_order(term):
    mono, _ = term
    return (-sum(p for _, p in mono), [(a._key, p) for a, p in mono])


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
    """One atom per written quotient, so `n / 2` equals `n / 2` wherever it is written. A quotient of unknown value
    whose operands are not their values (a config field written one of its ways, `k.d / k.e`) is `alias` of the
    quotient of the values (`d / 4`), so that it equals `c.d / c.e` and `c.d / 4` of the same values and prints as
    written."""
    key = (num.key(), den.key(), value.key() if value is not None else None)
    atom = _QUOTIENTS.get(key)
    if atom is None:
        atom = Atom("quot", _quot_name(num, den), value=value, quot=(num, den))
        atom._key = _division_key(atom, num, den)
        if value is None:
            nv, dv = num.val, den.val  # no aliases nor known values left: the alias is its own value
            if (nv.key(), dv.key()) != (num.key(), den.key()):
                atom.alias = _quot_atom(nv, dv, None)
        _QUOTIENTS[key] = atom
    return atom


def _division_key(atom: Atom, num: Dim, den: Dim) -> int:
    """A written division's sort key: just after its operands' last atom (`derived_key` of its text), not the order
    it was first written in (which is the order of the checks: a quotient made first in another item, or another
    process, printed its products in another order)."""
    last = max((a._key for a in num.atoms() | den.atoms()), default=0)
    value = format_dim(atom.value) if atom.value is not None else ""
    return derived_key(last, f"{atom.kind} {atom.name} {value}")


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


# ----------------------------------------------------------------------------- floor division


def floor_divide(num: Dim, den: Dim) -> Dim | DivisionError:
    """`num // den`, Python's floor division (the quotient rounded toward minus infinity).

    An int when both values are known; otherwise the terms of `num` that `den` divides
    exactly are taken out and the rest stays a written floor division, valued when its atoms
    are (`(H + 2 * p - k) // s`). Refused (a DivisionError) only for a zero divisor."""
    return _division("//", num, den)


def remainder(num: Dim, den: Dim) -> Dim | DivisionError:
    """`num % den`, Python's modulo: `num - den * (num // den)`, with the divisor's sign."""
    return _division("%", num, den)


def ceil_divide(num: Dim, den: Dim) -> Dim | DivisionError:
    """Ceil division, `-(-num // den)` (how it is written in Linnet and in Python): the
    output size of a pooling window with `ceil_mode`, the number of blocks covering `num`."""
    q = floor_divide(-num, den)
    return q if isinstance(q, DivisionError) else -q


def _division(kind: str, num: Dim, den: Dim) -> Dim | DivisionError:
    dv = den.val
    if not dv._t:
        return DivisionError(num, den, "division by zero")
    value = _CANONICAL[kind](num.val, dv)
    if _int(num) is not None and _int(den) is not None:
        return value  # literals: the number itself
    if kind == "//":
        split = _split(num, den)
        if split is not None and not split[1]._t:
            return split[0]  # the written operands divide exactly: `(2 * S) // 2` is `S`
    if len(value._t) == 1:
        ((mono, coeff),) = value._t.items()
        if coeff == 1 and len(mono) == 1 and mono[0][1] == 1:
            a = mono[0][0]
            if a.kind == kind and a.value is None and a.args == (num, den):
                return value  # written as its canonical form: one atom, not two
    return Dim.atom(_division_atom(kind, num, den, value))


def _split(num: Dim, den: Dim) -> tuple[Dim, Dim] | None:
    """(q, r) with `num == q * den + r`, q holding the terms of `num` that `den` (a single
    term) divides exactly; None when `den` has several terms."""
    if len(den._t) != 1:
        return None
    ((dm, dc),) = den._t.items()
    q: dict[Monomial, int] = {}
    r: dict[Monomial, int] = {}
    for m, c in num._t.items():
        qm = _mono_div(m, dm)
        if qm is not None and c % dc == 0:
            q[qm] = q.get(qm, 0) + c // dc
        else:
            r[m] = c
    return Dim(q), Dim(r)


def _canonical_floor(num: Dim, den: Dim) -> Dim:
    """The canonical form of `num // den` for canonical (`.val`) operands, `den` not zero.
    Atoms are integers, so `floor((q * den + r) / den)` is `q + floor(r / den)`: an int
    divisor reduces every coefficient modulo itself (`(2 * a + 5) // 2` is `a + 2`, the
    constant rest 1 lying in [0, 2)), a one-term divisor takes out the terms it divides; what
    remains is one `r // den` atom, shared by equal operands."""
    n, d = _int(num), _int(den)
    if n is not None and d is not None:
        return Dim.of(n // d)
    if d is not None:
        q: dict[Monomial, int] = {}
        r: dict[Monomial, int] = {}
        for m, c in num._t.items():
            q[m], r[m] = divmod(c, d)
        rest = Dim(r)
        if _int(rest) is not None:
            return Dim(q)  # a constant rest lies in [0, d) (or (d, 0]): its floor quotient is 0
        return Dim(q) + Dim.atom(_division_atom("//", rest, den, None))
    split = _split(num, den)
    if split is None:
        return Dim.of(1) if num._t == den._t else Dim.atom(_division_atom("//", num, den, None))
    q_dim, rest = split
    if not rest._t:
        return q_dim
    return q_dim + Dim.atom(_division_atom("//", rest, den, None))


def _canonical_remainder(num: Dim, den: Dim) -> Dim:
    """`num % den` as `num - den * (num // den)`, so that `a == b * (a // b) + a % b` holds
    symbolically."""
    n, d = _int(num), _int(den)
    if n is not None and d is not None:
        return Dim.of(n % d)
    return num - den * _canonical_floor(num, den)


_CANONICAL = {"//": _canonical_floor, "%": _canonical_remainder}
_DIVISION_FUNCTIONS = {"//": floor_divide, "%": remainder}


def minimum(a: Dim, b: Dim) -> Dim:
    """`min(a, b)`: what a slice's bound is once clamped to its dim's size (`x[:, :4]` of `[B, S]` has
    `min(4, S)` elements, as numpy, torch, JAX and ONNX read it). The smaller one when their difference is a known
    number or has one sign for every value of its atoms (`nonnegative`: `S` and `S + 1`); else one written atom,
    `min(4, S)`, the same wherever it is written, valued when its operands are."""
    av, bv = a.val, b.val
    diff = bv - av
    if nonnegative(diff):
        return a
    if nonnegative(-diff):
        return b
    value = None if (av.key(), bv.key()) == (a.key(), b.key()) else minimum(av, bv)
    key = ("min", a.key(), b.key(), value.key() if value is not None else None)
    atom = _DIVISION_ATOMS.get(key)
    if atom is None:
        atom = Atom("min", f"min({format_dim(a)}, {format_dim(b)})", value=value, args=(a, b))
        atom._key = _division_key(atom, a, b)
        _DIVISION_ATOMS[key] = atom
    return Dim.atom(atom)


def nonnegative(d: Dim) -> bool:
    """Whether `d` is at least 0 for every value of its atoms, which are sizes: a dim variable at least 1 (a tensor
    has a row, a sequence a token: `S - 1` is at least 0), the rest (int parameters, quotients and minima of sizes)
    at least 0. True when `d`, with each dim variable `S` written `1 + s`, has no negative coefficient, once each
    `min(a, b)` it adds or subtracts is replaced by its operands (`_without_minima`): `S - min(4, S)` is at least 0
    since `S - S` is, and `min(6, S) - min(2, S)` since both `6 - min(2, S)` and `S - min(2, S)` are."""
    return _without_minima(d.val, 6)


def negative(d: Dim) -> bool:
    """Whether `d` is below 0 for every value of its atoms, which are sizes (`nonnegative`): `-A`, `-A - 1` and
    `A - 2 * A` are, a dim variable being at least 1; `N - K` and `-k` (an int, which may be 0) are not."""
    return nonnegative(-d - _SMALL[1])


def _without_minima(v: Dim, depth: int) -> bool:
    """`nonnegative` of `v` (a `val`). A `min(a, b)` added (a positive coefficient) is one of its operands, so `v` is
    at least 0 if it is with either operand in its place; one subtracted is at most either operand, so `v` is at
    least 0 if it is with one of them in its place. The added ones are split first: the operands of a subtracted
    `min` that one of them matches (`S - min(2, S)` once `min(6, S)` is `S`) then cancel. Minima are replaced
    before dim variables are shifted to `1 + s`: a `min` remade of shifted operands would compare them as if
    each variable were at least 2."""
    if all(c >= 0 for c in v._t.values()):
        return True  # minima, like every atom, are at least 0
    linear = [(m, c) for m, c in v._t.items() if len(m) == 1 and m[0][1] == 1 and m[0][0].kind == "min"]
    if not linear:
        if any(a.kind == "min" for a in v.atoms()):
            return False  # a minimum inside a product or a floor division: not bounded here
        shift = {a: Dim.atom(a) + _SMALL[1] for a in v.atoms() if a.kind == "var"}
        # `.val` again: a floor quotient remade of shifted operands is written `(H + 2) // 2`, whose canonical form
        # takes the 1 out (`H // 2 + 1`), so `(H - 1) // 2`, canonically `(H + 1) // 2 - 1`, is at least 0
        return _no_negative_term(v.substitute(shift).val if shift else v, 4)
    if depth == 0:
        return False
    mono, c = next(((m, c) for m, c in linear if c > 0), linear[0])
    rest = Dim({m: n for m, n in v._t.items() if m != mono})
    cases = (_without_minima(rest + arg.val * Dim.of(c), depth - 1) for arg in mono[0][0].args)
    return all(cases) if c > 0 else any(cases)


def _no_negative_term(p: Dim, depth: int) -> bool:
    """Whether `p` has no negative coefficient once each floor quotient it subtracts, `n // k` (`k` a positive
    number), is replaced by what bounds it above, `n / k` (`p` multiplied by `k`): `H - (H + 1) // 2` is at least
    0 since `2 * H - (H + 1)` is, with `H` at least 1."""
    if all(c >= 0 for c in p._t.values()):
        return True
    if depth == 0:
        return False
    for mono, c in p._t.items():
        if c < 0 and len(mono) == 1 and mono[0][1] == 1:
            a = mono[0][0]
            k = a.args[1].as_int() if a.kind == "//" and a.args is not None else None
            if k is not None and k > 0:
                rest = Dim({m: n for m, n in p._t.items() if m != mono})
                return _no_negative_term(rest * Dim.of(k) + a.args[0] * Dim.of(c), depth - 1)
    return False


# What an atom with `args` is made from its operands by (`Dim.substitute` makes it again from new operands).
_ARG_FUNCTIONS = {**_DIVISION_FUNCTIONS, "min": minimum}
DIVISIONS = tuple(_CANONICAL)
_DIVISION_ATOMS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def _division_atom(kind: str, num: Dim, den: Dim, value: Dim | None) -> Atom:
    """One atom per written floor division (or remainder) and value, so that `n // 2` is the
    same atom wherever it is written."""
    key = (kind, num.key(), den.key(), value.key() if value is not None else None)
    atom = _DIVISION_ATOMS.get(key)
    if atom is None:
        atom = Atom(kind, f"{_operand(num, False)} {kind} {_operand(den, True)}", value=value, args=(num, den))
        atom._key = _division_key(atom, num, den)
        _DIVISION_ATOMS[key] = atom
    return atom


def _operand(d: Dim, right: bool) -> str:
    """An operand of a written `//` or `%`, parenthesised where Linnet's (and Python's)
    precedence needs it: a sum, a product or negation, a division on the right."""
    s = format_dim(d)
    terms = d.terms
    if len(terms) > 1:
        return f"({s})"
    if not terms:
        return s
    mono, coeff = terms[0]
    if not mono:
        return f"({s})" if coeff < 0 and right else s
    single = sum(p for _, p in mono) == 1
    compound = any(a.kind == "quot" or a.args is not None for a, _ in mono)
    if single and coeff == -1 and not right and not compound:
        return s  # `-S // 2` is `(-S) // 2`: unary minus binds tighter, in Linnet as in Python
    if coeff != 1 or not single or (right and compound):
        return f"({s})"
    return s


# Past this many bits an int is described by its length, not written out: decimal conversion is quadratic (Python
# refuses `str()` past 4,300 digits, `sys.get_int_max_str_digits`, for that reason); 65,536 bits is ~19,700 digits,
# written in ~5 ms.
MAX_WRITTEN_BITS = 65536


def int_text(n: int) -> str:
    """`n` in decimal, also past Python's limit on `str(int)` (4,300 digits), which raised ValueError from a
    diagnostic's message; past MAX_WRITTEN_BITS, its length (`a 30,103-digit int`)."""
    try:
        return str(n)
    except ValueError:  # past sys.get_int_max_str_digits()
        if n.bit_length() > MAX_WRITTEN_BITS:
            return f"a {digit_count(n):,}-digit int"
        return str(decimal.Decimal(n))  # decimal's conversion has no such limit


def digit_count(n: int) -> int:
    """How many decimal digits `abs(n)` has (n != 0), without writing it out."""
    n = abs(n)
    digits = int(n.bit_length() * math.log10(2))  # this many or one more
    return digits + (n >= 10**digits)


def shown_value(d: Dim) -> Dim:
    """`d.val` as a message shows it: a config field of unknown value as `d` writes it (`cfg.d`), not as the atom
    its ways of writing stand for (`Atom.alias`)."""
    v = d.val
    back = {a.alias: Dim.atom(a) for a in d.atoms() if a.alias is not None}
    return v.substitute(back) if back else v


def format_dim(d: Dim | None) -> str:
    """Render a dim in Linnet notation (which is also Python's): `B`, `576`, `2 * S + 1`,
    `c.hidden_size / 2`, `(H - 1) // 2 + 1`."""
    if d is None:
        return "?"
    if not d.terms:
        return "0"
    parts = []
    for i, (mono, coeff) in enumerate(d.terms):
        factors = []
        # a written division inside a product, or negated in front, keeps its parentheses
        alone = sum(p for _, p in mono) == 1 and abs(coeff) == 1 and not (i == 0 and coeff < 0)
        for a, p in mono:
            divided = a.kind == "quot" or (a.args is not None and a.kind != "min")
            name = f"({a.name})" if divided and not alone else a.name
            factors.extend([name] * p)
        mag = abs(coeff)
        if not factors:
            body = int_text(mag)
        elif mag == 1:
            body = " * ".join(factors)
        else:
            body = " * ".join([int_text(mag)] + factors)
        if i == 0:
            parts.append(("-" if coeff < 0 else "") + body)
        else:
            parts.append(("- " if coeff < 0 else "+ ") + body)
    return " ".join(parts)


def format_division(numerator: Dim | None, denominator: Dim | None) -> str:
    """`numerator / denominator` as a message writes it: an operand of more than one term or factor in parentheses
    (`(c.n - 1) / 2`; without them it read `c.n - 1 / 2`, another expression)."""

    def operand(d: Dim | None) -> str:
        text = format_dim(d)
        return f"({text})" if " " in text else text

    return f"{operand(numerator)} / {operand(denominator)}"


def solve_linear(pattern: Dim, target: Dim, unknown: Atom) -> Dim | DivisionError | None:
    """Solve `pattern == target` for `unknown` when `pattern` is `k * unknown + rest` with no
    other occurrence of `unknown`. Returns None when `pattern` is not of that form."""
    terms = pattern.val._t
    if len(terms) == 1:  # `pattern` is `unknown` itself (most dims of a signature): what the loop below returns
        ((mono, coeff),) = terms.items()
        if coeff == 1 and len(mono) == 1 and mono[0][0] is unknown and mono[0][1] == 1:
            return target
    k = Dim()
    rest: dict[Monomial, int] = {}
    for mono, coeff in pattern.val.terms:
        powers = dict(mono)
        p = powers.get(unknown, 0)
        if any(
            a is not unknown and (a.args is not None or a.quot is not None) and unknown in Dim.atom(a).atoms()
            for a in powers
        ):
            return None  # also inside a floor division: not linear
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
    if not rest and k._t == {(): 1}:  # `pattern` is `unknown` itself (most dims of a signature): no division
        return target
    return divide(target - Dim(rest), k)


def product(dims: Iterable[Dim | None]) -> Dim | None:
    result = Dim.of(1)
    for d in dims:
        if d is None:
            return None
        result = result * d
    return result


def dim_variables(d: Dim) -> set[str]:
    """The names of the dim variables (`B`, `S`, `N`) a dim is made of, those inside a written
    division included: what `evaluate` needs sizes for."""
    return {a.name for a in d.val.atoms() if a.kind == "var"}


def evaluate(d: Dim, sizes: dict[str, int]) -> int:
    """The integer value of `d` with its dim variables set by `sizes` (`{"B": 2, "S": 8}`),
    computed by the algebra itself (never by evaluating the dim's text): known constants are
    substituted, and `//` and `%` are Python's (an exact `/` never holds a dim variable: the
    checker refuses one it cannot prove exact).

    Raises ValueError naming what is missing: a dim variable `sizes` lacks (the message lists
    them, sorted), or a constant with no known value."""
    missing = sorted(dim_variables(d) - sizes.keys())
    if missing:
        raise ValueError(f"dim `{format_dim(d)}` needs a size for {', '.join(missing)}")
    total = 0
    for mono, coeff in d.val._t.items():
        term = coeff
        for a, p in mono:
            term *= _atom_value(a, sizes) ** p
        total += term
    return total


def _atom_value(a: Atom, sizes: dict[str, int]) -> int:
    """The integer an atom stands for under `sizes` (see `evaluate`)."""
    if a.kind == "var":
        return sizes[a.name]
    if a.value is not None:
        return evaluate(a.value, sizes)
    if a.args is not None and a.kind == "min":  # a slice bound clamped to its dim's size
        return min(evaluate(x, sizes) for x in a.args)
    if a.args is not None:  # a written floor division or remainder
        num, den = (evaluate(x, sizes) for x in a.args)
        if den == 0:
            raise ValueError(f"`{a.name}` divides by zero")
        return num // den if a.kind == "//" else num % den
    raise ValueError(f"`{a.name}` has no known value")
