"""Document symbols (the outline), workspace symbols and folding ranges, from the items'
syntax trees alone (no checking needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types as T

from linnet.syntax import ast as A
from linnet.syntax.items import Item, Source, make_item, split_items
from linnet.syntax.positions import split_lines

SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".tox", "build", "dist"}
MAX_WORKSPACE_FILES = 2000
MAX_WORKSPACE_SYMBOLS = 1000


@dataclass
class Symbol:
    """An outline entry: name, LSP kind, detail, item-relative spans of the whole definition
    and of its name, and its children."""

    name: str
    kind: T.SymbolKind
    detail: str
    span: A.Span
    name_span: A.Span
    children: list["Symbol"] = field(default_factory=list)


def _member_symbol(m: A.Node) -> Symbol | None:
    if isinstance(m, A.FnDef):
        kind = T.SymbolKind.Method
        detail = "entry fn" if m.entry else "fn"
        return Symbol(m.name.id, kind, detail, m.span, m.name.span)
    if isinstance(m, A.FieldDecl):
        kind = {"param": T.SymbolKind.Field, "submodule": T.SymbolKind.Property, "list": T.SymbolKind.Array}[m.kind]
        return Symbol(m.name.id, kind, m.kind, m.span, m.name.span)
    if isinstance(m, A.StateDecl):
        return Symbol(m.name.id, T.SymbolKind.Variable, "state", m.span, m.name.span)
    return None


def item_symbols(item: Item) -> list[Symbol]:
    """The outline of one item (empty when it did not parse)."""
    ast = item.ast
    if ast is None:
        return []
    if isinstance(ast, A.ModuleDef):
        children = [s for m in A.flat_members(ast.members) if (s := _member_symbol(m)) is not None]
        kind = T.SymbolKind.Class
        return [Symbol(ast.name.id, kind, "model" if ast.is_model else "module", ast.span, ast.name.span, children)]
    if isinstance(ast, A.FnDef):
        return [Symbol(ast.name.id, T.SymbolKind.Function, "fn", ast.span, ast.name.span)]
    if isinstance(ast, A.ConfigDef):
        children = [
            Symbol(f.name.id, T.SymbolKind.Field, "field", f.span, f.name.span)
            for f in ast.fields
            if isinstance(f, A.ConfigField)
        ]
        return [Symbol(ast.name.id, T.SymbolKind.Struct, "config", ast.span, ast.name.span, children)]
    if isinstance(ast, A.PresetDef):
        detail = f"preset of {ast.value.type_name.id}" if ast.value is not None else "preset"
        return [Symbol(ast.name.id, T.SymbolKind.Constant, detail, ast.span, ast.name.span)]
    return []


def flatten(found: list[Symbol], container: str | None = None):
    """(symbol, container name) for symbols and their children, depth first."""
    for s in found:
        yield s, container
        yield from flatten(s.children, s.name)


def workspace_files(roots: list[str]) -> list[Path]:
    """`.linnet` files under the workspace roots, skipping virtual environments and build
    output; at most MAX_WORKSPACE_FILES."""
    found: list[Path] = []
    for root in roots:
        base = Path(root)
        if not base.is_dir():
            continue
        stack = [base]
        while stack and len(found) < MAX_WORKSPACE_FILES:
            d = stack.pop()
            try:
                entries = sorted(d.iterdir())
            except OSError:
                continue
            for e in entries:
                if e.is_dir() and e.name not in SKIP_DIRS and not e.name.startswith("."):
                    stack.append(e)
                elif e.suffix == ".linnet" and e.is_file():
                    found.append(e)
    return found[:MAX_WORKSPACE_FILES]


def file_items(path: str, text: str) -> list[Item]:
    """Parse a file's items (no checking) for workspace symbols."""
    source = Source(path, text)
    return [make_item(source, offset, chunk) for offset, chunk in split_items(text)]


def matches(query: str, name: str) -> bool:
    """Case-insensitive subsequence match, as editors' symbol pickers do."""
    query = query.lower()
    name = name.lower()
    pos = 0
    for ch in query:
        pos = name.find(ch, pos)
        if pos < 0:
            return False
        pos += 1
    return True


def folding_ranges(items: list[Item]) -> list[tuple[int, int, str | None]]:
    """(start line, end line, kind) 0-based: multi-line items and functions, and runs of
    comment lines ("comment")."""
    out: list[tuple[int, int, str | None]] = []
    for item in items:
        if item.ast is not None:
            for node in A.definitions(item.ast):
                if isinstance(node, (A.ModuleDef, A.FnDef, A.ConfigDef, A.PresetDef)):
                    loc = item.resolve(node.span)
                    if loc.end.line > loc.start.line:
                        out.append((loc.start.line - 1, loc.end.line - 1, None))
    if items:
        text = items[0].source.text
        lines = split_lines(text)
        run_start = None
        for i, line in enumerate(lines + [""]):
            if line.lstrip().startswith("#"):
                if run_start is None:
                    run_start = i
            else:
                if run_start is not None and i - 1 > run_start:
                    out.append((run_start, i - 1, "comment"))
                run_start = None
    return sorted(out)
