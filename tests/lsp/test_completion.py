"""Completion (members after `.`, names in scope, items, ops, keywords, snippets) and signature
help, including while the statement being typed does not parse."""

from __future__ import annotations

import pytest
from lsprotocol import types as T

from .conftest import EXAMPLES, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def complete(client, doc, position) -> dict[str, T.CompletionItem]:
    result = await client.text_document_completion_async(T.CompletionParams(doc.id, position))
    items = result.items if isinstance(result, T.CompletionList) else result
    return {i.label: i for i in items}


async def test_config_fields_after_c_dot_while_typing(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    # type `let w = c.` on a new line in LlamaMLP.forward: the statement does not parse yet
    where = doc.pos("        down_proj(silu(gate_proj(x))")
    await doc.change(where, where, "        let w = c.\n")
    items = await complete(client, doc, doc.pos("let w = c.", len("let w = c.")))
    assert {"hidden_size", "rms_norm_eps", "rope_scaling", "head_dim"} <= set(items)
    assert items["rms_norm_eps"].kind == T.CompletionItemKind.Field
    # the value under the file's first preset, as hover shows it (the config's default is 1e-6)
    assert items["rms_norm_eps"].detail == "rms_norm_eps: float = 1e-5 (smollm2_135m)"
    assert "down_proj" not in items  # members of the config only
    doc.close()


async def test_module_members_after_a_submodule_dot(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    where = doc.pos("        let x = h + self_attn.step")
    await doc.change(where, where, "        self_attn.\n")
    items = await complete(client, doc, doc.pos("self_attn.\n", len("self_attn.")))
    assert {"q_proj", "k_cache", "project", "forward", "step"} <= set(items)
    assert items["step"].kind == T.CompletionItemKind.Method
    assert items["step"].detail.startswith("fn step(x: [B, S, c.hidden_size]")
    assert items["k_cache"].detail == "state k_cache: [max_batch, c.num_key_value_heads, max_positions, c.head_dim]"
    doc.close()


async def test_names_in_scope_items_and_ops(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    # at the start of the last line of LlamaAttention.forward's body
    items = await complete(client, doc, doc.pos("o_proj(rearrange(out", 0, nth=0))
    # parameters, the let above, members, module parameters, dims and load-time dims
    for name in ("x", "cos", "sin", "mask", "q", "k", "v", "out", "q_proj", "k_cache", "c", "B", "S", "max_positions"):
        assert name in items, name
    assert "h" not in items and "positions" not in items  # other functions' locals
    # the file's modules, the std library, primitive ops with signatures, keywords, dtypes
    assert items["LlamaMLP"].kind == T.CompletionItemKind.Class
    assert items["Linear"].kind == T.CompletionItemKind.Class
    assert items["softmax"].kind == T.CompletionItemKind.Function
    assert items["rearrange"].detail.startswith("op rearrange(")
    assert items["rearrange"].documentation.value
    assert items["let"].kind == T.CompletionItemKind.Keyword
    assert items["bf16"].kind == T.CompletionItemKind.TypeParameter
    # locals sort before globals, globals before ops
    assert items["out"].sort_text < items["LlamaMLP"].sort_text < items["rearrange"].sort_text
    doc.close()


async def test_item_snippets_at_the_start_of_a_line(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet", (EXAMPLES / "mlp.linnet").read_text() + "\n")
    end = doc.at(len(doc.text))
    items = await complete(client, doc, end)
    assert {"module", "fn", "config", "preset", "model"} <= set(items)
    assert items["module"].insert_text_format == T.InsertTextFormat.Snippet
    assert items["module"].insert_text.startswith("module ${1:Name}(c: ${2:Config}) {")
    doc.close()


async def signature(client, doc, position) -> T.SignatureHelp | None:
    return await client.text_document_signature_help_async(T.SignatureHelpParams(doc.id, position))


async def test_signature_help_for_ops_functions_modules_and_methods(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    # an op, second argument
    help_ = await signature(client, doc, doc.pos('rearrange(q_proj(x), "b s', len('rearrange(q_proj(x), "')))
    assert help_.signatures[0].label.startswith("rearrange(")
    assert help_.active_parameter == 1
    # each parameter's label is a substring of the signature's, as LSP requires (`name=size, ...` too)
    assert all(p.label in help_.signatures[0].label for p in help_.signatures[0].parameters)
    # a keyword argument selects its parameter
    help_ = await signature(client, doc, doc.pos("take(k_cache, rows, dim=0)", len("take(k_cache, rows, dim=")))
    names = [p.label.split(":")[0] for p in help_.signatures[0].parameters]
    assert help_.signatures[0].label.startswith("take(") and names[help_.active_parameter] == "dim"
    # a std function with its doc
    help_ = await signature(client, doc, doc.pos("attention(q, k, v, mask, c.head_dim", len("attention(q, k, v, ")))
    sig = help_.signatures[0]
    assert sig.label.startswith("fn attention(")
    assert help_.active_parameter == 3
    assert sig.parameters[3].label.startswith("mask")
    # a module constructor
    help_ = await signature(
        client, doc, doc.pos("RMSNorm(c.hidden_size, c.rms_norm_eps)", len("RMSNorm(c.hidden_size, "))
    )
    assert help_.signatures[0].label == "module RMSNorm(hidden_size: int, eps: float = 1e-6)"
    assert help_.active_parameter == 1
    # a submodule's method
    help_ = await signature(client, doc, doc.pos("self_attn.step(input_layernorm(h), cos", len("self_attn.step(")))
    assert help_.signatures[0].label.startswith("fn step(x: [B, S, c.hidden_size]")
    assert help_.active_parameter == 0
    # outside any call
    assert await signature(client, doc, doc.pos("config Llama")) is None
    doc.close()


async def test_nothing_inside_comments_and_strings(client):
    text = (
        (EXAMPLES / "mlp.linnet").read_text().replace("fc2(h)\n", 'fc2(h)  # gelu(fc1(\n        let s = "gelu(x, "\n')
    )
    doc = await open_doc(client, EXAMPLES / "mlp.linnet", text)
    in_comment = doc.pos("# gelu(fc1(", len("# gelu(fc1("))
    assert await signature(client, doc, in_comment) is None
    assert not await complete(client, doc, in_comment)
    in_string = doc.pos('"gelu(x, "', len('"gelu(x, '))
    assert not await complete(client, doc, in_string)
    # brackets inside a string argument do not count: this is `rearrange`'s second argument
    help_ = await signature(client, doc, doc.pos("let s", 0))
    assert help_ is None
    doc.close()
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    help_ = await signature(client, doc, doc.pos('"b s (h d) -> b h s d"', len('"b s (h d')))
    assert help_.signatures[0].label.startswith("rearrange(") and help_.active_parameter == 1
    doc.close()


async def test_completions_and_hovers_sent_with_each_keystroke_answer_for_the_new_text(client):
    """Issue 45 (completion during typing bursts): a completion or hover sent right after a keystroke is answered
    from the first stage of that keystroke's check (the edited function under the selected preset only, the rest
    as the last analysis had it) while the rest is checked; what it says is what a fresh analysis of the client's
    text says: the `let` being renamed under its new name only, the config's fields after `c.` with their values,
    the type of the `let` just above."""
    from linnet.lsp.completion import completions
    from linnet.lsp.hover import hover_markdown
    from linnet.semantics.program import Workspace

    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    tuple_line = "        (apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)"
    where = doc.pos(tuple_line)
    await doc.change(where, where, "        let w = k\n")
    name = "w"
    for letter in "eights":
        end = doc.pos(f"let {name} = k", len(f"let {name}"))
        await doc.change(end, end, letter)
        name += letter
        in_scope = doc.pos(tuple_line, len("        "))
        member = doc.pos("h=c.num_attention_heads", len("h=c."))
        got_scope = await complete(client, doc, in_scope)  # sent before the keystroke's diagnostics arrive
        got_member = await complete(client, doc, member)
        on_let = doc.pos(f"let {name} = k", len("let "))
        hover = await client.text_document_hover_async(T.HoverParams(doc.id, on_let))
        fresh = Workspace().open(str(EXAMPLES / "llama.linnet"), doc.text).analyze()
        for got, position in ((got_scope, in_scope), (got_member, member)):
            want = {c.label: c.detail or None for c in completions(fresh, doc.offset(position), None)}
            assert {label: item.detail for label, item in got.items()} == want
        assert name in got_scope and name[:-1] not in got_scope
        assert got_member["num_attention_heads"].detail == "num_attention_heads: int = 9 (smollm2_135m)"
        assert hover.contents.value == hover_markdown(fresh, doc.offset(on_let), None)[0]
        assert f"{name}: [B, c.num_key_value_heads, S, c.head_dim]" in hover.contents.value
    doc.close()
