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


CHAIN_LIB = """config C {
    d: int = 8
    h: int = 2
}

fn scale(x: [B, N], f: float) -> [B, N] {
    x * f
}

module Mlp(c: C) {
    up: Linear(c.d, c.d * c.h)
    down: Linear(c.d * c.h, c.d)

    fn forward(x: [B, c.d]) -> [B, c.d] {
        down(gelu(up(x)))
    }
}
"""
CHAIN_USER = """from "lib.linnet" import C, Mlp, scale

preset small = C { d = 4 }

model M(c: C) {
    mlp: Mlp(c)

    entry fn forward(x: [B, c.d]) -> [B, c.d] {
        scale(mlp(x), 2.0)
    }
}
"""
CHAIN_SCALE_BODY = ("x * f\n}", "x * (f * 2.0)\n}")


@pytest.mark.parametrize(
    "preset, edits",
    [
        (None, [("user", ("scale(mlp(x), 2.0)", "mlp(scale(x, 2.0))")), ("lib", CHAIN_SCALE_BODY)]),
        ("small", [("lib", ("x * f", "x * f * 3.0"))]),
        (None, [("lib", ("x * f", "x + f"))]),
        (
            None,
            [
                ("lib", ("up: Linear(c.d, c.d * c.h)", "up: Linear(c.d, c.d * c.h, use_bias=false)")),
                ("user", ("scale(mlp(x), 2.0)", "scale(mlp(x), 3.0)")),
                ("lib", CHAIN_SCALE_BODY),
            ],
        ),
        (
            None,
            [
                ("lib", ("down(gelu(up(x)))", "down(silu(up(x)))")),
                ("user", ("scale(mlp(x), 2.0)", "scale(mlp(x), 3.0)")),
                ("lib", CHAIN_SCALE_BODY),
            ],
        ),
        (None, [("lib", ("d: int = 8", "d: int = 16")), ("lib", ("down(gelu(up(x)))", "down(up(x) * 2.0)"))]),
    ],
    ids=["user-then-fn", "fn-under-preset", "fn-op", "member-then-fn", "method-then-fn", "default-then-method"],
)
def test_an_importer_lowers_what_a_fresh_workspace_lowers_after_each_edit(tmp_path: Path, preset, edits):
    """Sequences of edits of an imported config, function, member and method and of the importer's entry (found by
    a random edit differential, the importer analysed after each): the five that edit `scale`'s body lowered its
    old body at 0400f9a; the config default then method body held there too."""
    lib, user = str(tmp_path / "lib.linnet"), str(tmp_path / "user.linnet")
    (tmp_path / "lib.linnet").write_text(CHAIN_LIB, encoding="utf-8")
    texts = {"lib": CHAIN_LIB, "user": CHAIN_USER}
    ws = Workspace()
    ws.open(lib, CHAIN_LIB)
    lowered = format_program(lower_analysis(ws.open(user, CHAIN_USER).analyze(preset), preset))
    for step, (which, (old, new)) in enumerate(edits):
        assert texts[which].count(old) == 1
        texts[which] = texts[which].replace(old, new)
        ws.open(lib, texts["lib"])
        reused = format_program(lower_analysis(ws.open(user, texts["user"]).analyze(preset), preset))
        fresh = Workspace()
        fresh.open(lib, texts["lib"])
        expected = format_program(lower_analysis(fresh.open(user, texts["user"]).analyze(preset), preset))
        assert reused == expected, f"after edit {step}"
        assert reused != lowered  # every edit changes what lowers
        lowered = reused


def test_a_check_made_again_is_kept_for_the_next_analyses(monkeypatch):
    """The check made again for lowering replaces the reused one in the document's caches: the next analysis (an
    edit of another item) reuses the new check, and lowering it checks nothing again (before: the reused check
    stayed cached, and every analysis's lowering checked the model again until the model itself was edited)."""
    from linnet.semantics import program

    other = "fn other(x: [N]) -> [N] {\n    x\n}\n\n"
    doc = Document("/nowhere/model.linnet", other + LIB + "\n" + MODEL)
    doc.analyze()
    doc.update(doc.text.replace("    x\n}\n\nmodule", "    x @ w\n}\n\nmodule"))
    second = doc.analyze()
    again = second.resolved(second.model)
    checks = []
    real = program._check_item
    monkeypatch.setattr(program, "_check_item", lambda *args: checks.append(args[1].name) or real(*args))
    doc.update(doc.text.replace("    x\n}\n\nfn mix", "    x * 2.0\n}\n\nfn mix"))  # `other`'s body
    third = doc.analyze()
    assert checks == ["other"]  # the model's check is reused
    resolved = third.resolved(third.model)
    assert checks == ["other"]  # and is not made again (before: ["other", "M"])
    assert resolved.names is again.names
    assert lowered(third) == lowered(Document("/nowhere/model.linnet", doc.text).analyze())
