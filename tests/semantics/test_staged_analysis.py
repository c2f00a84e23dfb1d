"""A staged analysis (`Document.analyze_first`, what the language server's completion reads while a keystroke's
check runs): the random edit sequences of bench/diff_incremental.py, each text analysed first in stages in one
workspace and then by a fresh workspace. Completion from the first stage equals the fresh analysis's, or the stage
says it cannot answer (PartialAnalysis: the server then waits for the full analysis); the full analysis that follows
the first stage equals the fresh one (diagnostics, hover, definition, inlay hints)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.diff_incremental import changed_region, random_edit, views
from linnet.lsp.completion import completions
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
        try:
            out[at] = completions(analysis, at, preset)
        except PartialAnalysis:
            out[at] = PartialAnalysis
    return out


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_first_stage_completes_as_a_fresh_analysis(name):
    """Issue 45 (completion during typing bursts): a completion sent with a keystroke waited for the whole check
    of the new text, every preset's binding of the edited module (five on llama.linnet); it reads the first
    stage, which checks the edited function under the selected preset's binding only."""
    rng = random.Random(f"staged {name}")
    path = str(EXAMPLES / f"{name}.linnet")
    original = Path(path).read_text(encoding="utf-8")
    ws = Workspace()
    presets = [None] + [i.name for i in ws.open(path, original).items if i.kind == "preset"]
    preset = rng.choice(presets)
    ws.open(path, original).analyze(preset)
    text, history = original, []
    staged = answered = 0
    for step in range(24):
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
            for offset, found in got.items():
                if found is not PartialAnalysis:
                    answered += 1
                    assert found == want[offset], f"step {step} ({kind}) at {offset}: {text[offset - 30 : offset]!r}"
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
    assert staged and answered  # the sequences did exercise the first stage
