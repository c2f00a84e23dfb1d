"""The primitives, grouped: elementwise, comparison and logic, reductions, linear algebra,
shape, indexing, construction, dtype, state. One `register(OpDef(...))` per op, holding all
of the op's facts (see `OpDef`): rules, doc, numpy reference, exactness, test cases.

Each entry's `reference` is its numpy definition and its `cases` draw the inputs the backends'
op tests compare against it (numpy is imported lazily, only by tests, constant folding and
backends' parity checks; the checker never calls either).
"""

from __future__ import annotations

import math

from ..types.core import BOOL, F32, I64, DType, Shape, TensorT, format_shape
from ..types.dims import Dim, format_dim, product, shown_value
from ..types.scalars import arithmetic
from . import cases
from .cases import array, dims
from .rearrange import rearrange_reference, rearrange_shape
from .registry import (
    REGISTRY,
    OpDef,
    OpError,
    OpParam,
    broadcast,
    describe_dtype,
    dim_index,
    exact,
    join_dtypes,
    operand_dtype,
    register,
    require_fit,
    same_dim,
    shape_of,
)
from .registry import require_float as _require_float
from .slices import slice_shape


def _np():
    import numpy

    return numpy


def _require_int(d: DType, op: str, arg: str) -> DType:
    if not d.is_int:
        raise OpError("L303", f"`{op}` requires an integer tensor for `{arg}`, got {describe_dtype(d)}", arg)
    return d


def _require_bool(d: DType, op: str, arg: str) -> DType:
    if d != BOOL:
        raise OpError("L303", f"`{op}` requires a bool tensor for `{arg}`, got {describe_dtype(d)}", arg)
    return d


T = OpParam  # short alias for the tables below

# ----------------------------------------------------------------------------- elementwise unary


def _unary(name, doc, ref, fold=None, float_only=True, exact=False):
    def dtype_rule(a, _name=name):
        d = a["x"].dtype
        if not float_only and d == BOOL:
            raise OpError(
                "L303",
                f"`{_name}` requires numbers, got bool",
                "x",
                notes=["for bools use `not`"] if _name == "neg" else [],
            )
        return _require_float(d, _name) if float_only else d

    register(
        OpDef(
            name,
            [T("x", "tensor")],
            doc,
            lambda a: a["x"].shape,
            dtype_rule,
            reference=ref,
            fold=fold,
            category="elementwise",
            exact=exact,
            cases=cases.unary,
        )
    )


def _sigmoid(x):
    np = _np()
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    np = _np()
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


_unary("exp", "e to the power of each element.", lambda x: _np().exp(x), math.exp)
_unary("log", "Natural logarithm of each element.", lambda x: _np().log(x), math.log)
_unary("sqrt", "Square root of each element.", lambda x: _np().sqrt(x), math.sqrt)
_unary("rsqrt", "1 / sqrt(x), elementwise (torch.rsqrt).", lambda x: 1.0 / _np().sqrt(x), lambda v: 1.0 / math.sqrt(v))
_unary("sin", "Sine of each element (radians).", lambda x: _np().sin(x), math.sin)
_unary("cos", "Cosine of each element (radians).", lambda x: _np().cos(x), math.cos)
_unary("tanh", "Hyperbolic tangent of each element.", lambda x: _np().tanh(x), math.tanh)
_unary("sigmoid", "1 / (1 + exp(-x)), elementwise.", _sigmoid, lambda v: 1.0 / (1.0 + math.exp(-v)))
_unary("erf", "The Gauss error function, elementwise (used by exact GELU).", _erf, math.erf)
_unary("abs", "Absolute value of each element.", lambda x: _np().abs(x), abs, float_only=False, exact=True)
_unary("neg", "Negation, elementwise: the unary `-`.", lambda x: -x, lambda v: -v, float_only=False, exact=True)


# ----------------------------------------------------------------------------- dropout


def _dropout_shape(a):
    """x's shape, where `p` lies in [0, 1) (checked where it is known: a module parameter's value is known once
    the module is instantiated). PyTorch accepts p = 1 (every element zeroed), but a layer that drops its whole
    input is a mistake in a model, and 1 / (1 - p) is its scale."""
    p = a["p"]
    if p is not None and not 0.0 <= p < 1.0:
        raise OpError(
            "L216",
            f"`dropout` requires a probability `p` in [0, 1), got {p!r}",
            "p",
            notes=["p is the chance that an element is zeroed while training (PyTorch's `F.dropout(x, p)`)"],
        )
    return a["x"].shape


def _dropout_reference(x, p):
    """Inference: the identity (`F.dropout(x, p, training=False)`); training draws its mask at random."""
    return x.copy()


register(
    OpDef(
        "dropout",
        [T("x", "tensor"), T("p", "float")],
        "While training, zeroes each element with probability `p` and scales the others by 1 / (1 - p); in "
        "inference (generation, serving, `linnet run`) the identity (torch.nn.functional.dropout).",
        _dropout_shape,
        lambda a: _require_float(a["x"].dtype, "dropout"),
        reference=_dropout_reference,
        category="random",
        cases=lambda rng, s: ({"x": array(rng, s)}, {"p": 0.25}),
        random=True,
    )
)


# ----------------------------------------------------------------------------- elementwise binary


