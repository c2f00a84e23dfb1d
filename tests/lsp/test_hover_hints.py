"""Hover (types under the selected preset, signatures, docs, checkpoint names) and inlay hints."""

from __future__ import annotations

import pytest
from lsprotocol import types as T

from .conftest import EXAMPLES, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def hover(client, doc, needle, delta=0, nth=0) -> str | None:
    result = await client.text_document_hover_async(T.HoverParams(doc.id, doc.pos(needle, delta, nth)))
    return result.contents.value if result is not None else None


async def test_hover_shows_the_symbolic_and_the_presets_shape(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    text = await hover(client, doc, "let q = ", 4)
    assert "q: [B, c.num_attention_heads, S, c.head_dim]" in text
    assert "= `[B, 9, S, 64]` under preset `smollm2_135m`" in text
    # an expression: the result of a call
    text = await hover(client, doc, "o_proj(rearrange(out", 1)
    assert "[B, S, c.hidden_size]" in text or "Linear(" in text
    doc.close()


async def test_hover_on_a_submodule_call_a_std_function_and_an_op(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    text = await hover(client, doc, "down_proj(silu", 1, nth=1)  # the first is in the doc comment
    assert "Linear(in_features=1536, out_features=576, use_bias=false)" in text
    assert "down_proj: Linear(c.intermediate_size, c.hidden_size, use_bias=c.mlp_bias)" in text

    text = await hover(client, doc, "attention(q, k, v, mask", 2)
    assert "fn attention" in text  # the std function's signature
    assert "```linnet" in text

    text = await hover(client, doc, "rearrange(q_proj", 2)
    assert text.startswith("```linnet\nop rearrange(")
    doc.close()


async def test_hover_on_a_config_field_gives_its_declaration_and_doc(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    text = await hover(client, doc, "c.rms_norm_eps)", 3, nth=0)
    assert "rms_norm_eps: float = 1e-6" in text
    doc.close()


async def test_hover_on_a_parameter_lists_its_checkpoint_names(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    text = await hover(
        client, doc, "h @ transpose(model.embed_tokens.weight)", len("h @ transpose(model.embed_tokens.w")
    )
    assert "`model.embed_tokens.weight`" in text
    assert "1 checkpoint tensor" not in text or "28,311,552" in text
    assert "(1, 28,311,552 elements) under preset `smollm2_135m`" in text
    doc.close()


async def test_selecting_a_preset_changes_the_numbers(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    await client.workspace_execute_command_async(
        T.ExecuteCommandParams("linnet.selectPreset", [{"uri": doc.uri, "preset": "tinyllama_1_1b"}])
    )
    text = await hover(client, doc, "let q = ", 4)
    assert "= `[B, 32, S, 64]` under preset `tinyllama_1_1b`" in text
    hints = await client.text_document_inlay_hint_async(
        T.InlayHintParams(doc.id, T.Range(T.Position(0, 0), T.Position(len(doc.text.splitlines()), 0)))
    )
    assert ": [B, 32, S, 64]" in [h.label for h in hints]
    await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.selectPreset", [{"preset": ""}]))
    text = await hover(client, doc, "let q = ", 4)
    assert "under preset `smollm2_135m`" in text
    doc.close()


async def test_inlay_hints_after_lets_assignments_and_call_results(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    lines = len(doc.text.splitlines())
    hints = await client.text_document_inlay_hint_async(
        T.InlayHintParams(doc.id, T.Range(T.Position(0, 0), T.Position(lines, 0)))
    )
    by_place = {(h.position.line, h.position.character): h.label for h in hints}
    q = doc.pos("let q = ", 5)
    assert by_place[(q.line, q.character)] == ": [B, 9, S, 64]"
    k = doc.pos("let k = ", 5)
    assert by_place[(k.line, k.character)] == ": [B, 3, S, 64]"
    # assignment of a loop-carried value
    h = doc.pos("h = layer(h", 1)
    assert by_place[(h.line, h.character)] == ": [B, S, 576]"
    # a call result that ends a body
    body = "down_proj(silu(gate_proj(x)) * up_proj(x))"
    end = doc.pos(body, len(body), nth=1)  # the first is in the doc comment
    assert by_place[(end.line, end.character)] == "-> [..., 576]"
    assert all(h.kind == T.InlayHintKind.Type for h in hints)
    # only the requested range
    few = await client.text_document_inlay_hint_async(T.InlayHintParams(doc.id, T.Range(q, T.Position(q.line + 1, 0))))
    assert [h.label for h in few] == [": [B, 9, S, 64]"]
    doc.close()


async def test_inlay_hint_settings(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    rng = T.Range(T.Position(0, 0), T.Position(len(doc.text.splitlines()), 0))
    client.workspace_did_change_configuration(
        T.DidChangeConfigurationParams({"linnet": {"inlayHints": {"shapes": True, "maxLength": 8}}})
    )
    hints = await client.text_document_inlay_hint_async(T.InlayHintParams(doc.id, rng))
    assert hints and all(len(h.label) <= 8 + 3 for h in hints)
    assert ": [B, 9, …" in [h.label for h in hints]
    client.workspace_did_change_configuration(
        T.DidChangeConfigurationParams({"linnet": {"inlayHints": {"shapes": False}}})
    )
    assert not await client.text_document_inlay_hint_async(T.InlayHintParams(doc.id, rng))
    client.workspace_did_change_configuration(
        T.DidChangeConfigurationParams({"linnet": {"inlayHints": {"shapes": True, "maxLength": 40}}})
    )
    assert await client.text_document_inlay_hint_async(T.InlayHintParams(doc.id, rng))
    doc.close()


async def test_hover_on_a_shared_module_says_which_config_fields_it_reads(client):
    """mistral.linnet imports llama.linnet's decoder layer: hover on it lists the Llama fields it reads, directly and
    through the attention and MLP it builds: what a config must declare to be passed in Llama's place."""
    doc = await open_doc(client, EXAMPLES / "mistral.linnet")
    text = await hover(client, doc, "LlamaDecoderLayer(c)", 2)
    assert "module LlamaDecoderLayer(c: Llama)" in text
    assert "Reads `hidden_size`, `rms_norm_eps`, " in text
    assert all(f"`{f}`" in text for f in ("num_key_value_heads", "attention_bias", "mlp_bias", "intermediate_size"))
    assert "another config than `Llama` can be passed if it declares them" in text
    doc.close()


async def test_hover_and_hints_in_a_list_whose_elements_receive_their_index(client):
    """ModernBERT's `layers: [ModernBertEncoderLayer(c, layer_idx) for layer_idx in range(...)]`: the list (with
    the parameters of its 22 layers, the first without `attn_norm`), its index, and hints inside an element."""
    doc = await open_doc(client, EXAMPLES / "modernbert.linnet")
    text = await hover(client, doc, "layers: [", 2)
    assert "[ModernBertEncoderLayer(c, layer_idx=layer_idx) for layer_idx in range(22)]" in text
    # 22 x (Wqkv, Wo, Wi, Wo, mlp_norm) + 21 attn_norms: ModernBERT-base less its embeddings and final norm
    assert f"({22 * (768 * 2304 + 768 * 768 + 768 * 2304 + 1152 * 768 + 768) + 21 * 768:,})" in text
    text = await hover(client, doc, "for layer_idx in range", len("for l"))
    assert "layer_idx: int" in text
    text = await hover(client, doc, "attn_norm: LayerNorm", 2)
    assert "768 (768) per `ModernBertEncoderLayer`" in text
    lines = len(doc.text.splitlines())
    hints = await client.text_document_inlay_hint_async(
        T.InlayHintParams(doc.id, T.Range(T.Position(0, 0), T.Position(lines, 0)))
    )
    by_place = {(h.position.line, h.position.character): h.label for h in hints}
    normed = doc.pos("let normed = ", len("let normed"))
    assert by_place[(normed.line, normed.character)] == ": [B, S, 768]"
    doc.close()


SHARED_BINDING = """config C {
    n: int = 4
}

preset small = C { n = 4 }

preset big = C { n = 8 }

model M(c: C) {
    w: [c.n, c.n]

    fn forward(x: [B, c.n]) -> [B, c.n] {
        let y = x @ w
        y
    }
}
"""


async def test_hover_names_the_selected_preset_where_the_defaults_share_its_check(client, tmp_path):
    # `small` gives the defaults' values, so one check holds both scenarios (`defaults`, `small`): hover named the
    # check's first scenario, the defaults, and so said nothing of the preset it quoted
    doc = await open_doc(client, tmp_path / "shared.linnet", SHARED_BINDING)
    text = await hover(client, doc, "let y", 4)  # no preset selected: the first, `small`, is quoted
    assert "= `[B, 4]` under preset `small`" in text
    select = "linnet.selectPreset"
    for preset, shape in (("small", "[B, 4]"), ("big", "[B, 8]")):
        await client.workspace_execute_command_async(T.ExecuteCommandParams(select, [{"preset": preset}]))
        text = await hover(client, doc, "let y", 4)
        assert f"= `{shape}` under preset `{preset}`" in text
    await client.workspace_execute_command_async(T.ExecuteCommandParams(select, [{"preset": ""}]))
    doc.close()
