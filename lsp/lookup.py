"""What is at a place in a document: the word under the cursor, the definition a symbol
names, the header text and doc comment of a definition. Shared by hover, completion and
signature help."""

from __future__ import annotations

import re
from dataclasses import dataclass

from linnet.semantics.diagnostics import LocalAnchor, SymbolAnchor
from linnet.semantics.program import Analysis, find_symbol
from linnet.syntax import ast as A
from linnet.syntax.items import Item
from linnet.syntax.positions import split_lines

_WORD = re.compile(r"[A-Za-z_]\w*")

DEFINITIONS = (A.FnDef, A.ModuleDef, A.ConfigDef, A.PresetDef, A.ConfigField, A.FieldDecl, A.StateDecl, A.Param)


def word_at(text: str, offset: int) -> tuple[str, int, int] | None:
    """The identifier touching `offset` (character offset), with its start and end."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    m = _WORD.match(text, start)
    if m is None or m.end() < offset:
        return None
    return m.group(), m.start(), m.end()


@dataclass
class Definition:
    """A definition found from an anchor: the item, the node (None for locals) and the span of
    its name (item-relative)."""

    item: Item
    node: A.Node | None
    name_span: A.Span


def find_definition(analysis: Analysis, target) -> Definition | None:
    """The definition an anchor (from `Analysis.symbol_at`) names."""
    if isinstance(target, LocalAnchor):
        node = _definition_node(target.item, target.span)
        return Definition(target.item, node, target.span)
    if isinstance(target, SymbolAnchor) and analysis.globals is not None:
        found = find_symbol(target, analysis.globals, analysis.document.workspace)
        if found is None:
            return None
        item, span = found
        return Definition(item, _definition_node(item, span), span)
    return None


def _definition_node(item: Item, span: A.Span) -> A.Node | None:
    if item.ast is None:
        return None
    for node in reversed(A.node_at(item.ast, span.start)):
        if isinstance(node, DEFINITIONS):
            name = node.name
            if name.span == span or node.span == span:
                return node
    return None


def header(item: Item, node: A.Node) -> str:
    """A definition as its signature: a function or module up to its `{`, a field or
    parameter whole; whitespace collapsed."""
    text = item.text[node.span.start : node.span.end]
    if isinstance(node, A.FnDef):
        text = item.text[node.span.start : node.body.span.start]
    elif isinstance(node, (A.ModuleDef, A.ConfigDef)):
        brace = text.find("{")
        text = text[:brace] if brace >= 0 else text
    elif isinstance(node, A.PresetDef):
        brace = text.find("{")
        text = text[:brace] if brace >= 0 else text
    lines = [ln for ln in split_lines(text) if not ln.lstrip().startswith(("#", "@"))]
    return " ".join(" ".join(lines).split()).rstrip(" ,")


def doc_of(node: A.Node | None) -> str | None:
    return getattr(node, "doc", None) if node is not None else None