def _binary(name, op, doc, ref, fold, result=None, exact=True, draw=cases.binary, divides=False):
    """An elementwise binary op: exact (correctly rounded, foldable) unless `exact=False`;
    the backends' op tests hold every exact op to the reference bit for bit. `divides`: a compile-time zero `y` is
    L408, as in compile-time arithmetic (`ids % 0` fails on PyTorch and ONNX Runtime and gives garbage on XLA)."""
    params = [T("x", "operand"), T("y", "operand")]

    def shape_rule(a):
        return broadcast(shape_of(a["x"]), shape_of(a["y"]))

    def dtype_rule(a, _op=op or name):
        y = a["y"]
        if divides and ((isinstance(y, Dim) and y.as_int() == 0) or (isinstance(y, float) and y == 0.0)):
            raise OpError("L408", f"`{_op}` by zero has no value", "y")
        d = operand_dtype(a, op=_op)
        if result is not None:
            return result(d, _op)
        return d

    register(
        OpDef(
            name,
            params,
            doc,
            shape_rule,
            dtype_rule,
            reference=ref,
            fold=fold,
            category="elementwise",
            operator=op,
            exact=exact,
            cases=draw,
        )
    )


def _float_only(d, op):
    return _require_float(d, op)


def _to_bool(d, op):
    return BOOL


def _bool_only(d, op):
    if d != BOOL:
        raise OpError("L303", f"`{op}` requires bool tensors, got {describe_dtype(d)}")
    return BOOL


def _scalar(symbol: str):
    """The fold of an operator's op: the one scalar semantics (`types/scalars.py`)."""
    return lambda a, b: arithmetic(symbol, a, b)


def _numbers(d, op):
    if not (d.is_int or d.is_float):
        raise OpError("L303", f"`{op}` requires numbers, got {describe_dtype(d)}")
    return d


_binary("add", "+", "Elementwise sum with broadcasting.", lambda x, y: x + y, _scalar("+"), result=_numbers)
_binary("sub", "-", "Elementwise difference with broadcasting.", lambda x, y: x - y, _scalar("-"), result=_numbers)
_binary("mul", "*", "Elementwise product with broadcasting.", lambda x, y: x * y, _scalar("*"), result=_numbers)
_binary(
    "div",
    "/",
    "Elementwise true division with broadcasting (floats only).",
    lambda x, y: x / y,
    _scalar("/"),
    result=_float_only,
)
_binary(
    "floor_divide",
    "//",
    "Elementwise floor division with broadcasting (torch.floor_divide): the quotient rounded toward "
    "minus infinity, `-7 // 2` is -4 and `7.5 // -2.0` is -4.0.",
    lambda x, y: _np().floor_divide(x, y),
    _scalar("//"),
    result=_numbers,
    draw=cases.signed_division,
    divides=True,
)
_binary(
    "mod",
    "%",
    "Elementwise remainder of floor division with broadcasting (torch.remainder): it has the divisor's "
    "sign, `-7 % 2` is 1 and `-7.5 % 2.0` is 0.5.",
    lambda x, y: _np().remainder(x, y),
    _scalar("%"),
    result=_numbers,
    draw=cases.signed_division,
    divides=True,
)
_binary(
    "pow",
    "**",
    "Elementwise power with broadcasting (floats only).",
    lambda x, y: x**y,
    _scalar("**"),
    result=_float_only,
    exact=False,  # libm's pow and vectorised kernels differ in the last bit
)
_binary("maximum", None, "Elementwise maximum with broadcasting.", lambda x, y: _np().maximum(x, y), max)
_binary("minimum", None, "Elementwise minimum with broadcasting.", lambda x, y: _np().minimum(x, y), min)
_binary("eq", "==", "Elementwise `==`; gives bool.", lambda x, y: x == y, lambda a, b: a == b, result=_to_bool)
_binary("ne", "!=", "Elementwise `!=`; gives bool.", lambda x, y: x != y, lambda a, b: a != b, result=_to_bool)
_binary("lt", "<", "Elementwise `<`; gives bool.", lambda x, y: x < y, lambda a, b: a < b, result=_to_bool)
_binary("le", "<=", "Elementwise `<=`; gives bool.", lambda x, y: x <= y, lambda a, b: a <= b, result=_to_bool)
_binary("gt", ">", "Elementwise `>`; gives bool.", lambda x, y: x > y, lambda a, b: a > b, result=_to_bool)
_binary("ge", ">=", "Elementwise `>=`; gives bool.", lambda x, y: x >= y, lambda a, b: a >= b, result=_to_bool)
_binary(
    "logical_and",
    "and",
    "Elementwise `and` of bool tensors.",
    lambda x, y: _np().logical_and(x, y),
    lambda a, b: a and b,
    result=_bool_only,
    draw=cases.bool_binary,
)
_binary(
    "logical_or",
    "or",
    "Elementwise `or` of bool tensors.",
    lambda x, y: _np().logical_or(x, y),
    lambda a, b: a or b,
    result=_bool_only,
    draw=cases.bool_binary,
)

register(
    OpDef(
        "logical_not",
        [T("x", "tensor")],
        "Elementwise `not` of a bool tensor.",
        lambda a: a["x"].shape,
        lambda a: _require_bool(a["x"].dtype, "not", "x"),
        reference=lambda x: _np().logical_not(x),
        fold=lambda v: not v,
        category="elementwise",
        operator="not",
        exact=True,
        cases=cases.bool_unary,
    )
)

