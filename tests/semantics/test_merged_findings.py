"""A finding that occurs under several presets is published once (program._merge); its message quotes one
preset's values, and a note says whose when another preset's values differ."""

from linnet.semantics.program import Workspace

SOURCE = """config C {
    d: int = 128
    e: int = 128
}

preset small = C { d = 128, e = 24 }
preset other = C { d = 64, e = 32 }
preset same_as_small = C { d = 128, e = 24 }

model M(c: C) {
    w: Linear(c.d, c.e)

    entry fn forward(x: [B, c.d]) -> [B, c.d] {
        w(x)
    }
}
"""


def l204(text: str, preset: str | None = None):
    (found,) = [d for d in Workspace().open("m.linnet", text).analyze(preset).diagnostics if d.code == "L204"]
    return found


def test_a_message_quoting_one_presets_values_says_whose_they_are():
    d = l204(SOURCE)
    assert "([B, 24] vs [B, 128])" in d.message  # `small`'s sizes (`other`'s are [B, 32] vs [B, 64])
    assert set(d.presets) == {"small", "other", "same_as_small"}
    assert "the values in this message are those under `small`, `same_as_small`; they differ under the others" in (
        d.notes
    )
    d = l204(SOURCE, "other")  # the selected preset's values are the ones quoted
    assert "([B, 32] vs [B, 64])" in d.message
    assert "the values in this message are those under `other`; they differ under the others" in d.notes


def test_no_note_where_every_preset_gives_the_same_message():
    text = SOURCE.replace("preset other = C { d = 64, e = 32 }\n", "")
    assert not any("the values in this message" in n for n in l204(text).notes)
