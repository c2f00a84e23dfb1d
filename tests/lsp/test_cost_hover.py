"""What a preset costs, through a real client: hover on the root model, a preset, a module and a member, and the
opt-in parameter inlay hints (`linnet.inlayHints.parameters`). The numbers are the cost model's (tests/ir/
test_cost*.py hold them to transformers and PyTorch); here they are checked against the checker's own parameter
tree, an independent count."""

from __future__ import annotations

import pytest
from lsprotocol import types as T

from linnet.semantics.program import Document

from .conftest import EXAMPLES, open_doc
from .test_hover_hints import hover

pytestmark = pytest.mark.asyncio(loop_scope="module")


def tree_params(preset: str, prefix: str = "") -> int:
    """Elements of the checker's parameter tree under `prefix` (`model.layers.`)."""
    path = EXAMPLES / "llama.linnet"
    tree = Document(str(path), path.read_text(encoding="utf-8")).analyze().trees[preset]
    return sum(p.numel() for p in tree.params if p.path.startswith(prefix))


async def test_hover_on_a_preset_and_the_model_shows_the_summary(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    text = await hover(client, doc, "preset tinyllama_1_1b", len("preset t"))
    assert "**Cost** under preset `tinyllama_1_1b` (dtype f32, max_batch 1, max_positions 768)" in text
    assert f"({tree_params('tinyllama_1_1b'):,})" in text  # 1,100,048,384: transformers' count
    assert "44.0 KiB per token" in text  # 22 layers x 2 x 4 KV heads x 64 x 4 bytes
    assert "```text\n" in text and "forward  1 x 768" in text and "step       1 x 1" in text
    text = await hover(client, doc, "model LlamaForCausalLM", len("model L"))  # the first preset: smollm2_135m
    assert "under preset `smollm2_135m`" in text and "(134,515,008)" in text
    doc.close()


async def test_hover_on_a_module_and_a_member_shows_its_parameters(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    text = await hover(client, doc, "    layers: [", 5)
    layers = tree_params("smollm2_135m", "model.layers.")
    assert f"parameters under preset `smollm2_135m`: 106.20 M ({layers:,}) per `LlamaModel`" in text
    text = await hover(client, doc, "module LlamaAttention", len("module L"))
    attention = tree_params("smollm2_135m", "model.layers.0.self_attn.")
    assert f"{30 * attention:,}" in text and "30 in the model" in text
    text = await hover(client, doc, "    q_proj: Linear", 5)  # the member's declaration
    assert "331.8 K (331,776) per `LlamaAttention`" in text  # 576 x 576, no bias
    text = await hover(client, doc, "q_proj(x)", 1)  # a use: its type and signature, no cost (nothing to lower)
    assert "q_proj: Linear(" in text and "parameters under" not in text
    doc.close()


async def test_no_cost_for_a_document_with_errors(client):
    path = EXAMPLES / "llama.linnet"
    text = path.read_text(encoding="utf-8").replace("intermediate_size = 1536,", 'intermediate_size = "x",', 1)
    doc = await open_doc(client, path, text)
    assert any(d.severity == T.DiagnosticSeverity.Error for d in await doc.diagnostics())
    shown = await hover(client, doc, "preset smollm2_135m", len("preset s"))
    assert shown is None or "**Cost**" not in shown
    doc.close()


async def test_parameter_inlay_hints_are_opt_in(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    everything = T.InlayHintParams(doc.id, T.Range(T.Position(0, 0), T.Position(len(doc.text.splitlines()), 0)))
    labels = [h.label for h in await client.text_document_inlay_hint_async(everything)]
    assert not any("params" in label for label in labels)
    client.workspace_did_change_configuration(
        T.DidChangeConfigurationParams({"linnet": {"inlayHints": {"shapes": True, "parameters": True}}})
    )
    try:
        hints = await client.text_document_inlay_hint_async(everything)
        by_place = {(h.position.line, h.position.character): h.label for h in hints}
        member = "layers: [LlamaDecoderLayer(c); c.num_hidden_layers]"
        end = doc.pos(member, len(member))
        per_layer = tree_params("smollm2_135m", "model.layers.0.")
        assert by_place[(end.line, end.character)] == f"30 × {per_layer / 1e6:.2f} M params"
        name = doc.pos("model LlamaForCausalLM", len("model LlamaForCausalLM"))
        assert by_place[(name.line, name.character)] == "134.52 M params"
        assert ": [B, 9, S, 64]" in by_place.values()  # the shapes stay
    finally:
        client.workspace_did_change_configuration(
            T.DidChangeConfigurationParams({"linnet": {"inlayHints": {"shapes": True, "maxLength": 40}}})
        )
    doc.close()


async def test_an_importers_cost_follows_an_edit_of_an_imported_function(client, tmp_path):
    """The importer's checks are reused after an edit of an imported function's body (its interface is unchanged);
    its cost is the edited body's, as a fresh workspace's analysis shows it (before the fix: the old body's)."""
    from linnet.lsp.hover import hover_markdown
    from linnet.semantics.program import Workspace
    from tests.ir.test_lower_after_edits import EDITS, LIB, USER

    from .test_imports import _next_publish

    (tmp_path / "lib.linnet").write_text(LIB, encoding="utf-8")
    (tmp_path / "user.linnet").write_text(USER, encoding="utf-8")
    lib = await open_doc(client, tmp_path / "lib.linnet")
    user = await open_doc(client, tmp_path / "user.linnet")
    before = await hover(client, user, "model M", len("model "))
    old, new = EDITS["a function's body"]  # `x` -> `x @ w`: a matmul more
    published = len(client.published)
    await lib.change(lib.pos(old), lib.pos(old, len(old)), new)
    await _next_publish(client, user, published)  # the importer checked again after the edit
    shown = await hover(client, user, "model M", len("model "))
    fresh = Workspace()
    fresh.open(str(tmp_path / "lib.linnet"), lib.text)
    analysis = fresh.open(str(tmp_path / "user.linnet"), USER).analyze()
    expected, _ = hover_markdown(analysis, USER.index("model M") + len("model "), None)

    def cost(text: str) -> str:
        return text[text.index("**Cost**") :]

    assert cost(expected) != cost(before)
    assert cost(shown) == cost(expected)
    lib.close()
    user.close()


NOT_LOWERED = """config C {
    ch: int = 64
}

preset small = C { ch = 48 }

module Stack(c: C) {
    norm: GroupNorm(32, 64)

    fn sized(x: [B, c.ch, 8, 8]) -> ([B, c.ch, 8, 8], int) {
        (x, c.ch)
    }

    fn forward(x: [B, c.ch, 8, 8]) -> [B, 64, 8, 8] {
        let (h, width) = sized(x)
        norm(reshape(h, [B, width, 8, 8]))
    }
}

model M(c: C) {
    stack: Stack(c)

    entry fn forward(x: [B, c.ch, 8, 8]) -> [B, 64, 8, 8] {
        stack(x)
    }
}
"""


async def test_the_hover_says_why_a_model_that_checks_has_no_cost(client, tmp_path):
    """A model that checks but does not lower under the preset (48 channels in GroupNorm's 32 groups, through a size
    a user function returns in a tuple beside a tensor: the checker evaluates a call of a function returning ints,
    bools, floats, strs or tuples of them only, not one whose tuple holds a tensor): the hover on the model and the
    preset says so, with lowering's message (before: no cost, silently). (The sizes returned as a tuple of ints,
    which this test used before, are a check error since such a call takes its body's value: fn_values.py.)"""
    path = tmp_path / "patches.linnet"
    path.write_text(NOT_LOWERED, encoding="utf-8")
    doc = await open_doc(client, path)
    assert not await doc.diagnostics()
    why = "**Cost** under preset `small`: not known: the model does not lower: "
    for where in ("model M", "preset small"):
        text = await hover(client, doc, where, len(where) - 1)
        assert why in text and "(g c) = 48 with g = 32: 48 is not divisible by 32" in text
    doc.close()
