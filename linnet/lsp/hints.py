"""textDocument/inlayHint: shapes after `let` bindings, assignments and call results, with the
selected preset's numbers (`let q: [B, 9, S, 64] = ...`); with `linnet.inlayHints.parameters`,
the parameters each submodule member holds (`layers: [...]  30 × 2.65 M params`) and the root
model's total."""

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
    kind: str  # "binding" | "result" | "parameters"


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
                    if text:  # after the statement: after the parentheses of a parenthesised call too
                        hints.append(Hint(item.offset + node.stmts[-1].span.end, f"-> {text}", "result"))
    return [h for h in hints if start <= h.offset <= end]


def parameter_hints(analysis: Analysis, start: int, end: int, preset: str | None) -> list[Hint]:
    """Parameter counts under the preset (`costs.preset_to_show`) for items overlapping the
    absolute character range [start, end): after each submodule member one instance of its module
    holds (`331.8 K params`; a list of layers `30 × 2.65 M params`), and after the root model's
    name its total. None for a document whose model does not lower (errors)."""
    from linnet.summary import format_count  # the IR loads with the first parameter hints, not at start

    from .costs import costs_of, member_params, module_classes, preset_to_show

    costs = costs_of(analysis, preset_to_show(analysis, preset))
    if costs is None:
        return []
    hints: list[Hint] = []
    for item in analysis.document.items:
        if item.offset > end or item.offset + len(item.text) < start or not isinstance(item.ast, A.ModuleDef):
            continue
        classes = module_classes(costs.program, item.name, item.source.path)
        if item.ast.is_model and item.name == costs.program.model:
            label = f"{format_count(costs.cost.param_count)} params"
            hints.append(Hint(item.offset + item.ast.name.span.end, label, "parameters"))
        for member in A.flat_members(item.ast.members):
            if not isinstance(member, A.FieldDecl) or member.kind not in ("submodule", "list"):
                continue
            held = {member_params(costs, key, member.name.id, per_item=True) for key in classes}
            if len(held) != 1 or None in held:
                continue
            count, n = held.pop()
            label = f"{n} × {format_count(count)} params" if member.kind == "list" else f"{format_count(count)} params"
            hints.append(Hint(item.offset + member.span.end, label, "parameters"))
    return [h for h in hints if start <= h.offset <= end]
