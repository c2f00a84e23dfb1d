"""Reading a source file: UTF-8, a leading byte-order mark dropped, line endings kept as they are (`\\r\\n` and a
lone `\\r` are line breaks to the front end, so positions are the file's own).

A file that is not UTF-8 is reported at the line and column of its first bad byte, as the front end counts them:
Python's own error names a byte offset into whatever chunk its reader had decoded ("position 712").
"""

from __future__ import annotations

from pathlib import Path

from .positions import LINE_BREAK

_BOM = b"\xef\xbb\xbf"


class NotUtf8(UnicodeDecodeError):
    """A source file that is not UTF-8: `line` and `column` (1-based, columns in characters) of its first bad
    byte. A UnicodeDecodeError, so that callers that catch one still do; its text says where."""

    def __init__(self, err: UnicodeDecodeError, line: int, column: int):
        super().__init__(err.encoding, err.object, err.start, err.end, err.reason)
        self.line, self.column = line, column

    def __str__(self) -> str:
        byte = self.object[self.start]
        return f"not UTF-8 text: byte 0x{byte:02x} at line {self.line}, column {self.column} ({self.reason})"


def decode_source(raw: bytes) -> str:
    """The text of a source file's bytes `raw`. Raises NotUtf8."""
    body = raw[len(_BOM) :] if raw.startswith(_BOM) else raw
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as err:
        before = body[: err.start].decode("utf-8")
        breaks = list(LINE_BREAK.finditer(before))
        line_start = breaks[-1].end() if breaks else 0
        raise NotUtf8(err, len(breaks) + 1, len(before) - line_start + 1) from None


def read_source_text(path: str | Path) -> str:
    """The text of the source file at `path`. Raises OSError and NotUtf8."""
    with open(path, "rb") as f:
        return decode_source(f.read())
