"""`linnet check` on a big file with thousands of errors stays linear (issue 45 item 3): each error's excerpt reads
its line from the source split once, not re-split per error, and did-you-mean suggestions skip, without computing
a distance, the candidates whose lengths or characters put them out of reach. Timings live in bench/, not here:
these tests count the work."""

from __future__ import annotations

from linnet.semantics import render, suggest
from linnet.semantics.program import Document


def _many_errors(n: int) -> str:
    item = "fn helper_{i}(x: f32[B, D]) -> f32[B, D] {{\n    let y = x + missing_{i}\n    y\n}}\n\n"
    return "".join(item.format(i=i) for i in range(n))


def test_rendering_splits_a_source_once_for_all_its_errors(monkeypatch):
    text = _many_errors(200)
    analysis = Document("/tmp/many.linnet", text).analyze()
    assert len(analysis.diagnostics) == 200
    splits = []
    real = render.split_lines
    monkeypatch.setattr(render, "split_lines", lambda t, *a: splits.append(len(t)) or real(t, *a))
    render._lines_of.cache_clear()
    out = [render.render_text(d, {"/tmp/many.linnet": text}.get) for d in analysis.diagnostics]
    assert "let y = x + missing_199" in out[-1]
    assert len(splits) == 1, f"the source was split {len(splits)} times for 200 errors"


def test_suggestions_compute_no_distance_for_candidates_out_of_reach(monkeypatch):
    calls = []
    real = suggest.edit_distance
    monkeypatch.setattr(suggest, "edit_distance", lambda *a, **k: calls.append(a) or real(*a, **k))
    candidates = [f"helper_{i}" for i in range(5000)] + ["missing_count"]
    assert suggest.suggestions("missing_cont", candidates) == ["missing_count"]
    assert len(calls) < 50, f"{len(calls)} distances computed among {len(candidates)} candidates"
