"""Shared machinery of the text code generators (PyTorch, JAX): naming values, rendering
arguments and members, and writing a program as a module of classes and functions.

A program prepared for a backend (`pipeline.prepare`) is written as one class per module class
that has methods (its parameters and state declared in `PARAMS`/`STATE`, its submodules in
`CHILDREN`), one method per function of that class, one function per Linnet function, and the
entries as methods of the root model's class. A call is a method call on the receiver
(`self.self_attn.step(...)`), a loop is `for layer in self.layers:`, a parameter is read where
it is used (`self.q_proj.weight`), and each statement that comes from the source says where:
`# [B, 9, S, 64] llama.linnet:77`. The helpers the code calls (the `Module` base class, `linear`, ...) are a
backend's prelude, a real module (`Prelude`): a generated module imports them from it, a standalone one carries their
definitions.

A backend subclasses `GraphEmitter` and sets its tables: `dtypes` (dtype name -> text),
`emitters` (registry op -> emitter), `native` (composite -> emitter, used where the passes
recorded `attrs["native"]`) and `reserved` (names generated code must not shadow); what it cannot
express raises `linnet.errors.CodegenError`. Nothing here imports a framework: generated code is text.

Random ops (dropout) read the backend's `training_arg` through `training_flag()`: an attribute of the module in a
method (PyTorch's `self.training`; JAX's `self.dropout_keys`, the call's random keys); a free function that runs
one, directly or through its callees, takes it as an argument, which its callers pass on
(`noisy(x, training=self.training)`).
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import re
import textwrap
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, ClassVar

from ..errors import CodegenError
from ..ops import REGISTRY
from ..types.core import DType
from ..types.dims import Dim, const, format_dim
from .core import Graph, Op, Program, Value, body_ops, format_tensor_type
from .passes import runs_random


def python_infix() -> dict[str, str]:
    """Registry op name -> the Python operator both torch and JAX arrays overload for it
    (`and`/`or` on bool tensors are `&`/`|`), from the registry's own `operator` fields."""
    from ..ops import OPERATORS

    spelled = {"and": "&", "or": "|"}
    return {name: spelled.get(sym, sym) for sym, name in OPERATORS.items() if sym not in ("@", "not")}


def infix_emitter(symbol: str):
    """An emitter writing `x <symbol> y` (operands may be tensors or numbers)."""
    return lambda e, op: f"{e.r(op.args['x'])} {symbol} {e.r(op.args['y'])}"


def dim_text(d: Dim, min_call: str = "min") -> str:
    """A dim as generated code computes it. A dim with a floor division or remainder is
    written in its canonical form, the value the checker compares (`(H - 8) // 8 + 1` is
    `H // 8`): its divisions then have operands that cannot be negative, which `jax.export`'s
    symbolic shapes need to decide that a size is at least 0, where `(H - 8) // 8` is
    inconclusive. A slice bound clamped to its dim's size (`min(4, S)`) is a call of `min_call`
    (generated JAX: `jax.core.min_dim`, since Python's `min` cannot compare symbolic dims)."""
    n = d.as_int()
    if n is not None:
        return str(n)
    if any(a.kind in ("//", "%") for a in d.atoms()):
        d = d.val
    calls = {
        a: Dim.atom(const(f"{min_call}({dim_text(a.args[0], min_call)}, {dim_text(a.args[1], min_call)})"))
        for a in d.atoms()
        if a.kind == "min" and a.args is not None
    }
    return format_dim(d.substitute(calls) if calls else d)


def shape_text(v: Value, min_call: str = "min") -> str:
    return "[" + ", ".join(dim_text(d, min_call) for d in v.dims) + "]"


def index_text(rank: int, dim: int, item: str) -> str:
    """`x[:, :, item]` addressing one dim."""
    dim = dim if dim >= 0 else rank + dim
    return ", ".join([":"] * dim + [item])


def dims_text(dims, as_list: bool = False, min_call: str = "min") -> str:
    text = ", ".join(dim_text(d, min_call) if isinstance(d, Dim) else str(d) for d in dims)
    return f"[{text}]" if as_list else text


def reshapes(op: Op) -> bool:
    """Whether `op` is a primitive whose registry entry says it `reshapes` (its statement notes the shape)."""
    entry = REGISTRY.get(op.name)
    return entry is not None and entry.reshapes


def np_dtype_name(v) -> str:
    """The Linnet dtype name of a numpy array."""
    return {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64", "int32": "i32", "bool": "bool"}[
        str(v.dtype)
    ]


_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")


