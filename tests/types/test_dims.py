"""The dim algebra: polynomial laws, exact division, substitution of known constants."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from linnet.types import dims as dim_algebra
from linnet.types.dims import (
    Dim,
    DivisionError,
    ceil_divide,
    const,
    dim_variables,
    divide,
    floor_divide,
    format_dim,
    remainder,
    solve_linear,
    var,
)

B, S, H = var("B"), var("S"), var("H")
K = const("c.hidden_size", 576)
U = const("n", None)  # a module parameter: value unknown
ATOMS = [B, S, H, K, U]


@st.composite
def dims(draw, depth=2, atoms=tuple(ATOMS)):
    if depth == 0 or draw(st.booleans()):
        if draw(st.booleans()):
            return Dim.of(draw(st.integers(-6, 6)))
        return Dim.atom(draw(st.sampled_from(atoms)))
    a, b = draw(dims(depth - 1, atoms)), draw(dims(depth - 1, atoms))
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


@given(dims(), st.integers(-5, 5).filter(bool))
def test_a_bare_unknown_is_solved_as_the_division_by_one_would(a, k):
    g = var("G")
    # `G == a` is solved without dividing (the checker's most common equation): the same form and value
    assert solve_linear(Dim.atom(g), a, g) == divide(a, Dim.of(1))
    # a product by a constant scales each term: the same terms as adding `a` |k| times
    total = sum([a] * abs(k), Dim.of(0))
    assert a * Dim.of(k) == Dim.of(k) * a == (total if k > 0 else -total)


# ----------------------------------------------------------------------------- floor division


def concrete(d: Dim, env: dict) -> int | None:
    """The value of `d` with every atom of `env` replaced by its number (inside floor
    divisions too), through the algebra's own substitution."""
    value = d.substitute({a: Dim.of(v) for a, v in env.items()})
    return value.as_int()


NONZERO = st.integers(-7, 7).filter(bool)


