"""Parsing one top-level item, with error recovery. Never raises on any input.

Recovery works by skipping: when lark stops at an error, the statement or member around the
error is blanked out (replaced by spaces, so every offset stays put) and the item is parsed
again. A missing closing brace at the end of an item is supplied instead. Each skipped
region becomes an `ErrorStmt` in the tree so the checker knows which names it would have
bound and stays quiet about them. One error is reported per skipped line: later errors on
lines already skipped are consequences, not news.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from . import ast as A
from .ast import Span
from .positions import lexable
from .recursion import deep_recursion

if TYPE_CHECKING:
    from lark import Token
    from lark.exceptions import UnexpectedInput

__all__ = [
    "GRAMMAR_PATH",
    "ItemCache",
    "ParsedItem",
    "SyntaxProblem",
    "code_mask",
    "parse_item",
    "parse_with_lark",
    "set_parse_cache",
]

GRAMMAR_PATH = Path(__file__).with_name("grammar.lark")
MAX_RECOVERIES = 40

_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {")": "(", "]": "[", "}": "{"}


@dataclass(slots=True)
class SyntaxProblem:
    """A syntax error: `code` is a diagnostic code (L001..L004), `span` item-relative;
    `labels` are secondary (span, text) pairs."""

    code: str
    message: str
    span: Span
    labels: list[tuple[Span, str]]
    notes: list[str]


@dataclass(slots=True)
class ParsedItem:
    ast: A.ItemDef | None
    problems: list[SyntaxProblem]


# ----------------------------------------------------------------------------- messages

_TERMINAL_TEXT = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "_NL": "a new line",
    "$END": "the end of the item",
    "ELLIPSIS": "`...`",
    "ENTRY": "`entry`",
}
_EXPR_STARTS = {"NAME", "INT", "FLOAT", "STRING", "LPAR", "LSQB", "MINUS", "TRUE", "FALSE", "NONE", "NOT", "IF"}


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_TEXT:
        return _TERMINAL_TEXT[name]
    try:
        from .lalr import lark_parser

        term = lark_parser().get_terminal(name)
        if term.pattern.type == "str":
            return f"`{term.pattern.value}`"
    except KeyError:
        pass
    return name.lower()


def _describe_token(tok: Token) -> str:
    if tok.type == "_NL":
        return "end of line"
    if tok.type == "$END":
        return "end of item"
    if tok.type == "NAME":
        return f"name `{tok}`"
    return f"`{tok}`"


def _expected_text(expected: set[str]) -> str:
    names = set(expected)
    parts = []
    if len(names & _EXPR_STARTS) >= 4:
        names -= _EXPR_STARTS
        parts.append("an expression")
    parts += sorted(_describe_terminal(n) for n in names if n not in ("WS", "COMMENT"))
    if not parts:
        return ""
    if len(parts) > 6:
        return "one of " + ", ".join(parts[:6]) + ", …"
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " or " + parts[-1]


# ----------------------------------------------------------------------------- scanning helpers


def code_mask(text: str) -> list[bool]:
    """True for characters that are code (not inside a string or a comment)."""
    mask = [True] * len(text)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "#":
            j = text.find("\n", i)
            j = n if j == -1 else j
            for k in range(i, j):
                mask[k] = False
            i = j
        elif ch == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            for k in range(i, j):
                mask[k] = False
            i = j
        else:
            i += 1
    return mask


def _open_delimiters(text: str, mask: list[bool], upto: int) -> list[int]:
    """Offsets of the delimiters still open at `upto` (outermost first)."""
    stack: list[int] = []
    for i in range(min(upto, len(text))):
        if not mask[i]:
            continue
        ch = text[i]
        if ch in _OPENERS:
            stack.append(i)
        elif ch in _CLOSERS:
            if stack and text[stack[-1]] == _CLOSERS[ch]:
                stack.pop()
    return stack


def _line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def _statement_region(text: str, mask: list[bool], pos: int) -> Span:
    """The statement or member around `pos`: from the start of its line to the end of the
    line where its ( [ { balance, stopping before a `}` that closes an enclosing block. A `}`
    before `pos` on its line closes a block the error is not in (`} elif b {`, `} else foo {`):
    the region starts after it, and takes the blocks that follow on the error's side."""
    start = _line_start(text, pos)
    paren = brace = 0
    i = start
    while i < len(text):
        ch = text[i]
        if mask[i]:
            if ch in "([":
                paren += 1
            elif ch in ")]":
                paren -= 1
            elif ch == "{":
                brace += 1
            elif ch == "}":
                if brace == 0 and paren == 0 and i < pos:
                    start = i + 1  # closes a block before the error: not part of it
                elif brace == 0:
                    break
                else:
                    brace -= 1
        if ch == "\n" and paren <= 0 and brace <= 0 and i >= pos:
            break
        i += 1
    if i <= pos:  # the error token itself closes the enclosing block: skip just that token
        return Span(pos, pos + 1)
    return Span(start, i)


_BOUND_PATTERNS = [
    re.compile(r"\blet\s+([A-Za-z_]\w*)"),
    re.compile(r"\bfn\s+([A-Za-z_]\w*)"),
    re.compile(r"^\s*(?:state\s+)?([A-Za-z_]\w*)\s*:", re.M),
]
_LET_TUPLE = re.compile(r"\blet\s*\(([^)]*)\)")


def _bound_names(text: str) -> list[str]:
    names = []
    for pat in _BOUND_PATTERNS:
        names += pat.findall(text)
    for group in _LET_TUPLE.findall(text):
        names += [n.strip() for n in group.split(",") if n.strip().isidentifier()]
    return names


_NAME = re.compile(r"[A-Za-z_]\w*")


def _used_names(text: str) -> list[str]:
    """Every identifier spelled in the code of `text` (not in its comments and strings)."""
    mask = code_mask(text)
    return list(dict.fromkeys(m.group() for m in _NAME.finditer(text) if mask[m.start()]))


def _blank(text: str, span: Span) -> str:
    piece = "".join(ch if ch == "\n" else " " for ch in text[span.start : span.end])
    return text[: span.start] + piece + text[span.end :]


# ----------------------------------------------------------------------------- recovery


class ItemCache(Protocol):
    """What `parse_item` asks of a parse cache (`linnet.lsp.parses.ParseCache`: the syntax package does no IO)."""

    def get(self, text: str) -> ParsedItem | None:
        """The parse of an item's `text` met before (a fresh copy), else None."""

    def put(self, text: str, parsed: ParsedItem) -> None:
        """Keep `parsed`, the parse of `text`."""


_cache: list[ItemCache | None] = [None]  # the parse cache in use (`set_parse_cache`), else None


def set_parse_cache(cache: ItemCache | None) -> None:
    """Have `parse_item` read and fill `cache` (None: parse every item; the default). The language server sets one
    (`linnet.lsp.startup`): with every item of the standard library and of the file opened in it, a start parses
    nothing and never imports lark."""
    _cache[0] = cache


def parse_item(text: str) -> ParsedItem:
    """Parse the text of one top-level item. Returns its AST (None when nothing could be
    recovered) and its syntax problems with item-relative spans. Never raises.

    With a parse cache set (`set_parse_cache`), an item's text parsed before is read from it (a fresh copy)."""
    cache = _cache[0]
    if cache is not None and (parsed := cache.get(text)) is not None:
        return parsed
    parsed = _parse(text)
    if cache is not None:
        cache.put(text, parsed)
    return parsed


def _parse(text: str) -> ParsedItem:
    """`parse_item` without the cache: the fast parser's AST (`descent.parse_fast`) when it is sure of the item,
    else lark's parse with recovery and the AST built from its tree."""
    from .descent import parse_fast

    text = lexable(text)  # a lone `\r` ends a line too; the grammar knows `\n` and `\r\n`
    item = parse_fast(text)
    if item is not None:
        _attach_docs(item, text)
        return ParsedItem(item, [])
    return parse_with_lark(text)


def parse_with_lark(text: str) -> ParsedItem:
    """lark's parse of one item's `text` (lexable: `positions.lexable`) with recovery, and the AST built from its
    tree: the reference the fast parser (`descent.py`) is checked against, and the route of every item it gives up
    on. Never raises."""
    from .lalr import UnexpectedInput, lark_parser  # first: lark is imported without its optional modules

    parser = lark_parser()
    problems: list[SyntaxProblem] = []
    skipped: list[Span] = []
    reported_lines: set[int] = set()
    work = text
    tree = None
    for _ in range(MAX_RECOVERIES):
        try:
            tree = parser.parse(work)
            break
        except UnexpectedInput as err:
            step = _recover(work, err, problems, reported_lines)
            if step is None:
                break
            work, region = step
            if region is not None:
                skipped.append(region)
        except Exception as err:  # lark internals: never let them escape
            problems.append(
                SyntaxProblem(
                    "L001", f"cannot parse this item ({type(err).__name__})", Span(0, min(len(text), 1)), [], []
                )
            )
            break
    if tree is None:
        if not problems:
            problems.append(SyntaxProblem("L001", "cannot parse this item", Span(0, 0), [], []))
        return ParsedItem(None, problems)
    from .builder import build
    from .literals import LiteralError

    try:
        with deep_recursion():
            item = build(tree)
    except RecursionError:
        problems.append(SyntaxProblem("L000", "this item nests too deeply to build", Span(0, 0), [], []))
        return ParsedItem(None, problems)
    except LiteralError as err:  # an integer past Python's digit limit, located on its token
        problems.append(SyntaxProblem("L001", err.message, err.span, [], []))
        return ParsedItem(None, problems)
    except Exception as err:  # a builder bug must not take the checker down
        problems.append(
            SyntaxProblem("L001", f"cannot build this item ({type(err).__name__}: {err})", Span(0, 0), [], [])
        )
        return ParsedItem(None, problems)
    if len(work) > len(text):  # closers were supplied past the end
        _clamp_spans(item, len(text))
    for region in skipped:
        _insert_error_stmt(item, region, text)
    _attach_docs(item, text)
    return ParsedItem(item, problems)


def _recover(work: str, err: UnexpectedInput, problems: list[SyntaxProblem], reported_lines: set[int]):
    """Record `err` and return the text to try next (and the region skipped), or None."""
    from .lalr import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    mask = code_mask(work)
    at_end = isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END")
    if at_end:
        pos = len(work.rstrip())
    elif isinstance(err, UnexpectedCharacters):
        pos = err.pos_in_stream
    else:
        pos = err.token.start_pos if err.token.start_pos is not None else len(work)

    def report(code, message, span, labels=(), notes=()):
        line = work.count("\n", 0, span.start)
        if line in reported_lines:
            return
        reported_lines.add(line)
        problems.append(SyntaxProblem(code, message, span, list(labels), list(notes)))

    # A delimiter opened on an earlier line and never closed: report the opener.
    open_stack = _open_delimiters(work, mask, pos)
    if at_end and open_stack:
        closers = "".join(_OPENERS[work[i]] for i in reversed(open_stack))
        opener = open_stack[-1]
        report(
            "L003",
            f"unclosed `{work[opener]}`",
            Span(opener, opener + 1),
            [(Span(pos, pos), f"expected `{_OPENERS[work[opener]]}` before the end of the item")],
        )
        return work + "\n" + closers, None
    if at_end:
        if not work.strip() or problems:
            return None  # after an error, an early end is its consequence, not news
        report(
            "L001",
            "unexpected end of item",
            Span(pos, pos),
            notes=[f"expected {_expected_text(err.expected)}"] if getattr(err, "expected", None) else [],
        )
        return None
    parens = [i for i in open_stack if work[i] in "(["]
    if parens and work.count("\n", parens[-1], pos) > 0:
        opener = parens[-1]
        report(
            "L003",
            f"unclosed `{work[opener]}`",
            Span(opener, opener + 1),
            [(Span(pos, pos), "the next line starts here")],
        )
        region = Span(_line_start(work, opener), _line_start(work, pos) - 1)
        if region.end <= region.start:
            return None
        return _blank(work, region), region

    if isinstance(err, UnexpectedCharacters):
        ch = work[pos] if pos < len(work) else ""
        shown = f"`{ch}`" if ch.isprintable() and not ch.isspace() else f"U+{ord(ch):04X}" if ch else "end"
        message = "unterminated string" if ch == '"' else f"unexpected character {shown}"
        report("L002", message, Span(pos, pos + 1))
    else:
        tok = err.token
        expected = _expected_text(set(err.expected)) if isinstance(err, UnexpectedToken) else ""
        span = Span(pos, tok.end_pos if tok.end_pos is not None else pos + 1)
        notes = [f"expected {expected}"] if expected else []
        report("L001", f"unexpected {_describe_token(tok)}", span, notes=notes)
    if not isinstance(err, UnexpectedCharacters) and err.token.type == "_NL":
        # the line ended too early (`let y = x *`): skip the statement that line ends
        pos = len(work[:pos].rstrip()) - 1
    region = _statement_region(work, mask, max(pos, 0))
    if not work[region.start : region.end].strip():
        return None
    return _blank(work, region), region


def _clamp_spans(item: A.Node, length: int) -> None:
    for node in A.walk(item):
        if node.span.end > length or node.span.start > length:
            node.span = Span(min(node.span.start, length), min(node.span.end, length))


def _insert_error_stmt(item: A.Node, region: Span, text: str) -> None:
    """Put an ErrorStmt for a skipped region into the innermost block or member list."""
    skipped = text[region.start : region.end]
    stmt = A.ErrorStmt(region, _bound_names(skipped), _used_names(skipped))
    best = None
    for node in A.walk(item):
        if node.span.start <= region.start and region.end <= node.span.end:
            if isinstance(node, (A.Block, A.ModuleDef, A.MemberIf, A.ConfigDef)):
                best = node
    if best is None:
        return
    if isinstance(best, A.Block):
        seq = best.stmts
    elif isinstance(best, A.MemberIf):
        seq = best.orelse if best.orelse and best.orelse[0].span.start < region.start else best.then
    elif isinstance(best, A.ConfigDef):
        seq = best.fields
    else:
        seq = best.members
    idx = sum(1 for s in seq if s.span.start < region.start)
    seq.insert(idx, stmt)


_DOC_BEARING = (A.ModuleDef, A.FnDef, A.ConfigDef, A.PresetDef, A.ConfigField, A.FieldDecl, A.StateDecl)


def _attach_docs(item: A.Node, text: str) -> None:
    """Attach `##` comment lines directly above a definition to it as its doc."""
    if "##" not in text:
        return
    for node in A.definitions(item):
        if not isinstance(node, _DOC_BEARING):
            continue
        lines = []
        pos = _line_start(text, node.span.start)
        while pos > 0:
            prev = _line_start(text, pos - 1)
            line = text[prev : pos - 1].strip()
            if not line.startswith("##"):
                break
            lines.append(line[2:].strip() if not line[2:3] == " " else line[3:].rstrip())
            pos = prev
        if lines:
            node.doc = "\n".join(reversed(lines))
