"""Positions in a source text: character offsets, byte offsets, lines and columns.

Linnet keeps character (code point) offsets internally. The CLI prints 1-based lines and
columns (columns count characters, as rustc does), JSON output adds UTF-8 byte offsets, and
the language server speaks the column unit it negotiated with the client (LSP 3.17
`positionEncoding`: UTF-8 bytes, UTF-16 code units, the default, or UTF-32 code points).

Lines end at `\\n`, `\\r\\n` or a lone `\\r`, and nowhere else: that is LSP's rule (3.17,
"Text Documents"), and this `LineIndex` is the one line index of Linnet, used by the checker,
the CLI and the language server alike, so that they agree on every line number. Python's
`str.splitlines` also breaks at `\\v`, `\\f`, `\\x1c`-`\\x1e`, `\\x85`, U+2028 and U+2029:
never use it on source text.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

LINE_BREAK = re.compile(r"\r\n|\r|\n")
"""A line break as LSP counts them."""

ENCODINGS = ("utf-8", "utf-16", "utf-32")
# A lone surrogate (a JSON string from a client may carry one, "\ud800") counts as the code units it would take
# (3 UTF-8 bytes, 1 UTF-16 unit), as WTF-8 and JavaScript strings count it, instead of failing to encode.
_LONE_SURROGATES = "surrogatepass"


def _utf8_units(ch: str) -> int:
    return len(ch.encode("utf-8", _LONE_SURROGATES))


def _utf16_units(ch: str) -> int:
    return 2 if ord(ch) > 0xFFFF else 1


"""The column units a client may negotiate (LSP `PositionEncodingKind` values)."""

_LONE_CR = re.compile(r"\r(?!\n)")


def changed_range(old: str, new: str) -> tuple[int, int, int]:
    """Where `new` differs from `old`: (start, old_end, new_end) such that `new` is `old` with `old[start:old_end]`
    replaced by `new[start:new_end]`, the common prefix and suffix as long as they can be (compared in C)."""
    start = common_prefix(old, new)
    tail = _common_suffix(old, new, min(len(old), len(new)) - start)
    return start, len(old) - tail, len(new) - tail


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b` (a binary search over slices: compared in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    """The length of the longest common suffix of `a` and `b`, at most `limit`."""
    lo, hi = 0, max(limit, 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid : len(a) - lo] == b[len(b) - mid : len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def lexable(text: str) -> str:
    """`text` with each lone `\\r` turned into `\\n`: the same length and the same offsets, and
    line breaks the lexer and the item splitter (which know `\\n` and `\\r\\n`) recognise."""
    return _LONE_CR.sub("\n", text) if "\r" in text else text


def split_lines(text: str, keepends: bool = False) -> list[str]:
    """`text`'s lines at LSP's line breaks only (unlike `str.splitlines`); a final line break
    ends the last line, as `splitlines` has it."""
    if keepends:
        lines = [m.group(0) for m in re.finditer(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)]
        return lines
    lines = LINE_BREAK.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


@dataclass(slots=True)
class Position:
    """A resolved position. `line`/`column` are 1-based (`column` counts characters);
    `character` is the 0-based UTF-16 column LSP expects by default (on 0-based line
    `line - 1`), `utf8` the 0-based UTF-8 column; `byte` is the UTF-8 offset in the text."""

    offset: int
    byte: int
    line: int
    column: int
    character: int
    utf8: int

    def units(self, encoding: str) -> int:
        """The 0-based column in `encoding` ("utf-8", "utf-16" or "utf-32")."""
        if encoding == "utf-8":
            return self.utf8
        if encoding == "utf-32":
            return self.column - 1
        return self.character


EDITED_INDEX_MAX = 4096  # characters of new text `LineIndex.edited` searches for line breaks; past that, a new index


class LineIndex:
    """Maps offsets in `text` to lines, columns, bytes and UTF-8/16/32 columns, and back."""

    def __init__(self, text: str):
        self.text = text
        if text.count("\r") != text.count("\r\n"):  # a lone `\r` (rare): ~3x slower than below
            self.line_starts = [0] + [m.end() for m in LINE_BREAK.finditer(text)]
        else:
            # running sums of line lengths, in C: a Python loop over a 5,000-line file cost ~4 ms
            # on every keystroke in the language server (a `\r\n` line ends at its `\n` too)
            self.line_starts = list(accumulate((len(line) + 1 for line in text.split("\n")[:-1]), initial=0))
        self._byte_starts: list[int] | None = None
        self.ascii = text.isascii()

    def edited(self, text: str, start: int, old_end: int, new_end: int) -> "LineIndex":
        """The index of `text`, which is this index's text with characters `start:old_end` replaced by what is
        `text[start:new_end]` (`changed_range`): the line starts before the edit kept, those after it moved, those
        in it found again (~0.1 ms on a 3,000-line file, where a new index took 0.6: an editor's keystroke makes
        one). A text with a `\r` is indexed anew (an edit can join or split a `\r\n`)."""
        if new_end - start > EDITED_INDEX_MAX or "\r" in text or "\r" in self.text[start:old_end]:
            return LineIndex(text)  # (a long new part: finding its breaks one by one would be slower)
        index = LineIndex.__new__(LineIndex)
        index.text = text
        starts = self.line_starts
        kept, moved = bisect_right(starts, start), bisect_right(starts, old_end)
        found = []
        at = text.find("\n", start, new_end)
        while at >= 0:
            found.append(at + 1)
            at = text.find("\n", at + 1, new_end)
        delta = new_end - old_end
        after = [s + delta for s in starts[moved:]] if delta else starts[moved:]
        index.line_starts = starts[:kept] + found + after
        index._byte_starts = None
        index.ascii = text.isascii()
        return index

    def line_of(self, offset: int) -> int:
        """0-based line containing `offset` (a line break belongs to the line it ends)."""
        return bisect_right(self.line_starts, offset) - 1

    def line_end(self, line0: int) -> int:
        """The offset where 0-based line `line0`'s text ends (before its line break)."""
        if line0 + 1 >= len(self.line_starts):
            return len(self.text)
        end = self.line_starts[line0 + 1] - 1
        if self.text[end] == "\n" and end > self.line_starts[line0] and self.text[end - 1] == "\r":
            end -= 1
        return end

    def line_text(self, line0: int) -> str:
        """The text of 0-based line `line0`, without its line break."""
        return self.text[self.line_starts[line0] : self.line_end(line0)]

    def _byte_line_starts(self) -> list[int]:
        if self._byte_starts is None:
            if self.ascii:
                self._byte_starts = self.line_starts
            else:
                starts, total, prev = [], 0, 0
                for s in self.line_starts:
                    total += len(self.text[prev:s].encode("utf-8", _LONE_SURROGATES))
                    starts.append(total)
                    prev = s
                self._byte_starts = starts
        return self._byte_starts

    def position(self, offset: int) -> Position:
        offset = max(0, min(offset, len(self.text)))
        line0 = self.line_of(offset)
        start = self.line_starts[line0]
        if self.ascii:
            col = offset - start
            return Position(offset, offset, line0 + 1, col + 1, col, col)
        prefix = self.text[start:offset]
        col = len(prefix)
        utf8 = len(prefix.encode("utf-8", _LONE_SURROGATES))
        byte = self._byte_line_starts()[line0] + utf8
        utf16 = col if prefix.isascii() else len(prefix.encode("utf-16-le", _LONE_SURROGATES)) // 2
        return Position(offset, byte, line0 + 1, col + 1, utf16, utf8)

    def offset_of(self, line0: int, units: int, encoding: str = "utf-16") -> int:
        """The character offset of a position given as a 0-based line and a column in
        `encoding` ("utf-8", "utf-16" or "utf-32"), clamped into the text: a line past the end
        is the end of the text, a column past the line's end is the line's end (LSP 3.17), and
        a column inside a character's code units is that character's start."""
        if line0 >= len(self.line_starts):
            return len(self.text)
        if line0 < 0:
            return 0
        start = self.line_starts[line0]
        line = self.line_text(line0)
        units = max(0, units)
        if encoding == "utf-32" or self.ascii or line.isascii():
            return start + min(units, len(line))
        width = _utf8_units if encoding == "utf-8" else _utf16_units
        count = 0
        for i, ch in enumerate(line):  # a column inside a character's code units is that character's start
            count += width(ch)
            if count > units:
                return start + i
        return start + len(line)

    def offset_of_utf16(self, line0: int, character: int) -> int:
        """The character offset of an LSP position in UTF-16 columns (see `offset_of`)."""
        return self.offset_of(line0, character, "utf-16")
