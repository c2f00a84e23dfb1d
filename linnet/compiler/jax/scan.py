"""Which loops over a list of submodules the JAX backend runs as one `lax.scan`, and how their lists are held.

A decoder's `for layer in layers { h = layer.step(h, ...) }` is one `loop` op in the Core IR (`linnet.ir.lower_calls`:
the items are instances of one class under one config, so their parameters have the same shapes and dtypes; a
list whose items receive their index, or a loop whose carried values change type, is unrolled there instead).
Traced as written, JAX traces and XLA compiles the body once per layer (22 times for TinyLlama-1.1B); as a
`lax.scan` over the layers' parameters stacked along a new leading axis, it traces and compiles one layer, which is
what the field does (MaxText's `scan_layers`, Flax's `nn.scan`, KerasHub's JAX models stack their layers so).

A list is *stacked* (`stacked_lists`) when every reference the program makes to its items goes through such a loop:
no item read by index (`layers[0]`, or a loop the lowering unrolled), no loop over it nested in another loop's item,
and no loop over it that runs dropout (the prelude's dropout keys count draws in trace order, which a scan body
traced once would repeat). Its parameters and state are then held under one key per member with `*` for the index
(`model.layers.*.self_attn.k_cache`, [count, ...] of each item's), made once at load (`stacked_key`); every loop over
it is emitted as the prelude's `scan_layers` (`scanned_loops`), which scans when the module holds the list stacked
and runs a plain loop otherwise. Nothing here imports jax: the language server shows the code.
"""

from __future__ import annotations

from linnet.ir.core import LOOP_PLACEHOLDER, Graph, Op, Program
from linnet.ir.passes import runs_random

__all__ = ["STACKED_INDEX", "stacked_lists", "scanned_loops", "stacked_key", "stacked_names", "unstacked"]

STACKED_INDEX = "*"  # the index segment of a stacked member's key: `model.layers.*.mlp.down_proj.weight`


def _visit(program: Program) -> tuple[dict[str, list[Op]], dict[str, int], set[str]]:
    """Walk every entry with absolute receiver prefixes: (loop ops by their list's absolute path, each list's
    count, the list paths referenced otherwise: an item by index, or a loop's list under another loop's item)."""
    loops: dict[str, list[Op]] = {}
    counts: dict[str, int] = {}
    blocked: set[str] = set()
    seen: set[tuple[int, str]] = set()

    def note(path: str) -> None:
        segments = path.split(".")
        for i, seg in enumerate(segments[1:], 1):
            if seg.isdigit():
                blocked.add(".".join(segments[:i]))

    def walk(g: Graph, prefix: str) -> None:
        if (id(g), prefix) in seen:
            return
        seen.add((id(g), prefix))
        for op in g.ops:
            if op.name in ("param", "state"):
                note(prefix + op.attrs["path"])
            elif op.name == "loop":
                path = prefix + op.attrs["list"]
                note(path)
                item = f"{op.attrs['list']}.{op.attrs['index']}."
                if runs_random(op.body) or not all(w.startswith(item) for w in op.writes):
                    blocked.add(path)  # dropout in the body, or state of the enclosing module written there
                loops.setdefault(path, []).append(op)
                counts[path] = op.attrs["count"]
                walk(op.body, prefix)
            elif op.name == "call" and op.callee is not None:
                receiver = op.attrs.get("receiver")
                if receiver is not None:
                    note(prefix + receiver.rstrip("."))
                walk(op.callee, prefix if receiver is None else prefix + receiver)
            elif op.body is not None:
                walk(op.body, prefix)

    for g in program.entries.values():
        walk(g, "")
    return loops, counts, blocked


def stacked_lists(program: Program) -> dict[str, int]:
    """The lists of submodules held stacked (the module docstring), by absolute path (`model.layers`), with their
    item counts; only lists of at least two items."""
    loops, counts, blocked = _visit(program)
    return {
        path: counts[path]
        for path in loops
        if path not in blocked and not LOOP_PLACEHOLDER.search(path) and counts[path] >= 2
    }


def scanned_loops(program: Program) -> set[int]:
    """The ids of the `loop` ops over a stacked list (`stacked_lists`), which the JAX code runs as `scan_layers`."""
    loops, _, _ = _visit(program)
    lists = stacked_lists(program)
    return {id(op) for path in lists for op in loops[path]}


def stacked_key(path: str, lists: dict[str, int]) -> tuple[str, int] | None:
    """The key holding `path` (a parameter or state path, or a fused key) stacked, and its index along the leading
    axis: (`model.layers.*.mlp.down_proj.weight`, 3) for `model.layers.3.mlp.down_proj.weight`; None when `path` is
    no item's of a stacked list (`lists`, `stacked_lists`)."""
    for head in lists:
        if path.startswith(head + "."):
            index, _, rest = path[len(head) + 1 :].partition(".")
            if index.isdigit() and rest:
                return f"{head}.{STACKED_INDEX}.{rest}", int(index)
    return None


def stacked_names(key: str, count: int) -> list[str]:
    """The per-item paths a stacked key holds, in index order (`stacked_key` reversed)."""
    head, _, rest = key.partition(f".{STACKED_INDEX}.")
    return [f"{head}.{i}.{rest}" for i in range(count)]


def unstacked(arrays: dict, keep: set[str] | dict | None = None) -> dict:
    """`arrays` with each stacked key (`list.*.member` [items, ...]) not in `keep` replaced by its items' arrays
    (`list.0.member`, ...), in order; the other keys as they are."""
    out = {}
    for key, a in arrays.items():
        if f".{STACKED_INDEX}." in key and (keep is None or key not in keep):
            out.update(zip(stacked_names(key, len(a)), a))
        else:
            out[key] = a
    return out