def member_chain(base: str, path: str) -> str:
    """`self.q_proj.weight` for `q_proj.weight` under `self`; list items by index
    (`self.layers[3]`), names that are not identifiers through getattr (a fused weight's
    `{q,k,v}_proj`)."""
    text = base
    for seg in path.split("."):
        if seg.isdigit():
            text += f"[{seg}]"
        elif _IDENTIFIER.match(seg) and not keyword.iskeyword(seg):
            text += f".{seg}"
        else:
            text = f"getattr({text}, {seg!r})"
    return text


@dataclass
class GraphEmitter:
    """Emits the statements of one graph. `names` maps value ids to Python expressions;
    `receivers` maps a path prefix to the Python name holding that module (`""` -> `self`,
    `layers.{i0}.` -> `layer` inside a loop)."""

    # How a dim's `min(a, b)` (a slice bound clamped to its dim's size) is called in the generated code (`dim_text`).
    MIN_CALL: ClassVar[str] = "min"
    numerics: str = "equivalent"
    names: dict[Any, str] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    uses: dict[int, int] = field(default_factory=dict)
    dim_names: set[str] = field(default_factory=set)
    receivers: dict[str, str] = field(default_factory=lambda: {"": "self"})
    methods: dict[str, str] = field(default_factory=dict)  # function key -> method or function name
    member_style: str = "attribute"  # "attribute": self.q_proj.weight; "dict": p['model...weight']
    prebound: dict[int, str] = field(default_factory=dict)  # value id -> the name `bind` gives it
    graph: Graph | None = None  # the graph being emitted
    helpers: "Helpers | None" = None  # where composites that run as their bodies become functions
    shapes: bool = True  # shape comments on reshaping statements (not in a function for several shapes)
    method: bool = False  # emitting a module's method (`self` is the module), not a free function

    # Set by each backend (class attributes of its subclass).
    dtypes: ClassVar[dict[str, str]] = {}
    emitters: ClassVar[dict] = {}
    native: ClassVar[dict] = {}
    reserved: ClassVar[set[str]] = set()
    backend: ClassVar[str] = ""
    uses_device: ClassVar[bool] = True  # tensors are made on a `device` (PyTorch; not JAX)
    # what random ops read (see the module docstring), and its value in a standalone `graph_function`: inference
    training_arg: ClassVar[str | None] = None
    training_off: ClassVar[str] = "None"

    def fresh(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint or "t") or "t"
        if base[0].isdigit():
            base = "t" + base
        if keyword.iskeyword(base) or base in self.reserved or base in self.dim_names:
            base += "_"
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def bind(self, v: Value, hint: str | None = None) -> str:
        name = self.prebound.pop(id(v), None) or self.fresh(hint if hint is not None else (v.hint or "t"))
        self.names[id(v)] = name
        return name

    def r(self, v) -> str:
        """Render an argument as Python text."""
        if isinstance(v, Value):
            try:
                return self.names[id(v)]
            except KeyError:
                raise CodegenError(f"%{v.name} is used before it is defined") from None
        if isinstance(v, Dim):
            return dim_text(v, self.MIN_CALL)
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

    def training_flag(self) -> str:
        """The Python expression random ops read where this graph runs (`training_arg`): the module's attribute in
        a method (`self.training`), the argument of a free function or of a flat graph (member_style "dict")."""
        if self.training_arg is None:
            raise CodegenError(f"the {self.backend} backend runs no random op")
        if self.method and self.member_style == "attribute":
            return f"self.{self.training_arg}"
        return self.training_arg

    def member(self, path: str) -> str:
        """A parameter or state tensor (path relative to the graph's receiver) as Python."""
        if self.member_style == "dict":
            return f"p[{path!r}]"
        best = max((p for p in self.receivers if path.startswith(p)), key=len)
        return member_chain(self.receivers[best], path[len(best) :])

    def receiver(self, prefix: str) -> str:
        """The module at a path prefix (`self_attn.` -> `self.self_attn`)."""
        path = prefix.rstrip(".")
        if not path:
            return self.receivers[""]
        best = max((p for p in self.receivers if prefix.startswith(p)), key=len)
        rest = prefix[len(best) :].rstrip(".")
        return member_chain(self.receivers[best], rest) if rest else self.receivers[best]

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
        outer, self.graph = self.graph, g
        stored = assigned_state(g)
        lines: list[str] = []
        try:
            for op in g.ops:
                lines += self.op_lines(op)
                for r in op.results:
                    for path in stored.get(id(r), ()):
                        lines.append(self.store_state(path, r))
        finally:
            self.graph = outer
        return lines

    def store_state(self, path: str, value: Value) -> str:
        """The statement making `value` the new value of state `path` (a state assigned by
        anything but `cache_write`, which writes in place itself)."""
        raise CodegenError(f"the {self.backend} backend cannot assign state `{path}`")

    def op_lines(self, op: Op) -> list[str]:
        if op.name in ("param", "state"):
            self.names[id(op.result)] = self.member(op.attrs["path"])
            return []
        if op.name == "composite":
            return self.composite_lines(op)
        if op.name == "call":
            return self.call_lines(op)
        if op.name == "loop":
            return self.loop_lines(op)
        emit = self.emitters.get(op.name)
        if emit is None:
            raise CodegenError(f"the {self.backend} backend has no lowering for `{op.name}`")
        out = emit(self, op)
        stmts, expr = out if isinstance(out, tuple) else ([], out)
        if expr is None:  # the emitter bound the results itself
            return self.commented(stmts, op)
        results = op.results
        lhs = ", ".join(self.bind(v) for v in results)
        return self.commented(stmts + [f"{lhs} = {expr}"], op)

    def commented(self, lines: list[str], op: Op, shape: bool | None = None) -> list[str]:
        """`lines` with the op's shape (for reshaping ops) and source position on the last."""
        if not lines:
            return lines
        notes = []
        if self.shapes and (reshapes(op) if shape is None else shape) and len(op.results) == 1:
            notes.append(shape_text(op.result))
        if op.origin:
            notes.append(op.origin)
        if notes:
            lines = lines[:-1] + [f"{lines[-1]}  # {' '.join(notes)}"]
        return lines

    def composite_lines(self, op: Op) -> list[str]:
        name = op.attrs["name"]
        if op.attrs.get("native"):
            emit = self.native.get(name)
            if emit is None:
                raise CodegenError(f"the {self.backend} backend has no native form of `{name}`")
            out = emit(self, op)
            stmts, expr = out if isinstance(out, tuple) else ([], out)
            lhs = ", ".join(self.bind(v) for v in op.results)
            return self.commented(stmts + [f"{lhs} = {expr}"], op, shape=True)
        body = op.body
        if self.helpers is not None:  # a function of the module, written once
            fn = self.helpers.function(op, self)
            args = ", ".join(self.r(op.args[iv.name]) for iv in body.inputs)
            lhs = ", ".join(self.bind(v) for v in op.results)
            return self.commented([f"{lhs} = {fn}({args})"], op, shape=False)
        for iv in body.inputs:
            self.names[id(iv)] = self.r(op.args[iv.name] if iv.name in op.args else None)
        args = ", ".join(self.r(op.args[k]) for k in op.args if isinstance(op.args[k], Value))
        lines = [f"# {name}({args})" + (f"  {op.origin}" if op.origin else "")]
        lines += self.graph_lines(body)
        for outer, inner in zip(op.results, body.outputs):
            self.names[id(outer)] = self.r(inner)
        return lines

    def call_lines(self, op: Op) -> list[str]:
        callee = op.callee
        args = ", ".join(self.r(v) for v in op.inputs())
        name = self.methods[callee.name]
        receiver = op.attrs.get("receiver")
        if receiver is None:
            fn = name
            if self.training_arg and runs_random(callee):
                passed = f"{self.training_arg}={self.training_flag()}"
                args = f"{args}, {passed}" if args else passed
            if callee_needs_device(self, callee):
                args = f"{args}, device=device" if args else "device=device"
        else:
            fn = f"{self.receiver(receiver)}.{name}"
        n = len(callee.outputs)
        for v, path in zip(op.results[n:], op.attrs.get("updates", [])):
            self.names[id(v)] = self.member(path)  # the callee wrote the receiver's state
        lhs = ", ".join(self.bind(v) for v in op.results[:n])
        return self.commented([f"{lhs} = {fn}({args})"], op, shape=False)

    def loop_lines(self, op: Op) -> list[str]:
        """`for layer in self.layers:` with the body inside; a carried value keeps its name
        (`h = layer.step(h, ...)`), copied first when the enclosing graph reads it after the loop
        or the body reads its value before the loop too."""
        body = op.body
        carried, captured = op.args["carried"], op.args["captured"]
        items = self.receiver(op.attrs["list"] + ".")
        var = self.fresh(op.attrs["var"])
        self.receivers[f"{op.attrs['list']}.{op.attrs['index']}."] = var
        later = self._read_after(op)
        lines, names = [], []
        also_captured = {id(v) for v in captured}  # `let x = h; for ... { h = l(h) + x }`
        for outer, inner, result in zip(carried, body.inputs, op.results):
            name = self.r(outer)
            if id(outer) in later or id(outer) in also_captured or not _IDENTIFIER.match(name):
                copy = self.fresh(result.hint or result.name)
                lines.append(f"{copy} = {name}")
                name = copy
            names.append(name)
            self.names[id(inner)] = name
        for outer, inner in zip(captured, body.inputs[len(carried) :]):
            self.names[id(inner)] = self.r(outer)
        for i, (out_value, name) in enumerate(zip(body.outputs, names)):
            producer = out_value.producer
            n = len(producer.callee.outputs) if producer is not None and producer.callee is not None else 1
            if producer is None or out_value not in producer.results[:n] or n != 1:
                continue
            if not self._read_after(producer, body, body.inputs[i]):
                self.prebound[id(out_value)] = name  # computed into the carried variable
        inner_lines = self.graph_lines(body)
        for out_value, name in zip(body.outputs, names):
            if self.r(out_value) != name:
                inner_lines.append(f"{name} = {self.r(out_value)}")
        for result, name in zip(op.results, names):
            self.names[id(result)] = name
        head = f"for {var} in {items}:" + (f"  # {op.origin}" if op.origin else "")
        return lines + [head] + ["    " + line for line in (inner_lines or ["pass"])]

    def _read_after(self, op: Op, g: Graph | None = None, value: Value | None = None) -> set[int] | bool:
        """The ids of values read after `op` in `g` (the graph being emitted); with `value`,
        whether that value is read after `op` (or returned)."""
        g = g or self.graph
        i = g.ops.index(op)
        read = {id(v) for later in g.ops[i + 1 :] for v in later.inputs()}
        read |= {id(v) for v in list(g.outputs) + list(g.state_updates.values())}
        if value is None:
            return read
        return id(value) in read or any(v is value for v in g.outputs)


