"""examples/qwen2.linnet and examples/qwen3.linnet (issue 17, rows `qwen2` and `qwen3`).

- Real size: each file checks clean under its presets; each preset's parameter count is transformers' for that real
  config (the model built on the `meta` device) and the published one; the real config.json binds to the preset's
  values, and a header-only copy of the real checkpoint matches every tensor name and shape (L501, L502, L503).
- Shrunk size: a 2-layer checkpoint with grouped-query attention, made by transformers with a seed, perturbed away
  from its init and saved with `save_pretrained`, loaded through its folder on every backend, equals transformers:
  logits at every position, 32 greedy tokens, and cached decode against uncached. Qwen2 has its q/k/v biases and a
  tied head (Qwen2.5 0.5B); Qwen3 has its per-head q/k norms and 8 heads of 8 over a 48-wide residual stream
  (head_dim is not hidden_size / heads, as in every Qwen3), untied (Qwen3 8B). The other head, and Qwen3's
  `attention_bias`, run on PyTorch.
- A checkpoint that turns Qwen2's sliding window on is refused on that key."""

from __future__ import annotations

import json
import shutil

import pytest

from linnet.semantics.program import Document
from tests.runtimes.conftest import LOGITS_ATOL, QWEN2, QWEN3, max_abs_diff, report
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

from linnet.errors import LinnetError  # noqa: E402
from linnet.runtimes.loading import LoadOptions, prepare  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

SOURCES = {"qwen2": QWEN2, "qwen3": QWEN3}
VOCAB = 256

