"""Test cases for every registry op, shared by the backends' op tests: random inputs around
a shape (`case`, drawn by the op's registry entry), a one-op graph of them
(`single_op_graph`), and the numpy reference."""

from __future__ import annotations

import numpy as np

from linnet.ir.core import Graph, Op, Value
from linnet.ops import REGISTRY
from linnet.types.core import BOOL, F32, I64, Shape, TensorT
from linnet.types.dims import Dim

NP = {F32: np.float32, I64: np.int64, BOOL: np.bool_}


def case(name: str, rng, shape: tuple[int, ...]):
    """(tensor args as numpy, compile-time args) for op `name` around `shape`: one draw of the
    op's own case generator (`OpDef.cases`)."""
    draw = REGISTRY[name].cases
    assert draw is not None, f"op `{name}` has no case generator: give its registry entry `cases`"
    return draw(rng, shape or (2,))


def tensor_type(a: np.ndarray) -> TensorT:
    dtype = {np.dtype(np.float32): F32, np.dtype(np.int64): I64, np.dtype(np.bool_): BOOL}[a.dtype]
    return TensorT(dtype, Shape(tuple(Dim.of(d) for d in a.shape)))


def single_op_graph(name: str, tensors: dict, const: dict):
    """(graph `f` running op `name` on `tensors` with `const`, the result types, the flat numpy inputs).
    An op without tensor inputs gets an unused i64[1] input (`anchor`)."""
    op_def = REGISTRY[name]
    inputs, args, rule = [], {}, {}
    for k, v in tensors.items():
        if isinstance(v, list):
            vals = [Value(tensor_type(a), f"{k}{i}") for i, a in enumerate(v)]
            inputs += vals
            args[k] = vals
            rule[k] = [x.type for x in vals]
        else:
            val = Value(tensor_type(v), k)
            inputs.append(val)
            args[k], rule[k] = val, val.type
    for p in op_def.params:
        value = const.get(p.name, p.default if p.default is not None and p.name not in tensors else None)
        if p.name not in tensors:
            args[p.name] = rule[p.name] = value
    shape, dtype = op_def.shape_rule(rule), op_def.dtype_rule(rule)
    types = (
        [TensorT(d, s) for d, s in zip(dtype if isinstance(dtype, list) else [dtype] * len(shape), shape)]
        if (isinstance(shape, list))
        else [TensorT(dtype, shape)]
    )
    op = Op(name, args, [])
    op.results = [Value(t, "out", op) for t in types]
    anchor = [] if inputs else [Value(TensorT(I64, Shape((Dim.of(1),))), "anchor")]
    g = Graph("f", inputs + anchor, [op], list(op.results))
    g.name_values()
    flat = [np.asarray(a) for v in tensors.values() for a in (v if isinstance(v, list) else [v])]
    flat += [np.zeros(1, dtype=np.int64)] if anchor else []
    return g, types, flat


REF_ARGS = {"repeats": int, "start": int, "stop": int, "step": int, "index": int}


def reference(name: str, tensors: dict, const: dict):
    args = dict(tensors)
    for k, v in const.items():
        if isinstance(v, Dim):
            v = v.as_int()
        elif isinstance(v, list):
            v = [x.as_int() if isinstance(x, Dim) else x for x in v]
        elif isinstance(v, dict):
            args.update({kk: vv.as_int() for kk, vv in v.items()})
            continue
        elif v in NP:
            v = np.dtype(NP[v])
        args[k] = v
    return REGISTRY[name].reference(**args)


# Exact ops a backend computes within one unit in the last place instead of bit for bit, and
# why. Constant folding still gives the correctly rounded value there, the reference's.
WITHIN_ONE_ULP = {
    ("jax", "div"): "XLA:CPU rewrites `a / broadcast(b)` as `a * broadcast(1 / b)` (seen in the compiled HLO)",
}


def assert_matches(name: str, got: np.ndarray, want, backend: str) -> None:
    """`backend`'s result of op `name` against `want` (the numpy reference or another backend):
    bit for bit where the registry says the op is `exact` (constant folding relies on it: a
    folded value must be what the backend would have computed), else within f32 rounding."""
    want = np.asarray(want)
    if (backend, name) in WITHIN_ONE_ULP:
        np.testing.assert_array_max_ulp(got, want, maxulp=1)
    elif REGISTRY[name].exact:
        np.testing.assert_array_equal(got, want, err_msg=f"`{name}` is exact: every backend must match bit for bit")
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-6)
