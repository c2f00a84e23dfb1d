"""The values of literal tokens, read alike by both routes of parsing an item: the fast parser (`descent.py`) and
lark's tree turned into the AST (`builder.py`).

An INT token's value is Python's `int()` of its digits, which refuses a decimal string past
`sys.get_int_max_str_digits()` digits (4,300 by default: Python's guard against quadratic conversions,
CVE-2020-10735); such a literal is a `LiteralError` located on its token, which `parser.parse_item` reports as L001.
"""

from __future__ import annotations

import ast as pyast
import sys

from .ast import Span

__all__ = ["LiteralError", "integer", "unquote"]


class LiteralError(Exception):
    """A literal token whose value cannot be read: `message` about the token at `span` (item-relative)."""

    def __init__(self, message: str, span: Span):
        super().__init__(message)
        self.message = message
        self.span = span


def integer(text: str, span: Span) -> int:
    """The value of an INT token's `text` (`1_000`: underscores between digits) at `span`. Raises LiteralError past
    Python's limit on decimal digits (`this integer has 4301 digits: at most 4300`)."""
    digits = text.replace("_", "")
    try:
        return int(digits)
    except ValueError:  # the only one an INT token's digits can raise
        message = f"this integer has {len(digits)} digits: at most {sys.get_int_max_str_digits()}"
        raise LiteralError(message, span) from None


def unquote(text: str) -> str:
    """The value of a STRING token's text (`"a\\n"`), as Python reads the literal; the text between the quotes when
    Python cannot (an escape it does not know)."""
    if "\\" not in text:
        return text[1:-1]  # what literal_eval gives, ~50 times faster: no escape
    try:
        return pyast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text[1:-1]