# ----------------------------------------------------------------------------- reductions


def _reduce_shape(a):
    x: Shape = a["x"].shape
    d = dim_index(x, a["dim"])
    dims = list(x.dims)
    if a["keepdim"]:
        dims[d] = Dim.of(1)
    else:
        del dims[d]
    return Shape(tuple(dims), x.prefix)


def _reduction(name, doc, ref, dtype_rule):
    register(
        OpDef(
            name,
            [T("x", "tensor"), T("dim", "index", -1), T("keepdim", "bool", False)],
            doc,
            _reduce_shape,
            dtype_rule,
            reference=ref,
            category="reduction",
            cases=cases.reduction,
        )
    )


_reduction(
    "sum",
    "Sum over one dim (`keepdim` keeps it as size 1).",
    lambda x, dim=-1, keepdim=False: _np().sum(x, axis=dim, keepdims=keepdim).astype(x.dtype),
    lambda a: a["x"].dtype if a["x"].dtype != BOOL else I64,
)
_reduction(
    "mean",
    "Mean over one dim (floats only).",
    lambda x, dim=-1, keepdim=False: _np().mean(x, axis=dim, keepdims=keepdim).astype(x.dtype),
    lambda a: _require_float(a["x"].dtype, "mean"),
)
_reduction(
    "max",
    "Maximum over one dim.",
    lambda x, dim=-1, keepdim=False: _np().max(x, axis=dim, keepdims=keepdim),
    lambda a: a["x"].dtype,
)
_reduction(
    "min",
    "Minimum over one dim.",
    lambda x, dim=-1, keepdim=False: _np().min(x, axis=dim, keepdims=keepdim),
    lambda a: a["x"].dtype,
)
_reduction(
    "argmax",
    "Index of the maximum over one dim (i64; first index on ties).",
    lambda x, dim=-1, keepdim=False: (
        _np().expand_dims(_np().argmax(x, axis=dim), dim) if keepdim else _np().argmax(x, axis=dim)
    ),
    lambda a: I64,
)


def _top_k_shape(a):
    x: Shape = a["x"].shape
    k: Dim = a["k"]
    if x.prefix is None and not x.dims:
        raise OpError("L208", "`top_k` requires a tensor of rank 1 or more", "x")
    n = x.dims[-1] if x.dims else None
    if k is not None and k.as_int() is not None and k.as_int() < 1:
        raise OpError("L211", f"`top_k` keeps at least one entry, got k = {k.as_int()}", "k")
    if (
        k is not None
        and n is not None
        and k.as_int() is not None
        and n.as_int() is not None
        and k.as_int() > n.as_int()
    ):
        raise OpError("L211", f"`top_k` keeps {k.as_int()} of {n.as_int()} entries", "k", dims=(k, n))
    out = Shape(tuple(x.dims[:-1]) + (k,), x.prefix)
    return [out, out]


def _top_k_reference(x, k):
    np = _np()
    indices = np.argsort(-x, axis=-1, kind="stable")[..., : int(k)]
    return np.take_along_axis(x, indices, axis=-1), indices.astype(np.int64)


register(
    OpDef(
        "top_k",
        [T("x", "tensor"), T("k", "int")],
        "The `k` largest entries of the last dim, largest first, and their indices (i64), as a tuple "
        "(`let (values, indices) = top_k(logits, 4)`; torch.topk, jax.lax.top_k, ONNX TopK): equal entries go "
        "to the lower index first.",
        _top_k_shape,
        lambda a: [a["x"].dtype, I64],
        reference=_top_k_reference,
        category="reduction",
        exact=True,
        cases=lambda rng, s: (
            {"x": array(rng, s[:-1] + (5,)) if rng.random() < 0.5 else rng.integers(0, 3, s[:-1] + (5,)).astype("f4")},
            {"k": Dim.of(int(rng.integers(1, 6)))},
        ),
    )
)

# ----------------------------------------------------------------------------- linear algebra


def _matmul_shape(a):
    x, y = a["x"].shape, a["y"].shape
    if (x.prefix is None and len(x.dims) == 0) or (y.prefix is None and len(y.dims) == 0):
        raise OpError("L208", "`@` requires tensors of rank 1 or more")
    xd, yd = list(x.dims), list(y.dims)
    if x.prefix is not None and len(xd) >= 1 and y.prefix is None and len(yd) == 2:
        # [..., K] @ [K, N] is [..., N] whether `x` is a vector or a batch of rows.
        if not same_dim(xd[-1], yd[0]):
            raise OpError(
                "L202",
                f"cannot matmul {format_shape(x)} with {format_shape(y)}: "
                f"{format_dim(shown_value(xd[-1]))} vs {format_dim(shown_value(yd[0]))}",
                arg_labels={"x": format_shape(x), "y": format_shape(y)},
                dims=(xd[-1], yd[0]),
                notes=["`a @ b` contracts the last dim of `a` with the second-to-last of `b`"],
            )
        return Shape(tuple(xd[:-1]) + (yd[1],), x.prefix)
    x_vec = x.prefix is None and len(xd) == 1
    y_vec = y.prefix is None and len(yd) == 1
    if x_vec:
        xd = [Dim.of(1)] + xd
    if y_vec:
        yd = yd + [Dim.of(1)]
    if len(xd) < 2 and x.prefix is not None or len(yd) < 2 and y.prefix is not None:
        raise OpError("L208", f"cannot matmul {format_shape(x)} with {format_shape(y)}: rank unknown")
    k1, k2 = xd[-1], yd[-2]
    if not same_dim(k1, k2):
        raise OpError(
            "L202",
            f"cannot matmul {format_shape(x)} with {format_shape(y)}: "
            f"{format_dim(shown_value(k1))} vs {format_dim(shown_value(k2))}",
            arg_labels={"x": format_shape(x), "y": format_shape(y)},
            dims=(k1, k2),
            notes=["`a @ b` contracts the last dim of `a` with the second-to-last of `b`"],
        )
    batch = broadcast(Shape(tuple(xd[:-2]), x.prefix), Shape(tuple(yd[:-2]), y.prefix))
    dims = list(batch.dims)
    if not x_vec:
        dims.append(xd[-2])
    if not y_vec:
        dims.append(yd[-1])
    return Shape(tuple(dims), batch.prefix)


