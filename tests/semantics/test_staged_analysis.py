"""A staged analysis (`Document.analyze_first`, what the language server's completion and hover read while a
keystroke's check runs): the random edit sequences of bench/diff_incremental.py, each text analysed first in stages
in one workspace and then by a fresh workspace. Completion and hover from the first stage equal the fresh
analysis's, or the stage says it cannot answer (PartialAnalysis: the server then waits for the full analysis); the
full analysis that follows the first stage equals the fresh one (diagnostics, hover, definition, inlay hints)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.diff_incremental import changed_region, random_edit, views
from linnet.lsp.completion import completions
from linnet.lsp.hover import hover_markdown
from linnet.semantics.program import PartialAnalysis, Workspace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _completion_offsets(rng: random.Random, text: str, at: int) -> list[int]:
    """After every `.` near the edit (member completion reads the types of the edited item's check), every few
    characters around it (names in scope), and a few anywhere."""
    near = range(max(0, at - 600), min(len(text), at + 600))
    dots = [i + 1 for i in near if text[i] == "."]
    return sorted(set(dots) | set(range(max(0, at - 60), min(len(text), at + 60), 7)) | {rng.randrange(len(text))})


def _answers(analysis, text: str, offsets: list[int], preset: str | None) -> dict:
    out = {}
    for at in offsets:
        for kind, query in (("completion", completions), ("hover", hover_markdown)):
            try:
                out[kind, at] = query(analysis, at, preset)
            except PartialAnalysis:
                out[kind, at] = PartialAnalysis
    return out


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "whisper"])
def test_the_first_stage_answers_as_a_fresh_analysis(name):
    """Issue 45 (completion during typing bursts): a completion or hover sent with a keystroke waited for the whole
    check of the new text, every preset's binding of the edited module (five on llama.linnet); they read the first
    stage, which checks the edited function under the selected preset's binding only and takes the rest from the
    last analysis."""
    rng = random.Random(f"staged {name}")
    path = str(EXAMPLES / f"{name}.linnet")
    original = Path(path).read_text(encoding="utf-8")
    ws = Workspace()
    presets = [None] + [i.name for i in ws.open(path, original).items if i.kind == "preset"]
    preset = rng.choice(presets)
    ws.open(path, original).analyze(preset)
    text, history = original, []
    staged = 0
    answered = {"completion": 0, "hover": 0}
    for step in range(30):
        kind, new = random_edit(rng, text, original, history)
        at = changed_region(text, new)
        history = (history + [text])[-6:]
        text = new
        if rng.random() < 0.15:
            preset = rng.choice(presets)
        first = ws.open(path, text).analyze_first(preset)
        fresh = Workspace().open(path, text).analyze(preset)
        if first is not None:
            staged += 1
            offsets = _completion_offsets(rng, text, at)
            got, want = _answers(first, text, offsets, preset), _answers(fresh, text, offsets, preset)
            for (query, offset), found in got.items():
                if found is not PartialAnalysis:
                    answered[query] += 1
                    assert found == want[query, offset], (
                        f"step {step} ({kind}) {query} at {offset}: {text[offset - 30 : offset]!r}"
                    )
        if rng.random() < 0.3:  # another keystroke before the rest of the check: the first stage is of the last text
            kind, new = random_edit(rng, text, original, history)
            at = changed_region(text, new)
            history, text = (history + [text])[-6:], new
            fresh = Workspace().open(path, text).analyze(preset)
        full = ws.open(path, text).analyze(preset)
        assert not full.partial
        offsets = sorted({rng.randrange(len(text)) for _ in range(12)} | set(range(max(0, at - 30), at + 30, 5)))
        offsets = [o for o in offsets if o <= len(text)]
        assert views(full, text, preset, offsets) == views(fresh, text, preset, offsets), f"step {step} ({kind})"
    assert staged and all(answered.values()), answered  # the sequences did exercise the first stage


BRANCHED = """\
config C {
    wide: bool = true
    d: int = 4
}

preset narrow = C { wide = false }
preset wide = C { wide = true, d = 8 }

module Block(c: C) {
    proj: Linear(c.d, c.d)

    fn forward(x: [B, c.d]) -> [B, c.d] {
        let y = proj(x)
        if c.wide {
            let w = gelu(y)
            w
        } else {
            let z = y * 2.0
            z
        }
    }
}

model Top(c: C) {
    block: Block(c)

    entry fn forward(x: [B, c.d]) -> [B, c.d] {
        block(x)
    }
}
"""


def test_the_first_stage_refuses_what_only_another_binding_checked():
    """The first stage has the edited module's check under one binding: a hover in a branch that binding does not
    take (the full analysis reads it from the next binding's check), a query under another preset and a resolved
    form (hover's costs) say PartialAnalysis, and the server asks the full analysis."""
    path = "/tmp/staged_branched.linnet"
    ws = Workspace()
    ws.open(path, BRANCHED).analyze(None)
    text = BRANCHED.replace("let y = proj(x)", "let y = proj(x) ")
    first = ws.open(path, text).analyze_first(None)
    fresh = Workspace().open(path, text).analyze(None)
    assert first is not None and first.staged_for == "narrow"
    outside = text.index("let y") + 4
    in_other = text.index("gelu(y)") + len("gelu(")  # `y` where only `wide` checks it (`narrow` takes the else)
    assert hover_markdown(first, outside, None) == hover_markdown(fresh, outside, None) is not None
    assert hover_markdown(fresh, in_other, None) is not None  # from the next check that takes that branch
    assert not fresh.diagnostics
    with pytest.raises(PartialAnalysis):
        hover_markdown(first, in_other, None)
    member = text.index("c.d, c.d") + 2
    assert completions(first, member, None) == completions(fresh, member, None)
    with pytest.raises(PartialAnalysis):
        completions(first, member, "wide")  # the module is checked under `narrow` only
    with pytest.raises(PartialAnalysis):
        first.resolved("Block")
    # `w.` typed where only `wide` (and the defaults) bind `w`: the fresh analysis finds its type in their checks
    typed = BRANCHED.replace("            w\n", "            w.\n")
    first = ws.open(path, typed).analyze_first(None)
    fresh = Workspace().open(path, typed).analyze(None)
    after_dot = typed.index("w.\n") + 2
    assert first is not None and [c.label for c in completions(fresh, after_dot, None)] == ["dtype"]
    with pytest.raises(PartialAnalysis):
        completions(first, after_dot, None)


def test_an_analysis_knows_when_its_document_moved_on():
    """The server reads an analysis's items in place (`OpenDocument.analyzed`): one made before another update of
    the same workspace document (a closed buffer's check still running when the file is opened again) no longer
    holds its text, and is made again rather than read."""
    from linnet.semantics.workspace import Workspace

    ws = Workspace()
    doc = ws.open("/tmp/moved_on.linnet", "config C {\n    d: int = 4\n}\n")
    first = doc.analyze()
    assert first.holds_text()
    ws.open("/tmp/moved_on.linnet", "config C {\n    d: int = 8\n}\n").analyze()
    assert not first.holds_text()
