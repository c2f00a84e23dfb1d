"""`linnet fmt`: normalises whitespace, keeping every token and comment.

The formatter works on the token stream, not the tree: it keeps the author's line breaks
(so it cannot change meaning, and comments stay where they were) and rewrites the space
between tokens and the indentation of each line:

- four spaces per enclosing bracket line (a `{`, `(` or `[` left open at a line's end);
- one space around binary operators, `=` and `->`, after `,`, `;` and a type's `:`; none
  inside brackets, around `.`, in keyword arguments (`dim=-1`), in slices (`x[:, 1:]`),
  after a unary `-`, or in generics (`fn softmax<T: float>`);
- at most one blank line, none after an opening or before a closing bracket, exactly one
  between top-level items (consecutive imports keep the author's grouping);
- two spaces before a trailing comment; no trailing whitespace; one final newline.

A file with syntax errors is not formatted (`FormatError`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from .items import Source, make_item, split_items
from .parser import GRAMMAR_PATH
from .positions import LINE_BREAK, lexable

OPENERS = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE"}
CLOSERS = set(OPENERS.values())
BINARY = {
    "PLUS",
    "MINUS",
    "STAR",
    "SLASH",
    "PERCENT",
    "AT",
    "POW",
    "EQUAL",
    "ARROW",
    "VBAR",
    "EQEQ",
    "NOTEQ",
    "LE",
    "GE",
    "LESSTHAN",
    "MORETHAN",
}
# keywords after which a bracket is not a call or an index: `if (`, `not (`, `let (`
OPERATOR_KEYWORDS = {"if", "else", "not", "and", "or", "in", "let", "for"}
OPERANDS = {"NAME", "INT", "FLOAT", "STRING", "RPAR", "RSQB", "ELLIPSIS"}
ITEM_KEYWORDS = {"config", "preset", "module", "model", "fn"}

if TYPE_CHECKING:
    from lark import Lark


class FormatError(Exception):
    """The source has a syntax error at `line`:`column` (1-based)."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(message)
        self.line = line
        self.column = column


@lru_cache(maxsize=1)
def _lexer() -> Lark:
    from lark import Lark  # here: the language server imports this module, and needs lark only to format

    return Lark(GRAMMAR_PATH.read_text(), parser="lalr", lexer="basic", start="item_source", cache=True)


def format_source(text: str) -> str:
    """Format a whole `.linnet` source, keeping its line endings (those of its first line break: `\n`, `\r\n`
    or `\r`). Raises FormatError when it has syntax errors."""
    source = Source("<fmt>", text)
    for offset, chunk in split_items(text):
        problems = make_item(source, offset, chunk).problems
        if problems:
            where = source.index.position(offset + problems[0].span.start)
            raise FormatError(problems[0].message, where.line, where.column)
    tokens = [t for t in _lexer().lex(lexable(text), dont_ignore=True) if t.type != "WS"]
    formatted = _Formatter(tokens).run()
    ending = LINE_BREAK.search(text)
    return formatted.replace("\n", ending.group()) if ending is not None and ending.group() != "\n" else formatted


def _is_name(tok) -> bool:
    """Names, and keywords standing as names (`model.layers`, `self(x)`)."""
    return tok.type == "NAME" or (str(tok).isidentifier() and str(tok) not in OPERATOR_KEYWORDS)


