"""`linnet fmt`: idempotent, keeps comments and meaning, refuses broken files."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.syntax.fmt import FormatError, format_source
from linnet.syntax.items import Source, make_item, split_items
from linnet.syntax.printer import dump
from tests.conftest import EXAMPLES, ROOT, check_golden

GOLDEN = Path(__file__).parent / "golden"
SOURCES = sorted(EXAMPLES.glob("*.linnet")) + sorted((ROOT / "linnet" / "std").glob("*.linnet"))


def _shape(text: str) -> list[str]:
    """The syntax trees of a source with spans removed: what formatting must keep."""
    out = []
    source = Source("t", text)
    for offset, chunk in split_items(text):
        item = make_item(source, offset, chunk)
        if item.ast is not None:
            out.append(re.sub(r"@\d+\.\.\d+", "", dump(item.ast)))
    return out


def _comments(text: str) -> list[str]:
    return [m.group(0).rstrip() for m in re.finditer(r"#[^\n]*", text)]


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_shipped_sources_are_formatted(path):
    text = path.read_text()
    assert format_source(text) == text


def test_messy_golden():
    text = (GOLDEN / "fmt_messy.linnet").read_text()
    out = format_source(text)
    check_golden(GOLDEN / "fmt_messy.formatted", out)
    assert format_source(out) == out
    assert _shape(out) == _shape(text)
    assert _comments(out) == _comments(text)


def test_refuses_syntax_errors():
    with pytest.raises(FormatError) as err:
        format_source("fn f(x: [N]) -> [N] {\n    let y = (x + ) * 2\n    y\n}\n")
    assert err.value.line == 2


def _perturb(text: str, rng: random.Random) -> str:
    """Change only whitespace that carries no meaning: spaces around tokens, blank lines."""
    out = []
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped:
            out.extend([" " * rng.randrange(0, 4)] * rng.randrange(1, 4))  # more blank lines where there was one
            continue
        if stripped.startswith("#"):
            out.append((" " * rng.randrange(1, 8) if line[:1].isspace() else "") + stripped)
            continue
        indent = " " * rng.randrange(1, 12) if line[:1].isspace() else ""  # items start in column 0
        body = []
        # strings and comments keep their text; only the code between them is respaced
        for i, part in enumerate(re.split(r'("(?:[^"\\\n]|\\.)*"|#.*$)', stripped)):
            if i % 2:
                body.append(part)
                continue
            part = "".join(p if not p.isspace() else " " * rng.randrange(1, 4) for p in re.split(r"(\s+)", part))
            body.append(re.sub(r"(?<=[,(\[])(?=\S)", lambda m: " " * rng.randrange(0, 2), part))
        out.append(indent + "".join(body))
    return "\n".join(out)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SOURCES), st.integers(0, 10**6))
def test_formatting_ignores_whitespace_and_is_idempotent(path, seed):
    text = path.read_text()
    messy = _perturb(text, random.Random(seed))
    out = format_source(messy)
    assert out == format_source(text) == text
    assert format_source(out) == out
    assert _shape(messy) == _shape(out)
    assert _comments(messy) == _comments(out)


def test_unary_minus_hugs_its_operand():
    assert (
        format_source("fn f(x: [N]) -> [N] {\n    - (x + x) * - x\n}\n")
        == "fn f(x: [N]) -> [N] {\n    -(x + x) * -x\n}\n"
    )


def test_a_keyword_argument_hugs_a_list_or_a_parenthesised_value():
    assert (
        format_source("fn f(x: [N]) -> [N] {\n    g(x, size = [N, 2], k = (N + 1))\n}\n")
        == "fn f(x: [N]) -> [N] {\n    g(x, size=[N, 2], k=(N + 1))\n}\n"
    )


def test_imports_keep_their_grouping_and_leave_a_blank_line_before_other_items():
    messy = (
        'from  "llama.linnet"  import LlamaMLP,LlamaAttention  as Attention\n'
        "from std . nn import (\n  Linear,\n  RMSNorm as Norm,\n)\n"
        "fn f(x: [N]) -> [N] {\n    x\n}\n"
        "from std.rope import rotate_half\n"
    )
    out = format_source(messy)
    assert out == (
        'from "llama.linnet" import LlamaMLP, LlamaAttention as Attention\n'
        "from std.nn import (\n    Linear,\n    RMSNorm as Norm,\n)\n\n"
        "fn f(x: [N]) -> [N] {\n    x\n}\n\n"
        "from std.rope import rotate_half\n"
    )
    assert format_source(out) == out
    assert _shape(out) == _shape(messy)
