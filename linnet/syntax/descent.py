"""The fast path of parsing one item: a recursive-descent parser that builds the AST (`ast.py`) in one pass.

lark's LALR parser (`lalr.py`) and the tree-to-AST transform (`builder.py`) run in Python once per rule and node;
on a 5 MB document that is most of `linnet check`'s parse. This parser reads the same grammar (`grammar.lark`)
with a compiled `re` tokenizer, one method per rule and precedence climbing for the operators, and builds the
nodes, with the spans lark's route gives them, as it goes: ~5x faster than lark's route
(bench/results/check_phases_parser.md).

It is a fast path, not a second parser: for any item it is not sure of (any syntax error, any construct or
contextual keyword whose reading it does not cover) it gives up (`parse_fast` returns None) and `parser.parse_item`
parses the item with lark. So `grammar.lark` stays the one specification of the syntax, and every syntax error,
its message, code, labels and recovery stay lark's. What it accepts it must build exactly as lark's route does:
tests/syntax/test_descent.py compares the two on every item of every `.linnet` file in the repository, on
mutations of them and on chains of operators (hypothesis), and requires the fast parser to give up wherever lark
reports an error.

Contextual keywords (see `lalr._KeywordLexer`): a keyword is a NAME where the LALR parser cannot take it but can
take a NAME. Here a keyword's spelling is read as a name only where the grammar admits no keyword at all, or only
the ones checked for (after `.`, `@`, `let`, `for`, an item keyword, in parameter and import lists, at the start
of an operand or of a member); elsewhere (a config field's name, a type, a dim, a name after an attribute) a
keyword's spelling gives up.
"""

from __future__ import annotations

import re

from . import ast as A
from .ast import Span
from .literals import LiteralError, integer, unquote

__all__ = ["parse_block", "parse_fast"]

# The lexer's terminals (grammar.lark's), first match wins as in lark's one alternation (linnet/syntax/lalr.py):
# only FLOAT and INT share a first character, and FLOAT comes first there too. Whitespace and a comment (ignored:
# a comment runs to the line's end) lead each match; BAD is a character no terminal matches, EOF the text's end.
_TOKEN = re.compile(
    r"""
    [\t \f\r]*+(?:\#[^\n]*+)?
    (?:
    (?P<NAME>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<OP>\.\.\.|->|==|!=|<=|>=|\*\*|//|[-+*/%@()\[\]{}:;,.<>=?|])
    |(?P<NL>(?:\r?\n[\t \f]*)+)
    |(?P<FLOAT>[0-9](?:_?[0-9])*\.[0-9](?:_?[0-9])*(?:[eE][+-]?[0-9]+)?|[0-9](?:_?[0-9])*[eE][+-]?[0-9]+)
    |(?P<INT>[0-9](?:_?[0-9])*)
    |(?P<STRING>"(?:[^"\\\n]|\\.)*")
    |(?P<EOF>\Z)
    |(?P<BAD>.)
    )
    """,
    re.VERBOSE,
)

# Words the grammar spells as terminals (grammar.lark's keyword strings).
KEYWORDS = frozenset(
    "let for if not fn module model config preset from import as state list range true false none entry in else "
    "or and".split()
)
_LITERALS = {"true": True, "false": False}
_EXPR_KEYWORDS = frozenset(("if", "not", "true", "false", "none"))
# binding power of the binary operators (grammar.lark's levels: or_expr, and_expr, comparison, sum, product; the
# prefix `not` binds between and_expr and comparison, 3); a dim (`dim_sum`) has only sums and products
_PRECEDENCE = {"or": 1, "and": 2, **dict.fromkeys(("==", "!=", "<=", ">=", "<", ">"), 4)}
_DIM_PRECEDENCE = {**dict.fromkeys(("+", "-"), 5), **dict.fromkeys(("*", "/", "//", "%", "@"), 6)}
_PRECEDENCE.update(_DIM_PRECEDENCE)
_NOT, _COMPARE = 3, 4
_new = tuple.__new__  # Span(start, end) without the NamedTuple's Python-level __new__: a third of a span's cost


