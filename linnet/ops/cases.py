"""Random test cases for the registry's ops: the generators shared by several entries (each
entry's `cases`, see `OpDef`) and the arrays they are made of.

A generator `cases(rng, shape)` draws one call of its op around `shape` (a non-empty tuple of
small sizes) with the numpy Generator `rng`. It returns `(tensors, constants)`: the tensor
arguments as numpy arrays (a list of arrays for a `tensors` parameter) and the compile-time
arguments as the shape and dtype rules see them (`Dim` for ints, `DType` for dtypes, a dict of
`Dim` for rearrange's `sizes`). Every backend's op test runs the op on these and compares it
with the op's numpy `reference`; tests/ops/test_op_facts.py checks that the rules say what
the reference produces on them.

Values stay where every op is defined and an exact comparison means something: floats in
[0.5, 1.5) (positive for `log` and `sqrt`, away from 0 for `/`), integers in 0..2, bools half
true. numpy is imported when a case is drawn, never when the registry loads (the checker does
not need it).
"""

from __future__ import annotations

from ..types.core import BOOL, F32, I64, DType
from ..types.dims import Dim


def array(rng, shape: tuple[int, ...], dtype: DType = F32):
    """A random numpy array of `shape`: f32 in [0.5, 1.5), i64 in 0..2, or bool half true."""
    import numpy as np

    if dtype == BOOL:
        return rng.random(shape) > 0.5
    if dtype == I64:
        return rng.integers(0, 3, size=shape).astype(np.int64)
    return (rng.random(shape, dtype=np.float32) + 0.5).astype(np.float32)


def dims(shape: tuple[int, ...]) -> list[Dim]:
    """`shape` as the compile-time dims a `shape: ints` argument holds."""
    return [Dim.of(d) for d in shape]


def unary(rng, shape):
    """`x` of `shape` (f32)."""
    return {"x": array(rng, shape)}, {}


def bool_unary(rng, shape):
    """`x` of `shape` (bool)."""
    return {"x": array(rng, shape, BOOL)}, {}


def binary(rng, shape):
    """`x` of `shape` and `y` of [1, shape[-1]] (f32): broadcasting from both sides."""
    return {"x": array(rng, shape), "y": array(rng, (1,) + shape[-1:])}, {}


def bool_binary(rng, shape):
    """`x` of `shape` and `y` of [shape[-1]] (bool)."""
    return {"x": array(rng, shape, BOOL), "y": array(rng, shape[-1:], BOOL)}, {}


def int_binary(rng, shape):
    """`x` of `shape` in 5..7 and `y` of [shape[-1]] in 1..3 (i64): a divisor never 0."""
    return {"x": array(rng, shape, I64) + 5, "y": array(rng, shape[-1:], I64) + 1}, {}


def signed_division(rng, shape):
    """`x` of `shape` and a divisor `y` of [shape[-1]], both signs, ints or floats (never 0): where
    floor division and its remainder differ from truncation's."""
    import numpy as np

    ints = bool(rng.integers(0, 2))
    divisors = [-4, -3, -1, 1, 2, 5] if ints else [-2.5, -2.0, -0.75, 0.5, 2.0, 3.0]
    dtype = np.int64 if ints else np.float32
    x = (rng.integers(-9, 10, size=shape) * (1 if ints else 1.25)).astype(dtype)
    return {"x": x, "y": rng.choice(np.array(divisors, dtype=dtype), size=shape[-1:])}, {}


def reduction(rng, shape):
    """`x` of `shape` (f32), a random `dim` of it (either sign) and `keepdim`."""
    rank = len(shape)
    return {"x": array(rng, shape)}, {"dim": int(rng.integers(-rank, rank)), "keepdim": bool(rng.integers(0, 2))}


def filled(rng, shape):
    """No tensors: `shape` and dtype f32 (zeros, ones)."""
    return {}, {"shape": dims(shape), "dtype": F32}
