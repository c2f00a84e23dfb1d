"""The one scalar semantics (linnet/types/scalars.py): Python's operators on ints and floats,
on symbolic dims too, with errors instead of infinities."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from linnet.types.dims import Dim, const, var
from linnet.types.scalars import ARITHMETIC, ScalarError, arithmetic, compare

INTS = st.integers(-50, 50)
FLOATS = st.floats(-50, 50, allow_nan=False).filter(lambda x: abs(x) > 1e-3 or x == 0)


def python(op: str, a, b):
    try:
        value = eval(f"a {op} b", {"a": a, "b": b})
    except ZeroDivisionError:
        return "zero"
    if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
        return "nonfinite"
    return value


@pytest.mark.parametrize("op", [o for o in ARITHMETIC if o != "/"])
@given(a=INTS, b=INTS)
def test_ints_are_pythons(op, a, b):
    expected = python(op, a, b)
    try:
        value = arithmetic(op, a, b)
    except ScalarError as err:
        # 0 ** -1 is Python's ZeroDivisionError; here, as for floats, a power with no finite value
        assert err.kind == expected or (op == "**" and expected == "zero" and err.kind == "nonfinite")
        return
    assert value == expected and type(value) is type(expected)


@given(a=INTS, b=INTS)
def test_int_division_is_exact_or_refused(a, b):
    try:
        value = arithmetic("/", a, b)
    except ScalarError as err:
        assert err.kind == ("zero" if b == 0 else "inexact")
        assert b == 0 or a % b
        return
    assert value * b == a and isinstance(value, int)


@pytest.mark.parametrize("op", ARITHMETIC)
@given(a=st.one_of(FLOATS, INTS), b=FLOATS)
def test_floats_are_pythons(op, a, b):
    expected = python(op, a, b)
    try:
        value = arithmetic(op, a, b)
    except ScalarError as err:
        assert err.kind == expected or (op == "**" and expected == "zero" and err.kind == "nonfinite")
        return
    assert value == expected and isinstance(value, float)


@pytest.mark.parametrize("op", ["+", "-", "*", "//", "%"])
@given(a=INTS, b=INTS.filter(bool))
def test_known_dims_compute_like_ints(op, a, b):
    dim = arithmetic(op, Dim.atom(const("n", a)), b)
    assert isinstance(dim, Dim) and dim.as_int() == python(op, a, b)


def test_symbolic_dims_stay_symbolic():
    s = Dim.atom(var("S"))
    assert str(arithmetic("//", s - Dim.of(1), 2)) == "(S - 1) // 2"
    assert arithmetic("*", s, 2).same(s + s)
    assert arithmetic("+", s, 0.5) is None  # a symbolic int meeting a float: not known here
    assert compare(">", s + Dim.of(1), s) is True
    assert compare("<", s, Dim.of(3)) is None
    assert compare("==", Dim.of(3), 3.0) is True


def test_operands_must_be_numbers():
    with pytest.raises(ScalarError) as err:
        arithmetic("+", True, 1)
    assert err.value.kind == "operands"
    with pytest.raises(ScalarError):
        compare("<", "a", 1)
    with pytest.raises(ScalarError):
        arithmetic("@", 2, 3)
    assert compare("<", "a", "b") is True