def assigned_state(g: Graph) -> dict[int, list[str]]:
    """Value id -> the state paths `g` assigns it to, where no `cache_write` wrote it in place
    (`GraphEmitter.store_state` writes those)."""
    out: dict[int, list[str]] = {}
    for path, v in g.state_updates.items():
        if v.producer is not None and v.producer.name not in ("cache_write", "call", "state"):
            out.setdefault(id(v), []).append(path)
    return out


def callee_needs_device(e: GraphEmitter, g: Graph) -> bool:
    """Whether a function takes `device` as an argument: it makes tensors and has no tensor
    argument to read the device from (on a backend whose tensors have one)."""
    return e.uses_device and not g.inputs and _makes_tensors(g)


def _makes_tensors(g: Graph) -> bool:
    return any(op.name in ("arange", "full", "zeros", "ones", "min_value", "const") for op in body_ops(g))


class Helpers:
    """What the module declares once for its functions: composites that run as their bodies,
    each a function (`rms_norm(x, weight)` rather than its six statements at every use:
    `function(op)` gives its name, identical bodies share one), and folded constants too long
    to write inline (`constant(hint, values)`)."""

    def __init__(self, write: Callable[[Graph, "GraphEmitter", str], list[str]], taken: set[str]):
        self.write = write  # (body graph, fresh emitter, name) -> the function's lines
        self.taken = set(taken)  # names a helper may not take
        self.reserved = taken  # names a helper's locals may not take
        self.sources: list[list[str]] = []
        self.constant_sources: list[list[str]] = []
        self._by_code: dict[tuple[str, ...], tuple[str, int, str | None]] = {}  # code -> name, source index, text
        self._constants: dict[str, str] = {}

    def constant(self, hint: str, values: list) -> str:
        """The name of a module-level list of `values` (a folded constant too long to write
        where it is used), made on first use."""
        text = repr(values)
        if text not in self._constants:
            name = _unique(re.sub(r"_\d+$", "", _python_name(hint or "c")).upper(), self.taken)
            self._constants[text] = name
            wrapped = textwrap.wrap(text[1:-1], 96, break_on_hyphens=False)
            self.constant_sources.append([f"{name} = ["] + [f"    {line}" for line in wrapped] + ["]"])
        return self._constants[text]

    def function(self, op: Op, e: "GraphEmitter") -> str:
        """The name of the function running composite `op`'s body, written on first use. Bodies that read the same
        but for their types (`apply_rope` over 9 query heads and over 3 KV heads: Python is shape-polymorphic) share
        one function, whose docstring is then the source's signature and whose comments name no shapes."""
        name = op.attrs["name"]
        fresh = type(e)(e.numerics, methods=e.methods, helpers=self)
        fresh.taken |= self.reserved
        lines = self.write(op.body, fresh, "NAME")
        code = (name, *(re.sub(r"  #.*$", "", line) for line in lines[2:]))  # shapes in comments differ
        if code not in self._by_code:
            fn = _unique(_python_name(name), self.taken)
            self._by_code[code] = (fn, len(self.sources), "\n".join(lines))
            self.sources.append([line.replace("def NAME(", f"def {fn}(", 1) for line in lines])
        fn, index, text = self._by_code[code]
        if text is not None and text != "\n".join(lines):  # another specialisation: written generically
            body = op.body
            generic = [lines[0], f'    """{body.signature} ({body.origin})"""']
            generic += [re.sub(r"  # \[[^\]]*\] ", "  # ", line) for line in lines[2:]]
            self.sources[index] = [line.replace("def NAME(", f"def {fn}(", 1) for line in generic]
            self._by_code[code] = (fn, index, None)
        return fn

    @property
    def names(self) -> set[str]:
        """The names of the functions written so far."""
        return {fn for fn, _, _ in self._by_code.values()}


