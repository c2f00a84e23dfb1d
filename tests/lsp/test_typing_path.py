"""Issue 45's defects, through a real client: the unread-member warning (L904) after an edit inside a module whose
callers' checks the edit left valid; a request before `initialize`; a Content-Length header that is not a number."""

from __future__ import annotations

import json

import pytest
from lsprotocol import types as T

from linnet.semantics.program import Workspace

from .conftest import EXAMPLES, TIMEOUT_S, WORKSPACE, open_doc
from .test_malformed import RawClient

HOVER = {"textDocument": {"uri": (WORKSPACE / "absent.linnet").as_uri()}, "position": {"line": 0, "character": 0}}


@pytest.mark.asyncio(loop_scope="module")
async def test_an_edit_that_stops_reading_a_projection_warns_as_a_fresh_check_does(client, tmp_path):
    """Before, L904's walk followed the callers' cached checks to LlamaAttention as it was before the edit (its
    interface unchanged, they were not re-checked) and read the old text: no warning, and a re-check of the old
    module on every edit."""
    text = (EXAMPLES / "llama.linnet").read_text(encoding="utf-8")
    path = tmp_path / "llama.linnet"
    path.write_text(text, encoding="utf-8")
    doc = await open_doc(client, path)
    assert not [d for d in await doc.diagnostics() if d.code == "L904"]
    start = doc.pos("rearrange(v_proj(x)", len("rearrange("))
    await doc.change(start, T.Position(start.line, start.character + 1), "k")
    fresh = Workspace().open(str(path), doc.text).analyze(None)
    expected = sorted(d.message for d in fresh.diagnostics if d.code == "L904")
    assert expected == ["`v_proj` is loaded but never read by any entry of `LlamaForCausalLM`"]
    got = sorted(d.message.split("\n")[0] for d in await doc.diagnostics() if d.code == "L904")
    assert got == expected
    await doc.change(start, T.Position(start.line, start.character + 1), "v")  # read again: the warning goes
    assert not [d for d in await doc.diagnostics() if d.code == "L904"]
    doc.close()


def test_a_request_before_initialize_is_server_not_initialized():
    """LSP 3.17: a request before `initialize` is answered with ServerNotInitialized (-32002); a hover got null."""
    client = RawClient()
    try:
        client.send({"id": 1, "method": "textDocument/hover", "params": HOVER})
        answer = client.responses({1}).get(1, {})
        assert answer.get("error", {}).get("code") == -32002 and "result" not in answer
        client.send({"id": 2, "method": "initialize", "params": {"capabilities": {}}})
        assert "capabilities" in client.responses({2})[2]["result"]
        client.send({"method": "initialized", "params": {}})
        client.send({"id": 3, "method": "textDocument/hover", "params": HOVER})
        assert "error" not in client.responses({3})[3]
    finally:
        log = client.close()
    assert "Traceback" not in log


def test_a_header_with_a_length_that_is_not_a_number_loses_only_its_own_message():
    """`Content-Length: abc` made pygls read the body as a header line, swallowing the next message's header: the
    stream fell out of step. The framed message is answered with InvalidRequest under its id, and the next one as
    usual."""
    client = RawClient()
    try:
        client.send({"id": 0, "method": "initialize", "params": {"capabilities": {}}})
        assert client.responses({0})
        client.send({"method": "initialized", "params": {}})
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "textDocument/hover", "params": HOVER}).encode()
        client.process.stdin.write(b"Content-Length: abc\r\n\r\n" + body)
        client.send({"id": 2, "method": "shutdown"})
        answers = client.responses({1, 2})
        assert answers[1]["error"]["code"] == -32600 and "Content-Length" in answers[1]["error"]["message"]
        assert answers[2].get("result", "missing") is None
        client.send({"method": "exit"})
        assert client.process.wait(timeout=TIMEOUT_S) == 0
    finally:
        if client.process.poll() is None:
            client.process.kill()


def test_the_unread_check_keeps_nothing_of_the_checks_an_edit_replaced():
    """L904's cache kept every check's reads (its function and names) until it held 20,000 entries: the server's
    memory grew ~4 MB per 20 edits of llama.linnet. It keeps what the last analysis used, so memory is flat."""
    import gc
    import tracemalloc

    text = (EXAMPLES / "llama.linnet").read_text(encoding="utf-8")
    workspace = Workspace()
    path = str(WORKSPACE / "llama_edits.linnet")
    at = text.index("q_proj(x)", text.index("fn project("))

    def edits(n: int) -> None:
        nonlocal text
        for _ in range(n):
            text = text[:at] + ("v" if text[at] == "q" else "q") + text[at + 1 :]
            analysis = workspace.open(path, text).analyze(None)
            assert not [d for d in analysis.diagnostics if d.code == "L904"]

    # 12 edits after 3 (each traced: slow): with the old cache they kept ~2 MB (4.1 MB after 6 + 24), now ~3 kB
    tracemalloc.start()
    try:
        edits(3)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        edits(12)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000, f"{grown / 1e6:.1f} MB kept by 12 edits"


def test_a_request_reads_the_first_stage_of_a_check_without_waiting_for_the_rest():
    """Issue 45: a completion or hover sent with a keystroke waited for the whole check of the new text (every
    preset's binding of the edited module); once the first stage is there (`OpenDocument.check_first`), a staged
    request reads it while the rest of the check holds the document, and says what a fresh analysis says."""
    import asyncio

    from linnet.lsp.convert import uri_of
    from linnet.lsp.documents import OpenDocument
    from linnet.lsp.hover import hover_markdown

    async def run() -> None:
        path = str(EXAMPLES / "llama.linnet")
        text = (EXAMPLES / "llama.linnet").read_text(encoding="utf-8")
        doc = OpenDocument(uri_of(path), text, 1, Workspace())
        async with doc.analyzed(None):
            pass
        at = text.index("q_proj(x)", text.index("fn project("))
        doc.apply_changes([T.TextDocumentContentChangeWholeDocument(text[:at] + "k" + text[at + 1 :])], 2)
        await doc.check_first(None)
        on_q = doc.text.index("let q") + 4
        async with doc._lock:  # what the rest of the check holds while it runs
            async with asyncio.timeout(TIMEOUT_S):
                async with doc.analyzed(None, staged=True) as first:
                    assert first.partial and first.staged_for == "smollm2_135m"
                    got = hover_markdown(first, on_q, None)
        fresh = Workspace().open(path, doc.text).analyze(None)
        assert got == hover_markdown(fresh, on_q, None) and "q: ?" in got[0]  # `k_proj` has fewer features: no type
        async with doc.analyzed(None) as full:  # the rest of the check
            assert not full.partial
        async with doc.analyzed(None, staged=True) as after:  # once there, the full analysis is what all read
            assert after is full

    asyncio.run(run())
