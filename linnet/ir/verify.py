"""The Core IR verifier: what every backend may rely on."""

from __future__ import annotations

import re

from ..ops import REGISTRY
from ..types.core import WORK, TensorT
from .core import Graph, Program

STRUCTURAL = ("param", "state", "const", "composite", "call", "loop")


class VerifyError(Exception):
    """The graph breaks an IR invariant; the message names the op, `op` is the op at fault.
    Most are lowering or pass bugs; one is the source's: a state value used after the state
    was written (`stale_state` names its path), which `build` reports at the op's position."""

    def __init__(self, message: str, op=None, stale_state: str | None = None):
        super().__init__(message)
        self.op = op
        self.stale_state = stale_state


def verify_program(program: Program) -> None:
    """`verify` every entry and function of `program`. Raises VerifyError."""
    for g in program.graphs():
        verify(g, program)


def verify(g: Graph, program: Program | None = None) -> None:
    """Check SSA form (each value defined once, before use), known ops with their required
    arguments, concrete dtypes, params and state that exist (in the program for an entry, in
    the receiver's module class for a method), calls whose arguments and results match their
    callee, and that a state tensor's old value is not read after it was overwritten (so
    backends may update it in place). Raises VerifyError."""
    _verify(g, program, g.receiver if g.kind != "composite" else None, set())


def _verify(g: Graph, program: Program | None, receiver: str | None, outer: set[int]) -> None:
    defined: set[int] = {id(v) for v in g.inputs}
    state_current: dict[str, int] = {}  # path -> id of the state's newest value
    state_reads: dict[int, str] = {}
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
                raise VerifyError(f"{where}: reads the old value of state `{path}` after it was written", op, path)
        for r in op.results:
            if id(r) in defined:
                raise VerifyError(f"{where}: %{r.name} is defined twice")
            if r.dtype is WORK or r.dtype.var:
                raise VerifyError(f"{where}: %{r.name} has no concrete dtype")
            defined.add(id(r))
        if op.name in ("param", "state") and program is not None and receiver is not None:
            t = member_type(program, receiver, op.attrs["path"], op.name)
            if t is None:
                raise VerifyError(f"{where}: unknown {op.name} `{op.attrs['path']}`")
        if op.name == "state":
            state_reads[id(op.result)] = op.attrs["path"]
            state_current[op.attrs["path"]] = id(op.result)
        if op.name == "cache_write":
            path = state_reads.get(id(op.args["cache"]))
            if path is not None:
                state_reads[id(op.result)] = path
                state_current[path] = id(op.result)
        if op.writes:  # a call or loop writes these paths: values read before are old now
            for pattern in [_path_pattern(w) for w in op.writes]:
                for path in state_current:
                    if pattern.fullmatch(path):
                        state_current[path] = -1
        if op.name == "call":
            _verify_call(op, program, where)
            for path, r in zip(op.attrs.get("updates", []), op.results[len(op.results) - len(op.attrs["updates"]) :]):
                state_reads[id(r)] = path
                state_current[path] = id(r)
        if op.name == "loop":
            body = op.body
            n = len(op.args["carried"])
            if len(body.inputs) != n + len(op.args["captured"]) or len(body.outputs) != n or len(op.results) != n:
                raise VerifyError(f"{where}: the loop's carried and captured values do not match its body")
            _verify(body, program, receiver, outer | defined)
        elif op.body is not None:
            _verify(op.body, None, None, set())
    for v in list(g.outputs) + list(g.state_updates.values()):
        if id(v) not in defined:
            raise VerifyError(f"{g.name}: output %{v.name} is not defined")
        path = state_reads.get(id(v))
        if path is not None and state_current[path] != id(v):
            raise VerifyError(
                f"{g.name}: returns the old value of state `{path}` after it was written", v.producer, path
            )


def _path_pattern(path: str) -> re.Pattern:
    """A written path as a pattern: a loop's `{iN}` stands for any index of the list."""
    return re.compile(re.sub(r"\\\{i\d+\\\}", r"(\\d+|\\{i\\d+\\})", re.escape(path)))


def _verify_call(op, program: Program | None, where: str) -> None:
    callee = op.callee
    if callee is None:
        raise VerifyError(f"{where}: a call without its callee")
    if program is not None and program.functions.get(op.attrs["fn"]) is not callee:
        raise VerifyError(f"{where}: calls `{op.attrs['fn']}`, which is not a function of the program")
    args = op.inputs()
    if len(args) != len(callee.inputs) or any(not _same(a.type, b.type) for a, b in zip(args, callee.inputs)):
        raise VerifyError(f"{where}: its arguments do not match the inputs of `{callee.name}`")
    want = [o.type for o in callee.outputs] + [v.type for v in callee.state_updates.values()]
    if len(want) != len(op.results) or any(not _same(a, r.type) for a, r in zip(want, op.results)):
        raise VerifyError(f"{where}: its results do not match the outputs of `{callee.name}`")


def _same(a: TensorT, b: TensorT) -> bool:
    return a.dtype == b.dtype and [d.key() for d in a.shape.dims] == [d.key() for d in b.shape.dims]


_INDEX = re.compile(r"^(\d+|\{i\d+\})$")


def member_type(program: Program, receiver: str, path: str, kind: str = "param") -> TensorT | None:
    """The type of the parameter (or state) `path` relative to an instance of module class
    `receiver`, through its children (`self_attn.q_proj.weight`, `layers.{i0}.mlp...`); None
    when the class has no such member. A name that `param_transforms` makes (a fused weight)
    is found by its name in the class it belongs to."""
    cls = program.modules.get(receiver)
    parts = path.split(".")
    while cls is not None:
        table = cls.params if kind == "param" else cls.state
        rest = ".".join(parts)
        if rest in table:
            return table[rest]
        # children by checkpoint name, which `@name` may make dotted (`"layer.0"`): the longest that starts the path
        by_path = {cls.checkpoint_names.get(name, name): name for name in cls.children}
        n = next((n for n in range(len(parts) - 1, 0, -1) if ".".join(parts[:n]) in by_path), 0)
        if not n:
            return None
        key, count = cls.children[by_path[".".join(parts[:n])]]
        parts = parts[n:]
        if count is not None:
            if not parts or not _INDEX.match(parts[0]):
                return None
            parts = parts[1:]
        cls = program.modules.get(key)
    return None
