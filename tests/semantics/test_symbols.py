"""Definitions and references: the symbol table the language server will use."""

from __future__ import annotations

from linnet.semantics.program import Document
from tests.conftest import EXAMPLES

TEXT = (EXAMPLES / "llama.linnet").read_text()
ANALYSIS = Document(str(EXAMPLES / "llama.linnet"), TEXT).analyze()


def at(needle: str, k: int = 0, start: str | None = None) -> int:
    base = TEXT.index(start) if start else 0
    return TEXT.index(needle, base) + k


def test_local_definition_and_uses():
    offset = at("let (q, k, v) = project", 5)
    definition = ANALYSIS.definition_at(offset)
    assert definition.line == TEXT[:offset].count("\n") + 1
    refs = ANALYSIS.references(offset)
    assert len(refs) == 2  # the definition and `attention(q, ...)`


def test_config_field_references_include_presets():
    offset = at("c.hidden_size", 2)
    definition = ANALYSIS.definition_at(offset)
    assert TEXT.split("\n")[definition.line - 1].strip().startswith("hidden_size: int")
    lines = {r.line for r in ANALYSIS.references(offset)}
    assert TEXT[: at("hidden_size = 576")].count("\n") + 1 in lines  # the preset sets it


def test_std_definitions_are_real_files():
    definition = ANALYSIS.definition_at(at("RMSNorm(c.hidden_size"))
    assert definition.path.endswith("nn.linnet")
    text = open(definition.path).read().split("\n")[definition.line - 1]
    assert text.startswith("module RMSNorm")
    attn = ANALYSIS.definition_at(at("attention(q, k, v", start="fn forward(x: [B, S, c.hidden_size], cos"))
    assert attn.path.endswith("attention.linnet")


def test_members_methods_and_loops():
    layers = ANALYSIS.definition_at(at("in layers", 3))
    assert TEXT.split("\n")[layers.line - 1].strip().startswith("layers:")
    step = ANALYSIS.definition_at(at("model.step(", 6))
    assert TEXT.split("\n")[step.line - 1].strip().startswith("fn step")
    loop_var = at("for layer in layers", 4)
    assert len(ANALYSIS.references(loop_var)) == 2


def test_no_type_shown_in_a_branch_not_taken():
    text = (
        "config C {\n    flag: bool = true\n}\n\nmodule M(c: C) {\n    fn f(x: [N]) -> [N] {\n"
        "        if c.flag { x } else { x * 2.0 }\n    }\n}\n"
    )
    from linnet.semantics.program import Document

    analysis = Document("t.linnet", text).analyze()
    assert analysis.type_at(text.index("{ x }") + 2).concrete == "[N]"
    assert analysis.type_at(text.index("x * 2.0")) is None  # never checked: flag is true


def test_edit_ranges_are_checked():
    import pytest

    from linnet.semantics.program import Document

    doc = Document("t.linnet", "fn f(x: [N]) -> [N] { x }\n")
    with pytest.raises(ValueError):
        doc.edit(-1, 5, "")
