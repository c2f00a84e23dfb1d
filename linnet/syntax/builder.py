"""Builds the AST (`ast.py`) from lark's parse tree of one item.

The grammar keeps every token that bounds a rule (brackets, leading keywords), so a node's
span runs from its first child to its last. Lark's own position propagation is not used: it
triples the parse time. A parenthesised expression is its contents' node, with its contents'
span; the parentheses count as its first and last token in the spans of the nodes around it.
"""

from __future__ import annotations

from lark import Token, Transformer, Tree
from lark.exceptions import VisitError

from . import ast as A
from .ast import Span
from .literals import LiteralError, integer
from .literals import unquote as _unquote


def _start(x, parens: dict[int, Span]) -> int | None:
    if isinstance(x, Token):
        return x.start_pos
    if isinstance(x, A.Node):
        return parens.get(id(x), x.span).start
    if isinstance(x, list):
        for y in x:
            s = _start(y, parens)
            if s is not None:
                return s
    return None


def _end(x, parens: dict[int, Span]) -> int | None:
    if isinstance(x, Token):
        return x.end_pos
    if isinstance(x, A.Node):
        return parens.get(id(x), x.span).end
    if isinstance(x, list):
        for y in reversed(x):
            e = _end(y, parens)
            if e is not None:
                return e
    return None


def _tok_span(tok: Token) -> Span:
    return Span(tok.start_pos, tok.end_pos)


def _name(tok: Token) -> A.Name:
    return A.Name(_tok_span(tok), str(tok))


def _inner(c) -> list:
    """Children between a leading and a trailing bracket token."""
    return list(c[1:-1])


