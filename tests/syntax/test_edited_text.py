"""What an edit keeps of the last text's line index and split into items (`LineIndex.edited`,
`items.split_items_edited`) is what the edited text gets anew: on hypothesis edits of the repository's `.linnet`
files, with the line breaks, headers, comments, attributes and indents that move items' bounds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.syntax import items as items_
from linnet.syntax.items import split_items, split_items_edited
from linnet.syntax.positions import LineIndex, changed_range
from tests.syntax.test_descent import SOURCES

TEXTS = sorted(t for t in SOURCES.values() if len(t) < 20_000)
# what goes in: a line's start made a header, a comment, an attribute, an indent or a `)`, line breaks of each kind
PIECES = ["\n", "\r\n", "\r", "\nmodule M {\n}\n", "\nfn", "\n#", "\n## doc\n", "\n@inert(\n", "\n  ", "\n)", "x", "é"]
PIECES += ["}", "{", "module", "fn f() {}", "\n\n", " ", "\t", "😀", 'from "a.linnet" import A\n', "preset"]


@st.composite
def edits(draw) -> tuple[str, str]:
    """A file of the corpus, and it with one edit: characters replaced by pieces, or by another line of the file."""
    text = draw(st.sampled_from(TEXTS))
    start = draw(st.integers(0, len(text)))
    end = draw(st.integers(start, min(len(text), start + draw(st.sampled_from([0, 1, 3, 40, 400])))))
    lines = text.splitlines(keepends=True) or [""]
    put = "".join(draw(st.lists(st.sampled_from(PIECES + [draw(st.sampled_from(lines))]), max_size=3)))
    return text, text[:start] + put + text[end:]


SETTINGS = settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@SETTINGS
@given(edits())
def test_an_edited_line_index_is_the_new_text_s(edit):
    old, new = edit
    index = LineIndex(old).edited(new, *changed_range(old, new))
    fresh = LineIndex(new)
    assert (index.text, index.line_starts, index.ascii) == (fresh.text, fresh.line_starts, fresh.ascii)
    for offset in range(0, len(new) + 1, max(1, len(new) // 50)):
        assert index.position(offset) == fresh.position(offset)


@SETTINGS
@given(edits())
def test_an_edited_split_is_the_new_text_s(edit):
    old, new = edit
    assert split_items_edited(split_items(old), new, *changed_range(old, new)) == split_items(new)


TWO = "fn f() {\n    1\n}\n\n## doc\nfn g() {\n    2\n}\n"
INDENTED = "fn f() {\n    1\n}\n  \nfn g() {\n    2\n}\n"


@pytest.mark.parametrize(
    "old,at,gone,put",
    [
        (TWO, TWO.index("\n\n## doc") + 1, 0, "@"),  # the last line of an item becomes an attribute of the next one
        (TWO, TWO.index("\n\n## doc") + 1, 0, "# c"),  # ... or a comment above it
        (INDENTED, INDENTED.index("  \n"), 0, "@inert(\n"),  # an indented line continues an attribute now
        (INDENTED, INDENTED.index("}\n"), 1, "@inert("),  # ... from further up
        (TWO, TWO.index(" {"), 1, "\nfn h() {}\n"),  # a header put on a header line
        (TWO, TWO.index("    1"), 0, "}\nmodule M {\n"),  # ... inside an item
    ],
)
def test_an_edit_that_moves_bounds_of_items_splits_as_the_new_text(old, at, gone, put):
    new = old[:at] + put + old[at + gone :]
    assert split_items(old) != split_items(new)  # (the edit moves a bound)
    assert split_items_edited(split_items(old), new, *changed_range(old, new)) == split_items(new)


def test_an_edit_inside_a_body_keeps_the_split_without_splitting_again(monkeypatch):
    text = SOURCES["examples/llama.linnet"]
    at = text.index("q_proj(x)", text.index("fn project("))
    new = text[:at] + "v" + text[at + 1 :]
    chunks = split_items(text)
    monkeypatch.setattr(items_, "split_items", lambda text: [])  # (what would be split anew)
    assert split_items_edited(chunks, new, *changed_range(text, new)) == [
        (offset, new[offset : offset + len(chunk)]) for offset, chunk in chunks
    ]