@given(dims(), st.integers(1, 7), st.integers(0, 6))
def test_floor_division_takes_out_multiples_of_the_divisor(a, s, r):
    # (a * s + r) // s == a + r // s for 0 <= r < s, symbolically
    r = r % s
    s_ = Dim.of(s)
    assert floor_divide(a * s_ + Dim.of(r), s_).same(a + Dim.of(r // s))
    assert floor_divide(a * s_ + Dim.of(r), s_).same(a)


@given(dims())
def test_floor_division_by_one_is_the_identity(a):
    assert floor_divide(a, Dim.of(1)).same(a)
    assert remainder(a, Dim.of(1)).same(Dim.of(0))


@given(dims(), dims(), ENV)
def test_floor_division_and_remainder_agree_with_python(a, b, env):
    den = evaluate(b, env)
    if den == 0:
        return
    q, m = floor_divide(a, b), remainder(a, b)
    assert not isinstance(q, DivisionError) and not isinstance(m, DivisionError)
    num = evaluate(a, env)
    assert concrete(q, env) == num // den
    assert concrete(m, env) == num % den
    assert concrete(ceil_divide(a, b), env) == -(-num // den)


@given(dims(), dims(), ENV)
def test_floor_and_ceil(a, b, env):
    den = evaluate(b, env)
    if den == 0:
        return
    floor, ceil = concrete(floor_divide(a, b), env), concrete(ceil_divide(a, b), env)
    assert floor <= ceil <= floor + 1
    assert (ceil == floor) == (evaluate(a, env) % den == 0)
    if den > 0:
        assert ceil == concrete(floor_divide(a + b - Dim.of(1), b), env)


@given(dims(), dims())
def test_division_identity_holds_symbolically(a, b):
    if not b.val.terms:
        return
    # a == b * (a // b) + a % b, and ceil is -floor of the negation
    assert (b * floor_divide(a, b) + remainder(a, b)).same(a)
    assert ceil_divide(a, b).same(-floor_divide(-a, b))


@given(dims(), st.integers(1, 7), st.integers(-20, 20))
def test_equal_floor_divisions_compare_equal(a, s, k):
    # moving whole multiples of the divisor out of the numerator gives the same dim
    s_ = Dim.of(s)
    assert floor_divide(a + Dim.of(k * s), s_).same(floor_divide(a, s_) + Dim.of(k))


def test_conv_output_size_is_symbolic_and_prints_as_written():
    p, k, s = const("p"), const("k"), const("s")
    size = floor_divide(Dim.atom(H) + Dim.of(2) * Dim.atom(p) - Dim.atom(k), Dim.atom(s)) + Dim.of(1)
    assert format_dim(size) == "(H + 2 * p - k) // s + 1"
    assert size.as_int() is None
    known = {H: 224, p: 1, k: 3, s: 2}
    assert concrete(size, known) == (224 + 2 - 3) // 2 + 1 == 112
    image = const("c.image_size", 224)
    written = floor_divide(Dim.atom(image) + Dim.of(2 * 1 - 3), Dim.of(2)) + Dim.of(1)
    assert format_dim(written) == "(c.image_size - 1) // 2 + 1" and written.as_int() == 112
    assert format_dim(ceil_divide(Dim.atom(S), Dim.of(2))) == "-(-S // 2)"
    assert format_dim(Dim.of(2) * floor_divide(Dim.atom(S), Dim.of(2))) == "2 * (S // 2)"
    assert format_dim(floor_divide(Dim.atom(S), floor_divide(Dim.atom(B), Dim.of(2)))) == "S // (B // 2)"
    assert format_dim(remainder(Dim.atom(S), Dim.of(2))) == "S % 2"


def test_floor_division_by_zero_is_refused():
    assert isinstance(floor_divide(Dim.atom(S), Dim.of(0)), DivisionError)
    assert isinstance(remainder(Dim.of(3), Dim.atom(const("z", 0))), DivisionError)


def test_substitution_reaches_inside_floor_divisions():
    half = floor_divide(Dim.atom(S) - Dim.of(1), Dim.of(2)) + Dim.of(1)
    assert half.substitute({S: Dim.of(7)}).as_int() == 4
    assert half.substitute({S: Dim.of(2) * Dim.atom(B) + Dim.of(1)}).same(Dim.atom(B) + Dim.of(1))
    assert solve_linear(half, Dim.of(4), S) is None  # S only inside a floor division: not linear


# -- evaluate: a dim's integer value under sizes for its variables (what `linnet run` needs)

SIZED = [B, S, H, K]  # U has no value: evaluating a dim that holds it is an error


@given(dims(atoms=SIZED), dims(atoms=SIZED), ENV)
def test_evaluate_agrees_with_integers(a, b, env):
    sizes = {atom.name: v for atom, v in env.items() if atom.kind == "var"}
    assert dim_algebra.evaluate(a, sizes) == evaluate(a, env)
    den = evaluate(b, env)
    if den:
        num = evaluate(a, env)
        assert dim_algebra.evaluate(floor_divide(a, b), sizes) == num // den
        assert dim_algebra.evaluate(remainder(a, b), sizes) == num % den
        assert dim_algebra.evaluate(ceil_divide(a, b), sizes) == -(-num // den)


def test_evaluate_names_what_it_lacks():
    d = Dim.atom(B) * Dim.atom(H) + Dim.atom(S)
    assert dim_variables(d) == {"B", "S", "H"}
    assert dim_algebra.evaluate(d, {"B": 2, "S": 3, "H": 4}) == 11
    with pytest.raises(ValueError, match=r"dim `B \* H \+ S` needs a size for H, S"):
        dim_algebra.evaluate(d, {"B": 2})
    with pytest.raises(ValueError, match="`n` has no known value"):
        dim_algebra.evaluate(Dim.atom(U) + Dim.atom(B), {"B": 1})
    assert dim_algebra.evaluate(floor_divide(Dim.atom(S) - Dim.of(1), Dim.of(2)), {"S": 8}) == 3


def test_minima_are_bounded_by_their_operands():
    """`nonnegative` replaces each `min` by its operands before it shifts dim variables to `1 + s`: a `min` remade
    of shifted operands compared them as if each variable were at least 2, so `min(2, S) - 2` (-1 where S is 1)
    was taken as at least 0, and `min(2, min(2, S))` as 2."""
    s = Dim.atom(S)
    two, four, six = (Dim.of(n) for n in (2, 4, 6))
    assert not dim_algebra.nonnegative(dim_algebra.minimum(two, s) - two)
    assert format_dim(dim_algebra.minimum(two, dim_algebra.minimum(two, s))) == "min(2, S)"
    assert dim_algebra.nonnegative(s - dim_algebra.minimum(four, s))
    assert dim_algebra.nonnegative(dim_algebra.minimum(six, s) - dim_algebra.minimum(two, s))
    assert not dim_algebra.nonnegative(dim_algebra.minimum(two, s) - dim_algebra.minimum(six, s))


def test_nonnegative_with_minima_holds_for_every_size():
    """Every sum of up to two `min(k, S)` (coefficients -1, 1 or 2), a multiple of `S` and a number that
    `nonnegative` takes as at least 0 is, for every `S` from 1 to 19."""
    s = Dim.atom(S)
    terms = [(c, k) for c in (-1, 1, 2) for k in range(6)]
    for (c1, k1), (c2, k2) in itertools.product(terms, terms):
        for s_coeff, constant in itertools.product((-1, 0, 1), range(-4, 5)):
            d = s * Dim.of(s_coeff) + Dim.of(constant)
            d = d + dim_algebra.minimum(Dim.of(k1), s) * Dim.of(c1) + dim_algebra.minimum(Dim.of(k2), s) * Dim.of(c2)
            if dim_algebra.nonnegative(d):
                assert all(dim_algebra.evaluate(d, {"S": n}) >= 0 for n in range(1, 20)), format_dim(d)


def test_floor_quotients_of_shifted_sizes_are_canonical():
    """`nonnegative` shifts each dim variable to `1 + s` and remakes the floor quotients that hold it: `(H - 1) // 2`,
    canonically `(H + 1) // 2 - 1`, became `(h + 2) // 2 - 1`, whose 1 stayed inside the quotient, so it was not
    taken as at least 0 (and `x[:, :, :(H - 1) // 2]` was a bound that may be negative). Whatever it takes as at
    least 0 is, for every `H` from 1 to 29."""
    h = Dim.atom(S)
    assert dim_algebra.nonnegative(floor_divide(h - Dim.of(1), Dim.of(2)))
    assert not dim_algebra.nonnegative(floor_divide(h - Dim.of(3), Dim.of(2)))
    for num, den, minus in itertools.product(range(-4, 3), (2, 3, 4), range(3)):
        d = floor_divide(h + Dim.of(num), Dim.of(den)) - Dim.of(minus)
        if dim_algebra.nonnegative(d):
            assert all(dim_algebra.evaluate(d, {"S": n}) >= 0 for n in range(1, 30)), format_dim(d)


def test_negative_is_below_zero_for_every_size_and_only_then():
    """`negative`: below 0 for every value of a dim's atoms (a dim variable at least 1, an int parameter at least
    0), what a declared dim no tensor can have is (L213); a sign only unknown is not."""
    b, s, u = Dim.atom(B), Dim.atom(S), Dim.atom(U)
    one = Dim.of(1)
    for d in (-s, Dim.of(0) - s, -s - one, s - s * Dim.of(2), -(s + b), -u - one, Dim.of(-1)):
        assert dim_algebra.negative(d), format_dim(d)
        if not d.atoms() & {U}:
            assert all(dim_algebra.evaluate(d, {"S": n, "B": m}) < 0 for n in range(1, 9) for m in range(1, 9))
    for d in (s - b, -u, one - s, Dim.of(0), s - one, floor_divide(s - one, Dim.of(2)) - s + one):
        assert not dim_algebra.negative(d), format_dim(d)
