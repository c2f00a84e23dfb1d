"""Completion where only a config value's field or a type can go: `MlpConfig { in_features = 8, | }` offered the
~127 names in scope (`Mlp`, `Linear`, `rms_norm`) instead of the fields not yet set, and `fn f(y: |` offered
members, functions and `max_batch` instead of types. Through the `analyze()` facade the server uses."""

from __future__ import annotations

import pytest

from linnet.lsp.completion import completions
from linnet.semantics.program import Workspace

from .conftest import EXAMPLES

MLP = (EXAMPLES / "mlp.linnet").read_text()
PRESET = "preset tiny = MlpConfig { in_features = 8, hidden_features = 32, out_features = 2 }"
SIGNATURE = "    entry fn forward(x: [B, c.in_features]) -> [B, c.out_features] {"


def labels_at(text: str, cursor: str) -> list[str]:
    """The completion labels at the `|` in `cursor`, which (without the `|`) occurs once in `text`."""
    before, after = cursor.split("|")
    assert text.count(before + after) == 1, cursor
    offset = text.index(before + after) + len(before)
    return [c.label for c in completions(Workspace().open(str(EXAMPLES / "mlp.linnet"), text).analyze(), offset, None)]


def test_a_config_values_fields_not_yet_set():
    text = MLP.replace(PRESET, "preset tiny = MlpConfig { in_features = 8,  }")
    assert labels_at(text, "in_features = 8, | }") == ["hidden_features", "out_features"]
    assert labels_at(text, "MlpConfig {| in_features") == ["hidden_features", "out_features"]
    # a field set after the cursor is not offered either; nor one set on another line of a value over lines
    text = MLP.replace(PRESET, "preset tiny = MlpConfig {\n    in_features = 8\n    \n    out_features = 2\n}")
    assert labels_at(text, "in_features = 8\n    |\n") == ["hidden_features"]


def test_a_nested_config_values_fields():
    text = MLP.replace(
        "    out_features: int = 4\n}",
        "    out_features: int = 4\n    inner: Inner = Inner { a = 3,  }\n}\n\n"
        "config Inner {\n    a: int = 1\n    b: int = 2\n}",
    )
    assert labels_at(text, "Inner { a = 3, | }") == ["b"]


def test_a_fields_value_is_not_a_field_place():
    text = MLP.replace(PRESET, "preset tiny = MlpConfig { in_features = , }")
    found = labels_at(text, "in_features = |, }")
    assert "MlpConfig" in found and "in_features" not in found


@pytest.mark.parametrize(
    "signature",
    [
        "    entry fn forward(x: |) -> [B, c.out_features] {",
        "    entry fn forward(x: [B, c.in_features], y: |) -> [B, c.out_features] {",
        "    entry fn forward(x: [B, c.in_features]) -> | {",
        "    entry fn forward<T>(x: [B, c.in_features], y: |) -> [B, c.out_features] {",
    ],
)
def test_types_at_a_parameter_or_return_type(signature):
    found = labels_at(MLP.replace(SIGNATURE, signature.replace("|", "")), signature)
    assert {"int", "float", "bool", "str", "MlpConfig", "f32", "i64"} <= set(found)
    for not_a_type in ("Mlp", "Linear", "rms_norm", "fc1", "max_batch", "c", "x", "let"):
        assert not_a_type not in found, not_a_type
    assert ("T" in found) == ("<T>" in signature)
    assert "list" not in found  # a config field's type only


def test_types_at_a_model_parameter_a_let_and_a_config_field():
    found = labels_at(MLP.replace("model Mlp(c: MlpConfig)", "model Mlp(c: )"), "model Mlp(c: |)")
    assert "MlpConfig" in found and "Linear" not in found
    text = MLP.replace("        fc2(h)", "        let y: \n        fc2(h)")
    found = labels_at(text, "let y: |\n")
    assert "f32" in found and "fc2" not in found
    text = MLP.replace("    out_features: int = 4\n", "    out_features: int = 4\n    extra: \n")
    found = labels_at(text, "extra: |\n")
    assert {"int", "list", "MlpConfig"} <= set(found) and "Linear" not in found


def test_names_in_scope_elsewhere_stay():
    """A default value, a body (an `if a == b {` block too) and an index are expressions: the names in scope."""
    text = MLP.replace("let h = gelu(fc1(x))", "let h = gelu(fc1(x[:, ]))")
    assert {"x", "fc1", "c", "gelu"} <= set(labels_at(text, "x[:, |]"))
    branch = "        if c.in_features == c.out_features {\n            \n        }\n        fc2(h)"
    text = MLP.replace("        fc2(h)", branch)
    assert {"h", "fc2", "gelu"} <= set(labels_at(text, "c.out_features {\n            |\n"))
    text = MLP.replace(SIGNATURE, "    entry fn forward(x: [B, c.in_features], k: int = ) -> [B, c.out_features] {")
    assert "c" in labels_at(text, "k: int = |)")