def constant_values(e: GraphEmitter, op: Op) -> str:
    """A folded constant's values as text: inline when short, else a module-level name."""
    values = op.attrs["value"].tolist()
    text = repr(values)
    if len(text) <= 60 or e.helpers is None:
        return text
    return e.helpers.constant(op.result.hint or op.result.name, values)


def python_reserved(*extra: str) -> set[str]:
    """Names generated code must not bind: builtins and the backend's module names."""
    return set(extra) | set(dir(builtins))


Emit = Callable[[GraphEmitter, Op], "str | tuple[list[str], str | None]"]


# ----------------------------------------------------------------------------- modules


@dataclass
class ModuleLayout:
    """How a program is written as Python: which module classes become classes (those with
    methods, the root, and what holds them), each function's Python name, and what each class
    declares."""

    program: Program
    classes: list[str] = field(default_factory=list)  # emitted class keys, children first
    names: dict[str, str] = field(default_factory=dict)  # function key -> method/function name
    methods: dict[str, list[str]] = field(default_factory=dict)  # class key -> function keys
    free: list[str] = field(default_factory=list)  # function keys without receiver
    merged: dict[str, list[str]] = field(default_factory=dict)  # function key -> keys written as it

    @classmethod
    def of(cls, program: Program, reserved: set[str]) -> "ModuleLayout":
        layout = cls(program)
        for key, g in program.functions.items():
            if g.receiver is None:
                layout.free.append(key)
            else:
                layout.methods.setdefault(g.receiver, []).append(key)
        for name in reversed(program.entries):
            layout.methods.setdefault(program.root, []).insert(0, name)
        emitted = set(layout.methods) | {program.root}
        changed = True
        while changed:  # a class holding an emitted class is emitted too
            changed = False
            for key, m in program.modules.items():
                if key not in emitted and any(c in emitted for c, _ in m.children.values()):
                    emitted.add(key)
                    changed = True
        layout.classes = [k for k in _children_first(program) if k in emitted]
        taken = set(reserved) | {class_name(program, k) for k in layout.classes}
        for key in layout.free:
            layout.names[key] = _unique(_python_name(key), taken)
        for keys in layout.methods.values():
            used: set[str] = set()
            for key in keys:
                g = program.entries.get(key) or program.functions[key]
                base = key if key in program.entries else g.qualname.rsplit(".", 1)[-1]
                layout.names[key] = _unique(_python_name(base), used | {"PARAMS", "STATE", "CHILDREN"})
                used.add(layout.names[key])
        return layout

    def declarations(self, key: str) -> tuple[dict, dict, dict]:
        """(PARAMS, STATE, CHILDREN) of an emitted class: its own tensors and those of the
        submodules that are not classes, by dotted path; children that are classes by name
        (a list of submodules as (class name, count))."""
        params: dict[str, Any] = {}
        state: dict[str, Any] = {}
        children: dict[str, tuple[str, int | None]] = {}

        def collect(k: str, prefix: str) -> None:
            m = self.program.modules[k]
            params.update({prefix + p: t for p, t in m.params.items()})
            replaced = {prefix + member for members in m.fused.values() for member in members}
            state.update({prefix + p: t for p, t in m.state.items()})
            for name, (child, count) in m.children.items():
                if child in self.classes:
                    if prefix:
                        raise CodegenError(f"{name}: a module class inside a module without methods")
                    children[name] = (class_name(self.program, child), count)
                elif count is None:
                    collect(child, f"{prefix}{name}.")
                else:
                    for i in range(count):
                        collect(child, f"{prefix}{name}.{i}.")
            for path in replaced:  # read through a fused weight instead
                params.pop(path, None)

        collect(key, "")
        return params, state, children


