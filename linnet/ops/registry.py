"""The primitive op registry: one `OpDef` per primitive, carrying everything known about the
op: name, signature, shape rule, dtype rule, docs, numpy reference, whether constant folding
it is exact, its random test cases, and whether the editors highlight it. Backends add one
lowering table each, keyed by op name (or name it in their `UNSUPPORTED` table, with a reason).

What is generated from the entries: the op table of docs/language.md and the builtin lists of
the editors' grammars (`python -m linnet.docgen`); what reads them: the checker (rules), the
IR's constant folding (`exact`, `reference`), the language server (signature, docs), and the
backends' op tests (`cases`, `reference`). tests/ops/test_op_facts.py fails when an entry
lacks one of these.

Shape and dtype rules see plain values: tensor arguments as `TensorT`, compile-time
arguments as Python values (`Dim` for ints, lists of `Dim`, `bool`, `str`, `DType`). They
raise `OpError` without spans; the checker places the error on the argument it names
(Typst's approach: the algebra knows nothing of source positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..types.core import BOOL, F32, WORK, DType, Shape, TensorT, format_shape
from ..types.dims import Dim, DivisionError, divide, format_dim, format_division, shown_value

REQUIRED = object()

# Argument kinds, as the checker converts them:
#   tensor      a TensorT
#   operand     a TensorT or a compile-time scalar (weak: takes the tensor's dtype)
#   tensors     a list of TensorT (a list literal)
#   int         a compile-time int (a Dim, possibly symbolic)
#   index       a compile-time int that must be a known constant (a dim index)
#   ints        a list of compile-time ints (a list literal of dims)
#   indices     a list of known constant ints
#   numbers     a list of known compile-time numbers (a list literal, a `list[float]` config field)
#   bool, float, str, dtype
#   sizes       the remaining keyword arguments, each a compile-time int (rearrange's axis sizes)
#   window      a compile-time int or a list of them, one per spatial dim (a stride `2` or `[2, 1]`):
#               the rules see a `Dim` or a list of `Dim` (`spatial.per_dim` expands it)
#   padding     a `window`, or the string "same" or "valid" (PyTorch's convolution padding)
KINDS = (
    "tensor", "operand", "tensors", "int", "index", "ints", "indices", "numbers", "bool", "float", "str", "dtype",
    "sizes", "window", "padding",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class OpParam:
    name: str
    kind: str
    default: Any = REQUIRED
    doc: str = ""

    def text(self) -> str:
        """The parameter as a signature shows it, in Linnet's spelling: `dim: index = -1`,
        `stop: int = none`; the `sizes` kind is rearrange's keyword sizes, `name=size, ...`."""
        if self.kind == "sizes":
            return "name=size, ..."
        if self.default is REQUIRED:
            return f"{self.name}: {self.kind}"
        return f"{self.name}: {self.kind} = {_literal(self.default)}"