class _GiveUp(Exception):
    """The item is not one the fast parser is sure of: lark's route parses it."""


def _tokens(text: str) -> tuple[list[str], list[str], list[int], list[int]]:
    """`text`'s tokens as the lexer and post-lexer (`lalr._NewlinePostLex`) pass them on: kinds (NAME, INT, FLOAT,
    STRING, NL, EOF, or the punctuation itself), texts, start and end offsets. Newlines inside ( ) and [ ] are
    dropped and runs of them collapsed, the leading ones too. Raises _GiveUp at a character no terminal matches."""
    kinds: list[str] = []
    texts: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    add_kind, add_text, add_start, add_end = kinds.append, texts.append, starts.append, ends.append
    stack: list[str] = []
    last_nl = True
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        start, end = m.span(kind)
        token = text[start:end]
        if kind == "NAME":
            last_nl = False
        elif kind == "OP":
            kind = token
            last_nl = False
            if token in "([{":
                stack.append(token)
            elif token in ")]}" and stack:
                stack.pop()
        elif kind == "NL":
            if last_nl or (stack and stack[-1] != "{"):
                continue
            last_nl = True
        elif kind == "BAD":
            raise _GiveUp
        else:
            last_nl = False
        add_kind(kind)
        add_text(token)
        add_start(start)
        add_end(end)
    return kinds, texts, starts, ends


