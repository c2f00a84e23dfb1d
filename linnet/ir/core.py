"""Core IR: typed SSA over the primitive registry.

A `Program` is one model lowered under one concrete config: its parameters and state (by
checkpoint name, with concrete shapes) and one `Graph` per entry function. A graph is a list
of `Op`s in SSA form; each op is a registry primitive (`linnet.ops.REGISTRY`) or one of four
structural ops:

- `param(path)`: reads a parameter (a graph input bound by the runtime);
- `state(path)`: reads module state (the KV cache) as it was when the entry was called;
- `const(value)`: a folded constant (a small numpy array);
- `composite(name)`: a call of a standard-library function that backends may replace by a
  native kernel (`softmax`, `rms_norm`, `attention`...); its `body` is the decomposition,
  which is what it means.

Module state is explicit: a graph reads `state` values and lists the new value of each state
tensor it writes in `state_updates`. A state tensor's old value is never used after it has
been overwritten (the verifier checks it), so backends may update it in place.

Types: every value is a `TensorT` with a concrete dtype (the working dtype is resolved at
lowering) and dims that are `Dim`s: integers, or polynomials over the entry's dim variables
(`B`, `S`), which stay symbolic so one graph serves every batch and sequence length.
Compile-time arguments of an op (`dim=-1`, `eps`, a pattern) are plain Python values, `Dim`s
for ints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..types.core import DType, Shape, TensorT
from ..types.dims import Dim, format_dim


@dataclass(eq=False)
class Value:
    """An SSA value: a tensor of `type`. `name` is a readable hint (`q`, `k_cache`), unique
    within its graph once `Graph.name_values` has run."""

    type: TensorT
    name: str = ""
    producer: "Op | None" = None
    hint: str = ""  # the name before it was made unique

    @property
    def dims(self) -> tuple[Dim, ...]:
        return self.type.shape.dims

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return len(self.type.shape.dims)

    def __repr__(self) -> str:
        return f"%{self.name or '?'}: {format_tensor_type(self.type)}"


@dataclass(eq=False)
class Op:
    """One operation. `args` maps the op's parameter names (the registry's) to `Value`s,
    lists of `Value`s, or compile-time values; `results` are the values it defines.
    `body` is the decomposition of a `composite`; `attrs` carry `path` (param, state),
    `value` (const) and `name` (composite). `origin` is "file:line" of the source."""

    name: str
    args: dict[str, Any]
    results: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    body: "Graph | None" = None
    origin: str = ""

    def inputs(self) -> list[Value]:
        """The values this op reads, in argument order."""
        out = []
        for v in self.args.values():
            if isinstance(v, Value):
                out.append(v)
            elif isinstance(v, (list, tuple)):
                out.extend(x for x in v if isinstance(x, Value))
        return out

    @property
    def result(self) -> Value:
        return self.results[0]


@dataclass(eq=False)
class Graph:
    """An entry function (or a composite's body): inputs, ops in order, outputs, and the new
    value of each state tensor it writes (`state_updates`, by checkpoint path)."""

    name: str
    inputs: list[Value]
    ops: list[Op] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    state_updates: dict[str, Value] = field(default_factory=dict)
    dim_vars: list[str] = field(default_factory=list)  # symbolic dims, with where they come from
    dim_sources: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (input index, axis)

    @property
    def uses_state(self) -> bool:
        """Whether the graph reads or writes state (a KV cache): a runtime must bind it."""
        return bool(self.state_updates) or any(op.name == "state" for op in self.ops)

    def name_values(self) -> None:
        """Give every value a unique readable name (its hint, suffixed when taken)."""
        taken: dict[str, int] = {}

        def fresh(v: Value) -> None:
            v.hint = v.hint or v.name
            base = _identifier(v.hint) or "t"
            n = taken.get(base, 0)
            taken[base] = n + 1
            v.name = base if n == 0 else f"{base}_{n}"

        for v in self.inputs:
            fresh(v)
        for op in self.ops:
            for v in op.results:
                fresh(v)
            if op.body is not None:
                op.body.name_values()


@dataclass
class TensorSpec:
    """A parameter or state tensor of a program: checkpoint path and concrete type."""

    path: str
    type: TensorT
    kind: str  # "param" | "state"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.as_int() for d in self.type.shape.dims)


@dataclass
class Program:
    """A model lowered under one config: parameters, state and entry graphs.

    `dtype` is the working dtype; `max_batch` and `max_positions` size the state.
    `config` is the concrete config (field name -> value) it was lowered under."""

    source: str
    model: str
    preset: str | None
    dtype: DType
    max_batch: int
    max_positions: int
    params: list[TensorSpec] = field(default_factory=list)
    state: list[TensorSpec] = field(default_factory=list)
    entries: dict[str, Graph] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def param(self, path: str) -> TensorSpec | None:
        for p in self.params:
            if p.path == path:
                return p
        return None


# ----------------------------------------------------------------------------- text form


def format_tensor_type(t: TensorT) -> str:
    return f"{t.dtype.name}[{', '.join(format_dim(d) for d in t.shape.dims)}]"


def tensor_type(dtype: DType, dims) -> TensorT:
    return TensorT(dtype, Shape(tuple(d if isinstance(d, Dim) else Dim.of(d) for d in dims)))


def format_arg(v: Any) -> str:
    """A compile-time argument or value reference as IR text."""
    if isinstance(v, Value):
        return f"%{v.name}"
    if isinstance(v, Dim):
        return format_dim(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, DType):
        return v.name
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_arg(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={format_arg(x)}" for k, x in v.items()) + "}"
    if v is None:
        return "none"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def format_op(op: Op, indent: str = "  ") -> list[str]:
    results = ", ".join(f"%{v.name}: {format_tensor_type(v.type)}" for v in op.results)
    if op.name in ("param", "state"):
        rhs = f'{op.name} "{op.attrs["path"]}"'
    elif op.name == "const":
        value = op.attrs["value"]
        rhs = f"const {value.tolist() if value.size <= 8 else f'<{value.size} values>'}"
    else:
        args = ", ".join(format_arg(v) if _is_value_arg(v) else f"{k}={format_arg(v)}" for k, v in op.args.items())
        rhs = f"composite {op.attrs['name']}({args})" if op.name == "composite" else f"{op.name}({args})"
    comment = f"  # {op.origin}" if op.origin else ""
    if op.body is None:
        return [f"{indent}{results} = {rhs}{comment}"]
    lines = [f"{indent}{results} = {rhs} {{{comment}"]
    lines += format_graph_body(op.body, indent + "  ")
    lines.append(indent + "}")
    return lines


def _is_value_arg(v) -> bool:
    return isinstance(v, Value) or (isinstance(v, (list, tuple)) and bool(v) and isinstance(v[0], Value))


def format_graph_body(g: Graph, indent: str) -> list[str]:
    lines = []
    if g.name.startswith("composite:"):
        lines.append(indent + "(" + ", ".join(repr(v) for v in g.inputs) + ")")
    for op in g.ops:
        lines += format_op(op, indent)
    for path, v in g.state_updates.items():
        lines.append(f'{indent}state "{path}" = %{v.name}')
    lines.append(f"{indent}return " + ", ".join(f"%{v.name}" for v in g.outputs))
    return lines


def format_graph(g: Graph) -> str:
    params = ", ".join(repr(v) for v in g.inputs)
    outs = ", ".join(format_tensor_type(v.type) for v in g.outputs)
    lines = [f"entry {g.name}({params}) -> ({outs}) {{"]
    lines += format_graph_body(g, "  ")
    lines.append("}")
    return "\n".join(lines)


def format_program(p: Program, entries: list[str] | None = None, header: bool = True) -> str:
    """The readable text form of a program (what `linnet ir` prints)."""
    out = []
    if header:
        out.append(
            f"# {p.source}: model {p.model}, preset {p.preset or '(defaults)'}, dtype {p.dtype.name}, "
            f"max_batch {p.max_batch}, max_positions {p.max_positions}"
        )
        for t in p.params:
            out.append(f"param {t.path}: {format_tensor_type(t.type)}")
        for t in p.state:
            out.append(f"state {t.path}: {format_tensor_type(t.type)}")
        out.append("")
    for name, g in p.entries.items():
        if entries is None or name in entries:
            out.append(format_graph(g))
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _identifier(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    if out and out[0].isdigit():
        out = "v" + out
    return out
