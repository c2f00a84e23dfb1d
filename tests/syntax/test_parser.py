"""The grammar and the parser: goldens, recovery, contextual keywords, never raising."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lark import Lark

from linnet.semantics.program import Document
from linnet.syntax import ast as A
from linnet.syntax.descent import parse_fast
from linnet.syntax.items import Source, make_item, split_items
from linnet.syntax.parser import GRAMMAR_PATH, code_mask, parse_item, parse_with_lark
from linnet.syntax.positions import lexable
from linnet.syntax.printer import dump
from tests.conftest import EXAMPLES, ROOT, check_golden

GOLDEN = Path(__file__).parent / "golden"


def test_grammar_has_no_conflicts(monkeypatch):
    # strict mode refuses shift/reduce conflicts and colliding terminals; it needs interegular, which lark looks for
    # once, when imported, and Linnet's own import of lark hides (`linnet.syntax.optional`: a parser that is not
    # strict never uses it). Whether this process imported lark through Linnet first depends on the tests before
    # this one, so lark is given interegular here.
    import interegular
    import lark.lexer

    monkeypatch.setattr(lark.lexer, "interegular", interegular, raising=False)
    monkeypatch.setattr(lark.lexer, "has_interegular", True)
    Lark(GRAMMAR_PATH.read_text(), parser="lalr", lexer="contextual", start="item_source", strict=True)


def _dump_source(text: str) -> str:
    source = Source("golden", text)
    out = []
    for offset, chunk in split_items(text):
        item = make_item(source, offset, chunk)
        out.append(f"# item {item.kind} {item.name} @{offset}")
        for p in item.problems:
            out.append(f"# {p.code} @{offset + p.span.start}..{offset + p.span.end}: {p.message}")
        if item.ast is not None:
            out.append(dump(item.ast, base=offset))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("*.linnet") if not p.stem.startswith("fmt_")))
def test_parser_golden(name):
    text = (GOLDEN / f"{name}.linnet").read_text(encoding="utf-8")
    check_golden(GOLDEN / f"{name}.ast", _dump_source(text))


def test_spans_cover_their_text():
    text = (EXAMPLES / "llama.linnet").read_text()
    source = Source("llama", text)
    for offset, chunk in split_items(text):
        item = make_item(source, offset, chunk)
        if item.ast is None:
            continue
        for node in A.walk(item.ast):
            if isinstance(node, A.Name):
                assert chunk[node.span.start : node.span.end] == node.id
            elif isinstance(node, A.IntLit):
                assert chunk[node.span.start : node.span.end].replace("_", "") == str(node.value)


def test_several_syntax_errors_are_all_reported_and_the_rest_checked():
    text = (GOLDEN / "recovery.linnet").read_text()
    diags = Document("r.linnet", text).analyze().diagnostics
    syntax = [(d.location.line, d.code) for d in diags if d.code.startswith("L0")]
    assert syntax == [(3, "L001"), (8, "L001"), (13, "L003")]
    # `w` and `b` survive recovery: no unknown-name cascade from the skipped lines
    assert not [d for d in diags if d.code == "L101"]


def test_skipped_let_keeps_its_name():
    text = "fn f(x: [N]) -> [N] {\n    let y = (x + ) * 2.0\n    y\n}\n"
    item = make_item(Source("t", text), 0, text)
    stmts = item.ast.body.stmts
    assert isinstance(stmts[0], A.ErrorStmt) and stmts[0].bound == ["y"]
    assert [d.code for d in Document("t", text).analyze().diagnostics] == ["L001"]


def test_keywords_are_names_where_a_keyword_cannot_stand():
    text = (
        "module M(c: C) {\n    model: Inner(c)\n    self: Inner(c)\n    output: Inner(c)\n"
        "    fn f(x: [N]) -> [N] { model.layer.self.output(x) }\n}\n"
    )
    parsed = parse_item(text)
    assert not parsed.problems
    names = [m.name.id for m in parsed.ast.members]
    assert names == ["model", "self", "output", "f"]


def test_missing_closing_brace_is_supplied():
    text = "fn f(x: [N]) -> [N] {\n    x\n"
    parsed = parse_item(text)
    assert parsed.ast is not None
    assert [p.code for p in parsed.problems] == ["L003"]


_ALPHABET = st.sampled_from(
    list('abcxyz_019 .,:;()[]{}<>=+-*/%@!?#"\n\t\\')
    + [
        "fn ",
        "let ",
        "module ",
        "config ",
        "preset ",
        "model ",
        "if ",
        "else ",
        "for ",
        "in ",
        "state ",
        "entry ",
        "[B, S]",
        "->",
        "...",
        "**",
        "é",
        "🦜",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, max_size=60).map("".join))
def test_random_text_never_raises(text):
    analysis = Document("fuzz.linnet", text).analyze()
    for d in analysis.diagnostics:
        assert 1 <= d.location.line and d.location.start.offset <= len(text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise(data):
    Document("fuzz.linnet", data.decode("utf-8", errors="replace")).analyze()


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.linnet")))
def test_truncations_and_deletions_of_examples_never_raise(example):
    text = (EXAMPLES / example).read_text()
    rng = random.Random(example)
    cuts = sorted(rng.sample(range(len(text)), 8))
    for cut in cuts:
        Document("t.linnet", text[:cut]).analyze()
        start = rng.randrange(len(text))
        Document("t.linnet", text[:start] + text[start + rng.randrange(1, 200) :]).analyze()


def test_nesting_too_deep_is_a_diagnostic_not_a_crash():
    shallow = "fn f(x: [N]) -> [N] {\n    " + " + ".join(["x"] * 400) + "\n}\n"
    assert Document("t.linnet", shallow).analyze().diagnostics == []
    calls = "fn g(x: [N]) -> [N] {\n    " + "exp(" * 200 + "x" + ")" * 200 + "\n}\n"
    assert Document("t.linnet", calls).analyze().diagnostics == []
    deep = "fn f(x: [N]) -> [N] {\n    " + " + ".join(["x"] * 12000) + "\n}\n"
    diags = Document("t.linnet", deep).analyze().diagnostics
    assert [d.code for d in diags] == ["L000"] and "too deeply" in diags[0].message


PARENTHESISED = """fn f(x: [B, (H + 1) * 2, -(H), (c).n]) -> [B] {
    let a = (H - 1) // 2
    let b = 2 * (H - 1)
    let t = (x) and (y)
    g((a + b), k=(1))
    let s = x[(1):(2), :(H - 1) // 2]
    (a).b(c)[0] ** (2)
    -(a) + (not (b))
    (a + b)
}
"""


@pytest.mark.parametrize("route", ["fast", "lark"])
def test_a_parenthesised_operand_s_parentheses_are_in_the_spans_around_it(route):
    # `(H - 1) // 2` spanned `H - 1) // 2`, and a message quoting it by its span was cut; the node of `(e)` keeps
    # its contents' span (as Python's ast does), so a name inside parentheses is where it was
    text = PARENTHESISED
    tree = parse_fast(text) if route == "fast" else parse_with_lark(text).ast
    quoted = {(type(n).__name__, text[n.span.start : n.span.end]) for n in A.walk(tree)}
    expected = [
        ("BinOp", "(H + 1) * 2"),
        ("BinOp", "H + 1"),
        ("Neg", "-(H)"),
        ("Attr", "(c).n"),
        ("Let", "let a = (H - 1) // 2"),
        ("BinOp", "(H - 1) // 2"),
        ("BinOp", "H - 1"),
        ("BinOp", "2 * (H - 1)"),
        ("BinOp", "(x) and (y)"),
        ("Arg", "(a + b)"),
        ("Arg", "k=(1)"),
        ("Slice", "(1):(2)"),
        ("Slice", ":(H - 1) // 2"),
        ("Attr", "(a).b"),
        ("Call", "(a).b(c)"),
        ("Index", "(a).b(c)[0]"),
        ("BinOp", "(a).b(c)[0] ** (2)"),
        ("Neg", "-(a)"),
        ("Not", "not (b)"),
        ("BinOp", "-(a) + (not (b))"),
        ("ExprStmt", "(a + b)"),
        ("BinOp", "a + b"),
    ]
    assert [e for e in expected if e not in quoted] == []
    for node in A.walk(tree):
        if isinstance(node, A.Name):
            assert text[node.span.start : node.span.end] == node.id
        if isinstance(node, A.BinOp) and node.op in ("and", "**"):  # no token of its own: the gap between operands
            assert text[node.op_span.start : node.op_span.end] == f" {node.op} "


def test_every_node_s_span_has_balanced_parentheses():
    """In every item of every `.linnet` file of the repository: a span that ends inside parentheses it does not
    start in (or starts inside ones it does not end in) quotes a cut expression."""
    listed = subprocess.run(["git", "ls-files", "*.linnet"], cwd=ROOT, capture_output=True, text=True, check=True)
    checked = 0
    for path in listed.stdout.split():
        for offset, chunk in split_items((ROOT / path).read_text(encoding="utf-8")):
            parsed = parse_item(lexable(chunk))
            if parsed.ast is None or parsed.problems:
                continue
            depth = [0]  # parentheses open before each offset, in code (not strings or comments)
            for ch, code in zip(chunk, code_mask(chunk)):
                depth.append(depth[-1] + (ch == "(" if code else 0) - (ch == ")" if code else 0))
            for node in A.walk(parsed.ast):
                start, end = node.span
                inside = depth[start : end + 1]
                assert inside[-1] == inside[0] and min(inside) == inside[0], (
                    f"{path}@{offset}: {type(node).__name__} spans {chunk[start:end]!r}"
                )
                checked += 1
    assert checked > 10_000
