"""Imports through a workspace: an importer follows edits of the files it imports, and only
the items an edit can affect are checked again (as within one file)."""

from __future__ import annotations

from pathlib import Path

from linnet.semantics.diagnostics import SymbolAnchor
from linnet.semantics.program import Document, Workspace

BLOCKS = """config Cfg {
    hidden: int = 64
}

module Mlp(c: Cfg) {
    up: Linear(c.hidden, c.hidden)

    fn forward(x: [B, c.hidden]) -> [B, c.hidden] {
        up(x)
    }
}

fn double(x: [N]) -> [N] {
    x * 2.0
}
"""

MAIN = """from "blocks.linnet" import Cfg, Mlp as Block, double

preset small = Cfg { hidden = 32 }

module Uses(c: Cfg) {
    block: Block(c)

    fn forward(x: [B, c.hidden]) -> [B, c.hidden] {
        block(x)
    }
}

fn unrelated(x: [N]) -> [N] {
    double(x)
}
"""


def _workspace(tmp_path: Path, blocks: str = BLOCKS, main: str = MAIN) -> tuple[Workspace, Document, Document]:
    ws = Workspace()
    lib = ws.open(str(tmp_path / "blocks.linnet"), blocks)
    doc = ws.open(str(tmp_path / "main.linnet"), main)
    return ws, lib, doc


def _codes(analysis) -> list[tuple[str, int]]:
    return [(d.code, d.location.line) for d in analysis.diagnostics]


def test_an_importer_follows_edits_of_the_imported_file(tmp_path):
    ws, lib, doc = _workspace(tmp_path)
    assert _codes(doc.analyze()) == []
    # the imported module now needs twice the width: the importer's use breaks, in the importer
    ws.open(lib.source.path, BLOCKS.replace("fn forward(x: [B, c.hidden])", "fn forward(x: [B, 2 * c.hidden])"))
    found = doc.analyze()
    assert [(d.code, d.location.path) for d in found.errors] == [("L203", doc.source.path)]
    # and back
    ws.open(lib.source.path, BLOCKS)
    assert _codes(doc.analyze()) == []


def test_an_edit_inside_an_imported_body_rechecks_nothing_in_the_importer(tmp_path):
    ws, lib, doc = _workspace(tmp_path)
    doc.analyze()
    ws.open(lib.source.path, BLOCKS.replace("        up(x)\n", "        let unused_probe = x\n        up(x)\n"))
    again = doc.analyze()
    assert again.stats.items_checked == 0
    assert _codes(again) == []
    assert _codes(lib.analyze()) == [("L901", 9)]


def test_an_interface_edit_rechecks_only_the_items_that_use_it(tmp_path):
    ws, lib, doc = _workspace(tmp_path)
    doc.analyze()
    ws.open(lib.source.path, BLOCKS.replace("fn double(x: [N]) -> [N]", "fn double(x: [N], k: float = 2.0) -> [N]"))
    again = doc.analyze()
    assert again.stats.checked_names == ["unrelated"]


def test_an_imported_file_that_appears_on_disk_is_found(tmp_path):
    path = tmp_path / "main.linnet"
    doc = Document(str(path), MAIN)
    assert [d.code for d in doc.analyze().errors] == ["L120"]
    (tmp_path / "blocks.linnet").write_text(BLOCKS)
    doc.workspace.file_changed(str(tmp_path / "blocks.linnet"))
    assert _codes(doc.analyze()) == []


def test_anchors_name_the_defining_file_through_aliases(tmp_path):
    ws, lib, doc = _workspace(tmp_path)
    analysis = doc.analyze()
    use = MAIN.index("Block(c)")
    target = analysis.symbol_at(use)
    assert target == SymbolAnchor(("Mlp",), lib.source.path)
    location = analysis.definition_at(use)
    assert location.path == lib.source.path and location.line == 5
    # in the importer: the imported name, its alias and the use through the alias; in the
    # imported file, its definition
    assert [(loc.line, loc.column) for loc in analysis.references(use)] == [(1, 34), (1, 41), (6, 12)]
    assert [(loc.line, loc.column) for loc in lib.analyze().references_to(target)] == [(5, 8)]
    # a member of an imported module's instance names the member in its file
    member = analysis.symbol_at(MAIN.index("block(x)"))
    assert member == SymbolAnchor(("Uses", "member", "block"), doc.source.path)
    assert analysis.files == [doc.source.path, lib.source.path]


