"""The notes of the classic convolution mistakes (tests/semantics/cases/spatial.linnet; the cases
check codes and messages, this the notes): a channels-last image given to a channels-first layer
or op says so, and names the rearrange that fixes it."""

from __future__ import annotations

from pathlib import Path

from linnet.semantics.program import Document

CASE = Path(__file__).parent / "cases" / "spatial.linnet"


def notes_at(code: str, line_text: str) -> list[str]:
    text = CASE.read_text(encoding="utf-8")
    line = text.split("\n").index(line_text) + 1
    diagnostics = Document(str(CASE), text).analyze().diagnostics
    (found,) = [d for d in diagnostics if d.code == code and d.location.line == line]
    return list(found.notes)


def test_channels_last_input_to_a_conv_layer_is_named():
    assert notes_at("L203", "        stem(pixel_values)") == [
        "the argument has 3 at dim 3, not 1: its dims may be in another order "
        '(channels-last? consider `rearrange(x, "b h w c -> b c h w")`)'
    ]


def test_channels_last_input_to_the_conv_op_is_named():
    assert notes_at("L215", "        conv2d(pixel_values, weight)") == [
        'the input\'s last dim is 3: it looks channels-last; consider `rearrange(x, "b ... c -> b c ...")` first'
    ]
