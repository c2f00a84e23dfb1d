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


NESTED = """config VisionConfig {
    d: int = 8
}

config Outer {
    vision: VisionConfig = VisionConfig { d = 4 }
    x: int = 1
}

preset p1 = Outer { x = 2 }
preset p2 = Outer { x = 3 }
preset wide = Outer { vision = VisionConfig { d = 16 } }

module Tower(c: VisionConfig) {
    fn f(x: [c.d]) -> [4] {
        x
    }
}

model M(c: Outer) {
    tower: Tower(c.vision)

    entry fn forward(x: [c.vision.d]) -> [4] {
        tower.f(x)
    }
}
"""


def test_a_nested_configs_own_defaults_are_not_named_after_the_outer_presets():
    """`Tower` takes the nested config: it is checked under `VisionConfig`'s own defaults (d = 8), under `Outer`'s
    default vision (d = 4, which `p1` and `p2` keep) and under `wide`'s (d = 16). Every preset's scenario holds
    `VisionConfig` at its defaults too, but no preset gives `Tower` d = 8: the finding there was noted `under the
    config defaults, p1, p2, wide`, and hover under `p1` showed d = 8."""
    analysis = Workspace().open("m.linnet", NESTED).analyze()
    (found,) = [d for d in analysis.diagnostics if d.code == "L204"]
    assert found.message == "`f` returns [c.d], declared [4] ([8] vs [4])"
    assert found.presets == ("defaults", "wide")
    assert found.notes[0] == "under the config defaults, `wide`"
    body = NESTED.index("        x\n") + len("        ")
    assert analysis.type_at(body, "p1").concrete == "[4]"
    assert analysis.type_at(body, "wide").concrete == "[16]"
