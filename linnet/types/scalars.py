"""Compile-time scalars: the one definition of Linnet's operators on ints, floats and bools.

Config fields (`semantics/configs.py`), the checker's folding of function bodies
(`semantics/expressions.py`) and lowering (`ir/lower.py`) all compute with these functions,
so `-7.5 % 2.0` is the same number wherever it is written; the tensor ops an operator lowers
to (`mod`, `floor_divide`, ...) compute the same thing on every backend (tests/types,
tests/compiler). The semantics are Python's, which are also PyTorch's and JAX's
(`torch.remainder`, `torch.floor_divide`, `jnp.remainder`, `jnp.floor_divide`):

- ints are exact and unbounded (up to `MAX_INT_BITS`), and may be symbolic: a `Dim`
  (`c.hidden_size`, `S`), so `+ - * // %` on dims stay dims;
- `a / b` on two ints is exact division: the quotient when `b` divides `a`, else an error
  (`inexact`); there is no rounding `/` on ints (write `//`);
- `a // b` is floor division and `a % b` its remainder, which has the divisor's sign
  (`-7 // 2 == -4`, `-7 % 2 == 1`, `7.5 // -2.0 == -4.0`, `-7.5 % 2.0 == 0.5`), on ints and
  floats alike; `a == b * (a // b) + a % b`;
- `a ** b` on ints with `b >= 0` is an int; with `b < 0` a float (`2 ** -1 == 0.5`);
- an int meeting a float is converted to float; float results must be finite reals;
- comparisons compare values (an int and a float by value); on symbolic dims they are known
  only where the difference is a known number (`S + 1 > S`).

Conversions (`CONVERSIONS`, called as functions in configs and bodies): `int(x)` truncates a
float toward zero, as Python's `int()` does (`int(2.9) == 2`, `int(-2.9) == -2`; Phi-3's
`int(head_dim * partial_rotary_factor)` in transformers), and keeps an int; `len(xs)` is the
length of a list. Neither takes a bool or a str.

Division by zero is an error for every operator and kind (`zero`), not an infinity.
Errors are `ScalarError`s with a `kind`; each caller turns them into its own diagnostic
(a config value, a function body) or exception (lowering).
"""

from __future__ import annotations

import math
import operator

from .dims import Dim, DivisionError, digit_count, divide, floor_divide, format_dim, format_division, remainder

ARITHMETIC = ("+", "-", "*", "/", "//", "%", "**")
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
MAX_INT_BITS = 4096  # compile-time ints beyond this are refused rather than computed

Int = int | Dim
_RING = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_DIM_DIVISIONS = {"/": divide, "//": floor_divide, "%": remainder}
_PYTHON = _RING | {"/": operator.truediv, "//": operator.floordiv, "%": operator.mod, "**": operator.pow}


