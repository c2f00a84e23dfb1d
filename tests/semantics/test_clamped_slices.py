"""A declared type that a clamped slice does not match (`x[:, :4]` of [B, S] is [B, min(4, S)]) says why, and what
states that the dim holds the rows (docs/language.md, "Slices clamp")."""

from __future__ import annotations

from linnet.semantics.program import Document

SOURCE = """fn first4(x: [B, S]) -> [B, 4] {
    x[:, :4]
}

fn first4_of_enough(x: [B, 4 + E]) -> [B, 4] {
    x[:, :4]
}
"""


def test_a_declared_type_a_clamped_slice_misses_notes_the_clamp():
    (error,) = Document("clamped.linnet", SOURCE).analyze().errors
    assert error.code == "L204" and "returns [B, min(4, S)], declared [B, 4]" in error.message
    assert any("[B, min(4, S)]" in n and "x: [B, 4 + E]" in n for n in error.notes)
