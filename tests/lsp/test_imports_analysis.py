"""The language server's import features at the level of `Document.analyze()` (what the
handlers in server.py call): cross-file rename plans and edits, definitions narrowed in the
imported file, completion inside imports."""

from __future__ import annotations

from pathlib import Path

import pytest

from linnet.lsp import navigation
from linnet.lsp.import_completion import import_completions
from linnet.semantics.program import Workspace

LIB = """## Doubles `x`.
fn double(x: [N], factor: float = 2.0) -> [N] {
    x * factor
}

config Sizes {
    width: int = 8
}
"""
USER = """from "lib.linnet" import double, Sizes

fn quad(y: [N]) -> [N] {
    double(double(y), factor=2.0)
}
"""
ALIASED = """from "lib.linnet" import double as twice

fn quad(y: [N]) -> [N] {
    twice(twice(y))
}
"""


TEXTS = {"lib.linnet": LIB, "user.linnet": USER, "aliased.linnet": ALIASED}


@pytest.fixture
def files(tmp_path: Path):
    ws = Workspace()
    for name, text in TEXTS.items():
        (tmp_path / name).write_text(text)
    docs = {name: ws.open(str(tmp_path / name), text) for name, text in TEXTS.items()}
    return tmp_path, {name: doc.analyze() for name, doc in docs.items()}


def _spelled(locations) -> list[tuple[str, int, str]]:
    """(file name, line, the text covered) of each location."""
    out = []
    for loc in locations:
        name = Path(loc.path).name
        out.append((name, loc.line, TEXTS[name][loc.start.offset : loc.end.offset]))
    return out


def test_rename_plans_and_edits_across_files(files):
    _, a = files
    user = a["user.linnet"]
    plan = navigation.plan_rename(user, USER.index("double(double"), "times_two")
    assert not plan.alias and plan.target.home.endswith("lib.linnet")
    edits = navigation.rename_edits(a.values(), plan, "times_two")
    assert sorted(_spelled(edits)) == [
        ("aliased.linnet", 1, "double"),  # the imported name; the alias `twice` and its uses stay
        ("lib.linnet", 2, "double"),
        ("user.linnet", 1, "double"),
        ("user.linnet", 4, "double"),
        ("user.linnet", 4, "double"),
    ]
    with pytest.raises(navigation.RenameError, match="already a name"):
        navigation.rename_edits(a.values(), plan, "Sizes")


def test_rename_through_an_alias_stays_in_its_file(files):
    _, a = files
    aliased = a["aliased.linnet"]
    plan = navigation.plan_rename(aliased, ALIASED.index("twice(twice"), "dbl")
    assert plan.alias and plan.target.home is None
    edits = navigation.rename_edits([aliased], plan, "dbl")
    assert [(loc.line, loc.column) for loc in edits] == [(1, 36), (4, 5), (4, 11)]


def test_definitions_in_the_imported_file_are_narrowed_to_the_name(files):
    _, a = files
    user = a["user.linnet"]
    loc = navigation.definition(user, USER.index("factor=2.0"))
    assert _spelled([loc]) == [("lib.linnet", 2, "factor")]


def test_completion_inside_imports(files):
    folder, a = files
    (folder / "sub").mkdir()
    user = a["user.linnet"]
    ws = user.document.workspace
    doc = ws.open(user.document.source.path, 'from "li\n' + USER)
    analysis = doc.analyze()
    found = import_completions(analysis, len('from "li'), lambda p: None)
    assert [(c.label, c.kind, c.replace) for c in found] == [
        ("aliased.linnet", "File", (6, 8)),
        ("lib.linnet", "File", (6, 8)),
        ("sub/", "Folder", (6, 8)),
    ]
    doc = ws.open(user.document.source.path, 'from "lib.linnet" import double, \n')
    found = import_completions(doc.analyze(), len('from "lib.linnet" import double, '), lambda p: LIB)
    assert [(c.label, c.detail) for c in found] == [("Sizes", "config Sizes")]
    doc = ws.open(user.document.source.path, 'from "lib.linnet" import double as \n')
    assert import_completions(doc.analyze(), len('from "lib.linnet" import double as '), lambda p: LIB) == []
    assert import_completions(a["lib.linnet"], LIB.index("x * factor"), lambda p: None) is None


def test_semantic_tokens_classify_imported_names_through_aliases(files):
    from linnet.lsp.tokens import TOKEN_TYPES, semantic_tokens

    _, a = files
    data = semantic_tokens(a["aliased.linnet"])
    line = char = 0
    found = {}
    for i in range(0, len(data), 5):
        d_line, d_char, length, kind, _ = data[i : i + 5]
        line, char = line + d_line, (char + d_char if d_line == 0 else d_char)
        found[(line, char)] = (ALIASED.split("\n")[line][char : char + length], TOKEN_TYPES[kind])
    assert found[(3, 4)] == ("twice", "function")  # a use through the alias
    assert found[(0, 25)] == ("double", "function")  # the imported name


def test_a_worker_runs_the_editors_text_with_its_imports(files):
    """Runs and the StableHLO/ONNX views go to a worker on a copy of the editor's text: the copy
    must find what the text imports, relative to the original, and leave nothing behind."""
    import asyncio

    from linnet.lsp import views

    folder, _ = files
    unsaved = USER.replace("    double(double(y)", "    let unused = y\n    double(double(y)")
    result = asyncio.run(views.run_worker(None, ["check", "{file}"], str(folder / "user.linnet"), unsaved, 120))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{folder / 'user.linnet'}:4:9: warning[L901]: `unused` is never used" in result.stdout
    assert "checked 2 files" in result.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["aliased.linnet", "lib.linnet", "user.linnet"]


@pytest.mark.parametrize(
    "old, new",
    [
        ("x * factor", "let y = x\n\n\n    y * factor"),  # a body edit that moves what follows down
        ("x * factor", "x *\n\n\n        factor"),  # the same, the expression split over lines
        ("factor: float = 2.0)", "\n    factor: float = 2.0)"),  # a parameter moved, the interface kept
    ],
)
def test_an_importers_views_follow_an_edit_that_moves_the_imported_lines(tmp_path: Path, old: str, new: str):
    """After an edit of lib.linnet that keeps its interfaces (user.linnet's checks are reused, naming the function
    from before the edit), definitions, hovers and types in user.linnet are a fresh workspace's: their anchors
    name definitions by path, found in the current text."""
    from linnet.lsp.hover import hover_markdown

    lib, user = str(tmp_path / "lib.linnet"), str(tmp_path / "user.linnet")
    edited = LIB.replace(old, new)
    ws = Workspace()
    ws.open(lib, LIB)
    ws.open(user, USER).analyze()
    ws.open(lib, edited)
    reused = ws.open(user, USER).analyze()
    assert reused.stats.checks_run == 0
    fresh = Workspace()
    fresh.open(lib, edited)
    expected = fresh.open(user, USER).analyze()

    def views(analysis):
        for at in range(len(USER)):
            t = analysis.type_at(at)
            found = navigation.definition(analysis, at)
            place = found and (found.path, found.start, found.end)
            yield at, hover_markdown(analysis, at, None), place, t and (t.symbolic, t.concrete)

    assert list(views(reused)) == list(views(expected))