def class_name(program: Program, key: str) -> str:
    return _python_name(key)


def _children_first(program: Program) -> list[str]:
    out: list[str] = []

    def visit(key: str) -> None:
        if key in out:
            return
        for child, _ in program.modules[key].children.values():
            visit(child)
        out.append(key)

    if program.root:
        visit(program.root)
    return out


def _python_name(name: str) -> str:
    text = re.sub(r"\W", "_", name.replace(".", "_"))
    return text if not keyword.iskeyword(text) else text + "_"


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 1
    while out in taken:
        n += 1
        out = f"{name}_{n}"
    taken.add(out)
    return out


def signature_text(g: Graph) -> str:
    """`f32[B, S, 576], f32[B, S, 64] -> f32[B, S, 576]`."""
    ins = ", ".join(format_tensor_type(v.type) for v in g.inputs) or "()"
    outs = ", ".join(format_tensor_type(v.type) for v in g.outputs)
    return f"{ins} -> {outs}"


def dim_sources(g: Graph) -> dict[str, tuple[int, int]]:
    """Each symbolic dim of `g`'s inputs: name -> (input index, axis) of its first occurrence as
    a whole dim (what a composite's body, which records none, reads its dims from)."""
    if g.dim_sources:
        return g.dim_sources
    out: dict[str, tuple[int, int]] = {}
    for i, v in enumerate(g.inputs):
        for axis, d in enumerate(v.dims):
            atoms = d.atoms()
            if len(atoms) == 1 and d.key() == Dim.atom(next(iter(atoms))).key():
                out.setdefault(format_dim(d), (i, axis))
    return out