class ScalarError(Exception):
    """An operator has no value for these operands.

    kind: "zero" (a divisor is zero), "inexact" (`/` of ints that don't divide; `division`
    holds the dims' DivisionError), "nonfinite" (no finite real float), "too_large" (an int
    over MAX_INT_BITS), "operands" (not numbers)."""

    def __init__(self, kind: str, message: str, division: DivisionError | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.division = division


def is_int(v) -> bool:
    return isinstance(v, Dim) or (isinstance(v, int) and not isinstance(v, bool))


def is_number(v) -> bool:
    return is_int(v) or isinstance(v, float)


def known_int(v: Int) -> int | None:
    """The Python int an int value equals, None when it is symbolic."""
    return v.as_int() if isinstance(v, Dim) else v


def arithmetic(op: str, a, b):
    """`a op b` for `op` in ARITHMETIC, on known operands: ints (Python ints or Dims) and
    floats. Returns a Python int when both are Python ints, a Dim when an int operand is a
    Dim, a float when either is a float; None when the value cannot be known at compile time
    (a symbolic dim meeting a float, an int power with a symbolic exponent). Raises
    ScalarError."""
    if op not in ARITHMETIC:
        raise ScalarError("operands", f"`{op}` is not an arithmetic operator on numbers")
    if not (is_number(a) and is_number(b)):
        raise ScalarError("operands", f"`{op}` needs numbers")
    if is_int(a) and is_int(b):
        return _int_arithmetic(op, a, b)
    x, y = _float(a), _float(b)
    if x is None or y is None:
        return None
    return _float_arithmetic(op, x, y)


def _float(v) -> float | None:
    if isinstance(v, Dim):
        n = v.as_int()
        return float(n) if n is not None else None
    return float(v)


def _int_arithmetic(op: str, a: Int, b: Int):
    plain = not isinstance(a, Dim) and not isinstance(b, Dim)
    if op == "**":
        return _int_power(a, b)
    x = a if isinstance(a, Dim) else Dim.of(a)
    y = b if isinstance(b, Dim) else Dim.of(b)
    if op in _RING:
        d = _RING[op](x, y)
    else:
        d = _DIM_DIVISIONS[op](x, y)
        if isinstance(d, DivisionError):
            if d.reason == "division by zero":
                raise ScalarError("zero", f"`{op}` by zero has no value", d)
            raise ScalarError("inexact", f"{format_division(x, y)} is not exact: {d.reason}", d)
    # a dim too: its written form's numbers (`A * B` of two 3,000-digit literals is one) are printed in messages
    if any(abs(c).bit_length() > MAX_INT_BITS for c in d._t.values()):
        raise ScalarError(
            "too_large",
            f"`{op}` of {_operand_text(a)} and {_operand_text(b)} is too large for a compile-time int "
            f"(more than {MAX_INT_BITS} bits)",
        )
    return d.as_int() if plain else d


def _operand_text(v: Int) -> str:
    """An int operand as a message quotes it: a number of more than 30 digits by its length."""
    n = known_int(v)
    if n is None:
        return format_dim(v)
    return f"a {digit_count(n)}-digit int" if abs(n) >= 10**30 else str(n)


def _int_power(a: Int, b: Int):
    base, exponent = known_int(a), known_int(b)
    if exponent is None:
        return None
    if exponent < 0:
        if base is None:
            return None
        return _float_arithmetic("**", float(base), float(exponent))
    if base is not None:
        if not power_fits(base, exponent):
            raise ScalarError("too_large", f"`{base} ** {exponent}` is too large for a compile-time int")
        value = base**exponent
        return value if not isinstance(a, Dim) and not isinstance(b, Dim) else Dim.of(value)
    if exponent > 64:
        raise ScalarError("too_large", f"`** {exponent}` of a symbolic int is too large to expand")
    return a**exponent


def _float_arithmetic(op: str, x: float, y: float) -> float:
    try:
        value = _PYTHON[op](x, y)
    except ZeroDivisionError:
        if op != "**":
            raise ScalarError("zero", f"`{op}` by zero has no value") from None
        value = math.inf  # 0.0 ** -1.0
    except (OverflowError, ValueError):
        value = math.inf
    result = finite_float(value)
    if result is None:
        raise ScalarError("nonfinite", f"`{op}` of {x!r} and {y!r} has no finite real value")
    return result


def negate(a):
    """`-a` of a number (int, Dim or float)."""
    if not is_number(a):
        raise ScalarError("operands", "`-` needs a number")
    return -a


def compare(op: str, a, b) -> bool | None:
    """`a op b` for `op` in COMPARISONS, on numbers (ints, Dims, floats) or on two bools or
    two strs (Python's order). None when it is not known at compile time (symbolic dims whose
    difference is not a number). Raises ScalarError for operands that cannot be compared."""
    if is_number(a) and is_number(b):
        if isinstance(a, Dim) or isinstance(b, Dim):
            x = a if isinstance(a, Dim) else None
            y = b if isinstance(b, Dim) else None
            if x is not None and y is not None:
                diff = (x - y).as_int()
            else:
                other = _float(x if x is not None else y)
                if other is None:
                    return None
                diff = other - b if x is not None else a - other
            if diff is None:
                return None
            a, b = diff, 0
    elif type(a) is not type(b) or not isinstance(a, (bool, str)):
        raise ScalarError("operands", f"`{op}` cannot compare these values")
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def finite_float(value) -> float | None:
    """`value` as a finite real float, or None (complex, infinite, NaN, too large)."""
    if isinstance(value, complex):
        return None
    try:
        f = float(value)
    except (OverflowError, TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def power_fits(base: int, exponent: int) -> bool:
    """Whether `base ** exponent` stays within MAX_INT_BITS (checked before computing it)."""
    if exponent < 0 or abs(base) <= 1:
        return True
    return exponent * math.log2(abs(base)) <= MAX_INT_BITS


def to_int(v) -> Int:
    """`int(v)`: a float truncated toward zero (Python's `int()`), an int (or dim) unchanged."""
    if is_int(v):
        return v
    if isinstance(v, float) and not isinstance(v, bool):
        return math.trunc(v)
    raise ScalarError("operands", f"`int` converts a number, got {_kind(v)}")


def length(v) -> int:
    """`len(v)`: the number of elements of a list."""
    if isinstance(v, (list, tuple)):
        return len(v)
    raise ScalarError("operands", f"`len` takes a list, got {_kind(v)}")


def _kind(v) -> str:
    if isinstance(v, bool):
        return "a bool"
    if isinstance(v, str):
        return "a str"
    if v is None:
        return "`none`"
    return "a number" if is_number(v) else "a record"


CONVERSIONS = {"int": to_int, "len": length}