class Builder(Transformer):
    """lark Transformer: one method per named rule or alias of `grammar.lark`."""

    def __init__(self):
        super().__init__()
        # a parenthesised expression's node (by id: nodes compare by identity and live as long as the tree) -> the
        # span of its outermost parentheses
        self.parens: dict[int, Span] = {}

    def _outer(self, node: A.Node) -> Span:
        """`node`'s span with the parentheses around it."""
        return self.parens.get(id(node), node.span)

    def _span(self, children) -> Span:
        """From the first child that has a position to the last, a child's parentheses included."""
        parens = self.parens
        start = end = None
        for c in children:
            start = _start(c, parens)
            if start is not None:
                break
        for c in reversed(children):
            end = _end(c, parens)
            if end is not None:
                break
        if start is None or end is None:
            return Span(0, 0)
        return Span(start, end)

    def paren(self, c):
        lpar, node, rpar = c
        self.parens[id(node)] = Span(lpar.start_pos, rpar.end_pos)
        return node

    # ----- atoms
    def name(self, c):
        return _name(c[0])

    def int_lit(self, c):
        span = _tok_span(c[0])
        return A.IntLit(span, integer(str(c[0]), span))

    def float_lit(self, c):
        text = str(c[0])
        return A.FloatLit(_tok_span(c[0]), float(text.replace("_", "")), text)

    def str_lit(self, c):
        return A.StrLit(_tok_span(c[0]), _unquote(str(c[0])))

    def true_lit(self, c):
        return A.BoolLit(_tok_span(c[0]), True)

    def false_lit(self, c):
        return A.BoolLit(_tok_span(c[0]), False)

    def none_lit(self, c):
        return A.NoneLit(_tok_span(c[0]))

    def tuple_lit(self, c):
        return A.TupleLit(self._span(c), _inner(c))

    def list_lit(self, c):
        return A.ListLit(self._span(c), _inner(c))

    # ----- operators
    def neg(self, c):
        return A.Neg(self._span(c), c[1])

    def not_op(self, c):
        return A.Not(self._span(c), c[1])

    def binary(self, c):
        left, op, right = c
        return A.BinOp(self._span(c), str(op), left, right, _tok_span(op))

    def pow_op(self, c):
        left, right = c
        return A.BinOp(self._span(c), "**", left, right, self._gap(left, right))

    def and_op(self, c):
        return A.BinOp(self._span(c), "and", c[0], c[1], self._gap(c[0], c[1]))

    def or_op(self, c):
        return A.BinOp(self._span(c), "or", c[0], c[1], self._gap(c[0], c[1]))

    def _gap(self, left: A.Node, right: A.Node) -> Span:
        """The span of an operator written without a token of its own: between its operands' parentheses."""
        return Span(self._outer(left).end, self._outer(right).start)

    def compare(self, c):
        left, op, right = c
        return A.Compare(self._span(c), str(op), left, right, _tok_span(op))

    # ----- postfix
    def call(self, c):
        args = c[2] if len(c) == 4 else []
        return A.Call(self._span(c), c[0], args)

    def args(self, c):
        return [a if isinstance(a, A.Arg) else A.Arg(self._outer(a), None, a) for a in c]

    def kwarg(self, c):
        return A.Arg(self._span(c), _name(c[0]), c[1])

    def attr(self, c):
        return A.Attr(self._span(c), c[0], _name(c[1]))

    def index(self, c):
        return A.Index(self._span(c), c[0], list(c[2:-1]))

    def slice(self, c):
        start, _colon, stop = c
        return A.Slice(self._span(c), start, stop)

    def ellipsis_index(self, c):
        return A.EllipsisLit(_tok_span(c[0]))

    def if_expr(self, c):
        _if, cond, then, orelse = c
        return A.IfExpr(self._span(c), cond, then, orelse)

    # ----- statements
    def block(self, c):
        return A.Block(self._span(c), _inner(c))

    def let_stmt(self, c):
        _let, target, annotation, value = c
        if isinstance(target, list):
            return A.Let(self._span(c), target, annotation, value, is_tuple=True)
        return A.Let(self._span(c), [_name(target)], annotation, value)

    def let_tuple(self, c):
        return [_name(t) for t in c if t.type == "NAME"]

    def assign_stmt(self, c):
        return A.Assign(self._span(c), _name(c[0]), c[1])

    def for_stmt(self, c):
        _for, var, iterable, body = c
        return A.For(self._span(c), _name(var), iterable, body)

    def expr_stmt(self, c):
        return A.ExprStmt(self._outer(c[0]), c[0])

    # ----- types
    def tensor_type(self, c):
        dtype = _name(c[0]) if c[0] is not None else None
        return A.TensorType(self._span(c), dtype, list(c[2:-1]))

    def ellipsis_dim(self, c):
        return A.EllipsisDim(_tok_span(c[0]))

    def named_type(self, c):
        return A.NamedType(self._span(c), _name(c[0]))

    def optional_type(self, c):
        return A.NamedType(self._span(c), _name(c[0]), optional=True)

    def literal_type(self, c):
        # `"a" | "b"`, or one of `true` and `false`
        bools = ("TRUE", "FALSE")
        values = [
            A.BoolLit(_tok_span(t), str(t) == "true") if t.type in bools else A.StrLit(_tok_span(t), _unquote(str(t)))
            for t in c
            if t.type != "QMARK"
        ]
        return A.LiteralType(self._span(c), values, optional=c[-1].type == "QMARK")

    def tuple_type(self, c):
        return A.TupleType(self._span(c), _inner(c))

    def list_type(self, c):
        return A.ListType(self._span(c), c[2])

    # ----- items
    def attribute(self, c):
        args = c[3] if len(c) == 5 else []  # `@composite` has no parentheses, `@name()` none inside
        return A.Attribute(self._span(c), _name(c[1]), args)

    def attributes(self, c):
        return list(c)

    def param(self, c):
        return A.Param(self._span(c), _name(c[0]), c[1], c[2])

    def params(self, c):
        return _inner(c)

    def generics(self, c):
        return list(c)

    def generic(self, c):
        return A.Generic(self._span(c), _name(c[0]), _name(c[1]) if c[1] is not None else None)

    def fn_def(self, c):
        attrs, entry, _fn, name, generics, params, ret, body = c
        return A.FnDef(
            self._span(c),
            _name(name),
            params,
            ret,
            body,
            entry=entry is not None,
            generics=generics or [],
            attributes=attrs,
        )

    def members(self, c):
        return list(c)

    def field_decl(self, c):
        attrs, name, ftype = c
        span = self._span(c)
        if isinstance(ftype, A.TensorType):
            return A.FieldDecl(span, _name(name), "param", type=ftype, attributes=attrs)
        if isinstance(ftype, tuple) and ftype[0] == "list":
            return A.FieldDecl(
                Span(span.start, ftype[3]),
                _name(name),
                "list",
                ctor=ftype[1],
                count=ftype[2],
                index=ftype[4],
                attributes=attrs,
            )
        return A.FieldDecl(span, _name(name), "submodule", ctor=ftype, attributes=attrs)

    def ctor(self, c):
        args = c[2] if len(c) == 4 else []
        return A.Call(self._span(c), _name(c[0]), args)

    def submodule_type(self, c):
        return c[0]

    def submodule_list_type(self, c):
        _open, ctor, count, close = c
        return ("list", ctor, count, close.end_pos, None)

    def submodule_list_for(self, c):
        _open, ctor, _for, index, _range, _lpar, count, _rpar, close = c
        return ("list", ctor, count, close.end_pos, _name(index))

    def state_decl(self, c):
        attrs, _state, name, ttype = c
        return A.StateDecl(self._span(c), _name(name), ttype, attributes=attrs)

    def member_if(self, c):
        _if, cond, _open, then, close, orelse = c
        span = self._span([_if, close] + ([orelse[1]] if orelse else []))
        return A.MemberIf(span, cond, then, orelse[0] if orelse else [])

    def member_else(self, c):
        if len(c) == 1:  # `else if`: the nested conditional is the one member of the `else`
            return ([c[0]], c[0])
        _open, members, close = c
        return (members, close)

    def module_def(self, c):
        attrs, _kw, name, params, _open, members, _close = c
        return A.ModuleDef(self._span(c), _name(name), params, members, attributes=attrs)

    def model_def(self, c):
        attrs, _kw, name, params, _open, members, _close = c
        return A.ModuleDef(self._span(c), _name(name), params, members, is_model=True, attributes=attrs)

    def config_field(self, c):
        attrs, name, ftype, default = c
        return A.ConfigField(self._span(c), _name(name), ftype, default, attributes=attrs)

    def config_def(self, c):
        attrs, _kw, name, *fields = c
        return A.ConfigDef(self._span(c), _name(name), fields[1:-1], attributes=attrs)

    def record_lit(self, c):
        return A.RecordLit(self._span(c), _name(c[0]), list(c[2:-1]))

    def field_init(self, c):
        return A.FieldInit(self._span(c), _name(c[0]), c[1])

    def preset_def(self, c):
        attrs, _kw, name, value = c
        return A.PresetDef(self._span(c), _name(name), value, attributes=attrs)

    def import_def(self, c):
        names = next(x for x in c[3:] if isinstance(x, list))
        return A.ImportDef(self._span(c), c[1], names)

    def import_path(self, c):
        return A.StrLit(_tok_span(c[0]), _unquote(str(c[0])))

    def module_path(self, c):
        return A.ModulePath(self._span(c), [_name(t) for t in c])

    def import_names(self, c):
        return list(c)

    def import_name(self, c):
        name, _as, alias = c
        return A.ImportedName(self._span(c), _name(name), _name(alias) if alias is not None else None)

    def item_source(self, c):
        return c[0]


def build(tree: Tree) -> A.ItemDef:
    """Turn lark's tree for `item_source` into an item node. Raises LiteralError (located) for a literal whose
    value cannot be read (an integer past Python's digit limit)."""
    try:
        return Builder().transform(tree)
    except VisitError as err:  # lark wraps what a rule's method raises
        if isinstance(err.orig_exc, LiteralError):
            raise err.orig_exc from None
        raise
