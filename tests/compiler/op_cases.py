"""Test cases for every registry op, shared by the backends' op tests: random inputs around
a shape (`case`), a one-op graph of them (`single_op_graph`), and the numpy reference."""

from __future__ import annotations

import numpy as np

from linnet.ir.core import Graph, Op, Value
from linnet.ops import REGISTRY
from linnet.types.core import BOOL, F32, I64, Shape, TensorT
from linnet.types.dims import Dim

NP = {F32: np.float32, I64: np.int64, BOOL: np.bool_}


def arr(rng, shape, dtype=F32):
    if dtype == BOOL:
        return rng.random(shape) > 0.5
    if dtype == I64:
        return rng.integers(0, 3, size=shape).astype(np.int64)
    return (rng.random(shape, dtype=np.float32) + 0.5).astype(np.float32)


def case(name: str, rng, shape: tuple[int, ...]):
    """(tensor args as numpy, compile-time args) for op `name` around `shape`."""
    s = shape or (2,)
    r = len(s)
    x = arr(rng, s)
    if name in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs", "neg"):
        return {"x": x}, {}
    if name == "logical_not":
        return {"x": arr(rng, s, BOOL)}, {}
    if name in ("logical_and", "logical_or"):
        return {"x": arr(rng, s, BOOL), "y": arr(rng, s[-1:], BOOL)}, {}
    if name in ("mod", "floor_divide"):
        # both signs, ints or floats: floor semantics differ from truncation exactly there
        divisors = [-4, -3, -1, 1, 2, 5] if rng.integers(0, 2) else [-2.5, -2.0, -0.75, 0.5, 2.0, 3.0]
        dtype = np.int64 if isinstance(divisors[0], int) else np.float32
        x = (rng.integers(-9, 10, size=s) * (1 if dtype == np.int64 else 1.25)).astype(dtype)
        return {"x": x, "y": rng.choice(np.array(divisors, dtype=dtype), size=s[-1:])}, {}
    if REGISTRY[name].category == "elementwise":
        return {"x": x, "y": arr(rng, (1,) + s[-1:])}, {}
    if name in ("sum", "mean", "max", "min", "argmax"):
        return {"x": x}, {"dim": int(rng.integers(-r, r)), "keepdim": bool(rng.integers(0, 2))}
    if name == "matmul":
        return {"x": arr(rng, s[:-1] + (3,)), "y": arr(rng, (3, 4))}, {}
    if name == "reshape":
        return {"x": x}, {"shape": [Dim.of(int(np.prod(s)))]}
    if name == "transpose":
        return {"x": x}, {"dim0": 0, "dim1": r - 1}
    if name == "permute":
        return {"x": x}, {"dims": list(rng.permutation(r).tolist())}
    if name == "unsqueeze":
        return {"x": x}, {"dim": int(rng.integers(-r - 1, r + 1))}
    if name == "squeeze":
        return {"x": arr(rng, s + (1,))}, {"dim": -1}
    if name == "expand":
        return {"x": arr(rng, (1,) + s)}, {"shape": [Dim.of(3)] + [Dim.of(d) for d in s]}
    if name == "rearrange":
        return {"x": arr(rng, (2, 3, 4 * 5))}, {"pattern": "b s (h d) -> b h s d", "sizes": {"h": Dim.of(4)}}
    if name == "concat":
        return {"xs": [x, arr(rng, s)]}, {"dim": -1}
    if name == "split":
        return {"x": arr(rng, s[:-1] + (5,))}, {"sizes": [Dim.of(2), Dim.of(3)], "dim": -1}
    if name == "repeat_interleave":
        return {"x": x}, {"repeats": Dim.of(3), "dim": 0}
    if name == "take":
        idx = rng.integers(0, s[0], size=(2, 3)).astype(np.int64)
        return {"x": x, "indices": idx}, {"dim": 0}
    if name == "slice":
        n = s[-1]
        return {"x": x}, {"dim": r - 1, "start": Dim.of(0), "stop": Dim.of(max(1, n - 1))}
    if name == "select":
        return {"x": x}, {"dim": r - 1, "index": Dim.of(-1)}
    if name == "where":
        return {"cond": arr(rng, s, BOOL), "x": x, "y": arr(rng, s[-1:])}, {}
    if name == "cast":
        return {"x": x * 3}, {"dtype": I64}
    if name == "arange":
        return {}, {"start": Dim.of(1), "stop": Dim.of(9), "step": Dim.of(2)}
    if name == "full":
        return {}, {"shape": [Dim.of(d) for d in s], "value": 2.5, "dtype": F32}
    if name in ("zeros", "ones"):
        return {}, {"shape": [Dim.of(d) for d in s], "dtype": F32}
    if name == "min_value":
        return {}, {"dtype": F32}
    if name == "cache_write":
        cache = arr(rng, (3, 2, 6, 4))
        return {
            "cache": cache,
            "rows": np.array([2, 0], dtype=np.int64),
            "positions": np.array([1, 3], dtype=np.int64),
            "new": arr(rng, (2, 2, 2, 4)),
        }, {}
    raise AssertionError(f"no test case for op `{name}`: add one")


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