class _Formatter:
    def __init__(self, tokens):
        self.tokens = tokens

    def lines(self):
        """Token lines, each with the number of blank lines before it."""
        out, current, blanks = [], [], 0
        for t in self.tokens:
            if t.type == "_NL":
                if current:
                    out.append((current, blanks))
                    blanks = str(t).count("\n") - 1
                else:
                    blanks += str(t).count("\n")
                current = []
            else:
                current.append(t)
        if current:
            out.append((current, blanks))
        return out

    def run(self) -> str:
        out: list[str] = []
        stack: list[int] = []  # line index of each open bracket
        prev_ended_item = False
        prev_item_import = False  # the last top-level item was an import
        in_attribute = False  # inside the brackets of a multi-line attribute (`@inert(...)`)
        for idx, (toks, blanks) in enumerate(self.lines()):
            leading_closers = 0
            for t in toks:
                if t.type in CLOSERS:
                    leading_closers += 1
                else:
                    break
            open_lines = stack[: max(0, len(stack) - leading_closers)]
            level = len(set(open_lines))
            want = 1 if blanks else 0
            if out and (out[-1].endswith(("{", "(", "[")) or toks[0].type in CLOSERS):
                want = 0
            starts_import = level == 0 and toks[0].type == "FROM"
            if (
                level == 0
                and prev_ended_item
                and (str(toks[0]) in ITEM_KEYWORDS or toks[0].type in ("AT", "COMMENT") or starts_import)
                and not (starts_import and prev_item_import)
            ):
                want = 1
            if want and out:
                out.append("")
            out.append("    " * level + self.render(toks))
            for t in toks:
                if t.type in OPENERS:
                    stack.append(idx)
                elif t.type in CLOSERS and stack:
                    stack.pop()
            if level == 0 and toks[0].type not in ("COMMENT", "AT"):
                prev_item_import = starts_import
            if level == 0 and toks[0].type == "AT":
                in_attribute = bool(stack)
            prev_ended_item = not stack and toks[0].type not in ("COMMENT", "AT") and not in_attribute
            in_attribute = in_attribute and bool(stack)
        return "\n".join(out) + "\n" if out else ""

    def render(self, toks) -> str:
        parts: list[str] = []
        brackets: list[str] = []  # open bracket kinds within this line... and unknown before
        annotated: list[bool] = []  # per open `(`: whether the current argument had a `:`
        generics = 0
        closed_generic = None
        prev = prev2 = None
        for t in toks:
            if t.type == "COMMENT":
                parts.append(("  " if parts else "") + str(t).rstrip())
                continue
            if prev is not None and self.space(t, prev, prev2, brackets, annotated, generics, closed_generic is prev):
                parts.append(" ")
            parts.append(str(t))
            if (
                t.type == "LESSTHAN"
                and prev is not None
                and _is_name(prev)
                and prev2 is not None
                and str(prev2) == "fn"
            ):
                generics += 1
            elif t.type == "MORETHAN" and generics:
                generics -= 1
                closed_generic = t
            elif t.type in OPENERS:
                brackets.append(t.type)
                annotated.append(False)
            elif t.type in CLOSERS:
                if brackets:
                    brackets.pop()
                    annotated.pop()
            elif t.type == "COMMA" and annotated:
                annotated[-1] = False
            elif t.type == "COLON" and annotated:
                annotated[-1] = True
            prev2, prev = prev, t
        return "".join(parts).rstrip()

    def space(self, t, prev, prev2, brackets, annotated, generics, after_generics) -> bool:
        k, pk = t.type, prev.type
        inner = brackets[-1] if brackets else None
        if pk == "AT" and prev2 is None:
            return False  # an attribute: `@name(...)`
        if k in ("RPAR", "RSQB", "COMMA", "SEMICOLON", "DOT", "QMARK"):
            return False
        if k == "RBRACE":
            return pk != "LBRACE"
        if pk in ("LPAR", "LSQB", "DOT"):
            return False
        if pk in ("LBRACE", "COMMA", "SEMICOLON"):
            return True
        if k == "COLON":
            return False
        if pk == "COLON":
            return inner != "LSQB"  # slices hug, types don't
        if generics and k in ("LESSTHAN", "MORETHAN"):
            return False
        if pk == "LESSTHAN" and generics:
            return False
        if after_generics and k == "LPAR":
            return False
        if k == "LESSTHAN" and _is_name(prev) and prev2 is not None and str(prev2) == "fn":
            return False
        if pk == "MINUS" and not (prev2 is not None and (prev2.type in OPERANDS or _is_name(prev2))):
            return False  # unary minus: `-x`, `-(a + b)`
        if k == "LPAR" and pk == "IMPORT" and prev2 is not None and prev2.type in ("STRING", "NAME"):
            return True  # `from "x.linnet" import (`
        if k == "EQUAL" or pk == "EQUAL":  # before brackets: a keyword argument's list hugs too, `size=[h, w]`
            return not (inner == "LPAR" and not annotated[-1])
        if k in ("LPAR", "LSQB"):
            return not (_is_name(prev) or pk in ("RPAR", "RSQB"))
        return True
