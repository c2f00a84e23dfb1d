"""Big documents with many errors (issue 45 item 3), through the real server: the published diagnostics are capped
with a summary that says how many are not shown, and `exit` ends the process at once even while a big file's
analysis runs in a worker thread (asyncio waited for it: minutes)."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from lsprotocol import types as T

from linnet.lsp.convert import MAX_PUBLISHED

from .conftest import TIMEOUT_S, WORKSPACE, open_doc
from .test_malformed import RawClient


def many_errors(n: int) -> str:
    """`n` small functions, each with one unknown name."""
    item = "fn helper_{i}(x: f32[B, D]) -> f32[B, D] {{\n    let y = x + missing_{i}\n    y\n}}\n\n"
    return "".join(item.format(i=i) for i in range(n))


@pytest.mark.asyncio(loop_scope="module")
async def test_published_diagnostics_are_capped_with_a_summary(client):
    n = MAX_PUBLISHED + 40
    doc = await open_doc(client, WORKSPACE / "many_errors.linnet", many_errors(n))
    for _ in range(int(TIMEOUT_S / 0.05)):  # a big file's first publish covers its first lines; then all of it
        found = [p.diagnostics for p in client.published[doc.first_publish :] if p.uri == doc.uri][-1]
        if len(found) > 100:
            break
        await asyncio.sleep(0.05)
    assert len(found) == MAX_PUBLISHED + 1
    summary = found[-1]
    assert summary.severity == T.DiagnosticSeverity.Information and summary.range.start == T.Position(0, 0)
    assert summary.message.startswith("40 more diagnostics not shown (40 errors, 0 warnings)")
    assert f"the first {MAX_PUBLISHED} of {n}" in summary.message and "linnet check" in summary.message
    assert all(d.code == "L101" for d in found[:-1])
    doc.close()


def test_exit_ends_the_process_while_a_big_file_is_analysed():
    """A file whose analysis takes far longer than the wait below: after `shutdown` and `exit` the process ends
    (status 0) without waiting for it."""
    client = RawClient()
    try:
        client.send({"id": 0, "method": "initialize", "params": {"capabilities": {}}})
        assert client.responses({0})
        client.send({"method": "initialized", "params": {}})
        text = many_errors(30000)  # about half a minute of checking on this machine
        uri = (WORKSPACE / "huge.linnet").as_uri()
        document = {"uri": uri, "languageId": "linnet", "version": 1, "text": text}
        client.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
        time.sleep(1.0)  # the analysis is under way
        client.send({"id": 1, "method": "shutdown"})
        assert client.responses({1}).get(1, {}).get("error") is None
        client.send({"method": "exit"})
        client.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        client.process.kill()
        raise AssertionError("the server did not exit while a big file was analysed") from None
    assert client.process.returncode == 0


def test_unknown_names_are_matched_against_the_few_names_that_can_be_suggested(monkeypatch):
    """Each unknown name's did-you-mean search looked at every top-level name (6,048 errors among as many items:
    quadratic; `linnet check` did not finish in 180 s). It now looks at the names an index over their characters
    cannot rule out, and suggests what it suggested before (`missing_12` is not offered `helper_12`; `helper_1x`
    is offered `helper_1`)."""
    import linnet.semantics.names as names
    from linnet.semantics.program import Workspace

    offered = []
    real = names.suggestions

    def counting(name, candidates, limit=3):
        candidates = list(candidates)
        offered.append(len(candidates))
        return real(name, candidates, limit)

    monkeypatch.setattr(names, "suggestions", counting)
    n = 400
    text = many_errors(n) + "fn typo(x: f32[B, D]) -> f32[B, D] {\n    x + helper_1x\n}\n"
    analysis = Workspace().open(str(WORKSPACE / "many.linnet"), text).analyze(None)
    errors = [d for d in analysis.diagnostics if d.code == "L101"]
    assert len(errors) == n + 1 and len(offered) == n + 1
    assert "did you mean `helper_1`?" in errors[-1].message and "did you mean" not in errors[0].message
    assert max(offered[:-1]) < n // 2  # the built-in names and a few; before: every top-level name (more than n)