def _matmul_dtype(a):
    d = join_dtypes(a["x"].dtype, a["y"].dtype, "@")
    if d == BOOL:
        raise OpError("L303", "`@` requires numbers, got bool tensors", notes=["consider `cast(x, f32)` first"])
    return d


def _matmul_flops(a, results):
    """2 x multiply-adds: each result element sums over the contracted dim (x's last)."""
    return Dim.of(2) * product(results[0].shape.dims) * a["x"].shape.dims[-1]


def _matmul_cases(rng, s):
    return {"x": array(rng, s[:-1] + (3,)), "y": array(rng, (3, 4))}, {}


register(
    OpDef(
        "matmul",
        [T("x", "tensor"), T("y", "tensor")],
        "Matrix product `x @ y` with numpy semantics: batch dims broadcast; rank-1 operands are "
        "treated as a row or column vector.",
        _matmul_shape,
        _matmul_dtype,
        reference=lambda x, y: _np().matmul(x, y),
        category="linalg",
        operator="@",
        cases=_matmul_cases,
        flops=_matmul_flops,
    )
)


def _linear_shape(a):
    x, w = a["x"].shape, a["weight"].shape
    if w.prefix is not None or len(w.dims) != 2:
        raise OpError("L208", f"linear requires a weight [out_features, in_features], got {format_shape(w)}", "weight")
    if x.prefix is None and len(x.dims) == 0:
        raise OpError("L208", "linear requires an input of rank 1 or more", "x")
    k, n = x.dims[-1], w.dims
    if not same_dim(k, n[1]):
        raise OpError(
            "L202",
            f"cannot apply a weight {format_shape(w)} to {format_shape(x)}: "
            f"{format_dim(shown_value(k))} vs {format_dim(shown_value(n[1]))}",
            arg_labels={"x": format_shape(x), "weight": format_shape(w)},
            notes=["`linear(x, weight)` is `x @ transpose(weight)`: weight is [out_features, in_features]"],
        )
    return Shape(tuple(x.dims[:-1]) + (n[0],), x.prefix)


register(
    OpDef(
        "linear",
        [T("x", "tensor"), T("weight", "tensor")],
        "A linear layer without bias, `x @ transpose(weight)` with `weight` [out_features, in_features] as "
        "PyTorch stores it (torch.nn.functional.linear). Passes make it from that matmul so backends contract "
        "the weight where it lies.",
        _linear_shape,
        lambda a: _matmul_dtype({"x": a["x"], "y": a["weight"]}),
        reference=lambda x, weight: _np().matmul(x, _np().swapaxes(weight, -1, -2)),
        category="linalg",
        cases=lambda rng, s: ({"x": array(rng, s[:-1] + (3,)), "weight": array(rng, (4, 3))}, {}),
        flops=_matmul_flops,  # x's last dim is in_features
    )
)

# ----------------------------------------------------------------------------- shape


def _reshape_shape(a):
    x: Shape = a["x"].shape
    target = list(a["shape"])
    if x.prefix is not None:
        raise OpError(
            "L208", f"reshape needs a known rank, got {format_shape(x)}", notes=["consider rearrange with `...`"]
        )
    before, after = product(x.dims), product(target)
    if before is not None and after is not None and not before.same(after):
        raise OpError(
            "L205",
            f"reshape from {format_shape(x)} to {format_shape(Shape(tuple(target)))} changes the "
            f"element count: {format_dim(shown_value(before))} vs {format_dim(shown_value(after))}",
            "shape",
        )
    return Shape(tuple(target))


register(
    OpDef(
        "reshape",
        [T("x", "tensor"), T("shape", "ints")],
        "The same elements in a new shape (row-major); the element count must be equal.",
        _reshape_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, shape: _np().reshape(x, [int(s) for s in shape]),
        category="shape",
        view=True,
        reshapes=True,
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, s)}, {"shape": [Dim.of(math.prod(s))]}),
    )
)


def _transpose_shape(a):
    x: Shape = a["x"].shape
    d0, d1 = dim_index(x, a["dim0"], "dim0"), dim_index(x, a["dim1"], "dim1")
    dims = list(x.dims)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return Shape(tuple(dims), x.prefix)


register(
    OpDef(
        "transpose",
        [T("x", "tensor"), T("dim0", "index", -2), T("dim1", "index", -1)],
        "Swap two dims (by default the last two, so `transpose(w)` of a matrix is its transpose).",
        _transpose_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, dim0=-2, dim1=-1: _np().swapaxes(x, dim0, dim1),
        category="shape",
        view=True,
        reshapes=True,
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, s)}, {"dim0": 0, "dim1": len(s) - 1}),
    )
)


