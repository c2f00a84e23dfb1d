"""lark's LALR parser for one top-level item: Linnet's grammar (`grammar.lark`), its lexer and post-lexer.

Kept apart from `parser.py` so that importing the front end does not import lark (~35 ms of a language server's
start, plus ~10 ms to load the parser's tables): `parser.parse_item` imports this module only for an item's text
that is not in its parse cache (`parser.set_parse_cache`; the language server's is `linnet.lsp.parses`) and that
the fast parser (`descent.py`) gives up on: one with a syntax error, or a construct it leaves to lark.
"""

from __future__ import annotations

from functools import lru_cache

from .optional import OPTIONAL_FOR_LARK, without_optional
from .parser import GRAMMAR_PATH

with without_optional(OPTIONAL_FOR_LARK):  # before anything imports lark: our grammar asks for neither
    from lark import Lark
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
    from lark.lexer import BasicLexer

__all__ = ["UnexpectedCharacters", "UnexpectedEOF", "UnexpectedInput", "UnexpectedToken", "lark_parser"]


class _NewlinePostLex:
    """Drops newlines inside ( ) and [ ], and collapses runs of newlines into one."""

    always_accept = ("_NL",)

    def process(self, stream):
        # Tokens are passed on at once: the contextual lexer picks the terminals for the next
        # token from the parser state, so holding a newline back would mislex what follows.
        stack: list[str] = []
        last_nl = True
        for tok in stream:
            kind = tok.type
            if kind == "_NL":
                if (stack and stack[-1] != "{") or last_nl:
                    continue
                last_nl = True
                yield tok
                continue
            last_nl = False
            if kind in ("LPAR", "LSQB", "LBRACE"):
                stack.append({"LPAR": "(", "LSQB": "[", "LBRACE": "{"}[kind])
            elif kind in ("RPAR", "RSQB", "RBRACE") and stack:
                stack.pop()
            yield tok


class _KeywordLexer(BasicLexer):
    """lark's basic lexer, with keywords that are contextual: a keyword token the parser
    cannot take where it stands becomes a NAME (`model.layers`, `self(x)`), as with lark's
    contextual lexer. That lexer compiles one regex per parser state on first use, which
    costs ~90 ms per process; this one compiles one regex in all."""

    __future_interface__ = 2

    def __init__(self, conf, comparator=None):
        super().__init__(conf, comparator)
        self.keywords = {t.name for t in conf.terminals if t.pattern.type == "str" and t.pattern.value.isidentifier()}

    def next_token(self, lex_state, parser_state=None):
        tok = super().next_token(lex_state, parser_state)
        if tok.type in self.keywords and parser_state is not None:
            actions = parser_state.parse_conf.parse_table.states[parser_state.position]
            if tok.type not in actions and "NAME" in actions:
                tok.type = "NAME"
        return tok


@lru_cache(maxsize=1)
def lark_parser() -> Lark:
    """The LALR parser for one item. Its tables are cached by lark in the temp directory
    (keyed by the grammar's hash), which makes a cold start about 15 ms instead of 300."""
    return Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        lexer=_KeywordLexer,
        start="item_source",
        postlex=_NewlinePostLex(),
        propagate_positions=False,
        maybe_placeholders=True,
        cache=True,
    )
