"""Core IR: typed SSA over the primitive registry, with functions and loops.

A `Program` is one model lowered under one concrete config: its parameters and state (by
checkpoint name, with concrete shapes), its module classes, one `Graph` per entry function and
one per function the entries call. A graph is a list of `Op`s in SSA form; each op is a
registry primitive (`linnet.ops.REGISTRY`) or one of these structural ops:

- `param(path)`: reads a parameter of the graph's receiver (a path relative to it);
- `state(path)`: reads module state (the KV cache) of the receiver as it is when the graph is
  entered;
- `const(value)`: a folded constant (a small numpy array);
- `composite(name)`: a call of a standard-library function that backends may replace by a
  native kernel (`softmax`, `rms_norm`, `attention`...); its `body` is the decomposition,
  which is what it means; passes may record in `attrs["variant"]` which native form a backend
  runs (never changing what it computes);
- `call(fn)`: a call of `Program.functions[fn]` (a module method or a Linnet function,
  specialised for its receiver's class and its argument types); `attrs["receiver"]` is the
  callee's receiver as a path prefix relative to the caller's (`"self_attn."`, `""` for the
  caller's own receiver, `None` for a function without one);
- `loop`: `for layer in layers { ... }` over a list of identical submodules: its `body` runs
  once per item with the item as receiver prefix `layers.{i0}.` (`{i0}` stands for the index),
  threading the loop-carried values.

Module state is a cell per checkpoint path. A graph reads `state` values, and lists the new
value of each state tensor it writes in `state_updates` (paths relative to its receiver);
a `call` returns the callee's new state values after its outputs (`attrs["writes"]`, relative
to the caller); a `loop` writes the paths in `attrs["writes"]` (with `{i0}`) and returns only
its carried values. A state tensor's old value is never used after it has been overwritten
(the verifier checks it), so backends may update it in place.

`inline_calls`/`unroll_loops` (`passes.flatten`) turn a program into the single flat graph
per entry that ONNX export and the interpreter run.

Types: every value is a `TensorT` with a concrete dtype (the working dtype is resolved at
lowering) and dims that are `Dim`s: integers, or polynomials over the program's dim variables
(`B`, `S`, shared by every entry), which stay symbolic so one graph serves every batch and
sequence length. Compile-time arguments of an op (`dim=-1`, `eps`, a pattern) are plain Python
values, `Dim`s for ints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..types.core import DType, Shape, TensorT
from ..types.dims import Dim, format_dim

LOOP_INDEX = "{i%d}"  # the placeholder for a loop's index in receiver paths (`layers.{i0}.`)
LOOP_PLACEHOLDER = re.compile(r"\{i(\d+)\}")


def substitute_indices(path: str, indices: dict[str, str]) -> str:
    """`path` with each loop placeholder (`{i0}`) that `indices` maps replaced by its value."""
    return LOOP_PLACEHOLDER.sub(lambda m: indices.get(m.group(0), m.group(0)), path)


def shift_indices(path: str, by: int) -> str:
    """A callee's loop placeholders renumbered past the `by` loops enclosing its call."""
    return LOOP_PLACEHOLDER.sub(lambda m: LOOP_INDEX % (int(m.group(1)) + by), path) if by else path


