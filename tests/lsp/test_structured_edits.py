"""Structured edits through the real server over stdio (function-level reuse's ground: bodies, signatures, members,
moved, renamed, duplicated and deleted methods, undo): after each edit the published diagnostics, the hover and the
inlay hints equal a fresh analysis of the client's text. LINNET_STRUCTURED_EDITS sets the number of edits (a few
hundred when looking for defects; a few dozen in the suite)."""

from __future__ import annotations

import os
import random

import pytest
from lsprotocol import types as T

from bench.diff_incremental import changed_region, random_edit
from linnet.lsp.convert import lsp_diagnostic
from linnet.lsp.hints import inlay_hints
from linnet.lsp.hover import hover_markdown
from linnet.semantics.program import Document

from .conftest import EXAMPLES, WORKSPACE, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")

EDITS = int(os.environ.get("LINNET_STRUCTURED_EDITS", "24"))
MAX_LENGTH = 40  # the fixture's linnet.inlayHints.maxLength


def _diagnostic_key(d: T.Diagnostic):
    related = tuple(
        (r.location.range.start.line, r.location.range.start.character, r.message) for r in d.related_information or ()
    )
    return (
        d.range.start.line,
        d.range.start.character,
        d.range.end.line,
        d.range.end.character,
        d.code,
        d.message,
        related,
    )


@pytest.mark.parametrize("name", ["llama", "gpt2"])
async def test_structured_edits_equal_a_fresh_analysis(client, name):
    rng = random.Random(f"structured {name}")
    path = WORKSPACE / f"structured_{name}.linnet"
    original = (EXAMPLES / f"{name}.linnet").read_text()
    doc = await open_doc(client, path, original)
    history: list[str] = []
    problems: list[str] = []
    try:
        for step in range(EDITS):
            kind, new = random_edit(rng, doc.text, original, history)
            history = (history + [doc.text])[-6:]
            start = changed_region(doc.text, new)
            tail = 0
            while tail < min(len(doc.text), len(new)) - start and doc.text[-1 - tail] == new[-1 - tail]:
                tail += 1
            await doc.change(doc.at(start), doc.at(len(doc.text) - tail), new[start : len(new) - tail])
            assert doc.text == new
            fresh = Document(str(path), new).analyze(None)
            want = sorted(_diagnostic_key(lsp_diagnostic(d)) for d in fresh.diagnostics if d.location.path == str(path))
            have = sorted(map(_diagnostic_key, await doc.diagnostics()))
            if have != want:
                problems.append(f"step {step} ({kind}): diagnostics\n  server {have}\n  fresh  {want}")
            for at in sorted({rng.randint(0, len(new)) for _ in range(4)} | {min(len(new), start + 2)}):
                hover = await client.text_document_hover_async(T.HoverParams(doc.id, doc.at(at)))
                found = hover_markdown(fresh, at, None)
                if (hover and hover.contents.value) != (found and found[0]):
                    problems.append(f"step {step} ({kind}): hover at {at}: server {hover} fresh {found}")
            end = doc.at(len(new))
            hints = await client.text_document_inlay_hint_async(
                T.InlayHintParams(doc.id, T.Range(T.Position(0, 0), end))
            )
            have_hints = sorted((h.position.line, h.position.character, h.label) for h in hints or ())
            want_hints = sorted(
                (doc.at(h.offset).line, doc.at(h.offset).character, h.label)
                for h in inlay_hints(fresh, 0, len(new), None, MAX_LENGTH)
            )
            if have_hints != want_hints:
                problems.append(f"step {step} ({kind}): inlay hints differ")
            assert not problems, "\n".join(problems[:5])
    finally:
        doc.close()
