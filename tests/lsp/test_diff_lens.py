"""The "Diff against transformers" lens: `linnet diff` on the root model in a worker, its first diverging module a
diagnostic on the member that declares it, cleared by an edit; "Verify" runs `linnet verify` the same way."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types as T

from tests.porting.catalogue import MUTATIONS

from .conftest import EXAMPLES, open_doc

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.porting.checkpoints import build

    folder = tmp_path_factory.mktemp("llama")
    build("llama", folder)
    return folder


async def published_from(client, doc, source: str, start: int) -> list[T.Diagnostic]:
    """The diagnostics from `source` in the first publication for `doc` after `start` that has any."""
    for _ in range(500):
        for p in client.published[start:]:
            found = [d for d in p.diagnostics if d.source == source]
            if p.uri == doc.uri and found:
                return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {source} diagnostic published")


async def test_diff_lens_places_the_first_difference_on_its_member(client, small_llama, tmp_path):
    (mutation,) = [m for m in MUTATIONS if m.id == "llama-head-merge-order"]
    text = (EXAMPLES / "llama.linnet").read_text().replace(mutation.find, mutation.replace)
    text += f'\n@weights("{small_llama}")\npreset tiny = Llama {{ hidden_size = 64 }}\n'
    doc = await open_doc(client, tmp_path / "llama.linnet", text)
    lenses = await client.text_document_code_lens_async(T.CodeLensParams(doc.id))
    assert "Diff against transformers" in [lens.command.title for lens in lenses]
    start = len(client.published)
    args = {"uri": doc.uri, "preset": "tiny"}
    result = await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.diff", [args]))
    # the heads merged in the wrong order feed o_proj (inlined in the attention's code): its output parts first
    assert result["agree"] is False and result["report"]["first"]["name"] == "model.layers.0.self_attn.o_proj"
    (diag,) = await published_from(client, doc, "linnet diff", start)
    assert doc.slice(diag.range) == "o_proj" and diag.range.start == doc.pos("o_proj: Linear(")
    head = "differs from transformers LlamaForCausalLM: model.layers.0.self_attn.o_proj in `forward`"
    assert diag.message.startswith(head)
    assert diag.severity == T.DiagnosticSeverity.Warning
    # an edit makes the result stale: the diagnostic goes with it
    await doc.change(doc.pos("config Llama"), doc.pos("config Llama"), "# an edit\n")
    assert [d for d in await doc.diagnostics() if d.source == "linnet diff"] == []
    doc.close()


async def test_verify_lens_places_the_first_parting_module(client, tmp_path):
    """A norm dropped from `forward` alone (the porting suite's row): `linnet verify` on seeded random weights at a
    shrunk preset finds forward and the cached steps part, on the decoder layers."""
    from tests.porting.layers import has_verify

    if not has_verify():
        pytest.skip("`linnet verify` is not in this tree (issue 40's layer 2)")
    (mutation,) = [m for m in MUTATIONS if m.id == "llama-norm-dropped-forward-only"]
    text = (EXAMPLES / "llama.linnet").read_text()
    at = text.index(mutation.find)
    text = text[:at] + mutation.replace + text[at + len(mutation.find) :]
    text += (
        "\npreset tiny = Llama { vocab_size = 256, hidden_size = 64, intermediate_size = 96, num_hidden_layers = 2,"
        " num_attention_heads = 4, num_key_value_heads = 2 }\n"
    )
    doc = await open_doc(client, tmp_path / "llama.linnet", text)
    start = len(client.published)
    args = {"uri": doc.uri, "preset": "tiny"}
    result = await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.verify", [args]))
    assert result["agree"] is False
    (diag,) = await published_from(client, doc, "linnet verify", start)
    assert diag.message.startswith("cache: ") and "`forward` and `step` part" in diag.message
    assert doc.slice(diag.range) in ("layers", "LlamaForCausalLM", "model")
    doc.close()
