"""Types of Linnet values: tensors (dtype + shape), compile-time scalars, configs, modules.

A tensor type is a dtype and a `Shape`; a shape is an optional leading `...` (a sequence of
dims bound once per call, like jaxtyping's `*batch`) followed by dims. Shapes print in
Linnet notation: `[B, S, c.hidden_size]`, `f32[..., 32]`, `i64[B]`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from .dims import Dim, format_dim, shown_value

_uid = itertools.count(1)

# ----------------------------------------------------------------------------- dtypes


@dataclass(frozen=True, slots=True)
class DType:
    """A dtype. `work` is the model's working dtype (f32, bf16 or f16, chosen at load time):
    opaque to the checker, so code right for one is right for all. Generic dtype variables
    (`fn softmax<T: float>`) have `var=True`; in a body they are rigid, at a call bound.
    `itemsize` is the bytes of one element (numpy's `itemsize`); None for `work` and dtype
    variables, whose size is that of the dtype they stand for."""

    name: str
    kind: str  # "float" | "int" | "bool" | "any"
    var: bool = False
    uid: int = 0
    itemsize: int | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.name

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"


F64 = DType("f64", "float", itemsize=8)
F32 = DType("f32", "float", itemsize=4)
F16 = DType("f16", "float", itemsize=2)
BF16 = DType("bf16", "float", itemsize=2)
I64 = DType("i64", "int", itemsize=8)
I32 = DType("i32", "int", itemsize=4)
BOOL = DType("bool", "bool", itemsize=1)
WORK = DType("work", "float")

DTYPES = {d.name: d for d in (F64, F32, F16, BF16, I64, I32, BOOL)}


def dtype_var(name: str, kind: str) -> DType:
    return DType(name, kind, var=True, uid=next(_uid))


# ----------------------------------------------------------------------------- shapes


@dataclass(slots=True, eq=False)
class EllipsisVar:
    """The `...` of one function's signature (rigid in its body, bound at each call)."""

    uid: int = field(default_factory=lambda: next(_uid))


@dataclass(slots=True)
class Shape:
    """`prefix` is the leading `...` or None; `dims` follow it. A None dim is unknown."""

    dims: tuple[Dim | None, ...]
    prefix: EllipsisVar | None = None

    @property
    def rank(self) -> int | None:
        return None if self.prefix is not None else len(self.dims)

    def __len__(self) -> int:
        return len(self.dims)


def format_shape(shape: Shape, concrete: bool = False) -> str:
    parts = ["..."] if shape.prefix is not None else []
    for d in shape.dims:
        parts.append(format_dim(shown_value(d) if (concrete and d is not None) else d))
    return "[" + ", ".join(parts) + "]"


# ----------------------------------------------------------------------------- value types


class Type:
    """Base of all value types."""

    __slots__ = ()


@dataclass(slots=True, eq=False)
class TensorT(Type):
    dtype: DType
    shape: Shape


@dataclass(slots=True, eq=False)
class ScalarT(Type):
    """A compile-time scalar: `int` (value a Dim), `float`, `bool` or `str`; `value` None when
    not known (a module parameter in a generic check). Literal floats and config floats are
    weak: they take the dtype of the tensor they meet."""

    kind: str
    value: Any = None
    literals: tuple[str, ...] | None = None  # allowed values of a literal-union `str`


@dataclass(frozen=True, slots=True, eq=False)
class DTypeT(Type):
    dtype: DType


@dataclass(slots=True, eq=False)
class TupleT(Type):
    items: tuple[Type, ...]


@dataclass(slots=True, eq=False)
class ListT(Type):
    """A list literal (`[B, S, 4]` given to reshape, `[a, b]` given to concat)."""

    items: tuple[Type, ...]


@dataclass(slots=True, eq=False)
class NoneT(Type):
    """`none`: an absent optional config value."""


@dataclass(slots=True, eq=False)
class ConfigT(Type):
    """A config record value (`c`, `c.rope_scaling`)."""

    value: Any  # configs.ConfigValue


@dataclass(slots=True, eq=False)
class ModuleT(Type):
    """An instance of a module (a submodule member, or a loop variable over a list)."""

    instance: Any  # checker.Instance


@dataclass(slots=True, eq=False)
class ModuleListT(Type):
    """A list of submodules: `count` elements of `instance`. A list whose elements receive
    their index (`[Block(c, i) for i in range(n)]`) has the index's atom `index` (in
    `instance`'s arguments, symbolic) and `element(k)`, element `k`'s own instance."""

    instance: Any
    count: Dim | None
    index: Any = None  # dims.Atom
    element: Any = None  # Callable[[int], Instance | None]

    def at(self, k: int) -> Any:
        """Element `k`'s instance (the shared one when elements do not receive their index)."""
        if self.element is None:
            return self.instance
        return self.element(k)


@dataclass(slots=True, eq=False)
class FnRefT(Type):
    """A callable name: a function, a primitive op, a method bound to an instance."""

    target: Any


@dataclass(slots=True, eq=False)
class UnitT(Type):
    """What a statement without a value produces."""


@dataclass(slots=True, eq=False)
class UnknownT(Type):
    """The poisoned type of a value after an error: accepted everywhere, reported nowhere."""


UNKNOWN = UnknownT()
UNIT = UnitT()
NONE = NoneT()


def tensor(dtype: DType, dims, prefix: EllipsisVar | None = None) -> TensorT:
    return TensorT(dtype, Shape(tuple(dims), prefix))


def format_type(t: Type, concrete: bool = False) -> str:
    """`[B, S, c.hidden_size]`, `f32[B, S]`, `int = 576`, `(…, …)`; with `concrete`, dims are
    shown with known constants substituted."""
    if isinstance(t, TensorT):
        prefix = "" if t.dtype is WORK else t.dtype.name
        return prefix + format_shape(t.shape, concrete)
    if isinstance(t, ScalarT):
        if t.kind == "int" and t.value is not None:
            shown = format_dim(shown_value(t.value) if concrete else t.value)
            return f"int = {shown}" if concrete or t.value.is_int() else "int"
        if t.value is not None and t.kind in ("float", "bool"):
            shown = str(t.value).lower() if isinstance(t.value, bool) else repr(t.value)
            return f"{t.kind} = {shown}"
        if t.kind == "str" and t.value is not None:
            return f'str = "{t.value}"'
        return t.kind
    if isinstance(t, DTypeT):
        return f"dtype {t.dtype.name}"
    if isinstance(t, TupleT):
        return "(" + ", ".join(format_type(i, concrete) for i in t.items) + ")"
    if isinstance(t, ListT):
        return "[" + ", ".join(format_type(i, concrete) for i in t.items) + "]"
    if isinstance(t, NoneT):
        return "none"
    if isinstance(t, ConfigT):
        return t.value.type_name
    if isinstance(t, ModuleT):
        return t.instance.describe()
    if isinstance(t, ModuleListT):
        count = format_dim(shown_value(t.count) if concrete and t.count is not None else t.count)
        if t.index is not None:
            return f"[{t.instance.describe()} for {t.index.name} in range({count})]"
        return f"[{t.instance.describe()}; {count}]"
    if isinstance(t, FnRefT):
        return getattr(t.target, "describe", lambda: "function")()
    if isinstance(t, UnitT):
        return "()"
    return "?"
