"""Every registry op through the PyTorch backend: the output shape equals the registry's shape
rule and the values equal the op's numpy reference, on random inputs, both in the
interpreter and in generated code."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.ir.core import Graph, Op, Value
from linnet.ops import REGISTRY
from linnet.semantics.dims import Dim
from linnet.semantics.types import BOOL, F32, I64, Shape, TensorT

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from linnet.compiler.torch.codegen import EMITTERS, function_source  # noqa: E402
from linnet.compiler.torch.interpret import Interpreter  # noqa: E402

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
    if name == "mod":
        return {"x": arr(rng, s, I64) + 5, "y": arr(rng, s[-1:], I64) + 1}, {}
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


def _type(a: np.ndarray) -> TensorT:
    dtype = {np.dtype(np.float32): F32, np.dtype(np.int64): I64, np.dtype(np.bool_): BOOL}[a.dtype]
    return TensorT(dtype, Shape(tuple(Dim.of(d) for d in a.shape)))


def run_op(name: str, tensors: dict, const: dict, generated: bool):
    op_def = REGISTRY[name]
    inputs, args, rule = [], {}, {}
    for k, v in tensors.items():
        if isinstance(v, list):
            vals = [Value(_type(a), f"{k}{i}") for i, a in enumerate(v)]
            inputs += vals
            args[k] = vals
            rule[k] = [x.type for x in vals]
        else:
            val = Value(_type(v), k)
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
    flat = [torch.from_numpy(np.array(a)) for v in tensors.values() for a in (v if isinstance(v, list) else [v])]
    flat += [torch.zeros(1, dtype=torch.int64)] if anchor else []
    if generated:
        ns: dict = {}
        exec("import torch\nimport torch.nn.functional as F\n" + function_source(g), ns)
        out = ns["f"]({}, *flat)
    else:
        out = Interpreter(g).run({}, *flat)
    return out, types


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


def test_every_op_has_a_torch_lowering():
    assert set(REGISTRY) - set(EMITTERS) == set()


@pytest.mark.parametrize("generated", [False, True], ids=["interpret", "generated"])
@pytest.mark.parametrize("name", sorted(REGISTRY))
@settings(max_examples=8, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_op_matches_registry_and_reference(name, generated, shape, seed):
    rng = np.random.default_rng(seed)
    tensors, const = case(name, rng, shape)
    expected = reference(name, tensors, const)
    out, types = run_op(name, tensors, const, generated)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    refs = list(expected) if isinstance(expected, (tuple, list)) else [np.asarray(expected)]
    assert len(outs) == len(types) == len(refs)
    for o, t, ref in zip(outs, types, refs):
        assert tuple(o.shape) == tuple(d.as_int() for d in t.shape.dims), (name, tuple(o.shape), t)
        assert tuple(o.shape) == np.asarray(ref).shape
        got = o.numpy()
        assert got.dtype == np.asarray(ref).dtype, (name, got.dtype, np.asarray(ref).dtype)
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(ref).astype(np.float64), rtol=1e-5, atol=1e-6)