def test_incremental_equals_full_with_imports(tmp_path):
    ws, lib, doc = _workspace(tmp_path)
    doc.analyze()
    steps = [
        (lib, BLOCKS.replace("hidden: int = 64", "hidden: int = 48")),
        (doc, MAIN.replace("block(x)", "block(block(x))")),
        (lib, BLOCKS.replace("module Mlp", "module Mlp2")),
        (lib, BLOCKS),
        (doc, MAIN.replace("Mlp as Block", "Mlp as Block, Mlp as Other")),
    ]
    for target, text in steps:
        ws.open(target.source.path, text)
        incremental = doc.analyze()
        fresh_ws = Workspace()
        fresh_ws.open(lib.source.path, lib.text)
        fresh = fresh_ws.open(doc.source.path, doc.text).analyze()
        assert [(d.code, d.message, d.location.start.offset) for d in incremental.diagnostics] == [
            (d.code, d.message, d.location.start.offset) for d in fresh.diagnostics
        ]


def test_a_function_calling_an_imported_one_of_the_same_name_is_no_recursion(tmp_path):
    ws = Workspace()
    ws.open(str(tmp_path / "blocks.linnet"), BLOCKS)
    doc = ws.open(
        str(tmp_path / "main.linnet"),
        'from "blocks.linnet" import double as base\n\nfn double(x: [N]) -> [N] {\n    base(x)\n}\n',
    )
    assert _codes(doc.analyze()) == []


def test_an_import_of_something_that_is_not_a_source_is_a_located_error(tmp_path, monkeypatch):
    from linnet.semantics import workspace

    monkeypatch.setattr(workspace, "MAX_SOURCE_BYTES", 1000)
    (tmp_path / "weights.linnet").write_bytes(b"\0" * 2000)
    (tmp_path / "binary.linnet").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "folder.linnet").mkdir()
    main = 'from "weights.linnet" import W\nfrom "binary.linnet" import B\nfrom "folder.linnet" import F\n'
    found = Document(str(tmp_path / "main.linnet"), main).analyze()
    assert [(d.code, d.location.line, d.message.split(": ", 1)[1].split(" (")[0]) for d in found.diagnostics] == [
        ("L120", 1, "2,000 bytes is more than a Linnet source"),
        ("L120", 2, "not UTF-8 text: byte 0xff at line 1, column 1"),  # where, not a byte offset
        ("L120", 3, "not a file"),
    ]


SHARING_MAIN = """from "blocks.linnet" import Mlp

## Another family's config: `Mlp` is declared over `Cfg`, and `Wide` declares what it reads.
config Wide {
    hidden: int = 64
}

module UsesWide(c: Wide) {
    block: Mlp(c)

    fn forward(x: [B, c.hidden]) -> [B, c.hidden] {
        block(x)
    }
}
"""


def test_a_body_edit_that_reads_a_new_field_rechecks_the_importer_that_shares_the_module(tmp_path):
    """What a module reads of its config is part of what importers see (semantics.sharing): a body
    edit that reads a field `Wide` lacks is L409 in the importer, and undoing it clears it."""
    with_scale = BLOCKS.replace("    hidden: int = 64\n", "    hidden: int = 64\n    scale: float = 1.0\n", 1)
    ws, lib, doc = _workspace(tmp_path, blocks=with_scale, main=SHARING_MAIN)
    assert _codes(doc.analyze()) == []
    ws.open(lib.source.path, with_scale.replace("        up(x)\n", "        up(x) * c.scale\n"))
    assert _codes(lib.analyze()) == []
    found = doc.analyze().errors
    assert [(d.code, d.location.path, d.location.line) for d in found] == [("L409", doc.source.path, 9)]
    assert "`Mlp` reads `scale` of its `Cfg` config, which `Wide` does not declare" in found[0].message
    ws.open(lib.source.path, with_scale)
    assert _codes(doc.analyze()) == []