def _permute_shape(a):
    x: Shape = a["x"].shape
    perm = list(a["dims"])
    if x.prefix is not None:
        raise OpError("L208", f"permute needs a known rank, got {format_shape(x)}")
    n = len(x.dims)
    norm = [p + n if p < 0 else p for p in perm]
    if sorted(norm) != list(range(n)):
        raise OpError("L208", f"permute needs a permutation of 0..{n - 1}, got {perm}", "dims")
    return Shape(tuple(x.dims[p] for p in norm))


register(
    OpDef(
        "permute",
        [T("x", "tensor"), T("dims", "indices")],
        "Reorder all dims (torch.permute).",
        _permute_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, dims: _np().transpose(x, dims),
        category="shape",
        view=True,
        reshapes=True,
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, s)}, {"dims": rng.permutation(len(s)).tolist()}),
    )
)


def _unsqueeze_shape(a):
    x: Shape = a["x"].shape
    d = dim_index(x, a["dim"], extra=1)
    dims = list(x.dims)
    pos = len(dims) + 1 + d
    dims.insert(pos, Dim.of(1))
    return Shape(tuple(dims), x.prefix)


register(
    OpDef(
        "unsqueeze",
        [T("x", "tensor"), T("dim", "index")],
        "Insert a dim of size 1 at `dim` (of the result).",
        _unsqueeze_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, dim: _np().expand_dims(x, dim),
        category="shape",
        view=True,
        reshapes=True,
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, s)}, {"dim": int(rng.integers(-len(s) - 1, len(s) + 1))}),
    )
)


def _squeeze_shape(a):
    x: Shape = a["x"].shape
    d = dim_index(x, a["dim"])
    dims = list(x.dims)
    if dims[d] is not None and dims[d].as_int() != 1:
        raise OpError(
            "L208",
            f"squeeze needs a dim of size 1, dim {a['dim']} of {format_shape(x)} is {format_dim(shown_value(dims[d]))}",
            "dim",
        )
    del dims[d]
    return Shape(tuple(dims), x.prefix)


register(
    OpDef(
        "squeeze",
        [T("x", "tensor"), T("dim", "index")],
        "Remove a dim of size 1.",
        _squeeze_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, dim: _np().squeeze(x, axis=dim),
        category="shape",
        view=True,
        reshapes=True,
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, s + (1,))}, {"dim": -1}),
    )
)


def _expand_shape(a):
    x: Shape = a["x"].shape
    target = Shape(tuple(a["shape"]))
    if x.prefix is not None:
        raise OpError("L208", f"expand needs a known rank, got {format_shape(x)}")
    if len(x.dims) > len(target.dims):
        raise OpError("L208", f"cannot expand {format_shape(x)} to the lower rank {format_shape(target)}", "shape")
    for i in range(1, len(x.dims) + 1):
        dx, dt = x.dims[-i], target.dims[-i]
        if dx is None or dt is None or dx.same(dt) or dx.as_int() == 1:
            continue
        raise OpError(
            "L201",
            f"cannot expand {format_shape(x)} to {format_shape(target)} "
            f"(dim {len(x.dims) - i}: {format_dim(shown_value(dx))} vs {format_dim(shown_value(dt))})",
            "shape",
        )
    return target


register(
    OpDef(
        "expand",
        [T("x", "tensor"), T("shape", "ints")],
        "Broadcast to a shape (dims of size 1 repeat; numpy.broadcast_to).",
        _expand_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, shape: _np().broadcast_to(x, [int(s) for s in shape]).copy(),
        category="shape",
        view=True,
        reshapes=True,
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, (1,) + s)}, {"shape": dims((3,) + s)}),
    )
)

register(
    OpDef(
        "rearrange",
        [T("x", "tensor"), T("pattern", "str"), T("sizes", "sizes")],
        'einops-style reshape and transpose: `rearrange(x, "b s (h d) -> b h s d", h=9)`. Every '
        "axis on one side appears on the other; sizes of split groups are given as keywords or "
        "inferred by exact division.",
        lambda a: rearrange_shape(a["x"].shape, a["pattern"], a["sizes"]),
        lambda a: a["x"].dtype,
        reference=rearrange_reference,
        category="shape",
        view=True,
        reshapes=True,
        cases=lambda rng, s: (
            {"x": array(rng, (2, 3, 4 * 5))},
            {"pattern": "b s (h d) -> b h s d", "sizes": {"h": Dim.of(4)}},
        ),
    )
)


def _concat_shape(a):
    xs: list[TensorT] = a["xs"]
    if not xs:
        raise OpError("L211", "concat needs at least one tensor", "xs")
    first = xs[0].shape
    d = dim_index(first, a["dim"])
    total = Dim()
    dims = list(first.dims)
    for t in xs:
        s = t.shape
        if len(s.dims) != len(first.dims) or (s.prefix is None) != (first.prefix is None):
            raise OpError(
                "L211", f"concat needs tensors of one rank: {format_shape(first)} and {format_shape(s)}", "xs"
            )
        for j, (p, q) in enumerate(zip(first.dims, s.dims)):
            if j != len(dims) + d and not same_dim(p, q):
                raise OpError(
                    "L211",
                    f"concat along dim {a['dim']}: {format_shape(first)} and {format_shape(s)} differ in dim {j}",
                    "xs",
                )
        if total is not None:
            total = None if s.dims[d] is None else total + s.dims[d]
    dims[d] = total
    return Shape(tuple(dims), first.prefix)


