"""examples/qwen2.linnet: clean under its preset, whose parameter count is transformers' for Qwen2.5-0.5B-Instruct
and whose names and shapes match a header-only copy of that checkpoint; a shrunk Qwen2 (2 layers, GQA 8/2, tied
head, q/k/v biases) made by transformers and loaded through its folder equals transformers on every backend
(logits at every position, 32 greedy tokens, cached decode against uncached); a checkpoint that turns the sliding
window on is refused on that key."""

from __future__ import annotations

import json
import shutil

import pytest

from linnet.semantics.program import Document
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import max_abs_diff
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
from linnet.runtimes.loading import prepare  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

QWEN2 = EXAMPLES / "qwen2.linnet"
VOCAB = 256

# config.json of Qwen/Qwen2.5-0.5B-Instruct, as published (written by transformers 4.43).
QWEN2_5_0_5B_INSTRUCT = {
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
PRESETS = {"qwen2_5_0_5b_instruct": QWEN2_5_0_5B_INSTRUCT}


def analyze():
    return Document(str(QWEN2), QWEN2.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    analysis = analyze()
    assert analysis.diagnostics == []
    assert analysis.presets == list(PRESETS)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_parameter_count_is_transformers(preset):
    ours = analyze().trees[preset].param_count()
    theirs = meta_model(PRESETS[preset]).num_parameters()
    print(f"{preset}: {ours:,} parameters (transformers: {theirs:,})")
    assert ours == theirs == 494_032_768


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_real_checkpoint_names_and_shapes(preset, tmp_path):
    """The real config.json binds (each key a field or declared inert) to the preset's own values, and every tensor
    of the real checkpoint has the name and shape the source declares (the load's L501 and L502 checks)."""
    check_real_checkpoint(QWEN2, preset, header_only_checkpoint(tmp_path, PRESETS[preset]))


def small_config(**changes):
    values = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=100.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        initializer_range=0.1,
    )
    return transformers.Qwen2Config(**values | changes)


@pytest.fixture(scope="module")
def small_qwen2(tmp_path_factory):
    """(folder, Reference) of a seeded, perturbed 2-layer Qwen2 with a tied head, saved with save_pretrained."""
    folder = tmp_path_factory.mktemp("qwen2")
    model = save_seeded(transformers.Qwen2ForCausalLM, small_config(), folder, seed=0)
    return folder, Reference(model, VOCAB)


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_qwen2_equals_transformers(small_qwen2, backend):
    folder, ref = small_qwen2
    check_decoder(QWEN2, folder, ref, backend, "small Qwen2 (tied, GQA 8/2)")


def test_untied_head(tmp_path):
    """Qwen2.5 7B and up keep their own `lm_head.weight`."""
    model = save_seeded(transformers.Qwen2ForCausalLM, small_config(tie_word_embeddings=False), tmp_path, seed=4)
    check_decoder(QWEN2, tmp_path, Reference(model, VOCAB), "torch", "small Qwen2 (untied)")


def test_sliding_window_on_is_refused_on_the_key(small_qwen2, tmp_path):
    """With `use_sliding_window` true transformers hides keys more than `sliding_window` positions back in the
    layers from `max_window_layers` on, which changes the logits; the source has no window, so the load stops at
    the key (L401 in config.json, labelled with the field's declaration) rather than run another model."""
    folder, ref = small_qwen2
    windowed = dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    windowed["layer_types"] = ["full_attention", "sliding_attention"]  # what Qwen2Config derives from those
    reference = transformers.Qwen2ForCausalLM.from_pretrained(folder).eval()
    sliding = transformers.Qwen2ForCausalLM.from_pretrained(folder, **windowed).eval()
    with torch.inference_mode():
        assert max_abs_diff(sliding(ref.ids).logits, reference(ref.ids).logits) > 0.01

    ckpt = tmp_path / "ckpt"
    shutil.copytree(folder, ckpt)
    config = json.loads((ckpt / "config.json").read_text()) | windowed
    text = json.dumps(config, indent=2)
    (ckpt / "config.json").write_text(text)
    with pytest.raises(LinnetError) as err:
        prepare(QWEN2, ckpt, max_positions=16)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if '"use_sliding_window"' in s)
    assert f"config.json:{line}:3: error[L401]: `use_sliding_window` can only be `false`" in err.value.message
    assert "use_sliding_window: false = false" in err.value.message  # the field's declaration