@dataclass(eq=False)
class Value:
    """An SSA value: a tensor of `type`. `name` is a readable hint (`q`, `k_cache`), unique
    within its graph once `Graph.name_values` has run."""

    type: TensorT
    name: str = ""
    producer: "Op | None" = None
    hint: str = ""  # the readable name it was given (`name` is it made unique)

    def __post_init__(self) -> None:
        self.hint = self.hint or self.name

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
    `body` is the decomposition of a `composite` or the body of a `loop`; `callee` the graph a
    `call` runs; `attrs` carry `path` (param, state), `value` (const), `name` (composite), `fn`,
    `receiver` and `writes` (call, loop). `origin` is "file:line" of the source."""

    name: str
    args: dict[str, Any]
    results: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    body: "Graph | None" = None
    origin: str = ""
    callee: "Graph | None" = None

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

    @property
    def writes(self) -> list[str]:
        """The state paths a `call` or `loop` writes (relative to the graph's receiver)."""
        return self.attrs.get("writes", [])


@dataclass(eq=False)
class Graph:
    """An entry, a function, a composite's body or a loop's body: inputs, ops in order,
    outputs, and the new value of each state tensor it writes (`state_updates`, by path
    relative to its receiver).

    `kind` is "entry", "method" (a module method: its params and state are its receiver's),
    "function", "composite" or "loop". `qualname` is the source name (`LlamaAttention.step`),
    `receiver` the key of its receiver's class in `Program.modules`, `origin` the definition's
    "file:line". `dim_vars` are the symbolic dims it uses that its inputs carry
    (`dim_sources`: name -> (input index, axis))."""

    name: str
    inputs: list[Value]
    ops: list[Op] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    state_updates: dict[str, Value] = field(default_factory=dict)
    dim_vars: list[str] = field(default_factory=list)
    dim_sources: dict[str, tuple[int, int]] = field(default_factory=dict)
    kind: str = "entry"
    qualname: str = ""
    receiver: str | None = None
    origin: str = ""
    signature: str = ""  # as the source writes it: `apply_rope(x: [B, H, S, 2 * R], ...) -> [...]`

    @property
    def uses_state(self) -> bool:
        """Whether the graph reads or writes state (a KV cache), itself or through what it
        calls: a runtime must bind it."""
        return bool(self.written_state()) or any(op.name == "state" for op in walk_ops(self))

    def written_state(self) -> set[str]:
        """Every state path this graph writes (relative to its receiver; loop writes with
        their `{i}` placeholders)."""
        out = set(self.state_updates)
        for op in self.ops:
            out |= set(op.writes)
        return out

    def name_values(self) -> None:
        """Give every value a unique readable name (its hint, suffixed when taken)."""
        taken: dict[str, int] = {}

        used: set[str] = set()

        def fresh(v: Value) -> None:
            base = _identifier(v.hint) or "t"
            n = taken.get(base, 0)
            name = base if n == 0 else f"{base}_{n}"
            while name in used:  # a hint may itself look suffixed (`t_1`)
                n += 1
                name = f"{base}_{n}"
            taken[base] = n + 1
            used.add(name)
            v.name = name

        for v in self.inputs:
            fresh(v)
        for op in self.ops:
            for v in op.results:
                fresh(v)
            if op.body is not None:
                op.body.name_values()


def body_ops(g: Graph):
    """The ops of `g` and of its composites' and loops' bodies, depth first (not its callees)."""
    for op in g.ops:
        yield op
        if op.body is not None:
            yield from body_ops(op.body)


def walk_ops(g: Graph, seen: set[int] | None = None):
    """Every op `g` runs: its own, composites' and loops' bodies, and the callees of its
    calls (each callee once)."""
    seen = set() if seen is None else seen
    for op in g.ops:
        yield op
        if op.body is not None:
            yield from walk_ops(op.body, seen)
        if op.callee is not None and id(op.callee) not in seen:
            seen.add(id(op.callee))
            yield from walk_ops(op.callee, seen)


@dataclass
class TensorSpec:
    """A parameter or state tensor of a program: checkpoint path and concrete type. `quantized` is
    the checkpoint format the source declares a parameter may be stored in (`@quantized("mxfp4")`),
    which loading dequantizes; None for a tensor stored as it is."""

    path: str
    type: TensorT
    kind: str  # "param" | "state"
    quantized: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.as_int() for d in self.type.shape.dims)


@dataclass
class ModuleClass:
    """The modules of one kind and one set of arguments (all `LlamaDecoderLayer(c)` of a
    model): what its methods may read. `params` and `state` by path relative to an instance
    (`q_proj.weight`), `children` by member name: (class key, None) for a submodule, (class
    key, count) for a list of submodules. `name` is the source module's name, `origin` its
    definition's "file:line". `fused` records the weights a pass fused (`{q,k,v}_proj.weight`,
    also in `params`) and the paths each replaces, which the code no longer reads."""

    key: str
    name: str
    origin: str
    params: dict[str, TensorT] = field(default_factory=dict)
    state: dict[str, TensorT] = field(default_factory=dict)
    children: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    std: bool = False  # a module of the standard library (`Linear`, `RMSNorm`...)
    fused: dict[str, list[str]] = field(default_factory=dict)  # fused weight -> the paths it replaces
    # a child's checkpoint name where `@name` makes it differ from the member's (`"layer.0"` for `attn`)
    checkpoint_names: dict[str, str] = field(default_factory=dict)

    def copy(self) -> "ModuleClass":
        return ModuleClass(
            self.key,
            self.name,
            self.origin,
            dict(self.params),
            dict(self.state),
            dict(self.children),
            self.std,
            {k: list(v) for k, v in self.fused.items()},
            dict(self.checkpoint_names),
        )