def _concat_dtype(a):
    d = a["xs"][0].dtype if a["xs"] else BOOL
    for t in a["xs"][1:]:
        d = join_dtypes(d, t.dtype, "concat")
    return d


register(
    OpDef(
        "concat",
        [T("xs", "tensors"), T("dim", "index", -1)],
        "Join tensors along one dim (torch.cat); the other dims must agree.",
        _concat_shape,
        _concat_dtype,
        reference=lambda xs, dim=-1: _np().concatenate(xs, axis=dim),
        category="shape",
        reshapes=True,
        exact=True,
        cases=lambda rng, s: ({"xs": [array(rng, s), array(rng, s)]}, {"dim": -1}),
    )
)


def _split_shapes(a):
    x: Shape = a["x"].shape
    d = dim_index(x, a["dim"])
    sizes = list(a["sizes"])
    acc = Dim()
    for s in sizes:
        acc = None if (acc is None or s is None) else acc + s
    total = acc
    have = x.dims[d]
    if total is not None and have is not None and not total.same(have):
        raise OpError(
            "L211",
            f"split sizes add up to {format_dim(shown_value(total))} but dim {a['dim']} of "
            f"{format_shape(x)} is {format_dim(shown_value(have))}",
            "sizes",
        )
    out = []
    for s in sizes:
        dims = list(x.dims)
        dims[d] = s
        out.append(Shape(tuple(dims), x.prefix))
    return out


def _split_reference(x, sizes, dim=-1):
    np = _np()
    cuts = np.cumsum([int(s) for s in sizes])[:-1]
    return tuple(np.split(x, cuts, axis=dim))


register(
    OpDef(
        "split",
        [T("x", "tensor"), T("sizes", "ints"), T("dim", "index", -1)],
        "Cut a tensor into pieces of the given sizes along one dim; gives a tuple "
        "(`let (q, k, v) = split(qkv, [d, d, d], dim=-1)`).",
        _split_shapes,
        lambda a: [a["x"].dtype] * len(a["sizes"]),
        reference=_split_reference,
        category="shape",
        reshapes=True,  # not `view`: torch.split's pieces are views of x, but `view` is of one result
        cases=lambda rng, s: ({"x": array(rng, s[:-1] + (5,))}, {"sizes": dims((2, 3)), "dim": -1}),
    )
)


def _repeat_shape(a):
    x: Shape = a["x"].shape
    d = dim_index(x, a["dim"])
    dims = list(x.dims)
    r = a["repeats"]
    n = r.as_int() if r is not None else None
    if n is not None and n < 1:
        # torch gives an empty dim for 0; ONNX Runtime's Expand refused the lowering's [.., 0, ..] (fixed dims)
        raise OpError("L216", f"`repeat_interleave` requires `repeats` of 1 or more, got {n}", "repeats")
    dims[d] = None if (dims[d] is None or r is None) else dims[d] * r
    return Shape(tuple(dims), x.prefix)


register(
    OpDef(
        "repeat_interleave",
        [T("x", "tensor"), T("repeats", "int"), T("dim", "index")],
        "Repeat each slice along `dim` `repeats` (1 or more) times in place (torch.repeat_interleave): with "
        "dim=1 on [B, Hkv, S, D], query head h reads KV head h // repeats (GQA).",
        _repeat_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, repeats, dim: _np().repeat(x, int(repeats), axis=dim),
        category="shape",
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, s)}, {"repeats": Dim.of(3), "dim": 0}),
    )
)

# ----------------------------------------------------------------------------- indexing


def _take_shape(a):
    x: Shape = a["x"].shape
    idx: Shape = a["indices"].shape
    d = dim_index(x, a["dim"])
    if x.prefix is not None and idx.prefix is not None:
        raise OpError("L208", "take: both the tensor and the indices have a `...`")
    n = len(x.dims)
    dims = list(x.dims[: n + d]) + list(idx.dims) + list(x.dims[n + d + 1 :])
    prefix = x.prefix if x.prefix is not None else idx.prefix
    if idx.prefix is not None and n + d > 0:
        raise OpError("L208", "take: indices with `...` must index the first dim")
    return Shape(tuple(dims), prefix)


def _take_cases(rng, s):
    indices = rng.integers(0, s[0], size=(2, 3)).astype("int64")
    return {"x": array(rng, s), "indices": indices}, {"dim": 0}


register(
    OpDef(
        "take",
        [T("x", "tensor"), T("indices", "tensor"), T("dim", "index", 0)],
        "Gather slices of `x` along `dim` at integer `indices` (numpy.take; torch.index_select "
        "generalised to any index shape). `take(weight, ids, dim=0)` is an embedding lookup.",
        _take_shape,
        lambda a: (_require_int(a["indices"].dtype, "take", "indices"), a["x"].dtype)[1],
        reference=lambda x, indices, dim=0: _np().take(x, indices, axis=dim),
        category="indexing",
        exact=True,
        cases=_take_cases,
    )
)


