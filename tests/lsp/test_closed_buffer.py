"""A buffer the editor closes while a check of it is due: that check, made after the close, never writes the text
the workspace holds for the file (linnet/semantics/workspace.py, `Workspace.open(..., since=...)`), which is the
buffer of the file opened since, or the file on disk: what the reopened buffer's requests and every importer read.

The LSP fuzz (tests/lsp/test_fuzz.py, seed 20260517) closes and reopens its document at once and types on: the
closed buffer's `_diagnose` was in its first stage (`check_first`) at the close and went on to the full check of
its last text, which updated the workspace's document, made anew for the reopened buffer, back to that text. The
reopened buffer's analysis, made just before, then read items of the closed buffer's text: semantic tokens of
another version's text (at version 712, or a document symbol's range elsewhere: traced in the server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types as T

from linnet.lsp import navigation
from linnet.lsp.convert import uri_of
from linnet.lsp.documents import DocumentClosed, Documents
from linnet.lsp.server import create_server
from linnet.lsp.tokens import semantic_tokens
from linnet.semantics.program import Document
from tests.conftest import EXAMPLES
from tests.lsp.test_import_reads import EDITED as TYPED  # typed in the reopened buffer: `double` moves down
from tests.lsp.test_import_reads import LIB, USER  # (the same library and importer)

ON_DISK = "fn double(x: [N]) -> [N] {\n    x + x\n}\n"  # the file as saved: `double` on its first line
TIMEOUT_S = 20.0


def _files(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "lib.linnet").write_text(ON_DISK, encoding="utf-8")
    (tmp_path / "user.linnet").write_text(USER, encoding="utf-8")
    return uri_of(str(tmp_path / "lib.linnet")), uri_of(str(tmp_path / "user.linnet"))


def _edit(uri: str, version: int, text: str) -> T.DidChangeTextDocumentParams:
    change = T.TextDocumentContentChangeWholeDocument(text)
    return T.DidChangeTextDocumentParams(T.VersionedTextDocumentIdentifier(version, uri), [change])


def _opened(uri: str, version: int, text: str) -> T.DidOpenTextDocumentParams:
    return T.DidOpenTextDocumentParams(T.TextDocumentItem(uri, "linnet", version, text))


def test_a_closed_buffers_due_check_leaves_the_reopened_buffer_and_its_importers_their_text(tmp_path, monkeypatch):
    # The server's own handlers, in the fuzz's order: lib.linnet's `_diagnose` pauses at a hook after the first
    # stage of its check of an edit, while the editor closes lib.linnet, opens it again with the same text, types
    # `first` above `double`, and the reopened buffer is checked; then the paused check goes on. It made the full
    # check of the closed buffer's text, which put that text back into the workspace: user.linnet's definition of
    # `double` then led to line 1, where the closed buffer has it, not line 3, where the open buffer has it.
    lib_uri, user_uri = _files(tmp_path)
    server = create_server()
    monkeypatch.setattr(server, "text_document_publish_diagnostics", lambda params: None)
    handle = server.protocol.fm.features
    on_use = USER.index("double(y)")
    checked: list[str] = []  # the texts of the closed buffer's full checks after the hook

    async def run() -> tuple:
        handle[T.TEXT_DOCUMENT_DID_OPEN](_opened(user_uri, 1, USER))
        handle[T.TEXT_DOCUMENT_DID_OPEN](_opened(lib_uri, 1, LIB))
        closed = server.documents.get(lib_uri)
        await asyncio.wait_for(closed.diagnose_task, TIMEOUT_S)
        reached, resume = asyncio.Event(), asyncio.Event()

        async def paused() -> None:  # the hook: the closed buffer's check, between its first stage and the rest
            reached.set()
            await resume.wait()

        monkeypatch.setattr(closed.staged_answers, "wait", paused)
        real_analyze = closed._analyze
        monkeypatch.setattr(closed, "_analyze", lambda text, preset: checked.append(text) or real_analyze(text, preset))
        handle[T.TEXT_DOCUMENT_DID_CHANGE](_edit(lib_uri, 2, LIB + "\n"))
        await asyncio.wait_for(reached.wait(), TIMEOUT_S)
        handle[T.TEXT_DOCUMENT_DID_CLOSE](T.DidCloseTextDocumentParams(T.TextDocumentIdentifier(lib_uri)))
        handle[T.TEXT_DOCUMENT_DID_OPEN](_opened(lib_uri, 3, LIB + "\n"))
        handle[T.TEXT_DOCUMENT_DID_CHANGE](_edit(lib_uri, 4, TYPED))
        reopened = server.documents.get(lib_uri)
        await asyncio.wait_for(reopened.diagnose_task, TIMEOUT_S)
        resume.set()
        await asyncio.wait_for(closed.diagnose_task, TIMEOUT_S)
        held = server.documents.workspace.loaded(reopened.path).text  # what lib.linnet's importers read now

        user = server.documents.get(user_uri)
        async with user.analyzed(None) as analysis:
            found = navigation.definition(analysis, on_use)
        params = T.SemanticTokensParams(T.TextDocumentIdentifier(lib_uri))
        tokens = await handle[T.TEXT_DOCUMENT_SEMANTIC_TOKENS_FULL](params)
        return held, found, tokens.data

    held, found, tokens = asyncio.run(run())
    assert checked == []  # the closed buffer's `_diagnose` ended at the close: its check would read a text no one shows
    assert held == TYPED  # what the workspace holds for lib.linnet: the open buffer's text
    assert (found.path, found.start.line, found.start.column) == (str(tmp_path / "lib.linnet"), 4, 4)
    assert tokens == semantic_tokens(Document(str(tmp_path / "lib.linnet"), TYPED).analyze())


@pytest.mark.parametrize("checked", [True, False], ids=["checked-before", "never-checked"])
def test_a_check_due_when_the_buffer_closed_leaves_importers_the_file_on_disk(tmp_path, checked):
    # A request sent before the close and answered after it checked the closed buffer's text: that check made the
    # buffer the workspace's text of lib.linnet again, for good (importers read it, not the file on disk), whether
    # the buffer had been checked before (its document was dropped at the close) or not (none was registered yet).
    # Such a request is now refused (DocumentClosed: the handler answers its default) without a check.
    lib_uri, user_uri = _files(tmp_path)
    documents = Documents()
    user = documents.open(user_uri, USER, 1)
    lib = documents.open(lib_uri, LIB, 1)
    on_use = USER.index("double(y)")

    async def run():
        if checked:
            async with lib.analyzed(None):
                pass
        lib.apply_changes([T.TextDocumentContentChangeWholeDocument(TYPED)], 2)
        documents.close(lib_uri)
        with pytest.raises(DocumentClosed):  # the request sent before the close
            async with lib.analyzed(None):
                pass
        async with user.analyzed(None) as analysis:
            return navigation.definition(analysis, on_use)

    found = asyncio.run(run())
    assert not documents.workspace.is_open(str(tmp_path / "lib.linnet"))
    assert (found.start.line, found.start.column) == (1, 4)  # the file on disk's `double`


def test_a_closed_buffer_stages_no_check(tmp_path, monkeypatch):
    # `check_first` of a buffer closed since its edit (its `_diagnose` at the close) does nothing: the first stage
    # would start from nothing, in a document of its own.
    lib_uri, _ = _files(tmp_path)
    documents = Documents()
    lib = documents.open(lib_uri, LIB, 1)
    staged: list[str] = []

    async def run() -> None:
        async with lib.analyzed(None):
            pass
        lib.apply_changes([T.TextDocumentContentChangeWholeDocument(LIB.replace("x * 2.0", "x * 3.0"))], 2)
        documents.close(lib_uri)
        monkeypatch.setattr(lib, "_analyze_first", lambda text, preset: staged.append(text) or (None, ()))
        await lib.check_first(None)

    asyncio.run(run())
    assert staged == []


def test_a_document_opened_again_without_a_close_owns_the_text(tmp_path):
    # A client that sends didOpen for a URI already open: the first buffer's check still due leaves the second's text
    # (a request about the first buffer is refused: DocumentClosed).
    lib_uri, _ = _files(tmp_path)
    documents = Documents()
    first = documents.open(lib_uri, LIB, 1)
    second = documents.open(lib_uri, TYPED, 1)

    async def run() -> str:
        async with second.analyzed(None):
            pass
        with pytest.raises(DocumentClosed):
            async with first.analyzed(None):
                pass
        return documents.workspace.loaded(second.path).text

    assert asyncio.run(run()) == TYPED


def test_two_buffers_of_one_file_each_read_their_own_text(tmp_path):
    # What `Analysis.holds_text` still guards: two URIs naming one file (`sub/../lib.linnet`), open at once, share
    # the workspace's document of the path; each one's analysis updates it to its own text. A request about the
    # first, whose analysis was made before the second's, read the items of the second's text without it.
    documents = Documents()
    one = documents.open(uri_of(str(tmp_path / "lib.linnet")), LIB, 1)
    other = documents.open(uri_of(str(tmp_path / "sub" / ".." / "lib.linnet")), TYPED, 1)

    async def run() -> list[int]:
        async with one.analyzed(None):
            pass
        async with other.analyzed(None):
            pass
        async with one.analyzed(None) as analysis:
            assert analysis.document.text == LIB
            return semantic_tokens(analysis)

    assert asyncio.run(run()) == semantic_tokens(Document(str(tmp_path / "lib.linnet"), LIB).analyze())


def test_a_request_in_flight_at_a_close_is_answered_without_checking_the_closed_text(tmp_path, monkeypatch):
    # A hover sent with a keystroke waits for the buffer's lock while the editor closes the buffer: it was answered
    # from a check of the closed text made from nothing, under the workspace's lock (seconds on a 5 MB file, which
    # every other document's requests waited for). Now it gets the hover's default, and nothing is checked.
    lib_uri, _ = _files(tmp_path)
    server = create_server()
    monkeypatch.setattr(server, "text_document_publish_diagnostics", lambda params: None)
    handle = server.protocol.fm.features
    checked: list[str] = []

    async def run():
        handle[T.TEXT_DOCUMENT_DID_OPEN](_opened(lib_uri, 1, LIB))
        doc = server.documents.get(lib_uri)
        await asyncio.wait_for(doc.diagnose_task, TIMEOUT_S)
        real_analyze = doc._analyze
        monkeypatch.setattr(doc, "_analyze", lambda text, preset: checked.append(text) or real_analyze(text, preset))
        await doc._lock.acquire()  # a check of the document under way
        handle[T.TEXT_DOCUMENT_DID_CHANGE](_edit(lib_uri, 2, TYPED))
        hover = asyncio.ensure_future(
            handle[T.TEXT_DOCUMENT_HOVER](T.HoverParams(T.TextDocumentIdentifier(lib_uri), T.Position(0, 4)))
        )
        await asyncio.sleep(0.05)  # the hover waits for the lock
        handle[T.TEXT_DOCUMENT_DID_CLOSE](T.DidCloseTextDocumentParams(T.TextDocumentIdentifier(lib_uri)))
        doc._lock.release()
        answer = await asyncio.wait_for(hover, TIMEOUT_S)
        await asyncio.wait_for(doc.diagnose_task, TIMEOUT_S)
        return answer

    assert asyncio.run(run()) is None
    assert checked == []


def test_the_check_of_a_buffer_closed_meanwhile_stops_at_its_next_pause_point(tmp_path, monkeypatch):
    # A buffer closed while its full check runs: the check went on to its end under the workspace's lock (the rest of
    # a 5 MB file's 20 s, which every other document's check waited for). It now stops at its next pause point.
    uri = uri_of(str(tmp_path / "llama.linnet"))
    documents = Documents()
    doc = documents.open(uri, (EXAMPLES / "llama.linnet").read_text(encoding="utf-8"), 1)
    paused: list[bool] = []

    def close_at_first_pause() -> None:  # (the request gate's wait, in the check's thread)
        paused.append(doc.dropped)
        if len(paused) == 1:
            documents.close(uri)  # the editor's didClose, as the worker thread sees it

    monkeypatch.setattr(doc.requests, "wait", close_at_first_pause)

    async def run(doc) -> None:
        async with doc.analyzed(None):
            pass

    with pytest.raises(DocumentClosed):
        asyncio.run(run(doc))
    assert paused == [False]  # the pause point after the close stopped the check

    left_open = Documents().open(uri, (EXAMPLES / "llama.linnet").read_text(encoding="utf-8"), 1)
    counted: list[bool] = []  # the same check, left open: it passes many pause points
    monkeypatch.setattr(left_open.requests, "wait", lambda: counted.append(True))
    asyncio.run(run(left_open))
    assert len(counted) > 10


def test_closing_one_of_two_buffers_of_a_file_leaves_the_other_answered(tmp_path):
    # Two URIs naming one file (`sub/../lib.linnet`), open at once: the editor closes one. The other is still open and
    # its requests are answered from its own text; the refusal of a closed buffer's requests (DocumentClosed) went by
    # the file's path, which both share, and refused them.
    (tmp_path / "sub").mkdir()
    lib_uri, _ = _files(tmp_path)
    documents = Documents()
    one = documents.open(lib_uri, LIB, 1)
    other = documents.open(uri_of(str(tmp_path / "sub" / ".." / "lib.linnet")), LIB, 1)

    async def run() -> str:
        async with one.analyzed(None):
            pass
        async with other.analyzed(None):
            pass
        documents.close(lib_uri)
        other.apply_changes([T.TextDocumentContentChangeWholeDocument(TYPED)], 2)
        async with other.analyzed(None) as analysis:
            return analysis.document.text

    assert asyncio.run(run()) == TYPED


def test_the_parse_of_a_buffer_closed_meanwhile_stops_and_leaves_its_document_as_it_was(tmp_path, monkeypatch):
    # The full check of a buffer whose text changed parses its new items first, with no pause point: the 5 MB file,
    # closed at its first screenful's diagnostics, went on to parse all of itself (2.5 s under the workspace's lock,
    # which a keystroke in another file waited for: bench/lsp_bigdoc.py's `close_while_checking`). The parse now stops
    # at the close, before it changes anything.
    uri = uri_of(str(tmp_path / "llama.linnet"))
    llama = (EXAMPLES / "llama.linnet").read_text(encoding="utf-8")
    documents = Documents()
    doc = documents.open(uri, llama, 1)

    async def run(doc) -> None:
        async with doc.analyzed(None):
            pass

    asyncio.run(run(doc))
    document = doc._analysis.document
    items = list(document.items)
    many = "".join(f"fn f{i}(x: [N]) -> [N] {{\n    x + x\n}}\n\n" for i in range(40))
    doc.apply_changes([T.TextDocumentContentChangeWholeDocument(many)], 2)
    paused: list[bool] = []

    def close_at_first_pause() -> None:  # (the request gate's wait, in the check's thread)
        paused.append(doc.dropped)
        if len(paused) == 1:
            documents.close(uri)

    monkeypatch.setattr(doc.requests, "wait", close_at_first_pause)
    with pytest.raises(DocumentClosed):
        asyncio.run(run(doc))
    assert paused == [False]
    assert document.source.text == llama and document.items == items  # nothing of the new text was committed
