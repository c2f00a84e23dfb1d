"""Shared machinery of the text code generators (PyTorch, JAX): naming values, rendering
arguments, walking graphs and composites, and folded constants.

A backend subclasses `GraphEmitter` and sets its tables: `dtypes` (dtype name -> text),
`emitters` (registry op -> emitter), `native` (composite -> (numerics, emitter)), `reserved`
(names generated code must not shadow) and `error` (the exception it raises). Nothing here
imports a framework: generated code is text.
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from ..errors import CodegenError
from ..types.core import DType
from ..types.dims import Dim, format_dim
from .core import Graph, Op, Value


class RenderError(CodegenError):
    """An op or argument a backend cannot express (names the op)."""


def python_infix() -> dict[str, str]:
    """Registry op name -> the Python operator both torch and JAX arrays overload for it
    (`and`/`or` on bool tensors are `&`/`|`), from the registry's own `operator` fields."""
    from ..ops import OPERATORS

    spelled = {"and": "&", "or": "|"}
    return {name: spelled.get(sym, sym) for sym, name in OPERATORS.items() if sym not in ("@", "not")}


def infix_emitter(symbol: str):
    """An emitter writing `x <symbol> y` (operands may be tensors or numbers)."""
    return lambda e, op: f"{e.r(op.args['x'])} {symbol} {e.r(op.args['y'])}"


def dim_text(d: Dim) -> str:
    n = d.as_int()
    if n is not None:
        return str(n)
    return format_dim(d)


def shape_text(v: Value) -> str:
    return "[" + ", ".join(dim_text(d) for d in v.dims) + "]"


def index_text(rank: int, dim: int, item: str) -> str:
    """`x[:, :, item]` addressing one dim."""
    dim = dim if dim >= 0 else rank + dim
    return ", ".join([":"] * dim + [item])


def dims_text(dims, as_list: bool = False) -> str:
    text = ", ".join(dim_text(d) if isinstance(d, Dim) else str(d) for d in dims)
    return f"[{text}]" if as_list else text


def add_constant(constants: dict, hint: str, value) -> str:
    """The key of `value` in `constants` (without the `const:` prefix), added if new."""
    for k, v in constants.items():
        if v.dtype == value.dtype and v.shape == value.shape and (v == value).all():
            return k.split(":", 1)[1]
    base = re.sub(r"_\d+$", "", hint) or "c"
    key, n = base, 0
    while f"const:{key}" in constants:
        n += 1
        key = f"{base}_{n}"
    constants[f"const:{key}"] = value
    return key


def all_ops(g: Graph):
    """The ops of `g`, composites' bodies included (depth first)."""
    for op in g.ops:
        yield op
        if op.body is not None:
            yield from all_ops(op.body)


def np_dtype_name(v) -> str:
    """The Linnet dtype name of a numpy array."""
    return {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64", "int32": "i32", "bool": "bool"}[
        str(v.dtype)
    ]


RESHAPING = ("reshape", "rearrange", "expand", "permute", "transpose", "squeeze", "unsqueeze", "concat")


@dataclass
class GraphEmitter:
    """Emits the statements of one graph. `names` maps value ids to Python names."""

    numerics: str = "equivalent"
    names: dict[Any, str] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    uses: dict[int, int] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)
    dim_names: set[str] = field(default_factory=set)

    # Set by each backend (class attributes of its subclass).
    dtypes: ClassVar[dict[str, str]] = {}
    emitters: ClassVar[dict] = {}
    native: ClassVar[dict] = {}
    reserved: ClassVar[set[str]] = set()
    backend: ClassVar[str] = ""
    error: ClassVar[type] = RenderError

    def fresh(self, hint: str) -> str:
        base = hint or "t"
        if keyword.iskeyword(base) or base in self.reserved or base in self.dim_names:
            base += "_"
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def bind(self, v: Value, hint: str | None = None) -> str:
        name = self.fresh(hint if hint is not None else (v.hint or v.name))
        self.names[id(v)] = name
        return name

    def r(self, v) -> str:
        """Render an argument as Python text."""
        if isinstance(v, Value):
            try:
                return self.names[id(v)]
            except KeyError:
                raise self.error(f"%{v.name} is used before it is defined") from None
        if isinstance(v, Dim):
            return dim_text(v)
        if isinstance(v, bool):
            return "True" if v else "False"
        if isinstance(v, DType):
            return self.dtypes[v.name]
        if isinstance(v, float):
            return self.float_text(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(self.r(x) for x in v) + "]"
        if v is None:
            return "None"
        return repr(v)

    def float_text(self, v: float) -> str:
        if math.isfinite(v):
            return repr(v)
        return repr(f"{v}").join(("float(", ")"))

    def count_uses(self, g: Graph) -> None:
        for op in g.ops:
            for v in op.inputs():
                self.uses[id(v)] = self.uses.get(id(v), 0) + 1
        for v in list(g.outputs) + list(g.state_updates.values()):
            self.uses[id(v)] = self.uses.get(id(v), 0) + 1

    # ----- graphs
    def graph_lines(self, g: Graph) -> list[str]:
        """Statements computing `g`'s ops (inputs must already be named)."""
        self.count_uses(g)
        self.prepare_graph(g)
        lines: list[str] = []
        for op in g.ops:
            if id(op) in self.skipped:
                continue
            lines += self.op_lines(op)
        return lines

    def prepare_graph(self, g: Graph) -> None:
        """A backend's hook before a graph is emitted (fusing patterns into `skipped` ops)."""

    def op_lines(self, op: Op) -> list[str]:
        if op.name == "composite":
            return self.composite_lines(op)
        emit = self.emitters.get(op.name)
        if emit is None:
            raise self.error(f"the {self.backend} backend has no lowering for `{op.name}`")
        out = emit(self, op)
        stmts, expr = out if isinstance(out, tuple) else ([], out)
        results = op.results
        if len(results) == 1:
            lhs = self.bind(results[0])
        else:
            lhs = ", ".join(self.bind(v) for v in results)
        comment = self.comment(op)
        return stmts + [f"{lhs} = {expr}{comment}"]

    def comment(self, op: Op) -> str:
        if op.name in RESHAPING:
            return f"  # {shape_text(op.result)}"
        return ""

    def composite_lines(self, op: Op) -> list[str]:
        name = op.attrs["name"]
        native = self.native.get(f"{name}@{self.numerics}") or self.native.get(name)
        if native is not None and self.numerics in native[0]:
            out = native[1](self, op)
            stmts, expr = out if isinstance(out, tuple) else ([], out)
            return stmts + [f"{self.bind(op.result)} = {expr}  # {name}{self._shape_note(op)}"]
        body = op.body
        for iv in body.inputs:
            self.names[id(iv)] = self.r(op.args[iv.name] if iv.name in op.args else None)
        lines = [f"# {name}({', '.join(self.r(op.args[k]) for k in op.args if isinstance(op.args[k], Value))})"]
        lines += self.graph_lines(body)
        for outer, inner in zip(op.results, body.outputs):
            self.names[id(outer)] = self.r(inner)
        return lines

    def _shape_note(self, op: Op) -> str:
        return f": {shape_text(op.result)}"


def python_reserved(*extra: str) -> set[str]:
    """Names generated code must not bind: builtins and the backend's module names."""
    return set(extra) | set(dir(builtins))


Emit = Callable[[GraphEmitter, Op], "str | tuple[list[str], str]"]
