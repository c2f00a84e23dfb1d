"""The Core IR interpreter: runs a graph one op at a time (`mode="interpret"`).

Each op is turned into the statement the code generator would write for it and executed on
its own, with the `equivalent` numerics: this is the reference every other mode is compared
with, and a failing op is reported with its IR text and source position.
"""

from __future__ import annotations

from linnet.ir.core import Graph, format_op

from .codegen import Emitter, add_constant


class InterpretError(RuntimeError):
    """An op failed at run time; the message gives the op's IR text and source position."""


class Interpreter:
    """Runs `graph`: `run(p, *inputs)` with `p` the tensors by checkpoint name (and `const:`
    keys, see `constants`). Returns the entry's output tensor(s)."""

    def __init__(self, graph: Graph, numerics: str = "equivalent"):
        import torch
        import torch.nn.functional as F

        self.graph = graph
        self._globals = {"torch": torch, "F": F}
        e = Emitter(numerics)
        e.dim_names = set(graph.dim_vars)
        e.taken |= e.dim_names
        self.input_names = [e.bind(v) for v in graph.inputs]
        self.constants: dict = {}
        for op in graph.ops:
            if op.name == "const":
                e.names[("const", id(op))] = add_constant(self.constants, op.result.name or "c", op.attrs["value"])
        e.count_uses(graph)
        self.steps = []
        for op in graph.ops:
            lines = e.op_lines(op)
            source = "\n".join(lines)
            code = compile(source, f"<linnet ir: {graph.name}>", "exec")
            self.steps.append((code, op))
        self.outputs = [e.r(v) for v in graph.outputs]

    def run(self, p: dict, *inputs):
        env = dict(self._globals)
        env["p"] = p
        for name, v in zip(self.input_names, inputs):
            env[name] = v
        for name, (i, axis) in self.graph.dim_sources.items():
            env[name] = inputs[i].shape[axis]
        env["device"] = inputs[0].device
        for code, op in self.steps:
            try:
                exec(code, env)
            except Exception as err:
                text = "\n".join(format_op(op))
                raise InterpretError(f"{type(err).__name__}: {err}\n  while running{'  ' + text}") from err
        outs = [env[n] for n in self.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)
