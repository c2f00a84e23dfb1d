"""Core IR simplifications: dead-code elimination, common subexpressions, constant folding,
over every graph of a program (entries, functions, loop and composite bodies).

Constant folding only evaluates ops whose result is exactly rounded in IEEE arithmetic
(integer and shape ops, casts, + - * /, comparisons), with the registry's numpy reference,
so a folded graph computes bit for bit what the unfolded one does on every backend. Pow,
exp, sin and the like are never folded: libm and vectorised kernels differ in the last bit.
Results are folded only while small (`FOLD_LIMIT` elements): a constant becomes text in
generated code, and a large one is better computed than read.
"""

from __future__ import annotations

import math
from typing import Any

from ..ops import REGISTRY
from ..types.dims import Dim
from .core import Graph, Op, Program, Value, walk_ops

FOLD_LIMIT = 64
# Known values are computed (to fold what reads them) only up to this many elements: a position table of
# `max_positions` rows is not worth computing in numpy, and `--max-positions 1000000000` made the fold an 8 GB
# `arange` before the cache-size check could refuse it.
KNOWN_LIMIT = 1 << 16
_NP_DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "i64": "int64", "i32": "int32", "bool": "bool"}


def optimize_program(program: Program) -> None:
    """`optimize` every graph of `program`, then drop the functions no entry calls (in place)."""
    for g in program.graphs():
        optimize(g)
    drop_unused_functions(program)


def optimize(g: Graph) -> None:
    """Fold constants, merge common subexpressions, drop dead code (in place)."""
    fold_constants(g)
    eliminate_common_subexpressions(g)
    eliminate_dead_code(g)
    for op in g.ops:
        if op.body is not None:
            optimize(op.body)


def drop_unused_functions(program: Program) -> None:
    """Remove the functions that no entry calls, directly or not."""
    called = {op.attrs["fn"] for g in program.entries.values() for op in walk_ops(g) if op.name == "call"}
    program.functions = {k: g for k, g in program.functions.items() if k in called}


def eliminate_dead_code(g: Graph) -> int:
    """Remove ops none of whose results reach an output or a state update, and that write no
    state (a call or loop that writes the KV cache stays). Returns the count."""
    live = {id(v) for v in g.outputs} | {id(v) for v in g.state_updates.values()}
    kept = []
    for op in reversed(g.ops):
        if op.writes or any(id(r) in live for r in op.results):
            kept.append(op)
            live |= {id(v) for v in op.inputs()}
    removed = len(g.ops) - len(kept)
    g.ops = list(reversed(kept))
    return removed


def _key(v: Any):
    if isinstance(v, Value):
        return ("v", id(v))
    if isinstance(v, Dim):
        return ("d", v.key())
    if isinstance(v, (list, tuple)):
        return ("l", tuple(_key(x) for x in v))
    if isinstance(v, dict):
        return ("m", tuple((k, _key(x)) for k, x in v.items()))
    if isinstance(v, float):
        return ("f", repr(v))
    return ("o", type(v).__name__, repr(v))


def eliminate_common_subexpressions(g: Graph) -> int:
    """Merge ops with the same name, arguments and attributes (all ops are pure: state
    updates are values), but for the registry's `random` ops: two dropouts of one tensor draw
    two masks while training. Returns the number of ops merged."""
    seen: dict[Any, Op] = {}
    replace: dict[int, Value] = {}
    random_callees: dict[int, bool] = {}
    kept = []
    for op in g.ops:
        _rewrite(op, replace)
        if op.name == "const":
            key = ("const", op.attrs["value"].dtype.str, op.attrs["value"].shape, op.attrs["value"].tobytes())
        elif op.body is not None or op.writes or _draws_random(op, random_callees):
            key = ("unique", id(op))  # bodies are not compared; state writes and random draws never merge
        else:
            key = (op.name, _key(op.args), _key(op.attrs))
        prior = seen.get(key)
        if prior is not None and len(prior.results) == len(op.results):
            for a, b in zip(op.results, prior.results):
                replace[id(a)] = b
            continue
        seen[key] = op
        kept.append(op)
    g.ops = kept
    g.outputs = [replace.get(id(v), v) for v in g.outputs]
    g.state_updates = {k: replace.get(id(v), v) for k, v in g.state_updates.items()}
    return len(replace)


def runs_random(g: Graph) -> bool:
    """Whether `g` runs a `random` registry op (dropout): itself, in a body, or in a callee, directly or not."""
    return any(op.name in REGISTRY and REGISTRY[op.name].random for op in walk_ops(g))


def _draws_random(op: Op, callees: dict[int, bool]) -> bool:
    """Whether `op` is a `random` registry op (dropout) or a call of a function that runs one (`callees` caches
    the answer per callee)."""
    if op.name in REGISTRY and REGISTRY[op.name].random:
        return True
    g = op.callee
    if g is None:
        return False
    if id(g) not in callees:
        callees[id(g)] = runs_random(g)
    return callees[id(g)]


def _rewrite(op: Op, replace: dict[int, Value]) -> None:
    for k, v in op.args.items():
        if isinstance(v, Value):
            op.args[k] = replace.get(id(v), v)
        elif isinstance(v, list):
            op.args[k] = [replace.get(id(x), x) if isinstance(x, Value) else x for x in v]


def fold_constants(g: Graph) -> int:
    """Replace small exact computations on known values by `const` ops. Returns the count."""
    import numpy as np

    known: dict[int, Any] = {}
    folded = 0
    for i, op in enumerate(g.ops):
        if op.name == "const":
            known[id(op.result)] = op.attrs["value"]
            continue
        if op.name not in REGISTRY or not REGISTRY[op.name].exact or len(op.results) != 1:
            continue
        r = op.result
        if any(r.dtype.name not in _NP_DTYPES for r in op.results) or any(d.as_int() is None for d in r.dims):
            continue
        if math.prod(d.as_int() for d in r.dims) > KNOWN_LIMIT:
            continue
        inputs = op.inputs()
        if any(id(v) not in known for v in inputs):
            continue
        args = {}
        for k, v in op.args.items():
            args[k] = _numpy_arg(v, known, np)
            if args[k] is _NO:
                break
        else:
            try:
                value = np.asarray(REGISTRY[op.name].reference(**args)).astype(_NP_DTYPES[r.dtype.name])
            except Exception:  # a reference that cannot take these arguments: leave the op alone
                continue
            known[id(r)] = value
            if inputs and value.size <= FOLD_LIMIT:
                g.ops[i] = Op("const", {}, [r], {"value": value}, origin=op.origin)
                r.producer = g.ops[i]
                folded += 1
    return folded


_NO = object()


def _numpy_arg(v, known, np):
    from ..types.core import DType

    if isinstance(v, Value):
        return known[id(v)]
    if isinstance(v, list):
        out = [_numpy_arg(x, known, np) for x in v]
        return _NO if any(x is _NO for x in out) else out
    if isinstance(v, Dim):
        n = v.as_int()
        return _NO if n is None else n
    if isinstance(v, DType):
        return np.dtype(_NP_DTYPES[v.name]) if v.name in _NP_DTYPES else _NO
    if isinstance(v, dict):
        return _NO
    return v