def _literal(value: Any) -> str:
    """A default value as Linnet source writes it (`true`, `none`, `-1`)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


class OpError(Exception):
    """A shape or dtype rule's refusal. `code` is the diagnostic code; `arg` names the argument
    to point at (None: the whole call); `inner` is a (start, end) range inside a string argument
    (rearrange patterns); `arg_labels` maps argument names to label texts; `casts` maps
    argument names to the dtype a `cast` would make them agree with (quick fixes), preferred
    first; `dims` are the dims in conflict, whose declarations (a config value, a preset's)
    the checker labels."""

    def __init__(
        self,
        code: str,
        message: str,
        arg: str | None = None,
        *,
        notes=(),
        inner=None,
        arg_labels: dict[str, str] | None = None,
        casts: dict[str, DType] | None = None,
        dims: tuple = (),
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.arg = arg
        self.notes = list(notes)
        self.inner = inner
        self.arg_labels = arg_labels or {}
        self.casts = casts or {}
        self.dims = tuple(dims)


# A test-case generator: `cases(rng, shape)` draws one call of the op around `shape` (a
# non-empty tuple of small sizes) with the numpy Generator `rng`, as (tensor arguments as numpy
# arrays, compile-time arguments as the rules see them). See `cases.py`.
CaseGenerator = Callable[[Any, tuple[int, ...]], tuple[dict[str, Any], dict[str, Any]]]


@dataclass(slots=True)
class OpDef:
    """A primitive.

    shape_rule(args) -> Shape or list[Shape]; dtype_rule(args) -> DType or list[DType].
    `fold` computes the value when every argument is a compile-time scalar (e.g. `sqrt(64)`).
    `reference(**args)` is the numpy definition of the op: the oracle each backend is compared
    against, and a check that `shape_rule` says what the op really produces.
    `exact`: the reference's result is exactly what every backend computes, bit for bit
    (integer and shape ops, casts, IEEE `+ - * /`, comparisons), so constant folding may
    replace the op by the reference's value (`linnet.ir.passes.fold_constants`). Transcendental
    ops (exp, sin, erf...) and reductions whose order of summation varies are not.
    `cases` draws random test cases (`CaseGenerator`); every backend's op test runs them.
    `keyword`: the editors' grammars highlight the op's name as a builtin.
    `flops(args, results)` is the op's floating-point operations per call, a `Dim` over the
    argument dims (`args` as the shape rule sees them, `results` the result `TensorT`s), counted
    as 2 x multiply-adds; ops without one count 0 (elementwise, reductions, shape and indexing:
    the cost model's convention, `linnet.ir.cost`, as in torch.utils.flop_counter).
    `random`: the op draws random numbers when the model trains (dropout), so two calls on the
    same arguments are different values: common-subexpression elimination never merges them
    (`linnet.ir.passes`), and its `reference` is what it computes in inference.
    `view`: the op's one result is a view of its argument `x` in PyTorch, which moves no data
    (`reshape`, `transpose`, `x[:, -1]`...): the cost model's peak-activation estimate gives it no
    bytes and keeps `x` alive while the view is (`linnet.ir.cost.peak_bytes`).
    `reshapes`: the op's result holds its inputs' elements in another arrangement of dims (new
    rank, dims reordered, merged, split apart, broadcast or joined), so what it does is its
    result's shape: generated code notes that shape beside its statement (`linnet.ir.render`), as
    nanoGPT annotates every reshape. Indexing ops and `repeat_interleave` do not.
    """

    name: str
    params: list[OpParam]
    doc: str
    shape_rule: Callable[[dict], Any]
    dtype_rule: Callable[[dict], Any]
    reference: Callable[..., Any] | None = None
    fold: Callable[..., Any] | None = None
    category: str = "misc"
    operator: str | None = None  # the infix operator that lowers to this op, if any
    aliases: tuple[str, ...] = field(default_factory=tuple)
    exact: bool = False
    cases: CaseGenerator | None = None
    keyword: bool = True
    flops: Callable[[dict, list], Any] | None = None
    random: bool = False
    view: bool = False
    reshapes: bool = False

    def signature(self) -> str:
        """`name(param: kind = default, ...)`, as hover, signature help and the docs show it."""
        return f"{self.name}({', '.join(p.text() for p in self.params)})"

    def describe(self) -> str:
        return f"op {self.signature()}"

    def docs_row(self) -> str:
        """The op's row in the op table of docs/language.md: its signature (and infix operator)
        and its doc."""
        operator = f" (`{self.operator}`)" if self.operator else ""
        doc = self.doc.replace("|", "\\|")  # a `|` would end the cell
        return f"| `{self.signature()}`{operator} | {doc} |"


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name} registered twice")
    REGISTRY[op.name] = op
    return op


# ----------------------------------------------------------------------------- shared rules


def dim_index(shape: Shape, dim: int, arg: str = "dim", extra: int = 0) -> int:
    """Normalise a dim index against `shape` (rank + `extra` positions, for unsqueeze).
    Returns a negative index (from the end), which stays valid under a leading `...`."""
    n = len(shape.dims) + extra
    if shape.prefix is None:
        if not -n <= dim < n:
            raise OpError("L208", f"dim {dim} is out of range for {format_shape(shape)} (rank {len(shape.dims)})", arg)
        return dim - n if dim >= 0 else dim
    if dim >= 0:
        raise OpError(
            "L208",
            f"dim {dim} of {format_shape(shape)} is not known: `...` has unknown rank; "
            f"count from the end (dim={dim - n if dim < n else -1})",
            arg,
        )
    if dim < -n:
        raise OpError("L208", f"dim {dim} reaches into the `...` of {format_shape(shape)}", arg)
    return dim


def same_dim(a: Dim | None, b: Dim | None) -> bool:
    return a is None or b is None or a.same(b)


def broadcast(a: Shape, b: Shape, names=("x", "y")) -> Shape:
    """numpy broadcasting of two shapes, aligned from the right."""
    la, lb = len(a.dims), len(b.dims)
    out: list[Dim | None] = []
    for i in range(1, max(la, lb) + 1):
        da = a.dims[-i] if i <= la else _MISSING
        db = b.dims[-i] if i <= lb else _MISSING
        if da is _MISSING:
            out.append(db)
        elif db is _MISSING:
            out.append(da)
        elif da is None or db is None:
            out.append(da if db is None else db)
        elif da.same(db) or db.as_int() == 1:
            out.append(da)
        elif da.as_int() == 1:
            out.append(db)
        else:
            n = max(la, lb)
            pos = n - i if a.prefix is None and b.prefix is None else -i
            raise OpError(
                "L201",
                f"shapes don't broadcast: {format_shape(a)} and {format_shape(b)} "
                f"(dim {pos}: {format_dim(shown_value(da))} vs {format_dim(shown_value(db))})",
                arg_labels={names[0]: format_shape(a), names[1]: format_shape(b)},
                dims=(da, db),
            )
    out.reverse()
    prefix = a.prefix or b.prefix
    if a.prefix is not None and b.prefix is not None and a.prefix is not b.prefix:
        raise OpError(
            "L201",
            f"shapes don't broadcast: {format_shape(a)} and {format_shape(b)} have different `...`",
            arg_labels={names[0]: format_shape(a), names[1]: format_shape(b)},
        )
    for shape, other in ((a, b), (b, a)):
        if shape.prefix is not None and other.prefix is None and len(other.dims) > len(shape.dims):
            raise OpError(
                "L208",
                f"cannot broadcast {format_shape(shape)} with {format_shape(other)}: `...` has unknown rank",
                arg_labels={names[0]: format_shape(a), names[1]: format_shape(b)},
            )
    return Shape(tuple(out), prefix)


class _Missing:
    pass


_MISSING = _Missing()


def describe_dtype(d: DType) -> str:
    if d is WORK:
        return "the working dtype"
    if d.var:
        return f"dtype variable {d.name}"
    return d.name


def require_float(d: DType, op: str, arg: str = "x") -> DType:
    """`d` when it is a float dtype (or not yet known); else L303 on `arg`."""
    if not d.is_float and d.kind != "any":
        raise OpError(
            "L303",
            f"`{op}` requires a float tensor, got {describe_dtype(d)}",
            arg,
            notes=["consider `cast(x, f32)` first"],
        )
    return d


def join_dtypes(a: DType, b: DType, op: str) -> DType:
    """The dtype of `a op b` for two tensors: equal dtypes only (no implicit promotion)."""
    if a == b:
        return a
    if a.is_float and b.is_float:
        raise OpError(
            "L301",
            f"mixed float dtypes in `{op}`: {describe_dtype(a)} and {describe_dtype(b)}",
            notes=["consider an explicit cast: `cast(y, x.dtype)`"],
        )
    if a.kind != b.kind or a.is_int:
        raise OpError(
            "L302", f"`{op}` mixes {describe_dtype(a)} and {describe_dtype(b)}", notes=["consider an explicit cast"]
        )
    raise OpError("L303", f"`{op}` mixes {describe_dtype(a)} and {describe_dtype(b)}")


def operand_dtype(args: dict, names=("x", "y"), op: str = "") -> DType:
    """Dtype of a binary elementwise op whose operands may be weak scalars."""
    a, b = args[names[0]], args[names[1]]
    ta = a.dtype if isinstance(a, TensorT) else None
    tb = b.dtype if isinstance(b, TensorT) else None
    if ta is not None and tb is not None:
        try:
            return join_dtypes(ta, tb, op)
        except OpError as err:
            err.arg_labels = {names[0]: _type_text(a), names[1]: _type_text(b)}
            # cast the int operand to the float one's dtype; two floats: the second to the first's
            if tb.is_float and not ta.is_float:
                err.casts = {names[0]: tb}
            elif ta.is_float and not tb.is_float:
                err.casts = {names[1]: ta}
            else:
                err.casts = {names[1]: ta, names[0]: tb}
            raise
    tensor_dtype, scalar = (ta, b) if ta is not None else (tb, a)
    kind = scalar_kind(scalar)
    if kind == "float" and not tensor_dtype.is_float:
        raise OpError(
            "L302",
            f"`{op}` mixes {describe_dtype(tensor_dtype)} with a float",
            names[1] if ta is not None else names[0],
            notes=["consider `cast(x, f32)` first"],
            casts={names[0] if ta is not None else names[1]: F32},
        )
    if kind == "bool" and tensor_dtype != BOOL:
        raise OpError("L303", f"`{op}` mixes {describe_dtype(tensor_dtype)} with a bool")
    require_fit(scalar, tensor_dtype, op, names[1] if ta is not None else names[0])
    return tensor_dtype


# (mantissa bits, largest exponent) of the float dtypes a constant is rounded into: one at or past the midpoint
# between the largest finite value and the next power of two rounds to inf
_FLOAT_FORMATS = {"f16": (10, 15), "bf16": (7, 127), "f32": (23, 127)}
_INT_BITS = {"i32": 32, "i64": 64}


def require_fit(value, dtype: DType, op: str, arg: str) -> None:
    """L216 for a compile-time number `value` that `dtype` (a concrete one: not the working dtype, not a variable)
    cannot hold: an int outside i32's or i64's range (PyTorch and XLA wrap it around, ONNX Runtime refuses the
    model), or a number a float dtype rounds to inf (`full([n], 1e40, f32)`)."""
    if dtype.var or isinstance(value, (bool, UnknownNumber)):
        return
    number = value.as_int() if isinstance(value, Dim) else value
    if not isinstance(number, (int, float)):
        return
    if dtype.name in _INT_BITS:
        bits = _INT_BITS[dtype.name]
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        if isinstance(number, int) and not low <= number <= high:
            raise OpError(
                "L216",
                f"`{op}` requires a constant that fits {dtype.name}, got {number}",
                arg,
                notes=[f"{dtype.name} holds {low} to {high}"],
            )
    elif dtype.name in _FLOAT_FORMATS:
        mantissa, emax = _FLOAT_FORMATS[dtype.name]
        if abs(number) >= (2 - 2.0 ** -(mantissa + 1)) * 2.0**emax:
            largest = (2 - 2.0**-mantissa) * 2.0**emax
            raise OpError(
                "L216",
                f"`{op}` requires a constant that fits {dtype.name}, got {number!r}",
                arg,
                notes=[f"{dtype.name}'s largest finite value is {largest!r}: this one would be inf"],
            )


def _type_text(t) -> str:
    prefix = "" if t.dtype is WORK else t.dtype.name
    return prefix + format_shape(t.shape)


@dataclass(frozen=True, slots=True)
class UnknownNumber:
    """A compile-time int or bool operand whose value the checker does not know (`if flag { 2 } else { 1 }` over a
    bool parameter): its kind is still known, so `positions + k` is i64, not a float mixed into i64."""

    kind: str  # "int" | "bool"


def scalar_kind(value) -> str:
    """Kind of a compile-time scalar handed to an op: "int", "float" or "bool"."""
    if isinstance(value, UnknownNumber):
        return value.kind
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (Dim, int)):
        return "int"
    return "float"


def shape_of(value) -> Shape:
    return value.shape if isinstance(value, TensorT) else Shape(())


def exact(num: Dim, den: Dim, what: str, arg: str | None = None) -> Dim:
    q = divide(num, den)
    if isinstance(q, DivisionError):
        raise OpError("L206", f"{what}: {format_division(num, den)} is not exact ({q.reason})", arg)
    return q
