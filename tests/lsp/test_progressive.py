"""A big file just opened gets its diagnostics in two steps (linnet/lsp/server.py `_check_first_items`): the items in
its first lines first, parsed and checked as if the file ended after them (a name defined further down is not
unknown), then everything; a hover there is answered from the first step, before the whole check ends.
Through a real client (pytest-lsp); order and contents, no timings."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types as T

from linnet.lsp.server import FIRST_LINES, PROGRESSIVE_LINES

from .conftest import TIMEOUT_S, Doc

pytestmark = pytest.mark.asyncio(loop_scope="module")

HEADER = """config Net {
    hidden_size: int = 64
    intermediate_size: int = 128
}

preset tiny = Net { hidden_size = 32, intermediate_size = 64 }

fn early(x: [B, S, D]) -> [B, S, D] {
    late(x)
}
"""
BLOCK = """
module Block{i}(c: Net) {{
    up: Linear(c.hidden_size, c.intermediate_size, use_bias=false)
    down: Linear(c.intermediate_size, c.hidden_size, use_bias=false)

    fn forward(x: [B, S, c.hidden_size]) -> [B, S, c.hidden_size] {{
        let h = up(x)
        down({arg})
    }}
}}
"""
LATE = "\nfn late(x: [B, S, D]) -> [B, S, D] {\n    x\n}\n"  # what `early` calls, defined at the end
BROKEN = "\nfn broken(x: [B]) -> [B] {\n    x +\n}\n"  # a syntax error at the very end


def big_file(blocks: int, unknown_in: tuple[int, ...]) -> str:
    """Modules `Block0..`; those in `unknown_in` use `hh` where `h` is meant (L101, and `h` is never used: L901)."""
    body = "".join(BLOCK.format(i=i, arg="hh" if i in unknown_in else "h") for i in range(blocks))
    return HEADER + body + LATE + BROKEN


def publishes(client, doc: Doc, version: int) -> list[list[T.Diagnostic]]:
    mine = client.published[doc.first_publish :]
    return [list(p.diagnostics) for p in mine if p.uri == doc.uri and p.version == version]


def lines_by_code(diagnostics: list[T.Diagnostic]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for d in diagnostics:
        out.setdefault(str(d.code), []).append(d.range.start.line)
    return {k: sorted(v) for k, v in sorted(out.items())}


async def test_a_big_file_publishes_its_first_items_first_and_hover_does_not_wait(client, tmp_path):
    blocks = 100
    text = big_file(blocks, unknown_in=(0, blocks - 1))
    lines = text.count("\n")
    assert lines >= PROGRESSIVE_LINES
    doc = Doc(client, (tmp_path / "big.linnet").as_uri(), text, first_publish=len(client.published))
    client.text_document_did_open(T.DidOpenTextDocumentParams(T.TextDocumentItem(doc.uri, "linnet", 1, text)))
    hover = await client.text_document_hover_async(T.HoverParams(doc.id, doc.pos("let h = up(x)", len("let "))))
    seen_at_hover = len(publishes(client, doc, 1))
    assert hover is not None and "h: [B, S, c.intermediate_size]" in hover.contents.value, hover

    # the last publish of version 1 holds every finding; wait for it
    top, bottom = doc.at(text.index("hh")).line, doc.at(text.rindex("hh")).line
    for _ in range(int(TIMEOUT_S / 0.05)):
        found = publishes(client, doc, 1)
        if found and bottom in lines_by_code(found[-1]).get("L101", []):
            break
        await asyncio.sleep(0.05)
    first, *_, complete = publishes(client, doc, 1)
    assert top < FIRST_LINES < bottom
    syntax = lines_by_code(complete).keys() - {"L101", "L901"}
    assert syntax, "the broken function at the end gives a syntax error"

    # first: the findings of the items in the first lines only (`late`, defined at the end, is not unknown there;
    # the syntax error at the end waits for the complete check, which parses everything)
    assert lines_by_code(first)["L101"] == [top]
    assert lines_by_code(first)["L901"] == [top - 1]
    assert not syntax & lines_by_code(first).keys()
    # then everything, as a small file would get it in one publish
    assert lines_by_code(complete)["L101"] == [top, bottom]
    assert lines_by_code(complete)["L901"] == [top - 1, bottom - 1]
    # the hover came back after the first publish and before the complete one
    assert seen_at_hover == 1, f"{seen_at_hover} publishes of version 1 before the hover's answer"

    # an edit afterwards is checked in one step: one publish of version 2, complete
    await doc.change(doc.pos("hh"), doc.pos("hh", 2), "h")
    after = await doc.diagnostics(2)
    assert lines_by_code(after)["L101"] == [bottom]
    assert len(publishes(client, doc, 2)) == 1
    doc.close()