# config.json of the real checkpoints, as published on the Hugging Face Hub.
QWEN2_5_0_5B_INSTRUCT = {  # Qwen/Qwen2.5-0.5B-Instruct, written by transformers 4.43
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_4B = {  # Qwen/Qwen3-4B, written by transformers 4.51
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
QWEN3_8B = QWEN3_4B | {"hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False}  # Qwen/Qwen3-8B

# (model_type, preset): (the real config.json, the published parameter count)
REAL = {
    ("qwen2", "qwen2_5_0_5b_instruct"): (QWEN2_5_0_5B_INSTRUCT, 494_032_768),
    ("qwen3", "qwen3_4b"): (QWEN3_4B, 4_022_468_096),
    ("qwen3", "qwen3_8b"): (QWEN3_8B, 8_190_735_360),
}


def analyze(model_type: str):
    path = SOURCES[model_type]
    return Document(str(path), path.read_text(encoding="utf-8")).analyze()


@pytest.mark.parametrize("model_type", sorted(SOURCES))
def test_checks_clean_under_every_preset(model_type):
    analysis = analyze(model_type)
    assert analysis.diagnostics == []
    assert analysis.presets == [preset for (t, preset) in REAL if t == model_type]


@pytest.mark.parametrize("model_type, preset", sorted(REAL))
def test_parameter_count_is_transformers(model_type, preset):
    config_json, published = REAL[model_type, preset]
    ours = analyze(model_type).trees[preset].param_count()
    theirs = meta_model(config_json).num_parameters()
    print(f"{preset}: {ours:,} parameters (transformers: {theirs:,})")
    assert ours == theirs == published


@pytest.mark.parametrize("model_type, preset", sorted(REAL))
def test_real_checkpoint_names_and_shapes(model_type, preset, tmp_path):
    """The real config.json binds (each key a field or declared inert) to the preset's own values, and every tensor
    of the real checkpoint has the name and shape the source declares."""
    check_real_checkpoint(SOURCES[model_type], preset, header_only_checkpoint(tmp_path, REAL[model_type, preset][0]))


# The shrunk models: 2 layers, 8 query heads over 2 key/value heads, rope_theta 100 (wavelengths of a few
# positions, so a wrong rotation shows within the prompts).
SMALL = {
    "qwen2": {"hidden_size": 64, "intermediate_size": 128, "tie_word_embeddings": True},
    "qwen3": {"hidden_size": 48, "intermediate_size": 96, "head_dim": 8, "tie_word_embeddings": False},
}
LABELS = {"qwen2": "small Qwen2 (tied, GQA 8/2)", "qwen3": "small Qwen3 (untied, GQA 8/2, 8 heads of 8 over 48)"}


def small_config(model_type: str, **changes):
    values = dict(
        vocab_size=VOCAB,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=100.0,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
    )
    return transformers.AutoConfig.for_model(model_type, **values | SMALL[model_type] | changes)


@pytest.fixture(scope="module", params=sorted(SMALL))
def small(request, tmp_path_factory):
    """(model_type, folder, Reference) of a seeded, perturbed 2-layer model saved with save_pretrained."""
    folder = tmp_path_factory.mktemp(request.param)
    model = save_seeded(small_config(request.param), folder, seed=0)
    return request.param, folder, Reference(model, VOCAB)


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_model_equals_transformers(small, backend):
    model_type, folder, ref = small
    check_decoder(SOURCES[model_type], folder, ref, backend, LABELS[model_type])


@pytest.mark.parametrize(
    "model_type, changes",
    [("qwen2", {"tie_word_embeddings": False}), ("qwen3", {"attention_bias": True, "tie_word_embeddings": True})],
    ids=["qwen2-untied", "qwen3-attention_bias-tied"],
)
def test_the_other_head_and_attention_bias(model_type, changes, tmp_path):
    """Qwen2.5 7B and up keep their own `lm_head.weight`; Qwen3's `attention_bias` (false in every released size,
    but a config value) puts biases on all four projections."""
    model = save_seeded(small_config(model_type, **changes), tmp_path, seed=4)
    check_decoder(SOURCES[model_type], tmp_path, Reference(model, VOCAB), "torch", f"small {model_type} with {changes}")


@pytest.mark.parametrize("small", ["qwen3"], indirect=True)
def test_the_qwen3_q_k_norms_would_show(small):
    """The same weights with the q/k norm scales reset to 1 give logits far outside the tolerance, so the comparison
    above checks that each norm's own weights are applied."""
    _, folder, ref = small
    model = transformers.Qwen3ForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(1.0)
            layer.self_attn.k_norm.weight.fill_(1.0)
        delta = max_abs_diff(model(ref.ids).logits, ref.logits)
    report("small Qwen3 with q/k norm scales of 1, against its own weights", delta)
    assert delta > 100 * LOGITS_ATOL


@pytest.mark.parametrize("small", ["qwen2"], indirect=True)
def test_qwen2_sliding_window_on_is_refused_on_the_key(small, tmp_path):
    """With `use_sliding_window` true transformers hides keys more than `sliding_window` positions back in the
    layers `layer_types` marks, which changes the logits; the source has no window, so the load stops at the key
    (L401 in config.json, labelled with the field's declaration) rather than run another model."""
    _, folder, ref = small
    windowed = dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    windowed["layer_types"] = ["full_attention", "sliding_attention"]  # what Qwen2Config derives from those
    reference = transformers.Qwen2ForCausalLM.from_pretrained(folder).eval()
    sliding = transformers.Qwen2ForCausalLM.from_pretrained(folder, **windowed).eval()
    with torch.inference_mode():
        assert max_abs_diff(sliding(ref.ids).logits, reference(ref.ids).logits) > 100 * LOGITS_ATOL

    ckpt = tmp_path / "ckpt"
    shutil.copytree(folder, ckpt)
    text = json.dumps(json.loads((ckpt / "config.json").read_text()) | windowed, indent=2)
    (ckpt / "config.json").write_text(text)
    with pytest.raises(LinnetError) as err:
        prepare(SOURCES["qwen2"], ckpt, LoadOptions(max_positions=16))
    line = next(i for i, s in enumerate(text.splitlines(), 1) if '"use_sliding_window"' in s)
    assert f"config.json:{line}:3: error[L401]: `use_sliding_window` can only be `false`" in err.value.message
    assert "use_sliding_window: false = false" in err.value.message  # the field's declaration