@dataclass
class ParamTransform:
    """A tensor the compiled code reads that the checkpoint does not hold: `sources`
    (checkpoint names) concatenated along `axis` under the name `key` (the weights of linear
    layers that share an input, one dot: `passes.fuse_linear_weights`). Runtimes make it once,
    at load; the sources are then not read by the code."""

    key: str
    sources: list[str]
    axis: int = 0


@dataclass
class Program:
    """A model lowered under one config: parameters, state, module classes, entry graphs and
    the functions they call.

    `dtype` is the working dtype; `max_batch` and `max_positions` size the state. `config` is
    the concrete config (field name -> value) it was lowered under. `root` is the key of the
    root model's class. `param_transforms` are the tensors made from checkpoint tensors at
    load (fused weights); `state_layouts` the shape a backend holds a state tensor in where it
    differs from its declared type (by path); `param_layouts` the memory layout a backend holds a parameter in
    where it differs from the checkpoint's (by path: "transposed", [K, N] in memory for an [N, K] parameter;
    `fusion.hold_wide_weights_transposed`). `takes_part`: the model's `@takes_part`, its
    parameters a part of a checkpoint (`part_prefix`: the prefix it names, or None to find it)."""

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
    functions: dict[str, Graph] = field(default_factory=dict)
    modules: dict[str, ModuleClass] = field(default_factory=dict)
    root: str = ""
    param_transforms: list[ParamTransform] = field(default_factory=list)
    state_layouts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    param_layouts: dict[str, str] = field(default_factory=dict)
    takes_part: bool = False
    part_prefix: str | None = None

    def param(self, path: str) -> TensorSpec | None:
        for p in self.params:
            if p.path == path:
                return p
        return None

    def graphs(self):
        """Every graph of the program: entries, then functions."""
        yield from self.entries.values()
        yield from self.functions.values()

    def state_written(self, entry: str) -> list[str]:
        """The checkpoint paths of the state tensors `entry` writes, itself or through the
        functions and loops it runs, in program order."""
        out: set[str] = set()

        def visit(g: Graph, prefix: str, indices: dict[str, str]) -> None:
            sub = lambda path: prefix + substitute_indices(path, indices)  # noqa: E731
            out.update(sub(path) for path in g.state_updates)
            for op in g.ops:
                if op.name == "call" and op.writes:
                    visit(op.callee, sub(op.attrs["receiver"] or ""), {})
                elif op.name == "loop" and op.writes:
                    for i in range(op.attrs["count"]):
                        visit(op.body, prefix, {**indices, op.attrs["index"]: str(i)})

        visit(self.entries[entry], "", {})
        return [t.path for t in self.state if t.path in out]

    def code_params(self) -> dict[str, tuple[int, ...]]:
        """The tensors the compiled code reads, by name, with their shapes: the parameters,
        with each `param_transforms` group in place of its sources."""
        shapes = {p.path: p.shape for p in self.params}
        for t in self.param_transforms:
            parts = [shapes.pop(s) for s in t.sources]
            shape = list(parts[0])
            shape[t.axis] = sum(p[t.axis] for p in parts)
            shapes[t.key] = tuple(shape)
        return shapes


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
    comment = f"  # {op.origin}" if op.origin else ""
    if op.name in ("param", "state"):
        rhs = f'{op.name} "{op.attrs["path"]}"'
    elif op.name == "const":
        value = op.attrs["value"]
        rhs = f"const {value.tolist() if value.size <= 8 else f'<{value.size} values>'}"
    elif op.name == "call":
        receiver = op.attrs.get("receiver")
        args = [f"self={receiver.rstrip('.') or 'self'}"] if receiver is not None else []
        args += [format_arg(v) for v in op.args.values()]
        rhs = f"call @{op.attrs['fn']}({', '.join(args)})"
        if op.writes:
            rhs += " writes " + ", ".join(op.writes)
    elif op.name == "loop":
        carried = ", ".join(format_arg(v) for v in op.args["carried"])
        captured = ", ".join(format_arg(v) for v in op.args["captured"])
        rhs = f"loop {op.attrs['var']} in {op.attrs['list']}[{op.attrs['count']}] carry ({carried}) with ({captured})"
        if op.writes:
            rhs += " writes " + ", ".join(op.writes)
    else:
        args = ", ".join(format_arg(v) if _is_value_arg(v) else f"{k}={format_arg(v)}" for k, v in op.args.items())
        rhs = f"composite {op.attrs['name']}({args})" if op.name == "composite" else f"{op.name}({args})"
        if op.attrs.get("variant"):
            rhs += " " + format_arg(op.attrs["variant"])
    lhs = f"{results} = " if results else ""
    if op.body is None:
        return [f"{indent}{lhs}{rhs}{comment}"]
    lines = [f"{indent}{lhs}{rhs} {{{comment}"]
    lines += format_graph_body(op.body, indent + "  ")
    lines.append(indent + "}")
    return lines


