"""Issue 20's smaller defects, each through a real client that prefers plain text (as some
clients do for hover and completion documentation): a rename refusal, go to definition on a
primitive op, standard-library files, plain-text hover, completion details under the preset,
and an unclosed call that made a "never used" warning on the line above."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types as T
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from linnet.lsp.navigation import OP_DOCS
from linnet.semantics.program import std_library

from .conftest import EXAMPLES, SERVER, WORKSPACE, _factory, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER, client_factory=_factory), scope="module")
async def plain(lsp_client: LanguageClient):
    """A client that asks for plain text in hover, completion and signature help."""
    capabilities = client_capabilities("visual-studio-code")
    text_document = capabilities.text_document
    text_document.hover.content_format = [T.MarkupKind.PlainText]
    text_document.completion.completion_item.documentation_format = [T.MarkupKind.PlainText, T.MarkupKind.Markdown]
    text_document.signature_help.signature_information.documentation_format = [T.MarkupKind.PlainText]
    lsp_client.set_configuration({"linnet": {"preset": ""}})
    await lsp_client.initialize_session(
        T.InitializeParams(
            capabilities=capabilities, workspace_folders=[T.WorkspaceFolder(WORKSPACE.as_uri(), "workspace")]
        )
    )
    yield
    await lsp_client.shutdown_session()


def _tracebacks(client: LanguageClient) -> list[str]:
    return [m.message for m in client.log_messages if "Traceback" in m.message]


async def test_a_refused_rename_is_request_failed_with_its_reason_and_no_traceback(plain):
    doc = await open_doc(plain, WORKSPACE / "refused.linnet", "config C {\n  a: int = 1\n}\n")
    with pytest.raises(JsonRpcException, match="`config` is not a valid name") as refused:
        await plain.text_document_rename_async(T.RenameParams(doc.id, doc.pos("C {"), "config"))
    assert refused.value.code == T.LSPErrorCodes.RequestFailed
    assert _tracebacks(plain) == []
    doc.close()


async def test_go_to_definition_on_a_primitive_op_opens_its_row_in_the_op_table(plain):
    text = "fn f(x: [B, 4]) -> [B, 4] {\n    exp(x)  # exp here is a comment\n}\n"
    doc = await open_doc(plain, WORKSPACE / "op_definition.linnet", text)
    found = await plain.text_document_definition_async(T.DefinitionParams(doc.id, doc.pos("exp(x)", 1)))
    assert found.uri == OP_DOCS.as_uri()
    row = OP_DOCS.read_text(encoding="utf-8").split("\n")[found.range.start.line]
    assert row.startswith("| `exp(x: tensor)`")
    assert row[found.range.start.character : found.range.end.character] == "exp"
    in_comment = await plain.text_document_definition_async(T.DefinitionParams(doc.id, doc.pos("exp here", 1)))
    assert in_comment is None
    doc.close()


async def test_a_standard_library_file_opens_with_a_read_only_warning(plain):
    path = std_library().paths()[0]
    text = open(path, encoding="utf-8").read()
    before = len(plain.messages)
    doc = await open_doc(plain, Path(path), text)
    shown = [m for m in plain.messages[before:] if "standard library" in m.message]
    assert len(shown) == 1 and "read-only" in shown[0].message and shown[0].type == T.MessageType.Warning
    doc.close()
    user = await open_doc(plain, WORKSPACE / "not_std.linnet", "config C {\n  a: int = 1\n}\n")
    assert not [m for m in plain.messages[before + 1 :] if "standard library" in m.message]
    user.close()


async def test_hover_and_completion_answer_plain_text_with_the_presets_values(plain):
    doc = await open_doc(plain, EXAMPLES / "llama.linnet")
    at = doc.pos("h=c.num_attention_heads", 5)
    hover = await plain.text_document_hover_async(T.HoverParams(doc.id, at))
    assert hover.contents.kind == T.MarkupKind.PlainText
    assert "`" not in hover.contents.value
    # the first preset, smollm2_135m, has 9 heads (the config's default is 32)
    assert hover.contents.value == "num_attention_heads: int = 32\n\n= 9 under preset smollm2_135m"
    found = await plain.text_document_completion_async(
        T.CompletionParams(doc.id, doc.pos("h=c.num_attention_heads", 4))
    )
    by_label = {c.label: c for c in found.items}
    assert by_label["num_attention_heads"].detail == "num_attention_heads: int = 9 (smollm2_135m)"
    assert by_label["hidden_size"].detail == "hidden_size: int = 576 (smollm2_135m)"
    documented = [c for c in found.items if c.documentation is not None]
    assert documented and all(c.documentation.kind == T.MarkupKind.PlainText for c in documented)
    doc.close()


async def test_an_unclosed_call_is_the_only_diagnostic(plain):
    text = "fn f(x: [B, 4]) -> [B, 4] {\n    let y = exp(x)\n    let z = exp(y\n    z\n}\n"
    doc = await open_doc(plain, WORKSPACE / "unclosed.linnet", text)
    found = await doc.diagnostics()
    assert [(d.code, d.range.start.line) for d in found] == [("L003", 2)]  # no "`y` is never used" above it
    doc.close()


def test_plain_text_keeps_no_markdown_of_ours():
    """Every piece of Markdown the server writes (fences, inline code, the cost hover's bold heading) is gone in
    the plain-text form a client that prefers plaintext gets."""
    from linnet.lsp.convert import plain_text

    markdown = "**Cost** under preset `tiny` (S = 8):\n\n```text\nparameters  1.2 M\n```\n`x: [B, 4]`"
    assert plain_text(markdown) == "Cost under preset tiny (S = 8):\n\nparameters  1.2 M\nx: [B, 4]"
