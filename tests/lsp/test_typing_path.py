"""Issue 45's defects on the typing path, through a real client: the unread-member warning (L904) after an
edit inside a module whose callers' checks the edit left valid."""

from __future__ import annotations

import pytest
from lsprotocol import types as T

from linnet.semantics.program import Workspace

from .conftest import EXAMPLES, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")


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
