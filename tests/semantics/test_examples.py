"""The examples: clean under every preset, the right parameter trees, and planted faults
reported each at its own line."""

from __future__ import annotations

import pytest

from linnet.semantics.program import Document
from tests.conftest import EXAMPLES

EXPECTED_PRESETS = {
    "mlp.linnet": ["tiny"],
    "llama.linnet": ["smollm2_135m", "smollm2_1_7b_instruct", "tinyllama_1_1b", "llama_3_1_8b"],
    "gpt2.linnet": ["gpt2"],
    "bert.linnet": ["all_minilm_l6_v2", "bert_base_uncased"],
}

# Parameter counts of the real checkpoints (transformers' `num_parameters()`).
PARAM_COUNTS = {
    ("llama.linnet", "smollm2_135m"): 134_515_008,
    ("llama.linnet", "smollm2_1_7b_instruct"): 1_711_376_384,
    ("llama.linnet", "tinyllama_1_1b"): 1_100_048_384,
    ("llama.linnet", "llama_3_1_8b"): 8_030_261_248,
    ("gpt2.linnet", "gpt2"): 124_439_808,
    ("bert.linnet", "all_minilm_l6_v2"): 22_713_216,
    ("bert.linnet", "bert_base_uncased"): 109_482_240,
}


def analyze(name: str, text: str | None = None):
    path = EXAMPLES / name
    return Document(str(path), text if text is not None else path.read_text()).analyze()


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_example_checks_clean_under_every_preset(name):
    analysis = analyze(name)
    assert analysis.diagnostics == []
    assert analysis.presets == EXPECTED_PRESETS[name]
    assert analysis.model is not None
    for preset in analysis.presets:
        assert preset in analysis.trees


@pytest.mark.parametrize("key", sorted(PARAM_COUNTS))
def test_parameter_counts(key):
    name, preset = key
    assert analyze(name).trees[preset].param_count() == PARAM_COUNTS[key]


def test_checkpoint_names_and_shapes():
    llama = analyze("llama.linnet")
    smol = {p.path: p.shape() for p in llama.trees["smollm2_135m"].params}
    assert smol["model.layers.0.self_attn.k_proj.weight"] == (192, 576)
    assert smol["model.layers.29.mlp.down_proj.weight"] == (576, 1536)
    assert "lm_head.weight" not in smol  # tied
    big = {p.path: p.shape() for p in llama.trees["llama_3_1_8b"].params}
    assert big["lm_head.weight"] == (128256, 4096)
    assert big["model.layers.31.self_attn.k_proj.weight"] == (1024, 4096)
    state = {s.path: s.shape() for s in llama.trees["smollm2_135m"].state}
    assert state["model.layers.0.self_attn.k_cache"] == (None, 3, None, 64)  # max_batch, max_positions at load
    gpt2 = {p.path: p.shape() for p in analyze("gpt2.linnet").trees["gpt2"].params}
    assert gpt2["transformer.h.0.attn.c_attn.weight"] == (768, 2304)  # Conv1D stores [in, out]
    bert = {p.path: p.shape() for p in analyze("bert.linnet").trees["all_minilm_l6_v2"].params}
    assert bert["encoder.layer.5.attention.self.query.weight"] == (384, 384)
    assert bert["embeddings.LayerNorm.weight"] == (384,)
    assert bert["pooler.dense.bias"] == (384,)


def test_decoders_and_encoders():
    assert analyze("llama.linnet").trees["smollm2_135m"].is_decoder
    assert set(analyze("gpt2.linnet").trees["gpt2"].entries) == {"forward", "step"}
    assert not analyze("bert.linnet").trees["all_minilm_l6_v2"].is_decoder


def test_hover_in_examples():
    text = (EXAMPLES / "llama.linnet").read_text()
    analysis = analyze("llama.linnet", text)
    at = text.index("let q = rearrange") + 4
    smol = analysis.type_at(at, "smollm2_135m")
    assert (smol.symbolic, smol.concrete) == ("[B, c.num_attention_heads, S, c.head_dim]", "[B, 9, S, 64]")
    big = analysis.type_at(at, "llama_3_1_8b")
    assert big.concrete == "[B, 32, S, 128]"
    out = analysis.type_at(text.index("let out = attention") + 4, "tinyllama_1_1b")
    assert (out.symbolic, out.concrete) == ("[B, c.num_attention_heads, S, c.head_dim]", "[B, 32, S, 64]")
    inv = analysis.type_at(text.index("let inv_freq") + 4, "llama_3_1_8b")
    assert inv.concrete == "f32[64]"


