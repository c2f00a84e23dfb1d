"""textDocument/semanticTokens/full: what each name is, from the symbol table rather than
from its spelling (the TextMate grammar colours keywords, literals and comments; this says
which names are modules, configs, parameters, locals, members, dims, dtypes and ops)."""

from __future__ import annotations

from linnet.ops import REGISTRY
from linnet.semantics.diagnostics import LocalAnchor, SymbolAnchor
from linnet.semantics.program import Analysis
from linnet.syntax import ast as A
from linnet.syntax.items import Item
from linnet.types.core import DTYPES

from .convert import lsp_position

TOKEN_TYPES = [
    "class",  # modules
    "struct",  # configs
    "function",  # functions and primitive ops
    "method",  # module methods
    "parameter",
    "variable",  # lets, loop variables, presets
    "property",  # config fields, module members
    "type",  # dtypes
    "typeParameter",  # dims, generic dtypes
]
TOKEN_MODIFIERS = ["declaration", "readonly", "defaultLibrary"]
_TYPE = {name: i for i, name in enumerate(TOKEN_TYPES)}
_DECLARATION, _READONLY, _LIBRARY = 1, 2, 4

_ITEM_KIND = {"module": "class", "config": "struct", "fn": "function", "preset": "variable"}


def _declarations(item: Item) -> dict[A.Span, tuple[str, int]]:
    """Name spans that declare something, with their token type and modifiers."""
    out: dict[A.Span, tuple[str, int]] = {}
    ast = item.ast
    if ast is None or isinstance(ast, A.ImportDef):
        return out
    kind = _ITEM_KIND.get(item.kind or "", "variable")
    out[ast.name.span] = (kind, _DECLARATION | (_READONLY if item.kind == "preset" else 0))
    for node in A.walk(ast):
        if isinstance(node, A.Param):
            out[node.name.span] = ("parameter", _DECLARATION)
        elif isinstance(node, A.Generic):
            out[node.name.span] = ("typeParameter", _DECLARATION)
        elif isinstance(node, A.Let):
            for t in node.targets:
                out[t.span] = ("variable", _DECLARATION)
        elif isinstance(node, A.For):
            out[node.var.span] = ("variable", _DECLARATION)
        elif isinstance(node, A.FnDef) and node is not ast:
            out[node.name.span] = ("method", _DECLARATION)
        elif isinstance(node, (A.FieldDecl, A.StateDecl, A.ConfigField)):
            out[node.name.span] = ("property", _DECLARATION)
    return out


def _kind_of_target(
    target, analysis: Analysis, params: set[A.Span], dims: set[A.Span], span: A.Span, item: Item
) -> tuple[str, int] | None:
    if isinstance(target, LocalAnchor):
        if span in dims:
            return "typeParameter", 0
        return ("parameter", 0) if target.item is item and target.span in params else ("variable", 0)
    if not isinstance(target, SymbolAnchor):
        return None
    path = target.path
    if len(path) == 1:
        found = analysis.globals.anchor_item(target) if analysis.globals is not None else None
        if found is None:
            return None
        mods = _LIBRARY if found.is_std else 0
        return _ITEM_KIND.get(found.kind or "", "variable"), mods
    if len(path) >= 3 and path[1] == "fn":
        return "method", 0
    if len(path) >= 3 and path[1] == "param":
        return "parameter", 0
    return "property", 0


def semantic_tokens(analysis: Analysis) -> list[int]:
    """The LSP relative encoding (deltaLine, deltaStart, length, type, modifiers) of every
    classified name, in document order."""
    found: list[tuple[int, int, int, int, int]] = []  # (line0, char, length, type, mods)
    for item in analysis.document.items:
        if item.ast is None:
            continue
        declared = _declarations(item)
        params = {s for s, (k, _) in declared.items() if k == "parameter"}
        refs = {}
        for span, target in analysis.refs_of(item):
            refs.setdefault(span, target)
        classified: dict[A.Span, tuple[str, int]] = dict(declared)
        dims = {  # capitalised names in a tensor type's dims: dim variables (`B`, `S`)
            sub.span
            for node in A.walk(item.ast)
            if isinstance(node, A.TensorType)
            for d in node.dims
            for sub in A.walk(d)
            if isinstance(sub, A.Name) and sub.id[:1].isupper()
        }
        for span, target in refs.items():
            if span in classified:
                continue
            kind = _kind_of_target(target, analysis, params, dims, span, item)
            if kind is not None:
                classified[span] = kind
        for node in A.walk(item.ast):
            if isinstance(node, A.TensorType) and node.dtype is not None:
                classified.setdefault(node.dtype.span, ("type", _LIBRARY))
            elif isinstance(node, A.Name) and node.span not in classified:
                if node.id in DTYPES:
                    classified[node.span] = ("type", _LIBRARY)
                elif node.id in REGISTRY:
                    classified[node.span] = ("function", _LIBRARY)
        for span in dims:
            classified.setdefault(span, ("typeParameter", 0))
        for span, (kind, mods) in classified.items():
            if span.end <= span.start:
                continue
            loc = item.resolve(span)
            if loc.start.line != loc.end.line:
                continue
            start, end = lsp_position(loc.start), lsp_position(loc.end)
            found.append((start.line, start.character, end.character - start.character, _TYPE[kind], mods))
    found.sort()
    data: list[int] = []
    prev_line = prev_char = 0
    last = None
    for line, char, length, kind, mods in found:
        if last is not None and (line, char) == last:
            continue  # one token per place
        last = (line, char)
        delta_line = line - prev_line
        delta_char = char - prev_char if delta_line == 0 else char
        data.extend((delta_line, delta_char, length, kind, mods))
        prev_line, prev_char = line, char
    return data
