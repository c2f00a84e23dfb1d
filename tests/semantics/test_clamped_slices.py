"""A declared type that a clamped slice does not match (`x[:, :4]` of [B, S] is [B, min(4, S)]) says why, and what
states that the dim holds the rows (docs/language.md, "Slices clamp"); a call that gives such a parameter a dim that
may have fewer rows says how the caller states it has them."""

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


STARTS = """fn after4(x: [B, S]) -> [B, S - 4] {
    x[:, 4:]
}

fn after4_of_enough(x: [B, 4 + E]) -> [B, E] {
    x[:, 4:]
}

fn caller(x: [B, S], y: [B, 4 + F]) -> [B, F] {
    after4_of_enough(x)
    after4_of_enough(y)
}
"""


def test_a_start_past_a_symbolic_end_is_clamped_and_a_pattern_is_not_assumed():
    """`x[:, 4:]` of [B, S] was typed [B, S - 4] (-2 columns at 2 tokens, where every backend gives 0), and
    `after4_of_enough(x)` solved `E = S - 4` without a word."""
    start, call = sorted(Document("starts.linnet", STARTS).analyze().errors, key=lambda e: e.location.line)
    assert start.code == "L204" and "returns [B, S - min(4, S)], declared [B, S - 4]" in start.message
    assert any("`x[:, 4:]` is [B, S - min(4, S)]" in n for n in start.notes)
    assert call.code == "L213" and call.message == (
        "argument `x` of `after4_of_enough`: dim 1 is S, but must be E + 4: E would be S - 4, negative where S is "
        "less than 4, and dims are sizes"
    )
    assert call.notes == (
        "consider declaring the dim as the parameter does where it comes from ([B, 4 + E] for [B, S]): a dim "
        "variable alone may be any size",
    )
