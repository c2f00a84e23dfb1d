"""Which parameters and state tensors an entry reads, by checkpoint path: what `linnet verify` compares between two
ways of computing the same thing (a parameter read by `step` and never by `forward` is a member dropped from one of
them), and what `linnet generate` asks of a decoder (a `step` that reads state it never writes needs an entry run
before it, an encoder-decoder's `prefill_encoder`)."""

from __future__ import annotations

from .core import Graph, Program, substitute_indices


def tensors_read(program: Program, entry: str, kind: str = "param") -> set[str]:
    """The checkpoint paths of the `kind` tensors ("param" or "state") that entry `entry` reads, itself or through
    the functions, composites and loops it runs (a loop's reads once per item: `layers.0.`, `layers.1.`, ...).
    Raises KeyError for an entry the program lacks."""
    out: set[str] = set()

    def visit(g: Graph, prefix: str, indices: dict[str, str]) -> None:
        for op in g.ops:
            if op.name == kind:
                out.add(prefix + substitute_indices(op.attrs["path"], indices))
            elif op.name == "call" and op.callee is not None:
                receiver = op.attrs.get("receiver")
                inner = prefix + substitute_indices(receiver, indices) if receiver is not None else prefix
                visit(op.callee, inner, {})
            elif op.name == "loop" and op.body is not None:
                for i in range(op.attrs["count"]):
                    visit(op.body, prefix, {**indices, op.attrs["index"]: str(i)})
            elif op.body is not None:  # a composite's decomposition
                visit(op.body, prefix, indices)

    visit(program.entries[entry], "", {})
    return out


def state_needed_first(program: Program, entry: str) -> list[str]:
    """The state paths `entry` reads and never writes (in program order): another entry must write them before it
    runs (an encoder-decoder's cross-attention cache, written by `prefill_encoder`). Raises KeyError for an entry
    the program lacks."""
    read = tensors_read(program, entry, "state")
    written = set(program.state_written(entry))
    return [t.path for t in program.state if t.path in read and t.path not in written]


__all__ = ["tensors_read", "state_needed_first"]
