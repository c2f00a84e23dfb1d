"""Go-to-definition, find references, rename (with prepareRename) and document highlight,
all from the front end's symbol table (`Analysis.symbol_at`, `.references`)."""

from __future__ import annotations

import re
from dataclasses import replace

from linnet.ops import REGISTRY
from linnet.semantics.program import Analysis
from linnet.syntax import ast as A
from linnet.syntax.items import Location

from .lookup import word_at

KEYWORDS = frozenset("and config else entry false fn for if in let model module none not or preset state true".split())
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # the grammar's NAME: ASCII only


class RenameError(ValueError):
    """A rename that cannot be done; the message says why (shown to the user)."""


def _name_only(analysis: Analysis, loc: Location) -> Location:
    """A location narrowed to the name it starts with: a parameter's definition spans
    `x: [B, D]`, and editors select, highlight and rename the name."""
    if loc.path != analysis.document.source.path:
        return loc
    text = analysis.document.text[loc.start.offset : loc.end.offset]
    m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text)
    if m is None or m.end() == len(text):
        return loc
    index = analysis.document.source.index
    return replace(loc, end=index.position(loc.start.offset + m.end()))


def definition(analysis: Analysis, offset: int) -> Location | None:
    """Where the symbol at `offset` is defined: this file, or a standard-library file."""
    loc = analysis.definition_at(offset)
    return _name_only(analysis, loc) if loc is not None else None


def references(analysis: Analysis, offset: int, include_declaration: bool) -> list[Location]:
    """Every use of the symbol at `offset` in this file, each once, narrowed to the name."""
    out, seen = [], set()
    for loc in analysis.references(offset, include_declaration):
        loc = _name_only(analysis, loc)
        key = (loc.path, loc.start.offset, loc.end.offset)
        if key not in seen:
            seen.add(key)
            out.append(loc)
    return out


def _names_taken(analysis: Analysis, offset: int) -> set[str]:
    """Names a rename at `offset` must not take: top-level items (the file's and the standard
    library's), primitive ops, and every name bound in the item around `offset` (parameters,
    members, `let`s, loop variables, config fields). Conservative: a name bound anywhere in
    the item is refused, so a rename can neither capture nor be captured."""
    taken = set(REGISTRY)
    if analysis.globals is not None:
        taken |= set(analysis.globals.names())
    item = analysis.item_at(offset)
    if item is not None and item.ast is not None:
        for node in A.walk(item.ast):
            if isinstance(node, (A.Param, A.FieldDecl, A.StateDecl, A.ConfigField, A.FnDef, A.Generic)):
                taken.add(node.name.id)
            elif isinstance(node, A.Let):
                taken.update(t.id for t in node.targets)
            elif isinstance(node, A.For):
                taken.add(node.var.id)
    return taken


def rename_range(analysis: Analysis, offset: int) -> tuple[int, int] | None:
    """prepareRename: the name at `offset` if it can be renamed (a symbol defined in this
    document), else None. Raises RenameError for a standard-library name."""
    word = word_at(analysis.document.text, offset)
    if word is None or word[0] in KEYWORDS:
        return None
    definition_ = analysis.definition_at(offset)
    if definition_ is None:
        return None
    if definition_.path != analysis.document.source.path:
        raise RenameError(f"`{word[0]}` is defined in the standard library ({definition_.path}) and cannot be renamed")
    return word[1], word[2]


def rename_edits(analysis: Analysis, offset: int, new_name: str) -> list[Location]:
    """The places to replace with `new_name`: every reference in this document, definition
    included. Raises RenameError for an invalid new name or a name that cannot be renamed."""
    if not _IDENTIFIER.match(new_name) or new_name in KEYWORDS:
        raise RenameError(f"`{new_name}` is not a valid name")
    if rename_range(analysis, offset) is None:
        raise RenameError("nothing to rename here")
    definition_ = definition(analysis, offset)
    # the names around the definition and around every use
    places = [offset] + ([definition_.start.offset] if definition_ is not None else [])
    path = analysis.document.source.path
    found = [loc for loc in references(analysis, offset, True) if loc.path == path]
    taken = set().union(*(_names_taken(analysis, p) for p in places + [loc.start.offset for loc in found]))
    if new_name in taken:
        raise RenameError(f"`{new_name}` is already a name here: renaming to it would change what the code means")
    return found


def highlights(analysis: Analysis, offset: int) -> list[tuple[Location, bool]]:
    """document/highlight: (location, is_definition) of the symbol at `offset` in this file."""
    path = analysis.document.source.path
    definition_ = definition(analysis, offset)
    out = []
    for loc in references(analysis, offset, True):
        if loc.path == path:
            is_def = definition_ is not None and loc.start.offset == definition_.start.offset and loc.path == path
            out.append((loc, is_def))
    return out
