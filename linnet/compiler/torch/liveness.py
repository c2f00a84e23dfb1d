"""Free each intermediate tensor of a generated function after its last use (`del`).

The generated code names every value once, so without this every intermediate of a function
lives until the function returns: the peak is the sum of all of them, where eager PyTorch code
written by hand (diffusers' VAE decoder, a torchvision ResNet) holds only the few a statement
reads. `release_dead_values` reads a function's text (Python's `ast`) and inserts, after each
statement of the function body, `del` for the tensors that statement reads last.

Only names that are safe to delete are: tensors the emitter bound (`tensors`, not dims nor
`device`), assigned by a statement of the function body itself (so bound on every path, not
only in one branch of an `if`), not the function's parameters (the caller holds those), read
after that first assignment, and last read before the statement that precedes the `return`
(returning frees the rest as soon). A name read inside a `for` loop of the body is deleted
after the loop.
"""

from __future__ import annotations

import ast
import textwrap


def release_dead_values(lines: list[str], tensors: set[str]) -> list[str]:
    """`lines` (one `def`, possibly indented as a method) with a `del` line after each body
    statement that reads some of `tensors` for the last time. Returns new lines."""
    source = textwrap.dedent("\n".join(lines))
    # a lone surrogate (a non-UTF-8 path quoted in a comment) cannot be parsed; `?` keeps every position
    fn = ast.parse(source.encode("utf-8", "replace").decode("utf-8")).body[0]
    if not isinstance(fn, ast.FunctionDef):
        return lines
    params = {a.arg for a in fn.args.args}
    first_assigned: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for i, stmt in enumerate(fn.body):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                last_read[node.id] = i
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                        first_assigned.setdefault(node.id, i)
    # the statement before the `return`: returning frees them as soon
    ends = len(fn.body) - 2 if isinstance(fn.body[-1], ast.Return) else len(fn.body) - 1
    dying: dict[int, list[str]] = {}
    for name, i in last_read.items():
        if name in tensors and name not in params and first_assigned.get(name, i) < i < ends:
            dying.setdefault(i, []).append(name)
    out = list(lines)
    indent = len(lines[0]) - len(lines[0].lstrip())
    for i in sorted(dying, reverse=True):
        stmt = fn.body[i]
        names = sorted(dying[i], key=lambda n: first_assigned[n])
        out.insert(stmt.end_lineno, " " * (indent + stmt.col_offset) + f"del {', '.join(names)}")
    return out