def _is_value_arg(v) -> bool:
    return isinstance(v, Value) or (isinstance(v, (list, tuple)) and bool(v) and isinstance(v[0], Value))


def format_graph_body(g: Graph, indent: str) -> list[str]:
    lines = []
    if g.kind in ("composite", "loop"):
        lines.append(indent + "(" + ", ".join(repr(v) for v in g.inputs) + ")")
    for op in g.ops:
        lines += format_op(op, indent)
    for path, v in g.state_updates.items():
        lines.append(f'{indent}state "{path}" = %{v.name}')
    lines.append(f"{indent}return " + ", ".join(f"%{v.name}" for v in g.outputs))
    return lines


def format_graph(g: Graph, program: Program | None = None) -> str:
    params = [repr(v) for v in g.inputs]
    if g.kind == "method" and program is not None and g.receiver in program.modules:
        params.insert(0, f"self: {program.modules[g.receiver].name}")
    outs = ", ".join(format_tensor_type(v.type) for v in g.outputs)
    keyword = "entry" if g.kind == "entry" else "fn"
    comment = f"  # {g.qualname}, {g.origin}" if g.kind != "entry" and g.origin else ""
    lines = [f"{keyword} {g.name}({', '.join(params)}) -> ({outs}) {{{comment}"]
    lines += format_graph_body(g, "  ")
    lines.append("}")
    return "\n".join(lines)


def format_program(p: Program, entries: list[str] | None = None, header: bool = True) -> str:
    """The readable text form of a program (what `linnet ir` prints): parameters, state,
    tensors made at load, entries, then the functions they call."""
    out = []
    if header:
        out.append(
            f"# {p.source}: model {p.model}, preset {p.preset or '(defaults)'}, dtype {p.dtype.name}, "
            f"max_batch {p.max_batch}, max_positions {p.max_positions}"
        )
        for t in p.params:
            out.append(f"param {t.path}: {format_tensor_type(t.type)}")
        for t in p.state:
            layout = p.state_layouts.get(t.path)
            held = f" held as [{', '.join(map(str, layout))}]" if layout else ""
            out.append(f"state {t.path}: {format_tensor_type(t.type)}{held}")
        for t in p.param_transforms:
            out.append(f"made {t.key} = concat({', '.join(t.sources)}, axis={t.axis})")
        out.append("")
    shown = [g for name, g in p.entries.items() if entries is None or name in entries]
    for g in shown + list(_called(shown, p)):
        out.append(format_graph(g, p))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _called(graphs: list[Graph], p: Program):
    """The functions the graphs call, transitively, in program order."""
    keys = {op.attrs["fn"] for g in graphs for op in walk_ops(g) if op.name == "call"}
    return (g for k, g in p.functions.items() if k in keys)


def _identifier(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    if out and out[0].isdigit():
        out = "v" + out
    return out
