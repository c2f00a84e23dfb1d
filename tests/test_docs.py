"""Every diagnostic code has a registry entry and a docs entry, and the docs are current."""

from __future__ import annotations

import re

from linnet.semantics.codes import CODES, docs_markdown
from tests.conftest import ROOT


def test_docs_page_is_generated_from_the_registry():
    assert (ROOT / "docs" / "diagnostics.md").read_text() == docs_markdown(), "regenerate with `make docs`"


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