def dims_lines(g: Graph, args: list[str], used: set[str]) -> list[str]:
    """Statements reading the graph's symbolic dims from its inputs' shapes."""
    by_input: dict[int, list[tuple[int, str]]] = {}
    for name, (i, axis) in dim_sources(g).items():
        if name in used:
            by_input.setdefault(i, []).append((axis, name))
    lines = []
    for i, dims in by_input.items():
        dims.sort()
        axes = [a for a, _ in dims]
        names = ", ".join(n for _, n in dims)
        if len(dims) == 1:  # `B = x.shape[0]`: a slice (`x.shape[:1]`) would bind a tuple
            lines.append(f"{names} = {args[i]}.shape[{axes[0]}]")
        elif axes == list(range(g.inputs[i].rank)):
            lines.append(f"{names} = {args[i]}.shape")
        elif axes == list(range(len(axes))):
            lines.append(f"{names} = {args[i]}.shape[:{len(axes)}]")
        else:
            lines += [f"{n} = {args[i]}.shape[{a}]" for a, n in dims]
    return lines


def identifiers(text: str) -> set[str]:
    """The identifiers a piece of code mentions (strings and comments removed)."""
    code = re.sub(r"'[^']*'|\"[^\"]*\"", "", text)
    code = re.sub(r"#[^\n]*", "", code)
    return set(re.findall(r"(?<![.\w])[A-Za-z_]\w*", code))


# ----------------------------------------------------------------------------- module writer


