"""Splitting a source into items."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from linnet.syntax.items import split_items
from tests.conftest import EXAMPLES


@given(
    st.lists(st.sampled_from(list("ab #@\n{}") + ["fn ", "config ", "module ", "preset "]), max_size=80).map("".join)
)
def test_items_partition_the_text(text):
    chunks = split_items(text)
    assert "".join(c for _, c in chunks) == text
    pos = 0
    for offset, chunk in chunks:
        assert offset == pos
        pos += len(chunk)


def test_comments_and_attributes_belong_to_the_item_below():
    text = 'config A {\n}\n\n## doc of B\n@weights("x")\npreset b = A {}\n'
    chunks = split_items(text)
    assert [c for _, c in chunks] == ["config A {\n}\n\n", '## doc of B\n@weights("x")\npreset b = A {}\n']


def test_examples_split_at_their_items():
    text = (EXAMPLES / "llama.linnet").read_text()
    heads = [c.split("\n")[0] for _, c in split_items(text)]
    assert sum(1 for _, c in split_items(text) if "module " in c or "model " in c) >= 6
    assert heads[0].startswith("#")


def test_an_import_is_an_item_with_no_name():
    from linnet.syntax.items import Source, make_item

    text = 'from "llama.linnet" import LlamaMLP\n## doc\nfn f(x: [N]) -> [N] {\n    x\n}\n'
    chunks = split_items(text)
    assert [c for _, c in chunks] == ['from "llama.linnet" import LlamaMLP\n', text[text.index("##") :]]
    item = make_item(Source("t", text), 0, chunks[0][1])
    assert (item.kind, item.name, item.problems) == ("import", None, [])
    assert chunks[0][1][item.name_span.start : item.name_span.end] == '"llama.linnet"'
