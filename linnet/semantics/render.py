"""Rendering diagnostics: terminal excerpts with carets and labels, JSON, GitHub annotations.

The terminal form follows rustc:

    examples/bad.linnet:18:17: error[L201]: shapes don't broadcast: ...
       |
    18 |         let s = a + b
       |                 ^^^^^ [B, S, 576]
       |
    16 |         let a = q(x)
       |             - `a` is [B, S, 576] from here
       = note: under preset `smollm2_135m`
"""

from __future__ import annotations

import functools
import json
import os
from typing import Callable, Iterable

from ..syntax.items import Location
from ..syntax.positions import split_lines
from .diagnostics import Diagnostic

TAB_WIDTH = 4  # columns a tab is shown as in an excerpt (the caret line is counted the same way)
_COLORS = {
    "error": "\033[1;31m",
    "warning": "\033[1;33m",
    "note": "\033[1;36m",
    "gutter": "\033[1;34m",
    "bold": "\033[1m",
    "reset": "\033[0m",
}


def _painter(color: bool) -> Callable[[str, str], str]:
    if not color:
        return lambda text, _kind: text
    return lambda text, kind: f"{_COLORS[kind]}{text}{_COLORS['reset']}"


def render_text(
    diag: Diagnostic,
    read_source: Callable[[str], str | None],
    display_path: Callable[[str], str] = str,
    color: bool = False,
) -> str:
    """rustc-style rendering: the header line, then labelled source excerpts, notes, fixes."""
    paint = _painter(color)
    loc = diag.location
    head = (
        f"{display_path(loc.path)}:{loc.line}:{loc.column}: "
        f"{paint(f'{diag.severity}[{diag.code}]', diag.severity)}: {paint(diag.message, 'bold')}"
    )
    marks = [(loc, diag.label, True)] + [(lab.location, lab.message, False) for lab in diag.labels]
    width = max(len(str(m[0].line)) for m in marks)
    lines = [head]
    bar = paint(" " * width + " |", "gutter")
    lines.append(bar)
    last_path = loc.path
    groups = _grouped(_ordered(marks))
    for i, group in enumerate(groups):
        where = group[0][0]
        if where.path != last_path:
            lines.append(
                paint(" " * width + "--> ", "gutter") + f"{display_path(where.path)}:{where.line}:{where.column}"
            )
            lines.append(bar)
            last_path = where.path
        source = read_source(where.path)
        if source is None:
            continue
        raw_line = _line(source, where.line)
        line_text = raw_line.expandtabs(TAB_WIDTH)
        lines.append(f"{paint(f'{where.line:>{width}} |', 'gutter')} {line_text}".rstrip())
        for mark_loc, text, primary in group:
            start_col = _shown_column(raw_line, mark_loc.start.column - 1)
            end_col = (
                _shown_column(raw_line, mark_loc.end.column - 1)
                if mark_loc.end.line == mark_loc.line
                else len(line_text)
            )
            end_col = max(end_col, start_col + 1)
            mark = ("^" if primary else "-") * (end_col - start_col)
            underline = " " * start_col + paint(
                mark + (f" {text}" if text else ""), diag.severity if primary else "gutter"
            )
            lines.append(f"{bar} {underline}".rstrip())
        if i + 1 < len(groups):
            lines.append(bar)
    for note in diag.notes:
        lines.append(f"{' ' * width} = {paint('note', 'note')}: {note}")
    for fix in diag.fixes:
        lines.append(f"{' ' * width} = {paint('help', 'note')}: {fix.message}")
    return "\n".join(lines)


def _shown_column(raw_line: str, column: int) -> int:
    """Where character `column` (0-based) of `raw_line` is in the line as shown, its tabs expanded: a caret
    under a tab-indented line counted each tab as one column and landed left of what it marks."""
    return len(raw_line[:column].expandtabs(TAB_WIDTH)) + max(0, column - len(raw_line))


def _ordered(marks: list[tuple[Location, str, bool]]):
    """The primary mark first, then the others by file and position, merged when they coincide."""
    primary, rest = marks[0], marks[1:]
    seen = {(primary[0].path, primary[0].start.offset, primary[0].end.offset)}
    out = [primary]
    for m in sorted(rest, key=lambda m: (m[0].path != primary[0].path, m[0].path, m[0].start.offset)):
        key = (m[0].path, m[0].start.offset, m[0].end.offset)
        if key in seen:
            continue
        seen.add(key)
        out.append(m)
    return out


def _grouped(marks):
    """Marks on the same line of the same file share one excerpt (the primary's group first)."""
    groups: list[list] = []
    index: dict[tuple[str, int], list] = {}
    for m in marks:
        key = (m[0].path, m[0].line)
        if key not in index:
            index[key] = []
            groups.append(index[key])
        index[key].append(m)
    for g in groups:
        g.sort(key=lambda m: (not m[2], m[0].start.column))
    return groups


def _line(source: str, line: int) -> str:
    lines = _lines_of(source)
    return lines[line - 1] if 0 < line <= len(lines) else ""


@functools.lru_cache(maxsize=8)
def _lines_of(source: str) -> list[str]:
    """A source's lines, split once per text (not once per rendered excerpt: thousands of errors in a 5 MB file
    re-split it thousands of times). A text is looked up by identity first, so a hit costs no comparison."""
    return split_lines(source)


def render_json(diags: Iterable[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diags], indent=2)


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def render_github(diag: Diagnostic, display_path: Callable[[str], str] = str) -> str:
    """A GitHub Actions workflow command (`::error file=...,line=...::message`)."""
    loc = diag.location
    kind = "error" if diag.severity == "error" else "warning"
    props = (
        f"file={_escape_property(display_path(loc.path))},line={loc.line},col={loc.column},"
        f"endLine={loc.end.line},endColumn={loc.end.column},title={_escape_property(diag.code)}"
    )
    message = diag.message + "".join(f"\n{n}" for n in diag.notes)
    return f"::{kind} {props}::{_escape_data(message)}"


def use_color(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and "NO_COLOR" not in os.environ
