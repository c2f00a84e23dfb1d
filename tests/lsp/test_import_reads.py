"""A request in an importing document reads the items of an imported document open in the editor, which that
document's analysis changes in place in a worker thread (its text, its items' offsets): the request reads them as
of one text (linnet/lsp/documents.py, `OpenDocument.analyzed`; the workspace's `editing` lock)."""

from __future__ import annotations

import asyncio
import threading

from lsprotocol import types as T

from linnet.lsp import navigation
from linnet.lsp.convert import uri_of
from linnet.lsp.documents import Documents
from linnet.syntax.items import Source

LIB = """## Doubles `x`.
fn double(x: [N]) -> [N] {
    x * 2.0
}
"""
# an item above `double`, on a line of its own: `double` keeps its parse and moves two lines down
EDITED = "fn first(x: [N]) -> [N] { x }\n\n" + LIB
USER = """from "lib.linnet" import double

fn quad(y: [N]) -> [N] {
    double(double(y))
}
"""
PAUSE_S = 2.0  # how long the read waits for the update to pause inside it (it never does once the read holds the lock)
TIMEOUT_S = 20.0


def test_a_read_of_an_imported_document_never_sees_half_of_its_update(tmp_path, monkeypatch):
    # The update of lib.linnet pauses at a hook after its text changed and before its items moved; the request in
    # user.linnet reads `double`'s definition meanwhile. It read the new text's line index with the old offset
    # (line 1, column 20: inside `first`), neither where `double` was (line 2) nor where it is (line 4).
    (tmp_path / "lib.linnet").write_text(LIB, encoding="utf-8")
    (tmp_path / "user.linnet").write_text(USER, encoding="utf-8")
    documents = Documents()
    lib = documents.open(uri_of(str(tmp_path / "lib.linnet")), LIB, 1)
    user = documents.open(uri_of(str(tmp_path / "user.linnet")), USER, 1)
    on_use = USER.index("double(y)")

    paused, resume = threading.Event(), threading.Event()
    real_set_text = Source.set_text

    def set_text(self, text: str, index=None) -> None:
        real_set_text(self, text, index)
        if text == EDITED:  # the hook: lib's update, its text set, its items not moved yet
            paused.set()
            resume.wait(TIMEOUT_S)

    monkeypatch.setattr(Source, "set_text", set_text)

    async def run() -> tuple:
        async with lib.analyzed(None):
            pass
        lib.apply_changes([T.TextDocumentContentChangeWholeDocument(EDITED)], 2)
        update = threading.Thread(target=lib._analyze, args=(EDITED, None))  # what `analyzed` runs in a worker
        async with user.analyzed(None) as analysis:  # a request's read is under way when lib's analysis starts
            update.start()
            paused.wait(PAUSE_S)
            during = navigation.definition(analysis, on_use)
        resume.set()
        update.join(TIMEOUT_S)
        async with user.analyzed(None) as analysis:  # the next request: the text lib.linnet has now
            after = navigation.definition(analysis, on_use)
        return during, after

    during, after = asyncio.run(run())
    assert (during.start.line, during.start.column) == (2, 4)  # as the analysis read lib.linnet
    assert (after.start.line, after.start.column) == (4, 4)
    assert during.path == after.path == str(tmp_path / "lib.linnet")
