"""Go-to-definition, find references, rename (with prepareRename) and document highlight,
all from the front end's symbol table (`Analysis.symbol_at`, `.references`)."""

from __future__ import annotations

import re

from linnet.semantics.program import Analysis
from linnet.syntax.items import Location

from .lookup import word_at

KEYWORDS = frozenset("and config else entry false fn for if in let model module none not or preset state true".split())
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*\Z")


class RenameError(ValueError):
    """A rename that cannot be done; the message says why (shown to the user)."""


def definition(analysis: Analysis, offset: int) -> Location | None:
    """Where the symbol at `offset` is defined: this file, or a standard-library file."""
    return analysis.definition_at(offset)


def references(analysis: Analysis, offset: int, include_declaration: bool) -> list[Location]:
    return analysis.references(offset, include_declaration)


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
    path = analysis.document.source.path
    return [loc for loc in analysis.references(offset, True) if loc.path == path]


def highlights(analysis: Analysis, offset: int) -> list[tuple[Location, bool]]:
    """document/highlight: (location, is_definition) of the symbol at `offset` in this file."""
    path = analysis.document.source.path
    definition_ = analysis.definition_at(offset)
    out = []
    for loc in analysis.references(offset, True):
        if loc.path == path:
            is_def = definition_ is not None and loc.start.offset == definition_.start.offset and loc.path == path
            out.append((loc, is_def))
    return out
