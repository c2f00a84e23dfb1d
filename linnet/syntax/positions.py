"""Positions in a source text: character offsets, byte offsets, lines and columns.

Linnet keeps character (code point) offsets internally. The CLI prints 1-based lines and
columns (columns count characters, as rustc does), JSON output adds UTF-8 byte offsets, and
the language server speaks UTF-16 code units (the LSP default `positionEncoding`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate


@dataclass(slots=True)
class Position:
    """A resolved position. `line`/`column` are 1-based; `character` is the 0-based UTF-16
    column LSP expects (on 0-based line `line - 1`); `byte` is the UTF-8 offset."""

    offset: int
    byte: int
    line: int
    column: int
    character: int


class LineIndex:
    """Maps offsets in `text` to lines, columns, bytes and UTF-16 positions, and back."""

    def __init__(self, text: str):
        self.text = text
        # running sums of line lengths, in C: a Python loop over a 5,000-line file cost ~4 ms
        # on every keystroke in the language server
        self.line_starts = list(accumulate((len(line) + 1 for line in text.split("\n")[:-1]), initial=0))
        self._byte_starts: list[int] | None = None
        self.ascii = text.isascii()

    def line_of(self, offset: int) -> int:
        """0-based line containing `offset`."""
        return bisect_right(self.line_starts, offset) - 1

    def line_text(self, line0: int) -> str:
        start = self.line_starts[line0]
        end = self.line_starts[line0 + 1] - 1 if line0 + 1 < len(self.line_starts) else len(self.text)
        return self.text[start:end].rstrip("\r")

    def _byte_line_starts(self) -> list[int]:
        if self._byte_starts is None:
            if self.ascii:
                self._byte_starts = self.line_starts
            else:
                starts, total, prev = [], 0, 0
                for s in self.line_starts:
                    total += len(self.text[prev:s].encode("utf-8"))
                    starts.append(total)
                    prev = s
                self._byte_starts = starts
        return self._byte_starts

    def position(self, offset: int) -> Position:
        offset = max(0, min(offset, len(self.text)))
        line0 = self.line_of(offset)
        start = self.line_starts[line0]
        if self.ascii:
            col, byte, utf16 = offset - start, offset, offset - start
        else:
            prefix = self.text[start:offset]
            col = len(prefix)
            byte = self._byte_line_starts()[line0] + len(prefix.encode("utf-8"))
            utf16 = len(prefix.encode("utf-16-le")) // 2
        return Position(offset, byte, line0 + 1, col + 1, utf16)

    def offset_of_utf16(self, line0: int, character: int) -> int:
        """The character offset of an LSP position (0-based line, UTF-16 column), clamped to
        the line's end."""
        if line0 >= len(self.line_starts):
            return len(self.text)
        if line0 < 0:
            return 0
        start = self.line_starts[line0]
        line = self.line_text(line0)
        if self.ascii or line.isascii():
            return start + min(character, len(line))
        units = 0
        for i, ch in enumerate(line):
            if units >= character:
                return start + i
            units += 2 if ord(ch) > 0xFFFF else 1
        return start + len(line)
