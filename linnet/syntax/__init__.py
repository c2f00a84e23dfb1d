"""Syntax: the grammar, item splitting, parsing with recovery, the AST, the formatter.

Parsing never raises: `parse_item` returns a tree (possibly with `ErrorStmt`s where text was
skipped) and its problems."""

from .ast import Span
from .items import Item, Location, Source, make_item, split_items
from .parser import ParsedItem, SyntaxProblem, parse_item

__all__ = [
    "Item",
    "Location",
    "ParsedItem",
    "Source",
    "Span",
    "SyntaxProblem",
    "make_item",
    "parse_item",
    "split_items",
]
