"""textDocument/inlayHint: shapes after `let` bindings, assignments and call results, with the
selected preset's numbers (`let q: [B, 9, S, 64] = ...`)."""

from __future__ import annotations

from dataclasses import dataclass

from linnet.semantics.program import Analysis
from linnet.syntax import ast as A
from linnet.types.core import TensorT, TupleT, Type, format_type


@dataclass
class Hint:
    """A hint: absolute character offset it sits at, its label, and whether it follows a name
    (`: type`) or a call result (`-> type`)."""

    offset: int
    label: str
    kind: str  # "binding" | "result"


def _shown(t: Type | None) -> bool:
    if isinstance(t, TensorT):
        return True
    return isinstance(t, TupleT) and all(isinstance(x, TensorT) for x in t.items)


def _cap(text: str, max_length: int) -> str:
    return text if len(text) <= max_length else text[: max(1, max_length - 1)] + "…"


def inlay_hints(analysis: Analysis, start: int, end: int, preset: str | None, max_length: int) -> list[Hint]:
    """Hints for items overlapping the absolute character range [start, end)."""
    hints: list[Hint] = []
    for item in analysis.document.items:
        if item.offset > end or item.offset + len(item.text) < start or item.ast is None:
            continue
        results = analysis.results_for(item, preset)
        if not results:
            continue
        types = results[0][1].types

        def label(node: A.Node, types=types) -> str | None:
            t = types.get(node)
            return _cap(format_type(t, concrete=True), max_length) if _shown(t) else None

        for node in A.walk(item.ast):
            if isinstance(node, A.Let) and node.annotation is None:
                for target in node.targets:
                    text = label(target)
                    if text:
                        hints.append(Hint(item.offset + target.span.end, f": {text}", "binding"))
            elif isinstance(node, A.Assign):
                text = label(node.target)
                if text:
                    hints.append(Hint(item.offset + node.target.span.end, f": {text}", "binding"))
            elif isinstance(node, A.Block) and node.stmts and isinstance(node.stmts[-1], A.ExprStmt):
                tail = node.stmts[-1].expr
                if isinstance(tail, A.Call):
                    text = label(tail)
                    if text:
                        hints.append(Hint(item.offset + tail.span.end, f"-> {text}", "result"))
    return [h for h in hints if start <= h.offset <= end]
