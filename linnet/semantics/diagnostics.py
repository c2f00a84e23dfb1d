"""Diagnostics: one value, rendered for the terminal, as JSON, as GitHub annotations and (in
the language server) as LSP diagnostics.

The checker produces `Finding`s whose places are anchors: an (item, item-relative span)
pair for places inside the item being checked, or a `SymbolAnchor` naming a definition in
another item (a preset's field, a callee's parameter) that is resolved only when the
diagnostic is shown. That keeps a cached finding correct when the other item is edited and
moves. `Analysis` turns findings into `Diagnostic`s with resolved `Location`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..syntax.ast import Span
from ..syntax.items import Item, Location
from .codes import CODES


# Anchors compare and hash by value (unsafe_hash: what frozen=True gave) but are not frozen: a frozen dataclass's
# __init__ sets each field through object.__setattr__, and a check makes an anchor for every name it resolves (860,000
# SymbolAnchors in the 5 MB document of issue 45). Nothing changes an anchor after it is made.
@dataclass(slots=True, unsafe_hash=True)
class LocalAnchor:
    item: Item
    span: Span


@dataclass(slots=True, unsafe_hash=True)
class SymbolAnchor:
    """A definition named by path: `("Llama", "hidden_size")` is the config field,
    `("smollm2_135m", "rope_scaling", "factor")` a preset's nested field init,
    `("attention", "param", "q")` a function parameter, `("Linear", "member", "weight")`.

    `file` is the path of the file that defines `path[0]` (what `symbol` makes), so that an
    anchor names one definition across files and imports' aliases. An empty `file` means
    "`path[0]` as the analysed file names it" (its own items, its imports, the standard
    library); `Analysis.canonical` turns those into the first kind."""

    path: tuple[str, ...]
    file: str = ""


def symbol(item: Item, *rest: str) -> SymbolAnchor:
    """The anchor of top-level `item`, or of a definition inside it (`symbol(linear, "member",
    "weight")`)."""
    return SymbolAnchor((item.name or "",) + rest, item.source.path)


Anchor = LocalAnchor | SymbolAnchor


@dataclass(slots=True)
class Label:
    anchor: Anchor
    message: str


@dataclass(slots=True)
class Fix:
    """A machine-usable fix: replace each anchor's text with the new text."""

    message: str
    edits: list[tuple[Anchor, str]]


@dataclass(slots=True)
class Finding:
    code: str
    message: str
    anchor: Anchor
    label: str = ""
    labels: list[Label] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    severity: str | None = None  # defaults to the code's severity
    scenarios: tuple[str, ...] | None = None  # filled when merging: None = every config

    def key(self):
        a = self.anchor
        where = (id(a.item), a.span) if isinstance(a, LocalAnchor) else a.path
        return (self.code, where)


# ----------------------------------------------------------------------------- located


@dataclass(slots=True)
class LocatedLabel:
    location: Location
    message: str


@dataclass(slots=True)
class TextEdit:
    location: Location
    new_text: str


@dataclass(slots=True)
class LocatedFix:
    message: str
    edits: tuple[TextEdit, ...]


@dataclass(slots=True)
class Diagnostic:
    """A diagnostic ready to show.

    code: stable code (`L201`), documented in docs/diagnostics.md.
    severity: "error" | "warning".
    message: one line, lowercase, naming both sides.
    location: the primary span; `label` is the text shown under its carets.
    labels: secondary spans with their text (where each shape came from).
    notes: extra lines ("under preset `tinyllama_1_1b`", "consider ...").
    fixes: edits that resolve it (did-you-mean names, a cast).
    presets: the configs it occurs under, or None when it occurs under every one.
    tags: "unnecessary" for unused code (LSP DiagnosticTag.Unnecessary).
    """

    code: str
    severity: str
    message: str
    location: Location
    label: str = ""
    labels: tuple[LocatedLabel, ...] = ()
    notes: tuple[str, ...] = ()
    fixes: tuple[LocatedFix, ...] = ()
    presets: tuple[str, ...] | None = None
    tags: tuple[str, ...] = ()

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def to_json(self) -> dict[str, Any]:
        def loc(where: Location) -> dict[str, Any]:
            return {
                "path": where.path,
                "start": {
                    "line": where.start.line,
                    "column": where.start.column,
                    "offset": where.start.offset,
                    "byte": where.start.byte,
                    "utf16": [where.start.line - 1, where.start.character],
                },
                "end": {
                    "line": where.end.line,
                    "column": where.end.column,
                    "offset": where.end.offset,
                    "byte": where.end.byte,
                    "utf16": [where.end.line - 1, where.end.character],
                },
            }

        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "location": loc(self.location),
            "label": self.label,
            "labels": [{"location": loc(lab.location), "message": lab.message} for lab in self.labels],
            "notes": list(self.notes),
            "fixes": [
                {
                    "message": f.message,
                    "edits": [{"location": loc(e.location), "new_text": e.new_text} for e in f.edits],
                }
                for f in self.fixes
            ],
            "presets": list(self.presets) if self.presets is not None else None,
            "docs": f"docs/diagnostics.md#{self.code.lower()}",
        }


Resolver = Callable[[Anchor], "Location | None"]


def locate(finding: Finding, resolve: Resolver) -> Diagnostic | None:
    """Resolve a finding's anchors. Returns None if its primary place no longer exists."""
    primary = resolve(finding.anchor)
    if primary is None:
        return None
    labels = []
    for label in finding.labels:
        loc = resolve(label.anchor)
        if loc is not None:
            labels.append(LocatedLabel(loc, label.message))
    fixes = []
    for fix in finding.fixes:
        edits = []
        for anchor, text in fix.edits:
            loc = resolve(anchor)
            if loc is not None:
                edits.append(TextEdit(loc, text))
        if edits:
            fixes.append(LocatedFix(fix.message, tuple(edits)))
    info = CODES[finding.code]
    notes = list(finding.notes)
    if finding.scenarios:
        names = ", ".join(f"`{s}`" for s in finding.scenarios)
        notes.insert(
            0,
            f"under {'preset' if len(finding.scenarios) == 1 else 'presets'} {names}"
            if "defaults" not in finding.scenarios
            else f"under {names.replace('`defaults`', 'the config defaults')}",
        )
    return Diagnostic(
        code=finding.code,
        severity=finding.severity or info.severity,
        message=finding.message,
        location=primary,
        label=finding.label,
        labels=tuple(labels),
        notes=tuple(notes),
        fixes=tuple(fixes),
        presets=finding.scenarios,
        tags=("unnecessary",) if finding.code in ("L901", "L903") else (),
    )
