"""Builds the AST (`ast.py`) from lark's parse tree of one item."""

from __future__ import annotations

import ast as pyast

from lark import Token, Transformer, Tree, v_args

from . import ast as A
from .ast import Span


def _tok_span(tok: Token) -> Span:
    return Span(tok.start_pos, tok.end_pos)


def _span(meta) -> Span:
    if getattr(meta, "empty", True):
        return Span(0, 0)
    return Span(meta.start_pos, meta.end_pos)


def _name(tok: Token) -> A.Name:
    return A.Name(_tok_span(tok), str(tok))


def _cover(*nodes) -> Span:
    spans = [n.span for n in nodes if n is not None]
    return Span(min(s.start for s in spans), max(s.end for s in spans))


def _unquote(text: str) -> str:
    try:
        return pyast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text[1:-1]


@v_args(meta=True)
class Builder(Transformer):
    """lark Transformer: one method per named rule or alias of `grammar.lark`."""

    # ----- atoms
    def name(self, meta, c):
        return _name(c[0])

    def int_lit(self, meta, c):
        return A.IntLit(_tok_span(c[0]), int(str(c[0]).replace("_", "")))

    def float_lit(self, meta, c):
        text = str(c[0])
        return A.FloatLit(_tok_span(c[0]), float(text.replace("_", "")), text)

    def str_lit(self, meta, c):
        return A.StrLit(_tok_span(c[0]), _unquote(str(c[0])))

    def true_lit(self, meta, c):
        return A.BoolLit(_span(meta), True)

    def false_lit(self, meta, c):
        return A.BoolLit(_span(meta), False)

    def none_lit(self, meta, c):
        return A.NoneLit(_span(meta))

    def tuple_lit(self, meta, c):
        return A.TupleLit(_span(meta), list(c))

    def list_lit(self, meta, c):
        return A.ListLit(_span(meta), list(c))

    # ----- operators
    def neg(self, meta, c):
        return A.Neg(_span(meta), c[0])

    def not_op(self, meta, c):
        return A.Not(_span(meta), c[0])

    def binary(self, meta, c):
        left, op, right = c
        return A.BinOp(_span(meta), str(op), left, right, _tok_span(op))

    def pow_op(self, meta, c):
        left, right = c
        op_start = left.span.end
        return A.BinOp(_span(meta), "**", left, right, Span(op_start, right.span.start))

    def and_op(self, meta, c):
        return A.BinOp(_span(meta), "and", c[0], c[1], Span(c[0].span.end, c[1].span.start))

    def or_op(self, meta, c):
        return A.BinOp(_span(meta), "or", c[0], c[1], Span(c[0].span.end, c[1].span.start))

    def compare(self, meta, c):
        left, op, right = c
        return A.Compare(_span(meta), str(op), left, right, _tok_span(op))

    # ----- postfix
    def call(self, meta, c):
        func = c[0]
        args = c[1] if len(c) > 1 and c[1] is not None else []
        return A.Call(_span(meta), func, args)

    def args(self, meta, c):
        out = []
        for a in c:
            out.append(a if isinstance(a, A.Arg) else A.Arg(a.span, None, a))
        return out

    def kwarg(self, meta, c):
        return A.Arg(_span(meta), _name(c[0]), c[1])

    def attr(self, meta, c):
        return A.Attr(_span(meta), c[0], _name(c[1]))

    def index(self, meta, c):
        return A.Index(_span(meta), c[0], list(c[1:]))

    def slice(self, meta, c):
        return A.Slice(_span(meta), c[0], c[1])

    def ellipsis_index(self, meta, c):
        return A.EllipsisLit(_tok_span(c[0]))

    def if_expr(self, meta, c):
        return A.IfExpr(_span(meta), c[0], c[1], c[2])

    # ----- statements
    def block(self, meta, c):
        return A.Block(_span(meta), list(c))

    def let_stmt(self, meta, c):
        target, annotation, value = c
        if isinstance(target, list):
            return A.Let(_span(meta), target, annotation, value, is_tuple=True)
        return A.Let(_span(meta), [_name(target)], annotation, value)

    def let_tuple(self, meta, c):
        return [_name(t) for t in c]

    def assign_stmt(self, meta, c):
        return A.Assign(_span(meta), _name(c[0]), c[1])

    def for_stmt(self, meta, c):
        return A.For(_span(meta), _name(c[0]), c[1], c[2])

    def expr_stmt(self, meta, c):
        return A.ExprStmt(c[0].span, c[0])

    # ----- types
    def tensor_type(self, meta, c):
        dtype = _name(c[0]) if c[0] is not None else None
        return A.TensorType(_span(meta), dtype, list(c[1:]))

    def ellipsis_dim(self, meta, c):
        return A.EllipsisDim(_tok_span(c[0]))

    def named_type(self, meta, c):
        return A.NamedType(_span(meta), _name(c[0]))

    def optional_type(self, meta, c):
        return A.NamedType(_span(meta), _name(c[0]), optional=True)

    def literal_type(self, meta, c):
        return A.LiteralType(_span(meta), [A.StrLit(_tok_span(t), _unquote(str(t))) for t in c])

    def tuple_type(self, meta, c):
        return A.TupleType(_span(meta), list(c))

    # ----- items
    def attribute(self, meta, c):
        args = c[1] if len(c) > 1 and c[1] is not None else []
        return A.Attribute(_span(meta), _name(c[0]), args)

    def attributes(self, meta, c):
        return list(c)

    def param(self, meta, c):
        return A.Param(_span(meta), _name(c[0]), c[1], c[2])

    def params(self, meta, c):
        return list(c)

    def generics(self, meta, c):
        return list(c)

    def generic(self, meta, c):
        return A.Generic(_span(meta), _name(c[0]), _name(c[1]) if c[1] is not None else None)

    def fn_def(self, meta, c):
        attrs, entry, name, generics, params, ret, body = c
        return A.FnDef(
            _span(meta), _name(name), params, ret, body, entry=entry is not None,
            generics=generics or [], attributes=attrs,
        )

    def members(self, meta, c):
        return list(c)

    def field_decl(self, meta, c):
        attrs, name, ftype = c
        span = _span(meta)
        if isinstance(ftype, A.TensorType):
            return A.FieldDecl(span, _name(name), "param", type=ftype, attributes=attrs)
        if isinstance(ftype, tuple) and ftype[0] == "list":
            return A.FieldDecl(span, _name(name), "list", ctor=ftype[1], count=ftype[2], attributes=attrs)
        return A.FieldDecl(span, _name(name), "submodule", ctor=ftype, attributes=attrs)

    def ctor(self, meta, c):
        args = c[1] if len(c) > 1 and c[1] is not None else []
        return A.Call(_span(meta), _name(c[0]), args)

    def submodule_type(self, meta, c):
        return c[0]

    def submodule_list_type(self, meta, c):
        return ("list", c[0], c[1])

    def state_decl(self, meta, c):
        attrs, name, ttype = c
        return A.StateDecl(_span(meta), _name(name), ttype, attributes=attrs)

    def member_if(self, meta, c):
        cond, then, orelse = c
        return A.MemberIf(_span(meta), cond, then, orelse or [])

    def member_else(self, meta, c):
        return c[0]

    def module_def(self, meta, c):
        attrs, name, params, members = c
        return A.ModuleDef(_span(meta), _name(name), params, members, attributes=attrs)

    def model_def(self, meta, c):
        attrs, name, params, members = c
        return A.ModuleDef(_span(meta), _name(name), params, members, is_model=True, attributes=attrs)

    def config_field(self, meta, c):
        attrs, name, ftype, default = c
        return A.ConfigField(_span(meta), _name(name), ftype, default, attributes=attrs)

    def config_def(self, meta, c):
        attrs, name, *fields = c
        return A.ConfigDef(_span(meta), _name(name), list(fields), attributes=attrs)

    def record_lit(self, meta, c):
        return A.RecordLit(_span(meta), _name(c[0]), list(c[1:]))

    def field_init(self, meta, c):
        return A.FieldInit(_span(meta), _name(c[0]), c[1])

    def preset_def(self, meta, c):
        attrs, name, value = c
        return A.PresetDef(_span(meta), _name(name), value, attributes=attrs)

    def item_source(self, meta, c):
        return c[0]


def build(tree: Tree) -> A.ItemDef:
    """Turn lark's tree for `item_source` into an item node."""
    return Builder().transform(tree)
