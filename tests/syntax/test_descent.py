"""linnet/syntax/descent.py, the fast parser, against lark's route (`parser.parse_with_lark`, the reference built
from grammar.lark): on every item of every `.linnet` file in the repository it builds lark's AST (every node, span
and field), and on mutations of them it either gives up or builds what lark builds. It never accepts an item lark
reports an error in."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.bigdoc_source import big_source
from linnet.syntax.descent import KEYWORDS, parse_fast
from linnet.syntax.items import split_items
from linnet.syntax.parser import _attach_docs, parse_item, parse_with_lark
from linnet.syntax.positions import lexable
from tests.conftest import ROOT


def _sources() -> dict[str, str]:
    """Every `.linnet` file git knows of (examples, the standard library, test fixtures, the editor grammar's
    tests), and the 5 MB document's first three copies (bench/bigdoc_source.py: its mistakes are not syntax)."""
    listed = subprocess.run(["git", "ls-files", "*.linnet"], cwd=ROOT, capture_output=True, text=True, check=True)
    sources = {path: (ROOT / path).read_text(encoding="utf-8") for path in listed.stdout.split()}
    sources["bench/bigdoc_source.py (3 copies)"] = big_source(3)
    return sources


SOURCES = _sources()
ITEMS = [(f"{path}@{offset}", lexable(chunk)) for path, text in SOURCES.items() for offset, chunk in split_items(text)]


def fast_or_none(text: str) -> str | None:
    """The fast parser's AST of `text` as its dataclass repr (every field of every node, spans included), with the
    doc comments lark's route attaches too; None when it gives up."""
    item = parse_fast(text)
    if item is None:
        return None
    _attach_docs(item, text)
    return repr(item)


def assert_given_up_on_or_as_lark(text: str) -> None:
    """The fast parser gives up on `text`, or lark accepts it and builds the same AST."""
    fast = fast_or_none(text)
    if fast is None:
        return
    reference = parse_with_lark(text)
    assert not reference.problems, f"the fast parser accepted what lark rejects: {reference.problems[0].message}"
    assert fast == repr(reference.ast)


def test_the_corpus_is_the_repository_s_linnet_files():
    assert len(SOURCES) > 70 and any(p.startswith("examples/") for p in SOURCES)
    assert any(p.startswith("linnet/std/") for p in SOURCES) and len(ITEMS) > 500


@pytest.mark.parametrize("where,text", ITEMS, ids=[where for where, _ in ITEMS])
def test_every_item_in_the_repository_parses_as_lark_parses_it(where, text):
    reference = parse_with_lark(text)
    fast = fast_or_none(text)
    if reference.problems or reference.ast is None:
        assert fast is None, "the fast parser accepted an item lark rejects"
    else:
        assert fast == repr(reference.ast)


def test_parse_item_takes_the_fast_route_and_lark_s_for_errors():
    text = "fn f(x: [B]) -> [B] {\n    x +\n}\n"
    assert parse_fast(text) is None
    parsed = parse_item(text)
    assert [p.code for p in parsed.problems] == ["L001"] and parsed.problems == parse_with_lark(text).problems


# what mutations insert or put in a token's place: every keyword, punctuation, literals, newlines and comments
VOCABULARY = sorted(KEYWORDS) + [
    *"()[]{}<>:;,.=+-*/%@?|",
    *("...", "->", "==", "!=", "<=", ">=", "**", "//"),
    *("x", "model", "_1", "1", "1_0", "1.5", "1e5", '"s"', '"\\n"', "\n", "\n\n", " ", "# c\n", "\r\n", "\t"),
]


def _cut_points(text: str) -> list[int]:
    """Where tokens (and the gaps between them) start: mutations act on whole tokens as well as characters."""
    points, prev_word = [0], None
    for i, ch in enumerate(text):
        word = ch.isalnum() or ch == "_"
        if word != prev_word or not word:
            points.append(i)
        prev_word = word
    return points + [len(text)]