@dataclass(frozen=True)
class Prelude:
    """A backend's runtime helpers: a real module, `module` (the file `path`), which imports the framework. A
    generated module imports the names its code reads from it (`import_lines`); a standalone one carries their
    definitions (`definitions`), read from the file's text, so that neither the generator (no framework here) nor
    the file imports it: the `base` class before the model's classes (they derive from it), everything else after
    the model (a function's globals are looked up when it runs)."""

    module: str
    path: Path
    base: str = "Module"

    @cached_property
    def blocks(self) -> dict[str, tuple[int, str, frozenset[str]]]:
        """Each name the file defines at top level: its statement's index, source (with the comment lines right above
        it) and the names it reads. The docstring and the imports are not blocks."""
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines()
        out = {}
        for index, node in enumerate(ast.parse(text).body):
            if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            ):
                continue
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            while start > 0 and lines[start - 1].startswith("#"):
                start -= 1
            source = "\n".join(lines[start : node.end_lineno])
            reads = frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", node)]
            for target in targets:
                name = getattr(target, "name", None) or getattr(target, "id", None)
                if name is not None:
                    out[name] = (index, source, reads)
        return out

    def used(self, code: str) -> list[str]:
        """The public names of the prelude that `code` (valid Python) reads, in the prelude's order. `code` may quote
        a path with bytes that are not UTF-8 (lone surrogates), which the parser cannot encode: read as U+FFFD."""
        tree = ast.parse(code.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
        reads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        return [name for name in self.blocks if name in reads and not name.startswith("_")]

    def needed(self, names: list[str]) -> list[str]:
        """`names` and every prelude name they read, transitively, in the prelude's order."""
        found, todo = set(), list(names)
        while todo:
            name = todo.pop()
            if name in self.blocks and name not in found:
                found.add(name)
                todo += self.blocks[name][2]
        return [name for name in self.blocks if name in found]

    def import_lines(self, names: list[str]) -> list[str]:
        return [f"from {self.module} import {', '.join(names)}"] if names else []

    def definitions(self, names: list[str]) -> list[str]:
        """The source of each statement that defines one of `names`, once each, in the prelude's order."""
        statements = {self.blocks[name][0]: self.blocks[name][1] for name in names}
        return [statements[i] for i in sorted(statements)]


class ModuleWriter:
    """Writes a prepared program as a Python module (see the module docstring). A backend
    subclasses it and sets `emitter` (its `GraphEmitter` subclass), `reserved`, `prelude` (its
    helpers, `Prelude`), and the hooks: `head` (docstring and imports, ending with
    `prelude_imports()`), `table` (a class's PARAMS/STATE declaration) and `tail` (what follows
    the classes: entry functions). `standalone`: the module carries the definitions of the
    prelude's helpers it calls instead of importing them (the prelude's `base` class before the
    model, the rest at the end), so that it imports only the framework."""

    emitter: ClassVar[type[GraphEmitter]] = GraphEmitter
    reserved: ClassVar[set[str]] = set()
    prelude: ClassVar[Prelude | None] = None

    def __init__(self, program: Program, numerics: str, standalone: bool = False):
        self.program = program
        self.numerics = numerics
        self.standalone = standalone
        self.layout = ModuleLayout.of(program, self.reserved)
        self.prelude_names: list[str] = []  # what the code reads of the prelude (`write`)

    def head(self) -> list[str]:
        return []

    def prelude_imports(self) -> list[str]:
        """The import of the prelude's helpers the code calls (none in a standalone module), after a blank line."""
        if self.standalone or self.prelude is None or not self.prelude_names:
            return []
        return ["", *self.prelude.import_lines(self.prelude_names)]

    def table(self, name: str, items: dict) -> list[str]:
        return []

    def tail(self) -> list[str]:
        return []

    def merge_identical(self) -> None:
        """Specialisations of one source function whose code reads the same (`apply_rope` for
        9 query heads and for 3 KV heads: Python is shape-polymorphic) become one function:
        their keys all take the first one's name, and the others are not written. Merges chain (a body reads the
        same as another's only once its callees were merged, on a later pass): a key merged into one that is then
        merged itself follows it, or its callers would name a function not written (GPT-OSS's `mask_7`)."""
        layout, program = self.layout, self.program
        self.helpers = Helpers(lambda body, e, name: self.function(body, e, name, method=False), set())
        self._reserved = self.reserved | set(layout.names.values()) | set(layout.classes)
        while True:
            seen: dict[tuple, str] = {}
            merged = False
            for owner, keys in [(None, layout.free), *layout.methods.items()]:
                for key in list(keys):
                    g = program.functions.get(key)
                    if g is None:  # an entry
                        continue
                    body = self.function(g, self.new_emitter(), "NAME", method=owner is not None)[2:]
                    code = tuple(re.sub(r"  #.*$", "", line) for line in body)  # shapes in comments differ
                    found = seen.setdefault((owner, g.qualname, code), key)
                    if found != key:  # `key`, and what was merged into it before, are written as `found`
                        into = layout.merged.setdefault(found, [])
                        for k in [key, *layout.merged.pop(key, [])]:
                            layout.names[k] = layout.names[found]
                            into.append(k)
                        keys.remove(key)
                        merged = True
            if not merged:
                return

    def write(self) -> str:
        """The module's text, valid UTF-8: a source path with bytes that are not UTF-8 (Python's lone surrogates,
        from `os.fsdecode`), which the docstrings and location comments quote, has each such byte as U+FFFD, so that
        `compile` and writing the file work (they raised UnicodeEncodeError)."""
        self.merge_identical()
        layout, program = self.layout, self.program
        helper_names: set[str] = set()
        while True:  # twice: the second time no local may take a helper's name
            reserved = self.reserved | set(layout.names.values()) | set(layout.classes) | helper_names
            write = lambda body, e, name: self.function(body, e, name, method=False)  # noqa: E731
            self.helpers = Helpers(write, reserved - helper_names)
            self._reserved = reserved
            body: list[str] = []
            for key in layout.free:
                g = program.functions[key]
                body += ["", ""] + self.function(g, self.new_emitter(), layout.names[key], method=False)
            for key in layout.classes:
                body += ["", ""] + self.class_source(key)
            made = self.helpers.names
            if made <= helper_names:
                break
            helper_names |= made
        code = body + self.tail()
        if self.prelude is not None:  # what the whole module reads: its classes, functions and helpers
            helpers = [line for source in self.helpers.constant_sources + self.helpers.sources for line in source]
            self.prelude_names = self.prelude.used("\n".join(helpers + code))
        before: list[str] = []
        after: list[str] = []
        if self.standalone and self.prelude is not None:
            needed = self.prelude.needed(self.prelude_names)
            base = [name for name in needed if name == self.prelude.base]
            for source in self.prelude.definitions(base):
                before += ["", "", source]
            rest = self.prelude.definitions([name for name in needed if name not in base])
            if rest:
                after += ["", "", f"# The helpers the model calls, as {self.prelude.module} defines them."]
            for source in rest:
                after += ["", "", source]
        out = self.head()
        for source in self.helpers.constant_sources:
            out += [""] + source
        out += before
        for source in self.helpers.sources:
            out += ["", ""] + source
        text = "\n".join(out + code + after).rstrip() + "\n"
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")

    def new_emitter(self) -> GraphEmitter:
        e = self.emitter(self.numerics, methods=dict(self.layout.names), helpers=self.helpers)
        e.taken |= self._reserved
        return e

    def class_source(self, key: str) -> list[str]:
        cls = self.program.modules[key]
        params, state, children = self.layout.declarations(key)
        lines = [f"class {key}(Module):", f'    """{cls.name} ({cls.origin})."""']
        for name, items in (("PARAMS", params), ("STATE", state)):
            rows = self.table(name, items)
            if rows:
                lines += [""] + ["    " + row for row in rows]
        if children:
            rows = [f"        {k!r}: {c if n is None else f'({c}, {n})'}," for k, (c, n) in children.items()]
            lines += ["", "    CHILDREN = {", *rows, "    }"]
        for fkey in self.layout.methods.get(key, []):
            g = self.program.entries.get(fkey) or self.program.functions[fkey]
            lines += [""] + self.function(g, self.new_emitter(), self.layout.names[fkey], method=True)
        return lines

    def function(self, g: Graph, e: GraphEmitter, name: str, method: bool) -> list[str]:
        e.shapes = g.name not in self.layout.merged
        lines = function_lines(g, e, name, method)
        if g.name in self.layout.merged:  # one function for several types: the source's signature
            indent = "        " if method else "    "
            lines[1] = f'{indent}"""{g.signature} ({g.origin})"""'
        return lines


def function_lines(g: Graph, e: GraphEmitter, name: str, method: bool) -> list[str]:
    """One graph as a method (`def name(self, ...)`, indented for a class body) or a function.
    A function that makes tensors and has no tensor argument takes `device`."""
    e.method = method
    args = [e.bind(v) for v in g.inputs]
    body = e.graph_lines(g)
    rets = [e.r(v) for v in g.outputs]
    used = identifiers("\n".join(body + rets))
    params = (["self"] if method else []) + args
    if not method and e.training_arg and runs_random(g):
        params.append(e.training_arg)
    needs_device = e.uses_device and "device" in used
    if not method and callee_needs_device(e, g):
        params.append("device")
        needs_device = False
    where = f" ({g.origin})" if g.origin else ""
    head = [f"def {name}({', '.join(params)}):", f'    """{signature_text(g)}{where}"""']
    prelude = dims_lines(g, args, used)
    if needs_device:
        if not args:
            raise CodegenError(f"`{g.qualname}` makes tensors but has no tensor argument to take the device from")
        prelude.append(f"device = {args[0]}.device")
    lines = head + ["    " + line for line in prelude + body + [f"return {', '.join(rets)}"]]
    return ["    " + line for line in lines] if method else lines


def graph_function(emitter: type[GraphEmitter], g: Graph, numerics: str = "equivalent") -> str:
    """A flat graph (no calls or loops) as a standalone `def NAME(p, inputs...)`, parameters and
    state read from the dict `p` by checkpoint name (the backends' op tests)."""
    e = emitter(numerics, member_style="dict")
    e.taken |= emitter.reserved | {"p"}
    text = function_lines(g, e, g.name, method=False)
    head = text[0].replace("()", "(p)") if "()" in text[0] else text[0].replace("(", "(p, ", 1)
    if e.training_arg:  # a graph that runs dropout: inference unless the caller says otherwise
        head = head.replace(f", {e.training_arg}):", f", {e.training_arg}={e.training_off}):")
    return "\n".join([head] + text[1:])
