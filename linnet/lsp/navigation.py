"""Go-to-definition, find references, rename (with prepareRename) and document highlight,
all from the front end's symbol table (`Analysis.symbol_at`, `.references_to`).

Definitions reached through imports live in other files: references and rename take the
analyses of every document that can name the definition (`Target.home`: the file that
defines it, and the files that import that one) and combine what each finds in its own
document. The server gathers those analyses (server.py, `LinnetServer.across`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

import linnet.ops.catalog
from linnet.ops import REGISTRY
from linnet.semantics.diagnostics import SymbolAnchor
from linnet.semantics.members import checkpoint_name_attribute
from linnet.semantics.program import Analysis
from linnet.syntax import ast as A
from linnet.syntax.items import Location
from linnet.syntax.positions import LineIndex

from .lookup import find_definition, place_kind, word_at

OP_DOCS = Path(__file__).resolve().parents[2] / "docs" / "language.md"  # section 9, "Primitive ops"
OP_CATALOG = Path(linnet.ops.catalog.__file__)

KEYWORDS = frozenset(
    "and as config else entry false fn for from if import in let model module none not or preset state true".split()
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # the grammar's NAME: ASCII only


class RenameError(ValueError):
    """A rename that cannot be done; the message says why (shown to the user)."""


@dataclass(frozen=True)
class Target:
    """The definition a request is about.

    anchor: as `Analysis.symbol_at` gives it (definitions in other files name their file).
    home: the file whose importers can name it too; None when only this document can (a
    local, a member's parameter, a definition of the standard library, which every file sees
    without importing).
    """

    anchor: object
    home: str | None


def target_at(analysis: Analysis, offset: int) -> Target | None:
    anchor = analysis.symbol_at(offset)
    if anchor is None:
        return None
    home = anchor.file if isinstance(anchor, SymbolAnchor) and anchor.file else None
    std = analysis.document.std
    if home is not None and std is not None and home in std.paths():
        home = None
    return Target(anchor, home)


def _name_only(analysis: Analysis, loc: Location) -> Location:
    """A location narrowed to the name it starts with: a parameter's definition spans
    `x: [B, D]`, and editors select, highlight and rename the name."""
    source = analysis.source_of(loc.path)
    if source is None:
        return loc
    text = source.text[loc.start.offset : loc.end.offset]
    m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text)
    if m is None or m.end() == len(text):
        return loc
    return replace(loc, end=source.index.position(loc.start.offset + m.end()))


def definition(analysis: Analysis, offset: int) -> Location | None:
    """Where the symbol at `offset` is defined: this file, a file it imports, or a
    standard-library file."""
    loc = analysis.definition_at(offset)
    if loc is not None:
        return _name_only(analysis, loc)
    text = analysis.document.text
    word = word_at(text, offset)
    if word is not None and word[0] in REGISTRY and analysis.symbol_at(offset) is None:
        return op_definition(word[0]) if place_kind(text, offset) == "code" else None
    return None


def op_definition(name: str) -> Location | None:
    """Where a primitive op is defined for a reader: its row in the op table of
    docs/language.md (signature and meaning, generated from the registry entry), else, where
    the docs are not installed, its entry in linnet/ops/catalog.py. The location is the op's
    name there; None if neither file has it."""
    op = REGISTRY[name]
    for path, needle in ((OP_DOCS, f"| `{op.signature()}`"), (OP_CATALOG, f'"{name}"')):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        at = text.find(needle)
        if at >= 0:
            start = text.index(name, at)
            index = LineIndex(text)
            return Location(str(path), index.position(start), index.position(start + len(name)))
    return None


def references_to(analysis: Analysis, anchor, include_declaration: bool) -> list[Location]:
    """Every use of definition `anchor` in the analysis' document (its definition too, when it
    is there and wanted), narrowed to the name."""
    return [_name_only(analysis, loc) for loc in analysis.references_to(anchor, include_declaration)]


def unique(locations: Iterable[Location]) -> list[Location]:
    """Locations each once, in order."""
    out, seen = [], set()
    for loc in locations:
        key = (loc.path, loc.start.offset, loc.end.offset)
        if key not in seen:
            seen.add(key)
            out.append(loc)
    return out


def references(analysis: Analysis, offset: int, include_declaration: bool) -> list[Location]:
    """Every use of the symbol at `offset` in this file, each once, narrowed to the name."""
    target = analysis.symbol_at(offset)
    return unique(references_to(analysis, target, include_declaration)) if target is not None else []


def _names_taken(analysis: Analysis, offset: int) -> set[str]:
    """Names a rename at `offset` must not take: top-level names (the file's, its imports' and
    the standard library's), primitive ops, and every name bound in the item around `offset`
    (parameters, members, `let`s, loop variables, config fields). Conservative: a name bound
    anywhere in the item is refused, so a rename can neither capture nor be captured."""
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
            elif isinstance(node, A.ImportedName):
                taken.add(node.local.id)
    return taken


@dataclass(frozen=True)
class Rename:
    """What a rename at a place changes: the places spelled `old` that name `target` (an
    alias renames only where the alias is spelled, in its own file)."""

    target: Target
    old: str
    alias: bool


def rename_range(analysis: Analysis, offset: int) -> tuple[int, int] | None:
    """prepareRename: the name at `offset` if it can be renamed (a symbol defined in this
    document or a file of the workspace), else None. Raises RenameError for a
    standard-library name."""
    word = word_at(analysis.document.text, offset)
    if word is None or word[0] in KEYWORDS:
        return None
    definition_ = analysis.definition_at(offset)
    if definition_ is None:
        return None
    std = analysis.document.std
    if std is not None and definition_.path in std.paths():
        raise RenameError(f"`{word[0]}` is defined in the standard library ({definition_.path}) and cannot be renamed")
    return word[1], word[2]


def plan_rename(analysis: Analysis, offset: int, new_name: str) -> Rename:
    """Check a rename at `offset` to `new_name` and say what it changes. Raises RenameError
    for an invalid new name or a name that cannot be renamed."""
    if not _IDENTIFIER.match(new_name) or new_name in KEYWORDS:
        raise RenameError(f"`{new_name}` is not a valid name")
    found = rename_range(analysis, offset)
    target = target_at(analysis, offset)
    definition_ = definition(analysis, offset)
    if found is None or target is None or definition_ is None:
        raise RenameError("nothing to rename here")
    old = analysis.document.text[found[0] : found[1]]
    source = analysis.source_of(definition_.path)
    defined = source.text[definition_.start.offset : definition_.end.offset] if source is not None else old
    if defined != old:  # a name an import binds with `as`: rename the alias, here only
        return Rename(Target(target.anchor, None), old, True)
    return Rename(target, old, False)


def rename_edits(analyses: Iterable[Analysis], plan: Rename, new_name: str) -> list[Location]:
    """The places to replace with `new_name`: in each analysis' document, every reference to
    the target spelled as the old name (definition included; an alias an importer gave it is
    kept, and so are its uses). Raises RenameError when `new_name` is already a name at one
    of them."""
    out: list[Location] = []
    for analysis in analyses:
        path = analysis.document.source.path
        text = analysis.document.text
        found = [
            loc
            for loc in references_to(analysis, plan.target.anchor, True)
            if loc.path == path and text[loc.start.offset : loc.end.offset] == plan.old
        ]
        taken = set().union(*(_names_taken(analysis, loc.start.offset) for loc in found))
        if new_name in taken:
            raise RenameError(
                f"`{new_name}` is already a name in {path}: renaming to it would change what the code means"
            )
        out.extend(found)
    return unique(out)


def checkpoint_rename_note(analysis: Analysis, plan: Rename, new_name: str) -> str | None:
    """A warning for a rename of a member whose name is part of its parameters' checkpoint names (a parameter, a
    submodule, a list of submodules, without `@name`): those names change with it (`norm.weight` becomes
    `ln.weight`), so a checkpoint that names them as before no longer loads (L501), and `@weights` finds nothing
    where it did; `@name("norm")` keeps them. None for any other rename."""
    anchor = plan.target.anchor
    if plan.alias or not isinstance(anchor, SymbolAnchor) or len(anchor.path) != 3 or anchor.path[1] != "member":
        return None
    found = find_definition(analysis, anchor)
    node = found.node if found is not None else None
    if not isinstance(node, A.FieldDecl) or checkpoint_name_attribute(node) is not None:
        return None
    return (
        f"renaming `{plan.old}` renames the checkpoint names under it (`{plan.old}.` becomes `{new_name}.` in "
        "each): a checkpoint that names them as before no longer loads; "
        f'consider `@name("{plan.old}")` on the member to keep them'
    )


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