@st.composite
def mutated_items(draw) -> str:
    """An item of the corpus with one to four edits: a token or a character deleted, inserted or replaced."""
    text = draw(st.sampled_from([t for _, t in ITEMS if len(t) < 3000]))
    for _ in range(draw(st.integers(1, 4))):
        points = _cut_points(text)
        k = draw(st.integers(0, len(points) - 2))
        start, end = points[k], points[k + 1]
        action = draw(st.sampled_from(["delete", "insert", "replace", "delete_char", "insert_char"]))
        if action == "delete":
            text = text[:start] + text[end:]
        elif action == "insert":  # one to three tokens
            inserted = draw(st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=3))
            text = text[:start] + " ".join(inserted) + text[start:]
        elif action == "replace":
            text = text[:start] + draw(st.sampled_from(VOCABULARY)) + text[end:]
        elif action == "delete_char" and text:
            text = text[:start] + text[start + 1 :]
        else:
            text = text[:start] + draw(st.characters(codec="utf-8")) + text[start:]
    return lexable(text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_items())
def test_mutated_items_are_given_up_on_or_parsed_as_lark_parses_them(text):
    assert_given_up_on_or_as_lark(text)


# operands, prefixes and operators of expressions, for chains of them in a function's body (what lark's levels,
# associativity and contextual keywords decide), and stray tokens to break them with
OPERANDS = ["x", "model.in", "1", "1.5", '"s"', "true", "none", "(x)", "(x,)", "[x, 1]", "f(x, y=1)", "x[1:, ...]"]
OPERANDS += ["if x {y} else {z}", "x.for", "(not x)", "in", "else"]
OPERANDS += ["(x + 1)", "(x).y", "(x)[1]", "(x)(1)", "f((x), y=(1))", "x[(1):(2)]", "((x))", "-(x)"]
PREFIXES = ["", "", "", "-", "not ", "- -", "not not "]
OPERATORS = ["+", "-", "*", "/", "//", "%", "@", "**", "==", "!=", "<", "<=", ">", ">=", "and", "or", "if"]
STRAY = ["(", ")", "[", "]", "{", "}", ",", "\n", "=", ":", "..."]


@st.composite
def chains(draw) -> str:
    """`prefix operand (operator prefix operand)*`, sometimes with a stray token put in."""
    parts = [draw(st.sampled_from(PREFIXES)) + draw(st.sampled_from(OPERANDS))]
    for _ in range(draw(st.integers(0, 5))):
        parts += [draw(st.sampled_from(OPERATORS)), draw(st.sampled_from(PREFIXES)) + draw(st.sampled_from(OPERANDS))]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), draw(st.sampled_from(STRAY)))
    return " ".join(parts)


@settings(max_examples=400, deadline=None)
@given(chains())
def test_operator_chains_are_given_up_on_or_parsed_as_lark_parses_them(chain):
    assert_given_up_on_or_as_lark("fn f(x: [B]) {\n    let z = " + chain + "\n}\n")


@pytest.mark.parametrize("where", ["fn f(x: [B]) -> [B] {{\n    x + {}\n}}\n", "module M() {{\n    w: [{}]\n}}\n"])
def test_an_integer_past_python_s_digit_limit_is_a_located_syntax_error_not_a_traceback(where):
    # int() refuses a decimal string of more than sys.get_int_max_str_digits() digits (4300: CVE-2020-10735); the
    # fast parser raised that ValueError out of `linnet check`, lark's route reported it at the item's start
    digits = "1_" + "9" * sys.get_int_max_str_digits()
    text = where.format(digits)
    assert parse_fast(text) is None
    parsed = parse_item(text)
    start = text.index(digits)
    assert parsed.ast is None and len(parsed.problems) == 1
    problem = parsed.problems[0]
    assert problem.code == "L001" and problem.span == (start, start + len(digits))
    assert problem.message == f"this integer has {len(digits) - 1} digits: at most {sys.get_int_max_str_digits()}"


def test_an_integer_past_the_limit_is_located_where_the_ast_builder_met_it():
    # the builder's failure was located by scanning the item's text for the first long integer: one in a statement
    # that recovery skipped (not built, its error already reported) took the place of the one the builder met
    skipped, built = "9" * 4301, "8" * 4301
    text = f"fn f(x: [B]) -> [B] {{\n    let a = ) {skipped}\n    x + {built}\n}}\n"
    parsed = parse_item(text)
    assert [(p.code, p.message) for p in parsed.problems] == [
        ("L001", "unexpected `)`"),
        ("L001", f"this integer has 4301 digits: at most {sys.get_int_max_str_digits()}"),
    ]
    start = text.index(built)
    assert parsed.problems[1].span == (start, start + len(built))
