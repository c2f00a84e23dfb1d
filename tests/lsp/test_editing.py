"""Semantic tokens, formatting and quick fixes."""

from __future__ import annotations

import pytest
from lsprotocol import types as T

from linnet.lsp.tokens import TOKEN_MODIFIERS, TOKEN_TYPES

from .conftest import EXAMPLES, WORKSPACE, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")


def decode(doc, data: list[int]) -> dict[tuple[int, int], tuple[str, str, set[str]]]:
    """(line, character) -> (text, token type, modifiers) from the relative encoding."""
    out = {}
    line = char = 0
    lines = doc.text.split("\n")
    for i in range(0, len(data), 5):
        dl, dc, length, kind, mods = data[i : i + 5]
        line += dl
        char = char + dc if dl == 0 else dc
        names = {m for b, m in enumerate(TOKEN_MODIFIERS) if mods & (1 << b)}
        out[(line, char)] = (lines[line][char : char + length], TOKEN_TYPES[kind], names)
    return out


async def test_semantic_tokens_classify_names_by_what_they_are(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    result = await client.text_document_semantic_tokens_full_async(T.SemanticTokensParams(doc.id))
    tokens = decode(doc, list(result.data))

    def at(needle, delta=0, nth=0):
        p = doc.pos(needle, delta, nth)
        return tokens[(p.line, p.character)]

    assert at("config Llama", 7) == ("Llama", "struct", {"declaration"})
    assert at("module LlamaMLP", 7) == ("LlamaMLP", "class", {"declaration"})
    assert at("preset smollm2_135m", 7) == ("smollm2_135m", "variable", {"declaration", "readonly"})
    assert at("hidden_size: int") == ("hidden_size", "property", {"declaration"})
    assert at("Linear(c.hidden_size") == ("Linear", "class", {"defaultLibrary"})
    assert at("c.hidden_size, c.intermediate_size", 2) == ("hidden_size", "property", set())
    assert at("fn forward(x: [..., c.hidden_size])", 11) == ("x", "parameter", {"declaration"})
    assert at("let q = ", 4) == ("q", "variable", {"declaration"})
    assert at("apply_rope(q", 11) == ("q", "variable", set())
    assert at("rearrange(q_proj") == ("rearrange", "function", {"defaultLibrary"})
    assert at("input_ids: i64[B, S]", 11) == ("i64", "type", {"defaultLibrary"})
    assert at("input_ids: i64[B, S]", 15) == ("B", "typeParameter", set())
    assert at("fn project(", 3) == ("project", "method", {"declaration"})
    assert at("= project(x, cos, sin)", 2) == ("project", "method", set())
    doc.close()


async def test_formatting_is_linnet_fmt(client):
    messy = "config  C {\n  a :int=1\n}\n\n\n\nfn f( x: [B , C.a] ) -> [B, 1]{x}\n"
    doc = await open_doc(client, WORKSPACE / "messy.linnet", messy)
    edits = await client.text_document_formatting_async(
        T.DocumentFormattingParams(doc.id, T.FormattingOptions(tab_size=4, insert_spaces=True))
    )
    from linnet.syntax.fmt import format_source

    (edit,) = edits
    assert doc.slice(edit.range) == messy
    assert edit.new_text == format_source(messy)
    doc.close()
    # a formatted file needs no edits; a file with syntax errors gets none, and a message
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    params = T.DocumentFormattingParams(doc.id, T.FormattingOptions(tab_size=4, insert_spaces=True))
    assert not await client.text_document_formatting_async(params)
    doc.close()
    doc = await open_doc(client, WORKSPACE / "broken.linnet", "fn f(x: [B) -> {\n")
    before = len(client.messages)
    params = T.DocumentFormattingParams(doc.id, T.FormattingOptions(tab_size=4, insert_spaces=True))
    assert not await client.text_document_formatting_async(params)
    assert "cannot format" in client.messages[before].message
    doc.close()


async def test_did_you_mean_quick_fix(client):
    doc = await open_doc(client, WORKSPACE / "faults.linnet")
    diags = await doc.diagnostics()
    unknown = next(d for d in diags if d.code == "L101")
    actions = await client.text_document_code_action_async(
        T.CodeActionParams(doc.id, unknown.range, T.CodeActionContext(diagnostics=[unknown]))
    )
    (action,) = actions
    assert action.title == "replace with `h`" and action.kind == T.CodeActionKind.QuickFix
    assert action.diagnostics[0].code == "L101"
    (edit,) = action.edit.changes[doc.uri]
    await doc.change(edit.range.start, edit.range.end, edit.new_text)
    assert "L101" not in [d.code for d in await doc.diagnostics()]
    doc.close()


async def test_cast_quick_fix_for_a_dtype_error(client):
    text = "fn f(x: f32[B, D], ids: i64[B, D]) -> f32[B, D] {\n    x + ids\n}\n"
    doc = await open_doc(client, WORKSPACE / "dtypes.linnet", text)
    diags = await doc.diagnostics()
    assert diags, "a float plus an int is a dtype error"
    actions = await client.text_document_code_action_async(
        T.CodeActionParams(doc.id, diags[0].range, T.CodeActionContext(diagnostics=diags))
    )
    casts = [a for a in actions if "cast" in a.title]
    assert casts, [a.title for a in actions]
    (edit,) = casts[0].edit.changes[doc.uri]
    await doc.change(edit.range.start, edit.range.end, edit.new_text)
    assert await doc.diagnostics() == []
    doc.close()


async def test_formatting_keeps_crlf_line_endings(client):
    text = (EXAMPLES / "mlp.linnet").read_text().replace("\n", "\r\n")
    doc = await open_doc(client, WORKSPACE / "crlf.linnet", text)
    params = T.DocumentFormattingParams(doc.id, T.FormattingOptions(tab_size=4, insert_spaces=True))
    assert not await client.text_document_formatting_async(params)  # already formatted
    messy = text.replace("let h = gelu", "let h =  gelu")
    await doc.change(doc.at(0), doc.at(len(doc.text)), messy)
    (edit,) = await client.text_document_formatting_async(params)
    assert edit.new_text == text
    doc.close()
