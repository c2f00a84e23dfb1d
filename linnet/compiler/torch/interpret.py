"""The Core IR interpreter: runs a flattened graph one op at a time (`mode="interpret"`).

The program is flattened first (every call inlined, every loop unrolled: `codegen.flat_program`),
and each op is turned into the statement the code generator would write for it, reading
parameters and state from a dict by checkpoint name, and executed on its own, with the
`equivalent` numerics: this is the reference every other mode is compared with, and a failing
op is reported with its IR text and source position.
"""

from __future__ import annotations

from linnet.ir.core import Graph, format_op
from linnet.ir.render import assigned_state

from .codegen import Emitter


class InterpretError(RuntimeError):
    """An op failed at run time; the message gives the op's IR text and source position."""


class Interpreter:
    """Runs `graph` (a flat entry): `run(p, *inputs)` with `p` the tensors by checkpoint name.
    Returns the entry's output tensor(s)."""

    def __init__(self, graph: Graph, numerics: str = "equivalent"):
        import torch
        import torch.nn.functional as F

        from .prelude import attended_keys, cache_rows

        self.graph = graph
        # attention statements call them
        self._globals = {"torch": torch, "F": F, "attended_keys": attended_keys, "cache_rows": cache_rows}
        e = Emitter(numerics, member_style="dict")
        e.dim_names = set(graph.dim_vars)
        e.taken |= e.dim_names | {"p", "training"}
        self.input_names = [e.bind(v) for v in graph.inputs]
        e.count_uses(graph)
        e.graph = graph
        self.steps = []
        stored = assigned_state(graph)
        for op in graph.ops:
            lines = e.op_lines(op) + [e.store_state(path, r) for r in op.results for path in stored.get(id(r), ())]
            if not lines:  # a parameter or state read: rendered where it is used
                continue
            code = compile("\n".join(lines), f"<linnet ir: {graph.name}>", "exec")
            self.steps.append((code, op))
        self.outputs = [e.r(v) for v in graph.outputs]

    def run(self, p: dict, *inputs, training: bool = False):
        """`training` switches dropout on (the module's `training` flag)."""
        env = dict(self._globals)
        env["p"] = p
        env["training"] = training
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
        outs = [eval(n, env) for n in self.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)
