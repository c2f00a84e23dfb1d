"""Lowering an analysis that reused checks across edits compiles the text as edited: the same Core IR as a fresh
workspace's analysis of the same texts.

An analysis reuses a check whose lookups kept their interfaces (a function's body is not part of its interface),
so after an edit of a top-level function's body, or an edit that parses an imported module again, the reused
checks of its callers still name the item from before the edit. Lowering (the language server's cost hover and
inlay hints, `lower_analysis`) follows those names: each test failed before `Analysis.resolved` checked again a
check naming a replaced item, compiling the old body (the importer's first-items case is in
tests/semantics/test_incremental.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from linnet.ir import format_program
from linnet.ir.build import lower_analysis
from linnet.semantics.program import Document, Workspace

LIB = """fn mix(x: [B, D], w: [D, D]) -> [B, D] {
    x
}

module Gain(d: int) {
    w: [d, d]

    fn forward(x: [B, d]) -> [B, d] {
        mix(x, w)
    }

    fn twice(x: [B, d]) -> [B, d] {
        x + x
    }
}
"""
MODEL = """config C {
    d: int = 4
}

preset p = C { d = 4 }

model M(c: C) {
    g: Gain(c.d)
    w: [c.d, c.d]

    entry fn forward(x: [B, c.d]) -> [B, c.d] {
        mix(g.twice(g(x)), w)
    }
}
"""
USER = 'from "lib.linnet" import mix, Gain\n\n' + MODEL
# Edits of LIB that keep every interface: the importer's checks are reused as they were
EDITS = {
    # a top-level function is parsed again whenever its text changes (only a module's body edit is spliced)
    "a function's body": ("    x\n}\n\nmodule", "    x @ w\n}\n\nmodule"),
    # an edit across two function bodies of a module is no splice: the module is parsed again
    "two bodies of a module": (
        "mix(x, w)\n    }\n\n    fn twice(x: [B, d]) -> [B, d] {\n        x + x",
        "mix(x, w) * 2.0\n    }\n\n    fn twice(x: [B, d]) -> [B, d] {\n        x * x",
    ),
}


def lowered(analysis) -> str:
    return format_program(lower_analysis(analysis, "p"))


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_importer_lowers_the_imported_text_as_edited(tmp_path: Path, edit: str):
    lib, user = str(tmp_path / "lib.linnet"), str(tmp_path / "user.linnet")
    old, new = EDITS[edit]
    edited = LIB.replace(old, new)
    assert edited != LIB
    ws = Workspace()
    ws.open(lib, LIB)
    before = lowered(ws.open(user, USER).analyze())
    ws.open(lib, edited)
    after = ws.open(user, USER).analyze()
    assert after.stats.checks_run == 0  # the importer's checks were reused: what this is about
    fresh = Workspace()
    fresh.open(lib, edited)
    expected = lowered(fresh.open(user, USER).analyze())
    assert expected != before
    assert lowered(after) == expected


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_model_lowers_its_own_file_as_edited(edit: str):
    old, new = EDITS[edit]
    path = "/nowhere/model.linnet"
    doc = Document(path, LIB + "\n" + MODEL)
    before = lowered(doc.analyze())
    doc.update(LIB.replace(old, new) + "\n" + MODEL)
    expected = lowered(Document(path, doc.text).analyze())
    assert expected != before
    assert lowered(doc.analyze()) == expected


def test_a_check_made_in_parts_keeps_naming_the_old_function():
    """An edit of `mix`'s body, then one inside `Gain.twice`'s (spliced: `Gain`'s check is made from the one before,
    `twice` checked again, `forward`'s part kept as it was, naming the old `mix`): lowered as a fresh analysis."""
    path = "/nowhere/model.linnet"
    doc = Document(path, LIB + "\n" + MODEL)
    doc.analyze()
    doc.update(doc.text.replace("    x\n}\n\nmodule", "    x @ w\n}\n\nmodule"))
    doc.analyze()
    doc.update(doc.text.replace("        x + x", "        x - x"))
    analysis = doc.analyze()
    assert analysis.stats.checked_names == ["Gain"]  # `twice` only (fn_reuse), the model's check reused
    assert lowered(analysis) == lowered(Document(path, doc.text).analyze())


def test_a_reused_check_is_made_again_once_per_analysis():
    """The check naming the old function is made again for lowering, once per analysis, and not when nothing was
    replaced."""
    doc = Document("/nowhere/model.linnet", LIB + "\n" + MODEL)
    first = doc.analyze()
    model = first.model
    cached = first.resolved(model, current=False).names  # the cached check's (a Resolved is made on each call)
    assert first.resolved(model).names is cached  # nothing replaced: the check as cached
    doc.update(doc.text.replace("    x\n}\n\nmodule", "    x @ w\n}\n\nmodule"))
    second = doc.analyze()
    assert second.resolved(model, current=False).names is cached  # reused: `mix`'s interface is unchanged
    again = second.resolved(model)
    assert again.names is not cached and second.resolved(model) is again
