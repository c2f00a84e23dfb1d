"""Rebuilding graphs: copying a program, inlining calls, unrolling loops.

One walker (`Rebuilder`) copies a graph op by op into a new one, and while it copies it may
replace a `call` by a copy of its callee's body (the callee's parameter and state paths
prefixed with the call's receiver) and a `loop` by one copy of its body per item (the index
placeholder `{iN}` replaced by the item's index). Three passes use it:

- `copy_program`: a deep copy, so that passes never change the program they were given;
- `inline_calls(program, should_inline)`: inline the calls a policy picks (`layer_calls`: the
  standard library's small modules and leaf layers, so a `Linear` becomes a `linear` op of its
  caller);
- `flatten(program)`: inline every call and unroll every loop, giving one flat graph per entry
  with absolute checkpoint paths, which is what ONNX export and the interpreter run.

State is a cell per path: while a graph is rebuilt, the newest value of each cell is tracked,
so that a state read after an inlined write reads the written value, and an entry's
`state_updates` are the cells' last values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .core import LOOP_INDEX, Graph, Op, Program, Value, shift_indices, substitute_indices
from .passes import drop_unused_functions, optimize


@dataclass
class _Scope:
    """Where copied ops land and how names map: `env` maps source value ids to copies;
    `prefix` is prepended to param/state paths and receivers; `indices` maps a source
    placeholder (`{i0}`) to what replaces it (an index, or a renumbered placeholder)."""

    out: Graph
    env: dict[int, Value]
    prefix: str
    indices: dict[str, str]
    depth: int  # loops enclosing `out` (placeholders {i0}..{i<depth-1}} are taken)
    cells: dict[str, Value] = field(default_factory=dict)  # state path -> newest value
    reads: dict[str, Value] = field(default_factory=dict)  # param path -> its read in `out`
    cell_of: dict[int, str] = field(default_factory=dict)  # value id -> the state path it holds


class Rebuilder:
    """Copies graphs of `program`, inlining the calls `inline(op)` picks and unrolling loops
    when `unroll`."""

    def __init__(self, program: Program, inline: Callable[[Op], bool], unroll: bool):
        self.program = program
        self.inline = inline
        self.unroll = unroll
        self.functions: dict[str, Graph] = {}  # copied callees by key (made on first use)

    # ----- whole graphs
    def graph(self, g: Graph) -> Graph:
        """A copy of `g` (a top-level entry or function)."""
        out = Graph(
            g.name,
            [],
            kind=g.kind,
            qualname=g.qualname,
            receiver=g.receiver,
            origin=g.origin,
            signature=g.signature,
            dim_vars=list(g.dim_vars),
            dim_sources=dict(g.dim_sources),
        )
        scope = _Scope(out, {}, "", {}, 0)
        for v in g.inputs:
            scope.env[id(v)] = self._input(out, v)
        self.run(g, scope)
        out.outputs = [scope.env[id(v)] for v in g.outputs]
        out.state_updates = {p: v for p, v in scope.cells.items() if v.producer is None or v.producer.name != "state"}
        return out

    def callee(self, key: str) -> Graph:
        if key not in self.functions:
            self.functions[key] = None  # type: ignore[assignment]  # (no recursion: the checker refuses it)
            self.functions[key] = self.graph(self.program.functions[key])
        return self.functions[key]

    # ----- ops
    def run(self, g: Graph, s: _Scope) -> None:
        """Copy `g`'s ops into `s.out` (its inputs already mapped in `s.env`), then apply its
        state updates to the cells."""
        for op in g.ops:
            if op.name == "param":
                path = self.path(op.attrs["path"], s)
                v = s.reads.get(path)
                if v is None:
                    v = s.reads[path] = self.emit(s, Op("param", {}, [], {"path": path}, origin=op.origin), op)[0]
                s.env[id(op.result)] = v
            elif op.name == "state":
                path = self.path(op.attrs["path"], s)
                v = s.cells.get(path)
                if v is None:
                    v = self.emit(s, Op("state", {}, [], {"path": path}, origin=op.origin), op)[0]
                    s.cells[path] = v
                    s.cell_of[id(v)] = path
                s.env[id(op.result)] = v
            elif op.name == "call" and self.inline(op):
                self.inline_call(op, s)
            elif op.name == "call":
                self.copy_call(op, s)
            elif op.name == "loop" and self.unroll:
                self.unroll_loop(op, s)
            elif op.name == "loop":
                self.copy_loop(op, s)
            else:
                copy = Op(op.name, self.args(op.args, s), [], dict(op.attrs), origin=op.origin)
                if op.body is not None:
                    copy.body = self.graph(op.body)
                self.emit(s, copy, op)
                if op.name == "cache_write":
                    path = s.cell_of.get(id(copy.args["cache"]))
                    if path is not None:
                        s.cells[path] = copy.result
                        s.cell_of[id(copy.result)] = path
        for path, v in g.state_updates.items():
            full = self.path(path, s)
            s.cells[full] = s.env[id(v)]
            s.cell_of[id(s.env[id(v)])] = full

    def inline_call(self, op: Op, s: _Scope) -> None:
        """The callee's ops in place of the call. Ops of the standard library's modules take
        the call's source position: the line the model's author wrote."""
        callee = op.callee
        receiver = self.path(op.attrs["receiver"] or "", s, prefixed=False)
        inner = _Scope(s.out, {}, s.prefix + receiver, {}, s.depth, s.cells, s.reads, s.cell_of)
        for i, a in zip(callee.inputs, self.args(op.inputs(), s)):
            inner.env[id(i)] = a
        start = len(s.out.ops)
        self.run(callee, inner)
        cls = self.program.modules.get(callee.receiver) if callee.receiver is not None else None
        if cls is not None and (cls.std or not cls.children) and op.origin:
            for copy in s.out.ops[start:]:
                copy.origin = op.origin
        made = {id(r) for copy in s.out.ops[start:] for r in copy.results}
        for r, o in zip(op.results, callee.outputs):
            value = s.env[id(r)] = inner.env[id(o)]
            if id(value) in made and r.hint:  # the caller's name for it (`let h = embed_tokens(ids)`)
                value.hint = r.hint
        for r, path in zip(op.results[len(callee.outputs) :], op.attrs.get("updates", [])):
            s.env[id(r)] = s.cells[self.path(path, s)]

    def copy_call(self, op: Op, s: _Scope) -> None:
        """A call kept as a call (of the callee's copy). Its state results follow the copy's
        `state_updates`, whose order inlining may have changed."""
        callee = self.callee(op.attrs["fn"])
        receiver = op.attrs["receiver"]
        prefix = self.path(receiver, s) if receiver is not None else None
        writes = [(prefix or "") + shift_indices(w, s.depth) for w in sorted(callee.written_state())]
        updates = [(prefix or "") + w for w in callee.state_updates]
        attrs = dict(op.attrs, receiver=prefix, writes=writes, updates=updates)
        copy = Op("call", self.args(op.args, s), [], attrs, origin=op.origin, callee=callee)
        n = len(callee.outputs)
        copy.results = [Value(r.type, r.hint, copy) for r in op.results[:n]]
        for path, v in zip(updates, callee.state_updates.values()):
            copy.results.append(Value(v.type, _state_hint(path), copy))
        old = {self.path(w, s): r for w, r in zip(op.attrs.get("updates", []), op.results[n:])}
        for r, c in zip(op.results[:n], copy.results):
            s.env[id(r)] = c
        for path, c in zip(updates, copy.results[n:]):
            if path in old:
                s.env[id(old[path])] = c
            s.cells[path] = c
            s.cell_of[id(c)] = path
        s.out.ops.append(copy)

    def unroll_loop(self, op: Op, s: _Scope) -> None:
        body, carried = op.body, self.args(op.args["carried"], s)
        captured = self.args(op.args["captured"], s)
        index = op.attrs["index"]
        for k in range(op.attrs["count"]):
            inner = _Scope(s.out, {}, s.prefix, {**s.indices, index: str(k)}, s.depth, s.cells, s.reads, s.cell_of)
            for i, v in zip(body.inputs, carried + captured):
                inner.env[id(i)] = v
            self.run(body, inner)
            carried = [inner.env[id(o)] for o in body.outputs]
        for r, v in zip(op.results, carried):
            s.env[id(r)] = v

    def copy_loop(self, op: Op, s: _Scope) -> None:
        index = LOOP_INDEX % s.depth
        body = Graph(op.body.name, [], kind="loop", qualname=op.body.qualname, receiver=op.body.receiver)
        inner = _Scope(body, {}, s.prefix, {**s.indices, op.attrs["index"]: index}, s.depth + 1)
        for v in op.body.inputs:
            inner.env[id(v)] = self._input(body, v)
        self.run(op.body, inner)
        body.outputs = [inner.env[id(v)] for v in op.body.outputs]
        body.state_updates = {p: v for p, v in inner.cells.items() if v.producer is None or v.producer.name != "state"}
        attrs = dict(op.attrs)
        attrs["index"] = index
        attrs["list"] = self.path(op.attrs["list"], s)
        attrs["writes"] = sorted(body.written_state())
        args = {"carried": self.args(op.args["carried"], s), "captured": self.args(op.args["captured"], s)}
        self.emit(s, Op("loop", args, [], attrs, body=body, origin=op.origin), op)

    # ----- helpers
    def path(self, path: str, s: _Scope, prefixed: bool = True) -> str:
        """A source path as the copy names it: placeholders mapped, prefixed with the scope's."""
        path = substitute_indices(path, s.indices)
        return s.prefix + path if prefixed else path

    def args(self, args, s: _Scope):
        if isinstance(args, dict):
            return {k: self.args(v, s) for k, v in args.items()}
        if isinstance(args, list):
            return [self.args(v, s) for v in args]
        if isinstance(args, Value):
            return s.env[id(args)]
        return args

    def emit(self, s: _Scope, copy: Op, source: Op) -> list[Value]:
        copy.results = [Value(r.type, r.hint, copy) for r in source.results]  # named anew
        for r, c in zip(source.results, copy.results):
            s.env[id(r)] = c
        s.out.ops.append(copy)
        return copy.results

    def _input(self, out: Graph, v: Value) -> Value:
        new = Value(v.type, v.hint)
        out.inputs.append(new)
        return new


def copy_program(program: Program) -> Program:
    """A copy of `program` whose graphs can be changed without changing `program`'s."""
    return _rebuilt(program, lambda op: False, unroll=False)


def inline_calls(program: Program, should_inline: Callable[[Op], bool]) -> Program:
    """`program` with the calls `should_inline(call op)` picks replaced by their callees'
    bodies, in every graph; functions no longer called are dropped. Returns a new program."""
    return _rebuilt(program, should_inline, unroll=False)


def flatten(program: Program) -> Program:
    """`program` with every call inlined and every loop unrolled: one flat graph per entry,
    paths absolute, no functions; folded, merged and pruned again (layers now share
    computations such as the rotary tables). Returns a new program."""
    out = _rebuilt(program, lambda op: True, unroll=True)
    for g in out.entries.values():
        optimize(g)
        g.name_values()
    return out


SMALL_LAYER_OPS = 4  # a leaf module's method of at most this many ops is inlined


def layer_calls(program: Program) -> Callable[[Op], bool]:
    """The default inlining policy: calls of the methods of layers, the modules that read best
    as the line that uses them: the standard library's (`Linear`, `Embedding`, `RMSNorm`,
    `LayerNorm`) and leaf modules (no state, no submodules) whose method is at most
    SMALL_LAYER_OPS ops and calls nothing (GPT-2's `Conv1D`: `x @ weight + bias`). Their
    parameters are then read, and linear layers fused, where they are used."""

    def pick(op: Op) -> bool:
        callee = op.callee
        cls = program.modules.get(callee.receiver) if callee.receiver is not None else None
        if cls is None:
            return False
        if cls.std:
            return True
        work = [o for o in callee.ops if o.name not in ("param", "state", "const")]
        return (
            not cls.state
            and not cls.children
            and len(work) <= SMALL_LAYER_OPS
            and not any(o.name in ("call", "loop", "composite") for o in work)
        )

    return pick


def _rebuilt(program: Program, inline: Callable[[Op], bool], unroll: bool) -> Program:
    r = Rebuilder(program, inline, unroll)
    entries = {name: r.graph(g) for name, g in program.entries.items()}
    for key in program.functions:
        r.callee(key)
    out = Program(
        program.source,
        program.model,
        program.preset,
        program.dtype,
        program.max_batch,
        program.max_positions,
        params=list(program.params),
        state=list(program.state),
        entries=entries,
        config=program.config,
        functions=dict(r.functions),
        modules={k: c.copy() for k, c in program.modules.items()},
        root=program.root,
        param_transforms=list(program.param_transforms),
        state_layouts=dict(program.state_layouts),
        param_layouts=dict(program.param_layouts),
        takes_part=program.takes_part,
        part_prefix=program.part_prefix,
    )
    drop_unused_functions(out)
    for g in out.graphs():
        g.name_values()
    return out


def _state_hint(path: str) -> str:
    return path.rstrip(".").rsplit(".", 1)[-1]