register(
    OpDef(
        "slice",
        [T("x", "tensor"), T("dim", "index"), T("start", "int", None), T("stop", "int", None)],
        "Elements `start:stop` of one dim (what `x[..., a:b]` means). Negative bounds count from the end.",
        slice_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, dim, start=None, stop=None: _np().take(
            x, range(*slice(start, stop).indices(x.shape[dim])), axis=dim
        ),
        category="indexing",
        view=True,
        exact=True,
        cases=lambda rng, s: (
            {"x": array(rng, s)},
            {"dim": len(s) - 1, "start": Dim.of(0), "stop": Dim.of(max(1, s[-1] - 1))},
        ),
    )
)


def _select_shape(a):
    x: Shape = a["x"].shape
    d = dim_index(x, a["dim"])
    dims = list(x.dims)
    idx = a["index"]
    i, n = (idx.as_int() if idx is not None else None), (dims[d].as_int() if dims[d] is not None else None)
    if i is not None and n is not None and not -n <= i < n:
        raise OpError("L212", f"index {i} is out of range for a dim of size {n}", "index")
    if idx is not None and dims[d] is not None and n is None:
        past = (dims[d] - idx).as_int()  # size - index known although the size is not
        if past is not None and past <= 0:
            raise OpError(
                "L212", f"index {format_dim(idx)} is past the end of a dim of size {format_dim(dims[d])}", "index"
            )
    del dims[d]
    return Shape(tuple(dims), x.prefix)


register(
    OpDef(
        "select",
        [T("x", "tensor"), T("dim", "index"), T("index", "int")],
        "One element of one dim, removing it (what `x[:, -1]` means).",
        _select_shape,
        lambda a: a["x"].dtype,
        reference=lambda x, dim, index: _np().take(x, int(index), axis=dim),
        category="indexing",
        view=True,
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, s)}, {"dim": len(s) - 1, "index": Dim.of(-1)}),
    )
)


def _where_shape(a):
    c = shape_of(a["cond"])
    return broadcast(broadcast(c, shape_of(a["x"]), ("cond", "x")), shape_of(a["y"]), ("x", "y"))


def _where_dtype(a):
    if isinstance(a["cond"], TensorT):
        _require_bool(a["cond"].dtype, "where", "cond")
    if not isinstance(a["x"], TensorT) and not isinstance(a["y"], TensorT):
        raise OpError("L107", "where needs a tensor for `x` or `y`")
    try:
        return operand_dtype(a, ("x", "y"), "where")
    except OpError as err:
        raise OpError(
            "L306", f"where's branches differ: {err.message.split(': ', 1)[-1]}", "y", notes=err.notes
        ) from err


register(
    OpDef(
        "where",
        [T("cond", "tensor"), T("x", "operand"), T("y", "operand")],
        "Elementwise choice: `x` where `cond` is true, else `y` (broadcast; one dtype).",
        _where_shape,
        _where_dtype,
        reference=lambda cond, x, y: _np().where(cond, x, y),
        category="indexing",
        exact=True,
        cases=lambda rng, s: ({"cond": array(rng, s, BOOL), "x": array(rng, s), "y": array(rng, s[-1:])}, {}),
    )
)

# ----------------------------------------------------------------------------- construction and dtype


register(
    OpDef(
        "cast",
        [T("x", "tensor"), T("dtype", "dtype")],
        "Convert to another dtype (`cast(h, f32)`, `cast(h, x.dtype)`): the only way dtypes change.",
        lambda a: a["x"].shape,
        lambda a: a["dtype"],
        reference=lambda x, dtype: x.astype(dtype),
        category="dtype",
        exact=True,
        cases=lambda rng, s: ({"x": array(rng, s) * 3}, {"dtype": I64}),
    )
)


