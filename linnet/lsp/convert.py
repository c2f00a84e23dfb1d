"""Between Linnet's values and LSP's: URIs and paths, positions and ranges, diagnostics.

Linnet keeps character offsets; LSP speaks 0-based lines and columns in the position encoding
negotiated at `initialize` (LSP 3.17 `general.positionEncodings`: the client's first choice
among utf-8, utf-16 and utf-32, else utf-16; pygls's `choose_position_encoding` picks it).
`Location`s carry every column unit (`linnet.syntax.positions.Position.units`), so converting a
span needs no text; converting an LSP position needs the document's `LineIndex`. pygls's
`PositionCodec` is not used for the conversions: it works on a list of lines the caller splits,
counts units one character at a time in Python, and moves a column past the line's end to the
last character, where LSP 3.17 says the line's end.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lsprotocol import types as T
from pygls import uris

from linnet.semantics.diagnostics import Diagnostic
from linnet.syntax.items import Location
from linnet.syntax.positions import ENCODINGS, LineIndex, Position

DOCS_DIAGNOSTICS = Path(__file__).resolve().parents[2] / "docs" / "diagnostics.md"


def path_of(uri: str) -> str:
    """The filesystem path of a `file:` URI; other URIs (`untitled:`) stand for themselves."""
    if uri.startswith("file:"):
        return uris.to_fs_path(uri) or uri
    return uri


def uri_of(path: str) -> str:
    """The URI of a path produced by `path_of` (or of a standard-library file)."""
    if "://" in path or path.startswith("untitled:"):
        return path
    return uris.from_fs_path(path) or path


# The column unit of every position in and out. It is negotiated once per connection, and a
# server process serves one connection (`linnet lsp` on stdio), so it is process-wide rather
# than threaded through every feature.
_encoding = "utf-16"


def position_encoding() -> str:
    """The position encoding in use ("utf-8", "utf-16" or "utf-32")."""
    return _encoding


def set_position_encoding(encoding: str) -> str:
    """Use `encoding` ("utf-8", "utf-16" or "utf-32"; anything else is utf-16, the LSP
    default) for every position from now on; returns the encoding in use."""
    global _encoding
    _encoding = encoding if encoding in ENCODINGS else "utf-16"
    return _encoding


def lsp_position(position: Position) -> T.Position:
    """A resolved Linnet position as LSP's 0-based line and column in the negotiated unit."""
    return T.Position(position.line - 1, position.units(_encoding))


def lsp_range(location: Location) -> T.Range:
    return T.Range(lsp_position(location.start), lsp_position(location.end))


def lsp_location(location: Location) -> T.Location:
    return T.Location(uri_of(location.path), lsp_range(location))


def offset_at(index: LineIndex, position: T.Position) -> int:
    """The character offset of an LSP position (in the negotiated unit), clamped into the text."""
    return index.offset_of(position.line, position.character, _encoding)


def range_of_offsets(index: LineIndex, start: int, end: int) -> T.Range:
    return T.Range(lsp_position(index.position(start)), lsp_position(index.position(end)))


def docs_link(code: str) -> str:
    """The docs entry of a diagnostic code: docs/diagnostics.md in the repository, one `## L201`
    heading per code (GitHub anchors are lower case)."""
    return f"{uri_of(str(DOCS_DIAGNOSTICS))}#{code.lower()}"


_SEVERITY = {"error": T.DiagnosticSeverity.Error, "warning": T.DiagnosticSeverity.Warning}


def lsp_diagnostic(d: Diagnostic) -> T.Diagnostic:
    """A Linnet diagnostic as LSP shows it: the label and notes follow the message on their own
    lines (clients show `relatedInformation` less prominently, if at all), and each secondary
    label is a `relatedInformation` entry pointing where that shape came from."""
    lines = [d.message]
    if d.label and d.label != d.message:
        lines.append(d.label)
    lines.extend(f"note: {n}" for n in d.notes)
    related = [T.DiagnosticRelatedInformation(lsp_location(lab.location), lab.message) for lab in d.labels]
    return T.Diagnostic(
        range=lsp_range(d.location),
        message="\n".join(lines),
        severity=_SEVERITY.get(d.severity, T.DiagnosticSeverity.Information),
        code=d.code,
        code_description=T.CodeDescription(href=docs_link(d.code)),
        source="linnet",
        related_information=related or None,
        tags=[T.DiagnosticTag.Unnecessary] if "unnecessary" in d.tags else None,
    )


MAX_PUBLISHED = 500  # diagnostics published per document; a summary stands for the rest


def published_diagnostics(found: list[Diagnostic], path: str, limit: int = MAX_PUBLISHED) -> list[T.Diagnostic]:
    """`found`'s diagnostics in `path` as LSP publishes them: at most `limit` (errors before warnings, each in the
    checker's order), and when there are more, one Information diagnostic on the first line saying how many are not
    shown and how to see them all. Only what is published is converted."""
    mine = [d for d in found if d.location.path == path]
    if len(mine) <= limit:
        return [lsp_diagnostic(d) for d in mine]
    mine.sort(key=lambda d: d.severity != "error")  # stable: errors first
    shown, rest = mine[:limit], mine[limit:]
    n_errors = sum(1 for d in rest if d.severity == "error")
    summary = T.Diagnostic(
        range=T.Range(T.Position(0, 0), T.Position(0, 0)),
        message=(
            f"{len(rest)} more diagnostics not shown ({n_errors} errors, {len(rest) - n_errors} warnings): only the "
            f"first {limit} of {len(mine)} are listed; `linnet check {path}` shows them all"
        ),
        severity=T.DiagnosticSeverity.Information,
        source="linnet",
    )
    return [lsp_diagnostic(d) for d in shown] + [summary]


_FENCE = re.compile(r"^```[\w-]*\n(.*?)\n```$", re.S | re.M)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*([^*\n]+)\*\*")


def plain_text(markdown: str) -> str:
    """What our Markdown says, as plain text: code blocks and inline code without their
    fences and backticks, bold without its asterisks (we write no other Markdown)."""
    return _BOLD.sub(r"\1", _INLINE_CODE.sub(r"\1", _FENCE.sub(r"\1", markdown)))


def markup(markdown: str, formats: Any) -> T.MarkupContent:
    """`markdown` in the format the client prefers: `formats` is its list for this feature
    (`hover.contentFormat`, `completionItem.documentationFormat`, ...), most preferred first
    (LSP 3.17); plain text when it lists plaintext before markdown, or markdown not at all."""
    for kind in formats or ():
        if kind in (T.MarkupKind.Markdown, "markdown"):
            break
        if kind in (T.MarkupKind.PlainText, "plaintext"):
            return T.MarkupContent(T.MarkupKind.PlainText, plain_text(markdown))
    return T.MarkupContent(T.MarkupKind.Markdown, markdown)