class _Parser:
    """One item's tokens and the position in them; one method per rule of grammar.lark."""

    __slots__ = ("kinds", "texts", "starts", "ends", "i")

    def __init__(self, text: str, offset: int = 0):
        """`text`'s tokens, at offsets `offset` on (the text is a part of an item's, from there)."""
        self.kinds, self.texts, self.starts, self.ends = _tokens(text)
        if offset:
            self.starts = [start + offset for start in self.starts]
            self.ends = [end + offset for end in self.ends]
        self.i = 0

    # ----- tokens

    def expect(self, kind: str) -> int:
        """Consume a token of `kind` (or give up); its index."""
        i = self.i
        if self.kinds[i] != kind:
            raise _GiveUp
        self.i = i + 1
        return i

    def accept(self, kind: str) -> bool:
        if self.kinds[self.i] == kind:
            self.i += 1
            return True
        return False

    def word(self, text: str) -> bool:
        """Consume the keyword `text` if it is next."""
        i = self.i
        if self.kinds[i] == "NAME" and self.texts[i] == text:
            self.i = i + 1
            return True
        return False

    def name(self) -> A.Name:
        """A NAME where the grammar admits no keyword (any word's spelling is a name there)."""
        i = self.i
        if self.kinds[i] != "NAME":
            raise _GiveUp
        self.i = i + 1
        return A.Name(_new(Span, (self.starts[i], self.ends[i])), self.texts[i])

    def plain_name(self) -> A.Name:
        """A NAME where some keyword could stand: one spelled like a keyword gives up."""
        if self.texts[self.i] in KEYWORDS:
            raise _GiveUp
        return self.name()

    def listed(self, parse_one, close: str) -> list:
        """`one ("," one)* ","?` before `close` (left for the caller): what `parse_one` parses, one or more."""
        items = [parse_one()]
        kinds = self.kinds
        while kinds[self.i] == ",":
            self.i += 1
            if kinds[self.i] == close:
                break
            items.append(parse_one())
        return items

    def nl(self) -> None:
        if self.kinds[self.i] == "NL":
            self.i += 1

    # ----- items

    def item_source(self) -> A.ItemDef:
        attrs = self.attributes()
        kinds, texts = self.kinds, self.texts
        i = self.i
        word = texts[i] if kinds[i] == "NAME" else None
        if word == "from" and not attrs:
            item = self.import_def()
        elif word == "config":
            item = self.config_def(attrs)
        elif word == "preset":
            item = self.preset_def(attrs)
        elif word == "module" or word == "model":
            item = self.module_def(attrs)
        elif word == "fn" or word == "entry":
            item = self.fn_def(attrs)
        else:
            raise _GiveUp
        self.nl()
        if kinds[self.i] != "EOF":
            raise _GiveUp
        return item

    def attributes(self) -> list[A.Attribute]:
        attrs = []
        kinds = self.kinds
        while kinds[self.i] == "@":
            at = self.i
            self.i += 1
            name = self.name()
            end = name.span.end
            args: list[A.Arg] = []
            if kinds[self.i] == "(":
                self.i += 1
                if kinds[self.i] != ")":
                    args = self.args()
                end = self.ends[self.expect(")")]
            self.nl()
            attrs.append(A.Attribute(_new(Span, (self.starts[at], end)), name, args))
        return attrs

    def import_def(self) -> A.ImportDef:
        start = self.starts[self.i]
        self.i += 1  # `from`
        source: A.StrLit | A.ModulePath
        if self.kinds[self.i] == "STRING":
            i = self.i
            self.i += 1
            source = A.StrLit(_new(Span, (self.starts[i], self.ends[i])), unquote(self.texts[i]))
        else:
            parts = [self.name()]
            while self.accept("."):
                parts.append(self.name())
            source = A.ModulePath(_new(Span, (parts[0].span.start, parts[-1].span.end)), parts)
        if not self.word("import"):
            raise _GiveUp
        if self.accept("("):
            names = self.import_names()
            end = self.ends[self.expect(")")]
        else:
            names = self.import_names()
            end = names[-1].span.end
        return A.ImportDef(_new(Span, (start, end)), source, names)

    def import_names(self) -> list[A.ImportedName]:
        names = [self.import_name()]
        while self.accept(","):
            if self.kinds[self.i] != "NAME":
                break  # a trailing comma
            names.append(self.import_name())
        return names

    def import_name(self) -> A.ImportedName:
        name = self.name()
        alias = None
        if self.word("as"):
            alias = self.name()
        return A.ImportedName(_new(Span, (name.span.start, (alias or name).span.end)), name, alias)

    def config_def(self, attrs: list[A.Attribute]) -> A.ConfigDef:
        kw = self.i
        self.i += 1
        name = self.name()
        fields, end = self.braced(self.config_field)
        return A.ConfigDef(_new(Span, (self._start(attrs, kw), end)), name, fields, attributes=attrs)

    def config_field(self) -> A.ConfigField:
        attrs = self.attributes()
        name = self.plain_name()
        self.expect(":")
        ftype = self.type()
        default = None
        if self.accept("="):
            default = self.config_value()
        start = attrs[0].span.start if attrs else name.span.start
        return A.ConfigField(_new(Span, (start, self.ends[self.i - 1])), name, ftype, default, attributes=attrs)

    def config_value(self) -> A.Expr | A.RecordLit:
        i = self.i
        if self.kinds[i] == "NAME" and self.kinds[i + 1] == "{" and self.texts[i] not in _EXPR_KEYWORDS:
            return self.record_lit()
        return self.expr()

    def record_lit(self) -> A.RecordLit:
        type_name = self.name()
        fields, end = self.braced(self.field_init)
        return A.RecordLit(_new(Span, (type_name.span.start, end)), type_name, fields)

    def field_init(self) -> A.FieldInit:
        name = self.name()
        self.expect("=")
        value = self.config_value()
        return A.FieldInit(_new(Span, (name.span.start, self.ends[self.i - 1])), name, value)

    def braced(self, parse_one) -> tuple[list, int]:
        """`{ _NL? (one (_sep one)* _sep?)? }` (`_sep`: a comma and a new line, or either): what `parse_one` parses,
        and where the `}` ends."""
        self.expect("{")
        self.nl()
        items = []
        kinds = self.kinds
        while kinds[self.i] != "}":
            items.append(parse_one())
            if self.accept(","):
                self.nl()
            elif not self.accept("NL"):
                break
        return items, self.ends[self.expect("}")]

    def preset_def(self, attrs: list[A.Attribute]) -> A.PresetDef:
        kw = self.i
        self.i += 1
        name = self.name()
        self.expect("=")
        value = self.record_lit()
        return A.PresetDef(_new(Span, (self._start(attrs, kw), value.span.end)), name, value, attributes=attrs)

    def _start(self, attrs: list[A.Attribute], token: int) -> int:
        return attrs[0].span.start if attrs else self.starts[token]

    def module_def(self, attrs: list[A.Attribute]) -> A.ModuleDef:
        kw = self.i
        is_model = self.texts[kw] == "model"
        self.i += 1
        name = self.name()
        params = self.params()
        self.expect("{")
        self.nl()
        members = self.members()
        end = self.ends[self.expect("}")]
        return A.ModuleDef(
            _new(Span, (self._start(attrs, kw), end)), name, params, members, is_model=is_model, attributes=attrs
        )

    def params(self) -> list[A.Param]:
        self.expect("(")
        params = []
        kinds = self.kinds
        while kinds[self.i] != ")":
            name = self.name()
            self.expect(":")
            ptype = self.type()
            default = self.expr() if self.accept("=") else None
            params.append(A.Param(_new(Span, (name.span.start, self.ends[self.i - 1])), name, ptype, default))
            if not self.accept(","):
                break
        self.expect(")")
        return params

    def members(self) -> list[A.Member]:
        return self.lines(self.member)

    def lines(self, parse_one) -> list:
        """`(one (_NL one)* _NL?)?` before a `}` (left for the caller): what `parse_one` parses."""
        items = []
        kinds = self.kinds
        while kinds[self.i] != "}":
            items.append(parse_one())
            if not self.accept("NL"):
                break
        return items

    def member(self) -> A.Member:
        attrs = self.attributes()
        i = self.i
        if self.kinds[i] != "NAME":
            raise _GiveUp
        word = self.texts[i]
        if word == "fn" or word == "entry":
            return self.fn_def(attrs)
        if word == "state":
            self.i += 1
            name = self.name()
            self.expect(":")
            ttype = self.tensor_type()
            return A.StateDecl(_new(Span, (self._start(attrs, i), ttype.span.end)), name, ttype, attributes=attrs)
        if word == "if" and not attrs:
            return self.member_if()
        # where a member starts only `state`, `fn`, `entry` and `if` are keywords (`model: LlamaModel(c)`); after an
        # attribute, an item's keywords are too (LALR merges the states after an attribute of items and members)
        name = self.plain_name() if attrs else self.name()
        self.expect(":")
        return self.field_decl(attrs, name)

    def member_if(self) -> A.MemberIf:
        start = self.starts[self.i]
        self.i += 1  # `if`
        cond = self.expr()
        self.expect("{")
        self.nl()
        then = self.members()
        end = self.ends[self.expect("}")]
        orelse: list[A.Member] = []
        if self.word("else"):
            if self.word("if"):
                self.i -= 1
                nested = self.member_if()
                orelse, end = [nested], nested.span.end
            else:
                self.expect("{")
                self.nl()
                orelse = self.members()
                end = self.ends[self.expect("}")]
        return A.MemberIf(_new(Span, (start, end)), cond, then, orelse)

    def field_decl(self, attrs: list[A.Attribute], name: A.Name) -> A.FieldDecl:
        start = attrs[0].span.start if attrs else name.span.start
        kinds = self.kinds
        i = self.i
        if kinds[i] == "[" and kinds[i + 1] == "NAME" and kinds[i + 2] == "(":
            self.i += 1
            ctor = self.ctor()
            index = None
            if self.accept(";"):
                count = self.expr()
            elif self.word("for"):
                index = self.name()
                if not self.word("in") or not self.word("range"):
                    raise _GiveUp
                self.expect("(")
                count = self.expr()
                self.expect(")")
            else:
                raise _GiveUp
            end = self.ends[self.expect("]")]
            return A.FieldDecl(
                _new(Span, (start, end)), name, "list", ctor=ctor, count=count, index=index, attributes=attrs
            )
        if kinds[i] == "NAME" and kinds[i + 1] == "(":
            ctor = self.ctor()
            return A.FieldDecl(_new(Span, (start, ctor.span.end)), name, "submodule", ctor=ctor, attributes=attrs)
        ttype = self.tensor_type()
        return A.FieldDecl(_new(Span, (start, ttype.span.end)), name, "param", type=ttype, attributes=attrs)

    def ctor(self) -> A.Call:
        func = self.plain_name()
        self.expect("(")
        args = self.args() if self.kinds[self.i] != ")" else []
        end = self.ends[self.expect(")")]
        return A.Call(_new(Span, (func.span.start, end)), func, args)

    def fn_def(self, attrs: list[A.Attribute]) -> A.FnDef:
        first = self.i
        entry = self.word("entry")
        if not self.word("fn"):
            raise _GiveUp
        name = self.name()
        generics = []
        if self.accept("<"):
            while True:
                gname = self.name()
                kind = self.name() if self.accept(":") else None
                generics.append(A.Generic(_new(Span, (gname.span.start, (kind or gname).span.end)), gname, kind))
                if not self.accept(","):
                    break
            self.expect(">")
        params = self.params()
        ret = self.type() if self.accept("->") else None
        body = self.block()
        return A.FnDef(
            _new(Span, (self._start(attrs, first), body.span.end)),
            name,
            params,
            ret,
            body,
            entry=entry,
            generics=generics,
            attributes=attrs,
        )

    # ----- types

    def type(self) -> A.Type:
        kinds, texts = self.kinds, self.texts
        i = self.i
        kind = kinds[i]
        if kind == "[":
            return self.tensor_type()
        if kind == "STRING":
            values = []
            while True:
                j = self.expect("STRING")
                values.append(A.StrLit(_new(Span, (self.starts[j], self.ends[j])), unquote(texts[j])))
                if not self.accept("|"):
                    break
            return A.LiteralType(_new(Span, (values[0].span.start, values[-1].span.end)), values)
        if kind == "(":
            self.i += 1
            items = self.listed(self.type, ")")
            end = self.ends[self.expect(")")]
            if len(items) < 2:
                raise _GiveUp
            return A.TupleType(_new(Span, (self.starts[i], end)), items)
        if kind != "NAME":
            raise _GiveUp
        word = texts[i]
        if word == "list":
            self.i += 1
            self.expect("[")
            item = self.type()
            end = self.ends[self.expect("]")]
            return A.ListType(_new(Span, (self.starts[i], end)), item)
        if word in _LITERALS:
            self.i += 1
            value = A.BoolLit(_new(Span, (self.starts[i], self.ends[i])), _LITERALS[word])
            optional = self.accept("?")
            return A.LiteralType(_new(Span, (self.starts[i], self.ends[self.i - 1])), [value], optional=optional)
        if kinds[i + 1] == "[":
            return self.tensor_type()
        name = self.plain_name()
        if self.accept("?"):
            return A.NamedType(_new(Span, (name.span.start, self.ends[self.i - 1])), name, optional=True)
        return A.NamedType(name.span, name)

    def tensor_type(self) -> A.TensorType:
        start = self.starts[self.i]
        dtype = self.plain_name() if self.kinds[self.i] == "NAME" else None
        self.expect("[")
        dims: list[A.Expr | A.EllipsisDim] = []
        kinds = self.kinds
        while kinds[self.i] != "]":
            if kinds[self.i] == "...":
                j = self.i
                self.i += 1
                dims.append(A.EllipsisDim(_new(Span, (self.starts[j], self.ends[j]))))
            else:
                dims.append(self.binary(5, _DIM_PRECEDENCE))
            if not self.accept(","):
                break
        end = self.ends[self.expect("]")]
        return A.TensorType(_new(Span, (start, end)), dtype, dims)

    def dim_unary(self) -> A.Expr:
        i = self.i
        kind = self.kinds[i]
        if kind == "-":
            self.i += 1
            operand = self.dim_unary()
            return A.Neg(_new(Span, (self.starts[i], self.ends[self.i - 1])), operand)
        if kind == "NAME":
            node: A.Expr = self.plain_name()
        elif kind == "INT":
            self.i += 1
            span = _new(Span, (self.starts[i], self.ends[i]))
            node = A.IntLit(span, integer(self.texts[i], span))
        elif kind == "(":
            self.i += 1
            node = self.binary(5, _DIM_PRECEDENCE)
            self.expect(")")
        else:
            raise _GiveUp
        while self.accept("."):
            attr = self.name()
            node = A.Attr(_new(Span, (self.starts[i], attr.span.end)), node, attr)
        return node

    # ----- statements

    def block(self) -> A.Block:
        start = self.starts[self.expect("{")]
        self.nl()
        stmts = self.lines(self.stmt)
        end = self.ends[self.expect("}")]
        return A.Block(_new(Span, (start, end)), stmts)

    def stmt(self) -> A.Stmt:
        i = self.i
        kinds, texts = self.kinds, self.texts
        if kinds[i] == "NAME":
            word = texts[i]
            if word == "let":
                return self.let_stmt()
            if word == "for":
                self.i += 1
                var = self.name()
                if not self.word("in"):
                    raise _GiveUp
                iterable = self.expr()
                body = self.block()
                return A.For(_new(Span, (self.starts[i], body.span.end)), var, iterable, body)
            if kinds[i + 1] == "=" and word not in _EXPR_KEYWORDS:
                self.i += 2
                value = self.expr()
                target = A.Name(_new(Span, (self.starts[i], self.ends[i])), word)
                return A.Assign(_new(Span, (self.starts[i], self.ends[self.i - 1])), target, value)
        expr = self.expr()
        return A.ExprStmt(_new(Span, (self.starts[i], self.ends[self.i - 1])), expr)

    def let_stmt(self) -> A.Let:
        start = self.starts[self.i]
        self.i += 1  # `let`
        is_tuple = self.accept("(")
        if is_tuple:
            targets = [self.name()]
            while self.accept(","):
                if self.kinds[self.i] == ")":
                    break
                targets.append(self.name())
            self.expect(")")
            if len(targets) < 2:
                raise _GiveUp
        else:
            targets = [self.name()]
        annotation = self.type() if self.accept(":") else None
        self.expect("=")
        value = self.expr()
        return A.Let(_new(Span, (start, self.ends[self.i - 1])), targets, annotation, value, is_tuple=is_tuple)

    # ----- expressions, lowest precedence first

    def expr(self) -> A.Expr:
        i = self.i
        if self.kinds[i] == "NAME" and self.texts[i] == "if":
            return self.if_expr()
        return self.binary(1)

    def if_expr(self) -> A.IfExpr:
        start = self.starts[self.i]
        self.i += 1  # `if`
        cond = self.expr()
        then = self.block()
        orelse: A.Block | A.IfExpr | None = None
        if self.word("else"):
            i = self.i
            if self.kinds[i] == "NAME" and self.texts[i] == "if":
                orelse = self.if_expr()
            else:
                orelse = self.block()
        return A.IfExpr(_new(Span, (start, (orelse or then).span.end)), cond, then, orelse)

    def binary(self, min_power: int, powers: dict[str, int] = _PRECEDENCE) -> A.Expr:
        """The operators of `powers` binding at least `min_power` (precedence climbing over grammar.lark's levels:
        left-associative, a comparison not chained); `powers` is `_DIM_PRECEDENCE` in a dim, whose operands are
        `dim_unary`'s."""
        kinds, texts, starts, ends = self.kinds, self.texts, self.starts, self.ends
        i = self.i
        if min_power <= _NOT and kinds[i] == "NAME" and texts[i] == "not":
            self.i = i + 1
            operand = self.binary(_NOT)
            left = A.Not(_new(Span, (starts[i], ends[self.i - 1])), operand)
        elif powers is _DIM_PRECEDENCE:
            left = self.dim_unary()
        elif kinds[i] == "-":
            left = self.unary()
        else:  # `unary` without the call: most operands are a postfix expression
            left = self.postfix()
            if kinds[self.i] == "**":
                left = self.power(left, i)
        while True:
            op = self.i
            kind = kinds[op]
            power = powers.get(texts[op] if kind == "NAME" else kind)
            if power is None or power < min_power:
                return left
            self.i = op + 1
            right = self.binary(power + 1, powers)
            span = _new(Span, (starts[i], ends[self.i - 1]))
            if power == _COMPARE:
                left = A.Compare(span, kind, left, right, _new(Span, (starts[op], ends[op])))
                if powers.get(kinds[self.i]) == _COMPARE:
                    raise _GiveUp  # `a < b < c`: comparisons do not chain
            elif power < _NOT:  # `and`, `or`: the operator's span is the gap between the operands
                left = A.BinOp(span, texts[op], left, right, _new(Span, (ends[op - 1], starts[op + 1])))
            else:
                left = A.BinOp(span, kind, left, right, _new(Span, (starts[op], ends[op])))

    def unary(self) -> A.Expr:
        i = self.i
        if self.kinds[i] == "-":
            self.i += 1
            operand = self.unary()
            return A.Neg(_new(Span, (self.starts[i], self.ends[self.i - 1])), operand)
        left = self.postfix()
        return self.power(left, i) if self.kinds[self.i] == "**" else left

    def power(self, left: A.Expr, first: int) -> A.BinOp:
        """`left ** unary`, at the `**`; `left` starts at token `first`."""
        op = self.i
        self.i += 1
        right = self.unary()
        starts, ends = self.starts, self.ends
        gap = _new(Span, (ends[op - 1], starts[op + 1]))
        return A.BinOp(_new(Span, (starts[first], ends[self.i - 1])), "**", left, right, gap)

    def postfix(self) -> A.Expr:
        kinds, texts, starts, ends = self.kinds, self.texts, self.starts, self.ends
        first = i = self.i
        if kinds[i] == "NAME" and texts[i] not in KEYWORDS:  # `atom`'s most common case, without the call
            self.i = i + 1
            node = A.Name(_new(Span, (starts[i], ends[i])), texts[i])
        else:
            node = self.atom()
        while True:
            i = self.i
            kind = kinds[i]
            if kind == ".":
                if kinds[i + 1] != "NAME":
                    raise _GiveUp
                self.i = i + 2
                attr = A.Name(_new(Span, (starts[i + 1], ends[i + 1])), texts[i + 1])
                node = A.Attr(_new(Span, (starts[first], ends[i + 1])), node, attr)
            elif kind == "(":
                self.i += 1
                args = self.args() if kinds[self.i] != ")" else []
                end = self.ends[self.expect(")")]
                node = A.Call(_new(Span, (starts[first], end)), node, args)
            elif kind == "[":
                self.i += 1
                items = self.listed(self.index_item, "]")
                end = self.ends[self.expect("]")]
                node = A.Index(_new(Span, (starts[first], end)), node, items)
            else:
                return node

    def index_item(self) -> A.Expr | A.Slice | A.EllipsisLit:
        i = self.i
        kinds = self.kinds
        if kinds[i] == "...":
            self.i += 1
            return A.EllipsisLit(_new(Span, (self.starts[i], self.ends[i])))
        start = None if kinds[i] == ":" else self.expr()
        if kinds[self.i] != ":":
            return start
        self.i += 1  # `:`
        stop = None if kinds[self.i] in (",", "]") else self.expr()
        return A.Slice(_new(Span, (self.starts[i], self.ends[self.i - 1])), start, stop)

    def args(self) -> list[A.Arg]:
        args = []
        kinds, texts = self.kinds, self.texts
        while True:
            i = self.i
            if kinds[i] == "NAME" and kinds[i + 1] == "=" and texts[i] not in _EXPR_KEYWORDS:
                self.i += 2
                value = self.expr()
                name = A.Name(_new(Span, (self.starts[i], self.ends[i])), texts[i])
                args.append(A.Arg(_new(Span, (self.starts[i], self.ends[self.i - 1])), name, value))
            else:
                value = self.expr()
                args.append(A.Arg(_new(Span, (self.starts[i], self.ends[self.i - 1])), None, value))
            if not self.accept(",") or kinds[self.i] == ")":
                return args

    def atom(self) -> A.Expr:
        i = self.i
        kind = self.kinds[i]
        span = _new(Span, (self.starts[i], self.ends[i]))
        text = self.texts[i]
        if kind == "NAME":
            self.i += 1
            if text in KEYWORDS:
                if text == "true" or text == "false":
                    return A.BoolLit(span, text == "true")
                if text == "none":
                    return A.NoneLit(span)
                if text == "if" or text == "not":
                    raise _GiveUp  # a keyword where an operand starts: lark reads it as a name
            return A.Name(span, text)
        if kind == "INT":
            self.i += 1
            return A.IntLit(span, integer(text, span))
        if kind == "FLOAT":
            self.i += 1
            return A.FloatLit(span, float(text.replace("_", "")), text)
        if kind == "STRING":
            self.i += 1
            return A.StrLit(span, unquote(text))
        if kind == "(":
            self.i += 1
            first = self.expr()
            if self.accept(")"):
                return first
            self.expect(",")
            items = [first] if self.kinds[self.i] == ")" else [first, *self.listed(self.expr, ")")]
            end = self.ends[self.expect(")")]
            return A.TupleLit(_new(Span, (span.start, end)), items)
        if kind == "[":
            self.i += 1
            items = [] if self.kinds[self.i] == "]" else self.listed(self.expr, "]")
            end = self.ends[self.expect("]")]
            return A.ListLit(_new(Span, (span.start, end)), items)
        raise _GiveUp


