"""The Core IR verifier: what every backend may rely on."""

from __future__ import annotations

from ..ops import REGISTRY
from ..types.core import WORK
from .core import Graph, Program

STRUCTURAL = ("param", "state", "const", "composite")


class VerifyError(Exception):
    """The graph breaks an IR invariant (a lowering or pass bug); the message names the op."""


def verify(g: Graph, program: Program | None = None) -> None:
    """Check SSA form (each value defined once, before use), known ops with their required
    arguments, concrete dtypes, params and state that exist in the program, and that a state
    tensor's old value is not read after it was overwritten (so backends may update in place).
    Raises VerifyError."""
    defined: set[int] = {id(v) for v in g.inputs}
    state_current: dict[str, int] = {}  # path -> id of the state's newest value
    state_reads: dict[int, str] = {}
    params = {p.path: p for p in program.params} if program is not None else None
    state = {s.path: s for s in program.state} if program is not None else None
    for i, op in enumerate(g.ops):
        where = f"{g.name}: op {i} ({op.name} -> %{op.results[0].name if op.results else '?'})"
        if op.name not in STRUCTURAL and op.name not in REGISTRY:
            raise VerifyError(f"{where}: unknown op")
        if op.name in REGISTRY:
            for p in REGISTRY[op.name].params:
                if p.name not in op.args:
                    raise VerifyError(f"{where}: missing argument `{p.name}`")
        for v in op.inputs():
            if id(v) not in defined:
                raise VerifyError(f"{where}: uses %{v.name} before it is defined")
            path = state_reads.get(id(v))
            if path is not None and state_current[path] != id(v):
                raise VerifyError(f"{where}: reads the old value of state `{path}` after it was written")
        for r in op.results:
            if id(r) in defined:
                raise VerifyError(f"{where}: %{r.name} is defined twice")
            if r.dtype is WORK or r.dtype.var:
                raise VerifyError(f"{where}: %{r.name} has no concrete dtype")
            defined.add(id(r))
        if op.name == "param" and params is not None and op.attrs["path"] not in params:
            raise VerifyError(f"{where}: unknown parameter `{op.attrs['path']}`")
        if op.name == "state":
            if state is not None and op.attrs["path"] not in state:
                raise VerifyError(f"{where}: unknown state `{op.attrs['path']}`")
            state_reads[id(op.result)] = op.attrs["path"]
            state_current[op.attrs["path"]] = id(op.result)
        if op.name == "cache_write":
            cache = op.args["cache"]
            path = state_reads.get(id(cache))
            if path is not None:
                state_reads[id(op.result)] = path
                state_current[path] = id(op.result)
        if op.body is not None:
            verify(op.body, None)
    for v in list(g.outputs) + list(g.state_updates.values()):
        if id(v) not in defined:
            raise VerifyError(f"{g.name}: output %{v.name} is not defined")
