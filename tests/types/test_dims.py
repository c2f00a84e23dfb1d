"""The dim algebra: polynomial laws, exact division, substitution of known constants."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from linnet.types.dims import Dim, DivisionError, const, divide, format_dim, solve_linear, var

B, S, H = var("B"), var("S"), var("H")
K = const("c.hidden_size", 576)
U = const("n", None)  # a module parameter: value unknown
ATOMS = [B, S, H, K, U]


@st.composite
def dims(draw, depth=2):
    if depth == 0 or draw(st.booleans()):
        if draw(st.booleans()):
            return Dim.of(draw(st.integers(-6, 6)))
        return Dim.atom(draw(st.sampled_from(ATOMS)))
    a, b = draw(dims(depth=depth - 1)), draw(dims(depth=depth - 1))
    return draw(st.sampled_from([a + b, a - b, a * b]))


def evaluate(d: Dim, env: dict) -> int:
    total = 0
    for mono, coeff in d.terms:
        term = coeff
        for atom, power in mono:
            term *= env[atom] ** power
        total += term
    return total


ENV = st.fixed_dictionaries(
    {B: st.integers(1, 9), S: st.integers(1, 9), H: st.integers(1, 9), K: st.just(576), U: st.integers(1, 9)}
)


@given(dims(), dims(), dims())
def test_ring_laws(a, b, c):
    assert (a + b).same(b + a)
    assert (a * b).same(b * a)
    assert ((a + b) + c).same(a + (b + c))
    assert ((a * b) * c).same(a * (b * c))
    assert (a * (b + c)).same(a * b + a * c)
    assert (a - a).same(Dim.of(0))
    assert (a * Dim.of(1)).same(a)


@given(dims(), dims(), ENV)
def test_operations_agree_with_integers(a, b, env):
    assert evaluate(a + b, env) == evaluate(a, env) + evaluate(b, env)
    assert evaluate(a * b, env) == evaluate(a, env) * evaluate(b, env)
    # substituting known constants keeps the value
    assert evaluate(a.val, env) == evaluate(a, env)


@given(dims(), st.integers(1, 7))
def test_exact_division_by_a_constant(a, k):
    q = divide(a * Dim.of(k), Dim.of(k))
    assert not isinstance(q, DivisionError)
    assert q.same(a)


@given(dims())
def test_division_by_a_monomial(a):
    q = divide(a * Dim.atom(S), Dim.atom(S))
    assert not isinstance(q, DivisionError) and q.same(a)


def test_inexact_division_is_refused():
    assert isinstance(divide(Dim.of(576), Dim.of(10)), DivisionError)
    err = divide(Dim.atom(S), Dim.of(2))
    assert isinstance(err, DivisionError) and "provably" in err.reason
    assert divide(Dim.atom(K), Dim.of(9)).as_int() == 64


def test_symbolic_form_is_kept_and_value_compared():
    heads, head_dim = const("c.num_attention_heads", 9), const("c.head_dim", 64)
    d = Dim.atom(heads) * Dim.atom(head_dim)
    assert format_dim(d) == "c.num_attention_heads * c.head_dim"
    assert d.same(Dim.of(576)) and d.as_int() == 576
    half = divide(Dim.atom(head_dim), Dim.of(2))
    assert format_dim(half) == "c.head_dim / 2" and half.as_int() == 32


def test_solve_linear():
    g = var("G")
    kv = const("kv", 4)
    assert solve_linear(Dim.atom(kv) * Dim.atom(g), Dim.of(32), g).as_int() == 8
    assert isinstance(solve_linear(Dim.atom(const("kv5", 5)) * Dim.atom(g), Dim.of(32), g), DivisionError)
    assert solve_linear(Dim.atom(g) * Dim.atom(g), Dim.of(16), g) is None
