"""Small helpers that describe values in messages and inspect syntax for the checker."""

from __future__ import annotations

from ..syntax import ast as A
from ..types.core import (
    ConfigT,
    DType,
    DTypeT,
    FnRefT,
    ListT,
    ModuleListT,
    ModuleT,
    NoneT,
    ScalarT,
    Shape,
    TensorT,
    TupleT,
    Type,
    UnitT,
    format_shape,
    format_type,
)


def cond_key(e: A.Node, text: str) -> tuple[str, bool]:
    polarity = True
    while isinstance(e, A.Not):
        polarity = not polarity
        e = e.operand
    return " ".join(text[e.span.start : e.span.end].split()), polarity


def number(t: ScalarT):
    if t.kind == "int":
        return t.value.as_int() if t.value is not None else None
    return t.value


def kind_text(t: Type) -> str:
    if isinstance(t, TensorT):
        return f"a tensor {format_type(t)}"
    if isinstance(t, ScalarT):
        return {"int": "an int", "float": "a float", "bool": "a bool", "str": "a str"}[t.kind]
    if isinstance(t, ModuleT):
        return f"the module `{t.instance.module.name.id}`"
    if isinstance(t, ModuleListT):
        return "a list of submodules"
    if isinstance(t, ConfigT):
        return f"a `{t.value.type_name}` config"
    if isinstance(t, NoneT):
        return "`none`"
    if isinstance(t, DTypeT):
        return "a dtype"
    if isinstance(t, FnRefT):
        return "a function"
    if isinstance(t, TupleT):
        return "a tuple"
    if isinstance(t, ListT):
        return "a list"
    if isinstance(t, UnitT):
        return "nothing"
    return "a value"


def dtype_text(d: DType) -> str:
    from ..ops.registry import describe_dtype

    return describe_dtype(d)


def binding_kind(kind: str) -> str:
    return {
        "param": "function parameter",
        "dim": "dim variable",
        "loop": "loop variable",
        "module_param": "module parameter",
    }.get(kind, kind)


def dotted(e) -> str | None:
    if isinstance(e, A.Name):
        return e.id
    if isinstance(e, A.Attr):
        base = dotted(e.value)
        return f"{base}.{e.name.id}" if base else None
    return None


def shapes_equal(a: Shape, b: Shape) -> bool:
    if (a.prefix is None) != (b.prefix is None) or len(a.dims) != len(b.dims):
        return False
    if a.prefix is not None and a.prefix is not b.prefix:
        return False
    return all(x is None or y is None or x.same(y) for x, y in zip(a.dims, b.dims))


def types_equal(a: Type, b: Type) -> bool:
    if isinstance(a, TensorT) and isinstance(b, TensorT):
        return a.dtype == b.dtype and shapes_equal(a.shape, b.shape)
    if isinstance(a, TupleT) and isinstance(b, TupleT):
        return len(a.items) == len(b.items) and all(types_equal(x, y) for x, y in zip(a.items, b.items))
    if isinstance(a, ScalarT) and isinstance(b, ScalarT):
        return a.kind == b.kind
    return type(a) is type(b)


def shape_pair(actual: Shape, declared: Shape) -> str:
    text = f"{format_shape(actual)}, declared {format_shape(declared)}"
    conc_a, conc_d = format_shape(actual, True), format_shape(declared, True)
    if (conc_a, conc_d) != (format_shape(actual), format_shape(declared)):
        text += f" ({conc_a} vs {conc_d})"
    return text


def tail_node(block: A.Block):
    if block.stmts and isinstance(block.stmts[-1], A.ExprStmt):
        return block.stmts[-1].expr
    return block


def has_error_stmt(block: A.Block) -> bool:
    return any(isinstance(n, A.ErrorStmt) for n in A.walk(block))


def cond_text(key: tuple[str, bool]) -> str:
    text, polarity = key
    return text if polarity else f"not {text}"


def wrapped(keys: list[tuple[str, bool]]) -> str:
    """A use wrapped in the `if`s of `keys`, one inside the other (`if a { if b { ... } }`): each
    condition is matched as written, so `if a and b` would not do."""
    out = "..."
    for key in reversed(keys):
        out = f"if {cond_text(key)} {{ {out} }}"
    return out
