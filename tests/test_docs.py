"""Every diagnostic code has a registry entry and a docs entry, and every generated file (the
diagnostics page, the language doc's op table, the editors' builtin lists) is current."""

from __future__ import annotations

import re

import pytest

from linnet import docgen
from linnet.semantics.codes import CODES, docs_markdown
from tests.conftest import ROOT


@pytest.mark.parametrize("name", sorted(docgen.GENERATED))
def test_generated_file_is_current(name):
    """docs/diagnostics.md, the op table of docs/language.md and the editors' builtin lists are
    what `make docs` (python -m linnet.docgen) generates from the registries."""
    current = (ROOT / name).read_text(encoding="utf-8")
    assert current == docgen.GENERATED[name](current), f"{name} is stale: regenerate with `make docs`"


def test_diagnostics_page_is_the_registry_of_codes():
    assert (ROOT / "docs" / "diagnostics.md").read_text() == docs_markdown()


def test_docgen_check_finds_a_stale_file_and_rewrites_it(tmp_path, capsys):
    for name in docgen.GENERATED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 0
    vim = tmp_path / "editors/nvim/syntax/linnet.vim"
    vim.write_text(vim.read_text().replace("\\|softmax", ""))
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert "linnet.vim: stale" in capsys.readouterr().err
    assert docgen.main(["--root", str(tmp_path)]) == 0
    assert vim.read_text() == (ROOT / "editors/nvim/syntax/linnet.vim").read_text()


def test_docgen_without_its_markers_is_a_usage_error(tmp_path, capsys):
    for name in docgen.GENERATED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    doc = tmp_path / "docs/language.md"
    doc.write_text(doc.read_text().replace(docgen.OP_TABLE_END, ""))
    assert docgen.main(["--root", str(tmp_path)]) == 2
    assert "the op table's markers are missing" in capsys.readouterr().err
    assert docgen.main(["--root", str(tmp_path / "nowhere")]) == 2


def test_every_code_used_is_registered():
    used = set()
    for path in (ROOT / "linnet").rglob("*.py"):
        used |= set(re.findall(r'"(L\d{3})"', path.read_text()))
    assert used - set(CODES) == set()


def test_every_user_facing_code_is_exercised_by_a_case():
    """L5xx need weights (the loader's tests) and L000 is the checker's own failure (tested in
    tests/syntax/test_parser.py with nesting too deep to follow)."""
    expected = set()
    for path in (ROOT / "tests" / "semantics" / "cases").glob("*.linnet"):
        expected |= set(re.findall(r"#\s*(?:error|warning)\[(L\d{3})\]", path.read_text()))
    missing = {c for c in CODES if not c.startswith("L5") and c != "L000"} - expected
    assert missing == set(), sorted(missing)