# ----------------------------------------------------------------------------- planted faults


def plant(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def test_wrong_num_key_value_heads():
    text = plant(
        (EXAMPLES / "llama.linnet").read_text(),
        "num_attention_heads = 32, num_key_value_heads = 4,",
        "num_attention_heads = 32, num_key_value_heads = 5,",
    )
    diags = analyze("llama.linnet", text).diagnostics
    assert {(d.code, d.presets) for d in diags} == {("L206", ("tinyllama_1_1b",))}
    lines = {d.location.line for d in diags}
    assert lines == {line_of(text, "let out = attention(q, k, v"), line_of(text, "let out = attention(q, take(")}
    assert "32 is not divisible by 5" in diags[0].message


def test_hidden_size_the_heads_do_not_divide():
    text = plant(
        (EXAMPLES / "llama.linnet").read_text(),
        "vocab_size = 49152, hidden_size = 576,",
        "vocab_size = 49152, hidden_size = 580,",
    )
    diags = analyze("llama.linnet", text).diagnostics
    assert [(d.code, d.location.line) for d in diags] == [("L404", line_of(text, "preset smollm2_135m"))]
    assert (
        diags[0].message == "`hidden_size` (580) is not divisible by `num_attention_heads` (9), as `head_dim` requires"
    )


def test_projection_with_swapped_features():
    text = plant(
        (EXAMPLES / "llama.linnet").read_text(),
        "gate_proj: Linear(c.hidden_size, c.intermediate_size, use_bias=c.mlp_bias)",
        "gate_proj: Linear(c.intermediate_size, c.hidden_size, use_bias=c.mlp_bias)",
    )
    diags = analyze("llama.linnet", text).diagnostics
    assert [(d.code, d.location.line) for d in diags] == [
        ("L203", line_of(text, "        down_proj(silu(gate_proj(x))"))
    ]
    assert diags[0].message.startswith(
        "argument `x` of `gate_proj` is [..., 576], expected [..., 1536]"
    )  # the first preset's numbers
    assert diags[0].presets is None  # wrong under every config


def test_syntax_error_beside_a_shape_error():
    text = (EXAMPLES / "llama.linnet").read_text()
    text = plant(
        text,
        "let x = h + self_attn(input_layernorm(h), cos, sin, mask)\n",
        "let x = h + self_attn(input_layernorm(h), cos, sin, mask) +\n",
    )
    text = plant(
        text, "        down_proj(silu(gate_proj(x)) * up_proj(x))", "        down_proj(silu(gate_proj(x)) * x)"
    )
    diags = analyze("llama.linnet", text).diagnostics
    assert [(d.code, d.location.line) for d in diags] == [
        ("L201", line_of(text, "        down_proj(silu(gate_proj(x)) * x)")),
        ("L001", line_of(text, "cos, sin, mask) +")),
    ]


def test_a_family_that_drops_a_field_the_shared_llama_modules_read_is_told_which():
    """mistral.linnet builds llama.linnet's decoder layer over its own config: without `mlp_bias`, which the layer
    reads through the LlamaMLP it builds, the layer's use is L409 naming the field and both configs, labelled where
    LlamaMLP reads it; with `mlp_bias: bool` the layer is accepted (a one-value type is not required)."""
    text = (EXAMPLES / "mistral.linnet").read_text()
    assert "    mlp_bias: false = false\n" in text
    without = text.replace("    mlp_bias: false = false\n", "")
    dropped = analyze("mistral.linnet", without)
    # once, at the argument: not again where MistralForCausalLM builds the MistralModel that holds it
    assert [(d.code, d.location.line) for d in dropped.diagnostics] == [
        ("L409", without[: without.index("[LlamaDecoderLayer(c)")].count("\n") + 1)
    ]
    d = dropped.diagnostics[0]
    assert d.message == "`LlamaDecoderLayer` reads `mlp_bias` of its `Llama` config, which `Mistral` does not declare"
    read = next(label for label in d.labels if label.message == "read here")
    llama = (EXAMPLES / "llama.linnet").read_text().split("\n")
    assert read.location.path.endswith("llama.linnet") and "c.mlp_bias" in llama[read.location.line - 1]
    widened = text.replace("mlp_bias: false = false", "mlp_bias: bool = false")
    assert analyze("mistral.linnet", widened).diagnostics == []