def _arange_shape(a):
    start, stop, step = a["start"], a["stop"], a["step"]
    if stop is None:
        start, stop = Dim.of(0), start
    if start is None or stop is None or step is None:
        return Shape((None,))
    s = step.as_int()
    if s is None or s <= 0:
        raise OpError("L208", f"arange needs a known positive step, got {format_dim(step)}", "step")
    span = stop - start
    n = span.as_int()
    if n is not None:
        return Shape((Dim.of(max(0, -(-n // s))),))
    return Shape((exact(span, step, "arange length", "stop"),))


register(
    OpDef(
        "arange",
        [T("start", "int"), T("stop", "int", None), T("step", "int", Dim.of(1))],
        "i64[n]: start, start + step, ... below stop (`arange(S)` is 0..S-1).",
        _arange_shape,
        lambda a: I64,
        reference=lambda start, stop=None, step=1: _np().arange(
            int(start), None if stop is None else int(stop), int(step), dtype="int64"
        ),
        category="construction",
        exact=True,
        cases=lambda rng, s: ({}, {"start": Dim.of(1), "stop": Dim.of(9), "step": Dim.of(2)}),
    )
)


def _full_dtype(a):
    require_fit(a["value"], a["dtype"], "full", "value")
    return a["dtype"]


register(
    OpDef(
        "full",
        [T("shape", "ints"), T("value", "float"), T("dtype", "dtype")],
        "A tensor of one value.",
        lambda a: Shape(tuple(a["shape"])),
        _full_dtype,
        reference=lambda shape, value, dtype: _np().full([int(s) for s in shape], value, dtype=dtype),
        category="construction",
        exact=True,
        cases=lambda rng, s: ({}, {"shape": dims(s), "value": 2.5, "dtype": F32}),
    )
)
register(
    OpDef(
        "zeros",
        [T("shape", "ints"), T("dtype", "dtype")],
        "A tensor of zeros.",
        lambda a: Shape(tuple(a["shape"])),
        lambda a: a["dtype"],
        reference=lambda shape, dtype: _np().zeros([int(s) for s in shape], dtype=dtype),
        category="construction",
        exact=True,
        cases=cases.filled,
    )
)
register(
    OpDef(
        "ones",
        [T("shape", "ints"), T("dtype", "dtype")],
        "A tensor of ones.",
        lambda a: Shape(tuple(a["shape"])),
        lambda a: a["dtype"],
        reference=lambda shape, dtype: _np().ones([int(s) for s in shape], dtype=dtype),
        category="construction",
        exact=True,
        cases=cases.filled,
    )
)


def _tensor_dtype(a):
    if a["dtype"] == BOOL:
        raise OpError("L303", "`tensor` makes a numeric tensor, got bool", "dtype")
    return a["dtype"]


register(
    OpDef(
        "tensor",
        [T("values", "numbers"), T("dtype", "dtype")],
        "A 1-d tensor of compile-time numbers, rounded to `dtype` (`tensor(c.rope_scaling.short_factor, f32)`; "
        "torch.tensor(values, dtype=dtype)).",
        lambda a: Shape((Dim.of(len(a["values"])),)),
        _tensor_dtype,
        reference=lambda values, dtype: _np().array(values, dtype="float64").astype(dtype),
        category="construction",
        exact=True,
        cases=lambda rng, s: ({}, {"values": [float(v) for v in rng.random(s[0]) * 4 - 2], "dtype": F32}),
    )
)


def _min_value_dtype(a):
    return _require_float(a["dtype"], "min_value", "dtype")


register(
    OpDef(
        "min_value",
        [T("dtype", "dtype")],
        "The most negative finite value of a float dtype, as a 0-d tensor (torch.finfo(dtype).min; "
        "transformers fills masked attention scores with it).",
        lambda a: Shape(()),
        _min_value_dtype,
        reference=lambda dtype: _np().array(_np().finfo(dtype).min, dtype=dtype),
        category="construction",
        cases=lambda rng, s: ({}, {"dtype": F32}),
    )
)

# ----------------------------------------------------------------------------- state


def _cache_write_shape(a):
    cache, rows, positions, new = (a[k].shape for k in ("cache", "rows", "positions", "new"))
    for name, s, rank in (("cache", cache, 4), ("new", new, 4), ("rows", rows, 1), ("positions", positions, 1)):
        if s.prefix is not None or len(s.dims) != rank:
            raise OpError("L208", f"cache_write needs `{name}` of rank {rank}, got {format_shape(s)}", name)
    for i, what in ((1, "heads"), (3, "head size")):
        if not same_dim(cache.dims[i], new.dims[i]):
            raise OpError(
                "L203",
                f"cache_write: `new` {format_shape(new)} and `cache` {format_shape(cache)} differ in {what} (dim {i})",
                "new",
            )
    for name, s in (("rows", rows), ("positions", positions)):
        if not same_dim(s.dims[0], new.dims[0]):
            raise OpError(
                "L203",
                f"cache_write: `{name}` {format_shape(s)} has one entry per batch row of `new` {format_shape(new)}",
                name,
            )
    return cache


def _cache_write_dtype(a):
    # i64 only: every backend builds the cache indices in i64 (ONNX Runtime refused i32
    # positions at run time, after they had checked clean)
    for arg in ("rows", "positions"):
        d = a[arg].dtype
        if d != I64:
            raise OpError(
                "L303",
                f"`cache_write` requires i64 `{arg}`, got {describe_dtype(d)}",
                arg,
                notes=["cache rows and token positions are i64 (as `step` takes them)"],
                casts={arg: I64} if d.is_int or d.is_float else {},
            )
    return join_dtypes(a["cache"].dtype, a["new"].dtype, "cache_write")


def _cache_write_reference(cache, rows, positions, new):
    out = cache.copy()
    s = new.shape[2]
    for b in range(new.shape[0]):
        out[rows[b], :, positions[b] : positions[b] + s, :] = new[b]
    return out


def _cache_write_cases(rng, s):
    """A cache of 3 rows, 2 heads, 6 positions, head size 4; two new entries of 2 positions
    written out of order (into rows 2 and 0, at positions 1 and 3)."""
    np = _np()
    return {
        "cache": array(rng, (3, 2, 6, 4)),
        "rows": np.array([2, 0], dtype=np.int64),
        "positions": np.array([1, 3], dtype=np.int64),
        "new": array(rng, (2, 2, 2, 4)),
    }, {}


register(
    OpDef(
        "cache_write",
        [T("cache", "tensor"), T("rows", "tensor"), T("positions", "tensor"), T("new", "tensor")],
        "KV-cache update: cache [max_batch, H, max_positions, D] with new [B, H, S, D] written at row "
        "rows[b], positions positions[b] .. positions[b] + S - 1 (rows and positions i64). Returns the "
        "updated cache (backends update it in place).",
        _cache_write_shape,
        _cache_write_dtype,
        reference=_cache_write_reference,
        category="state",
        cases=_cache_write_cases,
    )
)

# The binary operators and the ops they mean.
OPERATORS = {op.operator: op.name for op in REGISTRY.values() if op.operator}
