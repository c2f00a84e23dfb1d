"""Go-to-definition, references, rename, highlights, document and workspace symbols."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from lsprotocol import types as T
from pygls.exceptions import JsonRpcException

from .conftest import EXAMPLES, WORKSPACE, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _text_at(location: T.Location) -> str:
    """The text a location covers, read from its file (std-library files included)."""
    lines = Path(unquote(urlparse(location.uri).path)).read_text(encoding="utf-8").split("\n")
    r = location.range
    assert r.start.line == r.end.line
    return lines[r.start.line][r.start.character : r.end.character]


async def definition(client, doc, needle, delta=0, nth=0):
    result = await client.text_document_definition_async(T.DefinitionParams(doc.id, doc.pos(needle, delta, nth)))
    if isinstance(result, list):
        (result,) = result
    return result


async def test_definition_of_locals_members_configs_and_std(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    # a local: `q` in `apply_rope(q, ...)` goes to `let q = ...`
    loc = await definition(client, doc, "apply_rope(q", len("apply_rope("))
    assert loc.uri == doc.uri and doc.slice(loc.range) == "q"
    assert loc.range.start == doc.pos("let q = ", 4)
    # and in `attention(q, ...)` to the tuple binding
    loc = await definition(client, doc, "attention(q, k, v, mask", len("attention("))
    assert loc.range.start == doc.pos("let (q, k, v) = project", len("let ("))
    # a submodule member
    loc = await definition(client, doc, "q_proj(x)")
    assert loc.range.start == doc.pos("q_proj: Linear")
    # a config field through `c.`
    loc = await definition(client, doc, "c.vocab_size", 2)
    assert loc.range.start == doc.pos("vocab_size: int")
    # a preset field goes to the config field it sets
    loc = await definition(client, doc, "rms_norm_eps = 1e-5")
    assert loc.range.start == doc.pos("rms_norm_eps: float")
    # a module used as a type
    loc = await definition(client, doc, "LlamaMLP(c)")
    assert loc.range.start == doc.pos("LlamaMLP(c: Llama)")
    # the standard library is a real file
    loc = await definition(client, doc, "Linear(c.hidden_size")
    assert loc.uri.endswith("/linnet/std/nn.linnet") and _text_at(loc) == "Linear"
    loc = await definition(client, doc, "rms_norm_eps)", nth=0)
    assert doc.slice(loc.range) == "rms_norm_eps"
    doc.close()


async def test_references_and_highlights(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    refs = await client.text_document_references_async(
        T.ReferenceParams(
            text_document=doc.id, position=doc.pos("let h", 4), context=T.ReferenceContext(include_declaration=True)
        )
    )
    assert [doc.slice(r.range) for r in refs] == ["h", "h"]
    assert refs[0].range.start == doc.pos("let h", 4) and refs[1].range.start == doc.pos("fc2(h)", 4)
    refs = await client.text_document_references_async(
        T.ReferenceParams(
            text_document=doc.id, position=doc.pos("let h", 4), context=T.ReferenceContext(include_declaration=False)
        )
    )
    assert [r.range.start for r in refs] == [doc.pos("fc2(h)", 4)]
    # a config field: its declaration, the preset's init, and both uses
    refs = await client.text_document_references_async(
        T.ReferenceParams(
            text_document=doc.id,
            position=doc.pos("hidden_features: int"),
            context=T.ReferenceContext(include_declaration=True),
        )
    )
    assert len(refs) == 4 and all(doc.slice(r.range) == "hidden_features" for r in refs)
    highlights = await client.text_document_document_highlight_async(
        T.DocumentHighlightParams(doc.id, doc.pos("fc2(h)", 4))
    )
    kinds = sorted((h.range.start.line, h.kind) for h in highlights)
    assert kinds == [
        (doc.pos("let h").line, T.DocumentHighlightKind.Write),
        (doc.pos("fc2(h)").line, T.DocumentHighlightKind.Read),
    ]
    doc.close()


async def test_rename_a_config_field_everywhere(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    rng = await client.text_document_prepare_rename_async(
        T.PrepareRenameParams(doc.id, doc.pos("c.hidden_features", 3))
    )
    assert doc.slice(rng) == "hidden_features"
    edit = await client.text_document_rename_async(T.RenameParams(doc.id, doc.pos("c.hidden_features", 3), "width"))
    edits = sorted(edit.changes[doc.uri], key=lambda e: (e.range.start.line, e.range.start.character), reverse=True)
    assert len(edits) == 4
    for e in edits:
        await doc.change(e.range.start, e.range.end, e.new_text)
    assert doc.text.count("width") == 4 and "hidden_features = 32" not in doc.text  # a comment still says it
    assert await doc.diagnostics() == []  # still checks: every use was renamed
    doc.close()


async def test_rename_refuses_std_names_keywords_and_bad_names(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    with pytest.raises(JsonRpcException, match="standard library"):
        await client.text_document_prepare_rename_async(T.PrepareRenameParams(doc.id, doc.pos("Linear(c.in", 1)))
    assert await client.text_document_prepare_rename_async(T.PrepareRenameParams(doc.id, doc.pos("let h", 1))) is None
    with pytest.raises(JsonRpcException, match="not a valid name"):
        await client.text_document_rename_async(T.RenameParams(doc.id, doc.pos("let h", 4), "2x"))
    with pytest.raises(JsonRpcException, match="not a valid name"):
        await client.text_document_rename_async(T.RenameParams(doc.id, doc.pos("let h", 4), "let"))
    doc.close()


async def test_document_symbols_are_the_outline(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    found = await client.text_document_document_symbol_async(T.DocumentSymbolParams(doc.id))
    top = [(s.name, s.kind) for s in found]
    assert top[:2] == [("Llama", T.SymbolKind.Struct), ("smollm2_135m", T.SymbolKind.Constant)]
    assert ("LlamaForCausalLM", T.SymbolKind.Class) in top
    attention = next(s for s in found if s.name == "LlamaAttention")
    children = {c.name: c.kind for c in attention.children}
    assert children["q_proj"] == T.SymbolKind.Property
    assert children["k_cache"] == T.SymbolKind.Variable
    assert children["step"] == T.SymbolKind.Method
    assert doc.slice(attention.selection_range) == "LlamaAttention"
    assert doc.slice(attention.range).startswith("module LlamaAttention(c: Llama) {")
    model = next(s for s in found if s.name == "LlamaForCausalLM")
    assert {c.name: c.detail for c in model.children}["forward"] == "entry fn"
    doc.close()


async def test_workspace_symbols_search_the_workspace_folder(client):
    found = await client.workspace_symbol_async(T.WorkspaceSymbolParams(query="tinymod"))
    assert [(s.name, s.kind) for s in found] == [("TinyModel", T.SymbolKind.Class)]
    assert found[0].location.uri == (WORKSPACE / "faults.linnet").as_uri()
    found = await client.workspace_symbol_async(T.WorkspaceSymbolParams(query="split"))
    assert [(s.name, s.container_name) for s in found] == [("split", "Block")]


async def test_folding_ranges(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    found = await client.text_document_folding_range_async(T.FoldingRangeParams(doc.id))
    spans = {(f.start_line, f.end_line, f.kind) for f in found}
    model = doc.pos("model Mlp").line
    assert (model, len(doc.text.rstrip("\n").split("\n")) - 1, None) in spans
    assert (0, 1, T.FoldingRangeKind.Comment) in spans  # the header comment
    doc.close()


async def test_renaming_a_parameter_edits_names_only(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    at = doc.pos("forward(x", len("forward("))
    refs = await client.text_document_references_async(
        T.ReferenceParams(text_document=doc.id, position=at, context=T.ReferenceContext(include_declaration=True))
    )
    assert [doc.slice(r.range) for r in refs] == ["x", "x"]
    loc = await definition(client, doc, "fc1(x)", 4, nth=1)  # the first is in the doc comment
    assert doc.slice(loc.range) == "x" and loc.range.start == at
    edit = await client.text_document_rename_async(T.RenameParams(doc.id, at, "inputs"))
    edits = sorted(edit.changes[doc.uri], key=lambda e: (e.range.start.line, e.range.start.character), reverse=True)
    assert [doc.slice(e.range) for e in edits] == ["x", "x"]
    for e in edits:
        await doc.change(e.range.start, e.range.end, e.new_text)
    assert "forward(inputs: [B, c.in_features])" in doc.text and "fc1(inputs)" in doc.text
    assert await doc.diagnostics() == []
    doc.close()


@pytest.mark.parametrize(
    "needle, new_name, why",
    [
        ("let h", "x", "already a name"),  # would be captured: `fc1(x)` then reads `h`'s value
        ("let h", "fc1", "already a name"),  # a member
        ("let h", "gelu", "already a name"),  # an op
        ("let h", "héllo", "not a valid name"),  # the grammar's names are ASCII
        ("model Mlp", "Linear", "already a name"),  # a std module
        ("in_features: int", "out_features", "already a name"),  # another field
    ],
)
async def test_rename_refuses_names_that_change_meaning(client, needle, new_name, why):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    delta = 4 if needle == "let h" else (6 if needle == "model Mlp" else 0)
    with pytest.raises(JsonRpcException, match=why):
        await client.text_document_rename_async(T.RenameParams(doc.id, doc.pos(needle, delta), new_name))
    doc.close()


async def test_renaming_a_member_warns_that_its_checkpoint_names_change(client):
    """A member's name is part of its parameters' checkpoint names (`fc1.weight`): renaming it renames them, and a
    checkpoint saved under the old names then no longer loads. The rename says so and suggests `@name`; a local's
    rename and a member that has `@name` say nothing."""
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    before = len(client.messages)
    edit = await client.text_document_rename_async(T.RenameParams(doc.id, doc.pos("fc1(x)", 1, nth=1), "dense"))
    assert {doc.slice(e.range) for e in edit.changes[doc.uri]} == {"fc1"}
    shown = [m for m in client.messages[before:] if "checkpoint" in m.message]
    assert len(shown) == 1 and shown[0].type == T.MessageType.Warning
    assert "(`fc1.` becomes `dense.` in each)" in shown[0].message and '@name("fc1")' in shown[0].message
    before = len(client.messages)
    await client.text_document_rename_async(T.RenameParams(doc.id, doc.pos("let h", 4), "hidden"))
    at = doc.text.index("    fc1: ")
    await doc.change(doc.at(at), doc.at(at), '    @name("fc1")\n')
    await doc.diagnostics()
    await client.text_document_rename_async(T.RenameParams(doc.id, doc.pos("fc1(x)", 1, nth=1), "dense"))
    assert not [m for m in client.messages[before:] if "checkpoint" in m.message]
    doc.close()