def parse_fast(text: str) -> A.ItemDef | None:
    """The AST of one item's `text` (lexable: no lone `\\r`, `positions.lexable`), with item-relative spans, as lark's
    route builds it without its doc comments (`parser._attach_docs`); None when the fast parser is not sure of the
    item (a syntax error, or a construct it leaves to lark; an integer past Python's digit limit: lark's route
    reports it). Never raises."""
    try:
        return _Parser(text).item_source()
    except (_GiveUp, LiteralError, RecursionError, IndexError, ValueError):
        return None


def parse_block(text: str, start: int, end: int) -> A.Block | None:
    """The block (`{ ... }`, a function's body) that is `text[start:end]` (lexable), with spans relative to `text`, as
    `parse_fast` builds it in the whole of `text`; None when the fast parser is not sure of it (as `parse_fast`) or
    the part is not exactly one block. Never raises.

    The same as in the whole text because the tokens of the part are: a block starts with `{` and ends with its `}`,
    and every bracket between is matched by the grammar, so the lexer's bracket stack (what drops newlines inside
    `( )` and `[ ]`) is the same inside it whatever encloses it; and the parse of a block reads no token after its
    `}`. Used to re-parse one edited function body of a module (`splice.splice_body`)."""
    try:
        parser = _Parser(text[start:end], start)
        block = parser.block()
        return block if parser.kinds[parser.i] == "EOF" else None
    except (_GiveUp, LiteralError, RecursionError, IndexError, ValueError):
        return None
