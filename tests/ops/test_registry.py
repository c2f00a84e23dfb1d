"""The primitive registry: every shape rule says what its numpy reference really produces, on
random concrete shapes (that every op has its doc, reference and the rest: test_op_facts.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.ops import REGISTRY, OpError
from linnet.types.core import BOOL, F32, I64, Shape, TensorT
from linnet.types.dims import Dim

NP_DTYPES = {F32: np.float32, I64: np.int64, BOOL: np.bool_}


def tensor_type(shape, dtype=F32) -> TensorT:
    return TensorT(dtype, Shape(tuple(Dim.of(d) for d in shape)))


def array(shape, dtype=F32, rng=np.random.default_rng(0)):
    if dtype == BOOL:
        return rng.random(shape) > 0.5
    if dtype == I64:
        return rng.integers(0, 3, size=shape)
    return rng.random(shape, dtype=np.float32) + 0.5


def concrete(shape: Shape) -> tuple[int, ...]:
    return tuple(d.as_int() for d in shape.dims)


shapes = st.lists(st.integers(1, 4), min_size=0, max_size=4).map(tuple)


def broadcastable(draw, shape):
    """A shape that broadcasts with `shape`: a suffix of it, some dims replaced by 1."""
    k = draw(st.integers(0, len(shape)))
    tail = list(shape[len(shape) - k :])
    return tuple(1 if draw(st.booleans()) else d for d in tail)


def check(name, rule_args, ref_args):
    op = REGISTRY[name]
    shape = op.shape_rule(rule_args)
    dtype = op.dtype_rule(rule_args)
    out = op.reference(**ref_args)
    if isinstance(shape, list):
        assert [concrete(s) for s in shape] == [o.shape for o in out]
        assert all(NP_DTYPES[d] == o.dtype for d, o in zip(dtype, out))
    else:
        assert concrete(shape) == np.asarray(out).shape, (name, shape, np.asarray(out).shape)
        assert NP_DTYPES[dtype] == np.asarray(out).dtype, (name, dtype, np.asarray(out).dtype)


UNARY = [n for n, op in REGISTRY.items() if op.category == "elementwise" and len(op.params) == 1]
BINARY = [n for n, op in REGISTRY.items() if op.category == "elementwise" and len(op.params) == 2]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(UNARY), shapes)
def test_unary(name, shape):
    dtype = BOOL if name == "logical_not" else F32
    check(name, {"x": tensor_type(shape, dtype)}, {"x": array(shape, dtype)})


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(BINARY), shapes, st.data())
def test_binary_broadcasting(name, shape, data):
    other = broadcastable(data.draw, shape)
    a, b = (shape, other) if data.draw(st.booleans()) else (other, shape)
    dtype = BOOL if name.startswith("logical") else I64 if name == "mod" else F32
    with np.errstate(all="ignore"):
        check(
            name, {"x": tensor_type(a, dtype), "y": tensor_type(b, dtype)}, {"x": array(a, dtype), "y": array(b, dtype)}
        )


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["sum", "mean", "max", "min", "argmax"]), shapes.filter(len), st.data())
def test_reductions(name, shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    keepdim = data.draw(st.booleans())
    check(
        name,
        {"x": tensor_type(shape), "dim": dim, "keepdim": keepdim},
        {"x": array(shape), "dim": dim, "keepdim": keepdim},
    )


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_matmul(batch, m, k, n):
    a, b = batch + (m, k), (k, n)
    check("matmul", {"x": tensor_type(a), "y": tensor_type(b)}, {"x": array(a), "y": array(b)})
    check(
        "matmul", {"x": tensor_type(b), "y": tensor_type(batch + (n, m))}, {"x": array(b), "y": array(batch + (n, m))}
    )


def test_matmul_mismatch():
    with pytest.raises(OpError) as err:
        REGISTRY["matmul"].shape_rule({"x": tensor_type((2, 3)), "y": tensor_type((4, 5))})
    assert err.value.code == "L202"


@settings(max_examples=40, deadline=None)
@given(shapes.filter(len), st.data())
def test_shape_ops(shape, data):
    n = len(shape)
    d0, d1 = data.draw(st.integers(-n, n - 1)), data.draw(st.integers(-n, n - 1))
    x = tensor_type(shape)
    arr = array(shape)
    check("transpose", {"x": x, "dim0": d0, "dim1": d1}, {"x": arr, "dim0": d0, "dim1": d1})
    perm = data.draw(st.permutations(range(n)))
    check("permute", {"x": x, "dims": list(perm)}, {"x": arr, "dims": list(perm)})
    u = data.draw(st.integers(-n - 1, n))
    check("unsqueeze", {"x": x, "dim": u}, {"x": arr, "dim": u})
    total = int(np.prod(shape))
    check("reshape", {"x": x, "shape": [Dim.of(total)]}, {"x": arr, "shape": [total]})
    reps = data.draw(st.integers(1, 3))
    check("repeat_interleave", {"x": x, "repeats": Dim.of(reps), "dim": d0}, {"x": arr, "repeats": reps, "dim": d0})
    check("concat", {"xs": [x, x], "dim": d0}, {"xs": [arr, arr], "dim": d0})
    size = shape[d0]
    cut = data.draw(st.integers(0, size))
    check(
        "split",
        {"x": x, "sizes": [Dim.of(cut), Dim.of(size - cut)], "dim": d0},
        {"x": arr, "sizes": [cut, size - cut], "dim": d0},
    )
    start = data.draw(st.integers(-size, size))
    check(
        "slice",
        {"x": x, "dim": d0, "start": Dim.of(start), "stop": None},
        {"x": arr, "dim": d0, "start": start, "stop": None},
    )
    index = data.draw(st.integers(-size, size - 1))
    check("select", {"x": x, "dim": d0, "index": Dim.of(index)}, {"x": arr, "dim": d0, "index": index})
    ones = tuple(1 if data.draw(st.booleans()) else d for d in shape)
    check(
        "expand",
        {"x": tensor_type(ones), "shape": [Dim.of(d) for d in shape]},
        {"x": array(ones), "shape": list(shape)},
    )
    squeezable = shape[: d0 % n] + (1,) + shape[d0 % n + 1 :]
    check("squeeze", {"x": tensor_type(squeezable), "dim": d0}, {"x": array(squeezable), "dim": d0})


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3))
def test_rearrange(b, s, h, d):
    cases = [
        ("b s (h d) -> b h s d", (b, s, h * d), {"h": h}),
        ("b h s d -> b s (h d)", (b, h, s, d), {}),
        ("p -> 1 1 p", (s,), {}),
        ("... (h d) -> ... h d", (b, s, h * d), {"d": d}),
    ]
    for pattern, shape, sizes in cases:
        check(
            "rearrange",
            {"x": tensor_type(shape), "pattern": pattern, "sizes": {k: Dim.of(v) for k, v in sizes.items()}},
            {"x": array(shape), "pattern": pattern, **sizes},
        )


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), shapes)
def test_take_where_cast_and_construction(v, dsize, idx_shape):
    w = (v, dsize)
    check(
        "take",
        {"x": tensor_type(w), "indices": tensor_type(idx_shape, I64), "dim": 0},
        {"x": array(w), "indices": np.minimum(array(idx_shape, I64), v - 1), "dim": 0},
    )
    check(
        "where",
        {"cond": tensor_type(idx_shape, BOOL), "x": tensor_type(idx_shape), "y": 0.0},
        {"cond": array(idx_shape, BOOL), "x": array(idx_shape), "y": np.float32(0.0)},
    )
    check("cast", {"x": tensor_type(idx_shape), "dtype": I64}, {"x": array(idx_shape), "dtype": np.int64})
    dims = [Dim.of(d) for d in idx_shape]
    check("zeros", {"shape": dims, "dtype": F32}, {"shape": list(idx_shape), "dtype": np.float32})
    check(
        "full",
        {"shape": dims, "value": 2.0, "dtype": F32},
        {"shape": list(idx_shape), "value": 2.0, "dtype": np.float32},
    )
    check("arange", {"start": Dim.of(v), "stop": None, "step": Dim.of(1)}, {"start": v})
    check(
        "arange", {"start": Dim.of(0), "stop": Dim.of(2 * v), "step": Dim.of(2)}, {"start": 0, "stop": 2 * v, "step": 2}
    )
    check("min_value", {"dtype": F32}, {"dtype": np.float32})


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.data())
def test_cache_write(b, h, s, d, data):
    max_batch, max_positions = b + 1, s + 3
    cache = (max_batch, h, max_positions, d)
    rows = np.array(data.draw(st.permutations(range(max_batch)))[:b], dtype=np.int64)
    positions = np.array([data.draw(st.integers(0, max_positions - s)) for _ in range(b)], dtype=np.int64)
    args = {
        "cache": tensor_type(cache),
        "rows": tensor_type((b,), I64),
        "positions": tensor_type((b,), I64),
        "new": tensor_type((b, h, s, d)),
    }
    check(
        "cache_write", args, {"cache": array(cache), "rows": rows, "positions": positions, "new": array((b, h, s, d))}
    )
    out = REGISTRY["cache_write"].reference(
        np.zeros(cache, np.float32), rows, positions, np.ones((b, h, s, d), np.float32)
    )
    assert out.sum() == b * h * s * d  # each new entry lands once


def test_rules_refuse_with_codes():
    cases = [
        ("add", {"x": tensor_type((2, 3)), "y": tensor_type((2, 4))}, "L201"),
        ("reshape", {"x": tensor_type((2, 3)), "shape": [Dim.of(5)]}, "L205"),
        ("split", {"x": tensor_type((2, 6)), "sizes": [Dim.of(2), Dim.of(3)], "dim": -1}, "L211"),
        ("select", {"x": tensor_type((2, 4)), "dim": 1, "index": Dim.of(5)}, "L212"),
        ("sum", {"x": tensor_type((2, 4)), "dim": 2, "keepdim": False}, "L208"),
        ("rearrange", {"x": tensor_type((2, 6)), "pattern": "b (h d) -> b h e", "sizes": {}}, "L207"),
    ]
    for name, args, code in cases:
        with pytest.raises(OpError) as err:
            REGISTRY[name].shape_rule(args)
        assert err.value.code == code, name
    with pytest.raises(OpError) as err:
        REGISTRY["add"].dtype_rule({"x": tensor_type((2,)), "y": tensor_type((2,), I64)})
    assert err.value.code == "L302"
