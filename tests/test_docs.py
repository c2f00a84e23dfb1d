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


RESULTS = ROOT / "bench" / "results"
# A results path as the docs write it (`bench/results/name`; README.md's bench row: `results/name`), its name
# possibly on the next line (`bench/results/\n  name.md`) or with shell braces (`name_r14{,b}_f32_fast.md`);
# names without a file suffix (`bench/results/NAME`) are not files.
RESULT_PATH = re.compile(r"(?<![\w/-])(?:bench/)?results/\s*([\w.{},-]+)")
RESULT_NAME = re.compile(r"[\w.{},-]+\.(?:json|md|txt)")
# A bare name (`... and generate_speed_intel_r15b_fast.md`): a file name that starts with a bench script's name.
BARE_NAME = re.compile(r"(?<![\w./-])([\w{},-]+\.(?:json|md|txt))(?![\w-])")
BENCH_SCRIPTS = tuple(sorted(p.stem for p in (ROOT / "bench").glob("*.py")))


def expand_braces(name: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", name)
    if match is None:
        return [name]
    return [
        expanded
        for alternative in match.group(1).split(",")
        for expanded in expand_braces(name[: match.start()] + alternative + name[match.end() :])
    ]


def result_paths(text: str) -> set[str]:
    names = set()
    for match in RESULT_PATH.finditer(text):
        name = match.group(1).rstrip(".,")
        if RESULT_NAME.fullmatch(name):
            names.update(expand_braces(name))
    names.update(
        expanded
        for match in BARE_NAME.finditer(text)
        if match.group(1).startswith(BENCH_SCRIPTS)
        for expanded in expand_braces(match.group(1))
    )
    return names


def test_result_path_finds_wrapped_and_braced_names():
    text = (
        "(bench/results/\n  a_r14{,b}_fast.md, results/b.json). Run into `bench/results/`, bench/results/NAME; "
        "generate_speed_x.md and `serve_speed{,_y}.json`, not package.json or bench/generate_speed.py."
    )
    assert result_paths(text) == {
        "a_r14_fast.md",
        "a_r14b_fast.md",
        "b.json",
        "generate_speed_x.md",
        "serve_speed.json",
        "serve_speed_y.json",
    }


def test_every_results_path_in_the_docs_exists():
    """Each `bench/results/...` file (or bare results file name) that docs/*.md, README.md,
    bench/results/README.md or a docstring in linnet/ names is in the tree (superseded runs leave it:
    bench/results/README.md says where they are)."""
    sources = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", RESULTS / "README.md"]
    sources += sorted((ROOT / "linnet").rglob("*.py"))
    missing = {
        f"{path.relative_to(ROOT)}: bench/results/{name}"
        for path in sources
        for name in result_paths(path.read_text(encoding="utf-8"))
        if not (RESULTS / name).is_file()
    }
    assert missing == set(), sorted(missing)


def test_every_results_file_is_in_the_index():
    """bench/results/README.md's index lists every file in bench/results/ (the first column of its table) and
    nothing else, so the index cannot drift from the files."""
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    index = text.split("\n## Index\n", 1)[1].split("\n## ", 1)[0]
    listed = set()
    for line in index.splitlines():
        if line.startswith("| `"):
            listed.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    files = {p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md" and not p.name.startswith(".")}
    assert sorted(files - listed) == [], "files missing from bench/results/README.md's index"
    assert sorted(listed - files) == [], "bench/results/README.md's index lists files that are not there"
