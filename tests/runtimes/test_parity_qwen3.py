"""examples/qwen3.linnet: clean under its presets, whose parameter counts are transformers' for Qwen3-4B and
Qwen3-8B and whose names and shapes match header-only copies of those checkpoints; a shrunk Qwen3 (2 layers, GQA 8/2,
head_dim 8 with 8 heads over a 48-wide residual stream, per-head q/k RMSNorm) made by transformers and loaded
through its folder equals transformers on every backend (logits at every position, 32 greedy tokens, cached decode
against uncached); the same with `attention_bias` and a tied head on PyTorch."""

from __future__ import annotations

import pytest

from linnet.semantics.program import Document
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import LOGITS_ATOL, max_abs_diff, report
from tests.runtimes.zoo_decoders import (
    BACKENDS,
    Reference,
    check_decoder,
    check_real_checkpoint,
    header_only_checkpoint,
    meta_model,
    save_seeded,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

QWEN3 = EXAMPLES / "qwen3.linnet"
VOCAB = 256

# config.json of Qwen/Qwen3-4B and Qwen/Qwen3-8B, as published (written by transformers 4.51).
QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_8B = QWEN3_4B | {"hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False}
PRESETS = {"qwen3_4b": (QWEN3_4B, 4_022_468_096), "qwen3_8b": (QWEN3_8B, 8_190_735_360)}


def analyze():
    return Document(str(QWEN3), QWEN3.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    analysis = analyze()
    assert analysis.diagnostics == []
    assert analysis.presets == list(PRESETS)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_parameter_count_is_transformers(preset):
    config_json, published = PRESETS[preset]
    ours = analyze().trees[preset].param_count()
    theirs = meta_model(config_json).num_parameters()
    print(f"{preset}: {ours:,} parameters (transformers: {theirs:,})")
    assert ours == theirs == published


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_real_checkpoint_names_and_shapes(preset, tmp_path):
    """The real config.json binds (each key a field or declared inert) to the preset's own values, and every tensor
    of the real checkpoint has the name and shape the source declares (the load's L501 and L502 checks)."""
    check_real_checkpoint(QWEN3, preset, header_only_checkpoint(tmp_path, PRESETS[preset][0]))


def small_config(**changes):
    values = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        rope_theta=100.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    return transformers.Qwen3Config(**values | changes)


@pytest.fixture(scope="module")
def small_qwen3(tmp_path_factory):
    """(folder, Reference) of a seeded, perturbed 2-layer Qwen3 with an untied head, saved with save_pretrained."""
    folder = tmp_path_factory.mktemp("qwen3")
    model = save_seeded(transformers.Qwen3ForCausalLM, small_config(), folder, seed=0)
    return folder, Reference(model, VOCAB)


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_qwen3_equals_transformers(small_qwen3, backend):
    folder, ref = small_qwen3
    check_decoder(QWEN3, folder, ref, backend, "small Qwen3 (untied, GQA 8/2, head_dim 8)")


def test_attention_bias_and_tied_head(tmp_path):
    """`attention_bias` puts biases on all four projections (false in every released Qwen3, but a config value)."""
    model = save_seeded(
        transformers.Qwen3ForCausalLM, small_config(attention_bias=True, tie_word_embeddings=True), tmp_path, seed=4
    )
    check_decoder(QWEN3, tmp_path, Reference(model, VOCAB), "torch", "small Qwen3 (attention_bias, tied)")


def test_the_q_k_norms_would_show(small_qwen3):
    """The same weights with the q/k norm scales reset to 1 give logits far outside the tolerance, so the comparison
    above checks that each norm's own weights are applied (and to the right heads)."""
    _, ref = small_qwen3
    model = transformers.Qwen3ForCausalLM.from_pretrained(small_qwen3[0]).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(1.0)
            layer.self_attn.k_norm.weight.fill_(1.0)
        delta = max_abs_diff(model(ref.ids).logits, ref.logits)
    report("small Qwen3 with q/k norm scales of 1, against its own weights", delta)
    assert delta > 100 * LOGITS_ATOL
