"""`cache_write` takes i64 rows and positions (issue 13, part 8): i32 positions checked clean
and then crashed ONNX Runtime. The checker refuses them with a quick fix (`cast(..., i64)`),
and the fixed program runs on every backend and matches the registry's numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.ir.core import Graph, Op, Value
from linnet.ops import REGISTRY
from linnet.semantics.program import Document
from linnet.types.core import F32, I32, I64, Shape, TensorT
from linnet.types.dims import Dim
from tests.compiler.test_operators_agree import BACKENDS, MARKS
from tests.conftest import apply_fix

SOURCE = """config C {
    heads: int = 2
}

module Cache(c: C) {
    state k_cache: [max_batch, c.heads, max_positions, 4]

    fn write(k: [B, c.heads, S, 4], positions: i64[B], rows: i64[B]) {
        let short = cast(positions, i32)
        k_cache = cache_write(k_cache, rows, short, k)
    }
}
"""


def test_the_offered_fix_checks_clean():
    (diag,) = Document("cache.linnet", SOURCE).analyze().diagnostics
    assert diag.code == "L303" and "requires i64 `positions`, got i32" in diag.message
    (fix,) = diag.fixes
    fixed = apply_fix(SOURCE, fix)
    assert "cache_write(k_cache, rows, cast(short, i64), k)" in fixed
    assert Document("cache.linnet", fixed).analyze().diagnostics == []


def tensor(dtype, shape):
    return TensorT(dtype, Shape(tuple(Dim.of(n) for n in shape)))


def fixed_graph() -> Graph:
    """`cache_write(cache, rows, cast(positions_i32, i64), new)`, as the fix writes it."""
    cache = Value(tensor(F32, (3, 2, 6, 4)), "cache")
    rows, positions = Value(tensor(I64, (2,)), "rows"), Value(tensor(I32, (2,)), "positions")
    new = Value(tensor(F32, (2, 2, 2, 4)), "new")
    cast = Op("cast", {"x": positions, "dtype": I64}, [])
    cast.results = [Value(tensor(I64, (2,)), "wide", cast)]
    write = Op("cache_write", {"cache": cache, "rows": rows, "positions": cast.results[0], "new": new}, [])
    write.results = [Value(cache.type, "out", write)]
    graph = Graph("f", [cache, rows, positions, new], [cast, write], list(write.results))
    graph.name_values()
    return graph


@pytest.mark.parametrize("backend", [pytest.param(b, marks=MARKS.get(b, pytest.mark.onnxruntime)) for b in BACKENDS])
def test_the_fixed_program_runs_on_every_backend(backend):
    rng = np.random.default_rng(0)
    inputs = [
        rng.random((3, 2, 6, 4), dtype=np.float32),
        np.array([2, 0], dtype=np.int64),
        np.array([1, 3], dtype=np.int32),
        rng.random((2, 2, 2, 4), dtype=np.float32),
    ]
    out = BACKENDS[backend](fixed_graph(), inputs)
    expected = REGISTRY["cache_write"].reference(inputs[0], inputs[1], inputs[2].astype(np.int64), inputs[3])
    np.testing.assert_array_equal(out, expected)
