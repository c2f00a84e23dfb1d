"""Pushed diagnostics: codes, docs links, where conflicting shapes came from, unused tags,
presets, and versions (stale results are not published)."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types as T

from .conftest import EXAMPLES, WORKSPACE, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_planted_faults_are_located_with_codes_and_related_information(client):
    doc = await open_doc(client, WORKSPACE / "faults.linnet")
    diags = {d.code: d for d in await doc.diagnostics()}
    assert sorted(diags) == ["L101", "L204", "L205", "L206", "L901"]

    unknown = diags["L101"]
    assert doc.slice(unknown.range) == "hh"
    assert unknown.severity == T.DiagnosticSeverity.Error
    assert unknown.message.startswith("unknown name `hh`; did you mean `h`?")
    assert unknown.source == "linnet"
    assert unknown.code_description.href.endswith("docs/diagnostics.md#l101")

    mismatch = diags["L204"]
    assert doc.slice(mismatch.range) == "block(x)"
    assert "([B, S, 8] vs [B, S, 16])" in mismatch.message
    (related,) = mismatch.related_information
    assert related.location.uri == doc.uri
    assert doc.slice(related.location.range) == "[B, S, c.intermediate_size]"
    assert related.message == "declared [B, S, c.intermediate_size] here"

    unused = diags["L901"]
    assert unused.severity == T.DiagnosticSeverity.Warning
    assert list(unused.tags) == [T.DiagnosticTag.Unnecessary]
    assert doc.slice(unused.range) == "unused"

    # only preset tiny_b breaks `split`; the diagnostic says so and points at its values
    inexact = diags["L206"]
    assert "note: under preset `tiny_b`" in inexact.message
    assert sorted(doc.slice(r.location.range) for r in inexact.related_information) == [
        "intermediate_size = 14",
        "num_heads = 3",
    ]
    doc.close()


async def test_docs_link_points_at_an_existing_heading(client):
    doc = await open_doc(client, WORKSPACE / "faults.linnet")
    from pathlib import Path
    from urllib.parse import urlparse

    for d in await doc.diagnostics():
        url = urlparse(d.code_description.href)
        text = Path(url.path).read_text(encoding="utf-8")
        assert f"## {url.fragment.upper()}" in text
    doc.close()


async def test_an_edit_that_breaks_a_shape_and_its_undo(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    assert await doc.diagnostics() == []
    # fc2(h) -> fc1(h): fc1 wants [.., in_features], h is [B, hidden_features]
    start = doc.pos("fc2(h)")
    end = doc.pos("fc2(h)", 3)
    await doc.change(start, end, "fc1")
    (d,) = await doc.diagnostics()
    assert d.severity == T.DiagnosticSeverity.Error
    assert doc.slice(d.range).startswith("h")
    assert d.message.startswith("argument `x` of `fc1` is [B, 32], expected [B, 8]")  # preset `tiny`
    await doc.change(start, doc.pos("fc1(h)", 3), "fc2")
    assert await doc.diagnostics() == []
    doc.close()


async def test_a_burst_of_edits_ends_with_the_last_versions_diagnostics(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    before = len(client.published)
    where = doc.pos("fc2(h)")
    for ch in "let zz = 1\n        ":
        await doc.change(where, where, ch)
        where = doc.at(doc.offset(where) + 1)
    final = await doc.diagnostics()
    assert [d.code for d in final] == ["L901"]  # `zz` is never used
    published = [p for p in client.published[before:] if p.uri == doc.uri and p.version is not None]
    # never a stale result after a newer one, and the last one published is the last one sent
    versions = [p.version for p in published]
    assert all(a < b for a, b in zip(versions, versions[1:])) and versions[-1] == doc.version
    doc.close()


async def test_closing_a_document_clears_its_diagnostics(client):
    doc = await open_doc(client, WORKSPACE / "faults.linnet")
    assert await doc.diagnostics()
    doc.close()
    for _ in range(500):
        last = [p for p in client.published if p.uri == doc.uri][-1]
        if not last.diagnostics and last.version is None:
            break
        await asyncio.sleep(0.02)
    assert not last.diagnostics and last.version is None


async def test_syntax_errors_are_diagnostics_not_crashes(client):
    doc = await open_doc(client, WORKSPACE / "broken.linnet", "module M(c: Nope {\n    fn f(x: [B,) -> {\n")
    diags = await doc.diagnostics()
    assert diags and all(d.code.startswith("L0") or d.code.startswith("L1") for d in diags)
    # the server still answers
    result = await client.text_document_hover_async(T.HoverParams(doc.id, T.Position(0, 8)))
    assert result is None or isinstance(result, T.Hover)
    doc.close()


async def test_a_save_with_new_text_is_analysed(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    saved = doc.text.replace("fc2(h)", "fc2(hh)")
    client.text_document_did_save(T.DidSaveTextDocumentParams(doc.id, text=saved))
    for _ in range(500):
        last = [p for p in client.published if p.uri == doc.uri][-1]
        if last.diagnostics:
            break
        await asyncio.sleep(0.02)
    assert "L101" in [d.code for d in last.diagnostics]
    doc.close()


async def test_a_change_to_a_document_never_opened_is_not_a_popup(client):
    before = len(client.messages)
    client.text_document_did_change(
        T.DidChangeTextDocumentParams(
            T.VersionedTextDocumentIdentifier(version=2, uri=(WORKSPACE / "never.linnet").as_uri()),
            [T.TextDocumentContentChangeWholeDocument(text="fn f() {}")],
        )
    )
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")  # the server still answers
    assert len(client.messages) == before
    doc.close()


async def test_an_unread_parameter_is_a_warning_on_its_member(client):
    text = (EXAMPLES / "llama.linnet").read_text(encoding="utf-8")
    text = text.replace("x + mlp(post_attention_layernorm(x))", "x + mlp(input_layernorm(x))")
    doc = await open_doc(client, EXAMPLES / "llama.linnet", text)
    (unread,) = await doc.diagnostics()
    assert unread.code == "L904"
    assert unread.severity == T.DiagnosticSeverity.Warning
    assert doc.slice(unread.range) == "post_attention_layernorm"
    doc.close()
