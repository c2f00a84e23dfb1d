"""examples/whisper.linnet against transformers' WhisperForConditionalGeneration.

At real size (no weights): the source checks clean under its presets, whose parameters are those of transformers'
model for that config built on the `meta` device (names, shapes and count; `proj_out` is tied to the decoder's
embeddings), and whose config is the config.json transformers writes for it. At shrunk size
(`tests/runtimes/whisper_checkpoint.py`), loaded through the folder on every backend: the encoder's states (`encode`,
and `prefill_encoder` filling two cache rows out of order), the decoder's logits at every position (`forward`), and
the decoder's `step` over the cross-attention cache (a prefill of 4 tokens, then one token at a time) against the
logits of the full forward; JAX's backends the same on a TPU (the tests marked tpu). Then greedy transcription
(`Transcriber`) against transformers' `generate` on the same features: the language given, detected, and translation,
with suppressed tokens and an EOS stop."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import (
    ALL_BACKENDS,
    LOGITS_ATOL,
    device_label,
    max_abs_diff,
    on_devices,
    record,
    run_device,
)
from tests.runtimes.whisper_checkpoint import FRAMES, N_MELS, SUPPRESS_TOKENS, save_small_whisper

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

WHISPER = EXAMPLES / "whisper.linnet"
CHECKPOINT = "seeded 2+2-layer"
# f32 against transformers' eager f32: what we see is ~1e-5 on the encoder's states, 3e-5 on the logits.
STATES_ATOL = 1e-4
# On a TPU (tests/runtimes/conftest.py: TPU_LOGITS_ATOL says why bounds are wider there), for every output: this
# model's values are large (states up to 5, logits up to 8: every parameter perturbed by 0.5), its CPU distance is
# already 3e-5, and a dot at the chip's default precision (one bf16 pass) moves it by 0.13 (states) to 0.29 (logits).
TPU_ATOL = 1e-3

# The real checkpoints' config.json values (openai/whisper-tiny is WhisperConfig's defaults).
REAL_CONFIGS = {
    "whisper_tiny": {},
    "whisper_large_v3": dict(
        vocab_size=51866, num_mel_bins=128, d_model=1280, encoder_layers=32, encoder_attention_heads=20,
        encoder_ffn_dim=5120, decoder_layers=32, decoder_attention_heads=20, decoder_ffn_dim=5120,
    ),
}  # fmt: skip


def analysis():
    return Document(str(WHISPER), WHISPER.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    result = analysis()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    with torch.device("meta"):
        ref = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**REAL_CONFIGS[preset]))
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}  # the tied proj_out is listed once
    tree = analysis().trees[preset]
    assert {p.path: p.shape() for p in tree.params} == theirs
    assert tree.param_count() == ref.num_parameters()
    assert "proj_out.weight" not in theirs and "model.encoder.conv2.weight" in theirs


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    from linnet.ir import build

    transformers.WhisperConfig(**REAL_CONFIGS[preset]).save_pretrained(tmp_path)
    real = json.loads((tmp_path / "config.json").read_text())
    ours = build(WHISPER, preset=preset).config
    assert set(ours) - set(real) == {"encoder_head_dim", "decoder_head_dim"}
    assert {key: real[key] for key in ours if key in real} == {k: v for k, v in ours.items() if k in real}


@pytest.fixture(scope="module")
def small_whisper(tmp_path_factory):
    """(folder, transformers model) of the seeded shrunk Whisper."""
    folder = tmp_path_factory.mktemp("whisper")
    return folder, save_small_whisper(folder)


def inputs():
    """Log-mel-like features for two clips and 7 decoder tokens each (seeded)."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, N_MELS, FRAMES, generator=g), torch.randint(0, 90, (2, 7), generator=g)


def load(backend: str, folder, device: str = "cpu", **kwargs):
    if (why := BACKENDS[backend].unavailable(device)) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(WHISPER, weights=folder, max_batch=2, device=device, progress=False, **kwargs)


@pytest.mark.parametrize("backend, device", on_devices(ALL_BACKENDS))
def test_encoder_states_and_decoder_logits(small_whisper, backend, device):
    folder, ref = small_whisper
    m = load(backend, folder, run_device(device))
    assert m.program.max_positions == 40  # the decoder's position table caps the self-attention cache
    features, decoder_ids = inputs()
    with torch.inference_mode():
        states_ref = ref.model.encoder(features).last_hidden_state
        logits_ref = ref(input_features=features, decoder_input_ids=decoder_ids).logits
    (states,) = m.run("encode", features.numpy())
    (logits,) = m.run("forward", features.numpy(), decoder_ids.numpy())
    # clip 0 into cache row 1, clip 1 into row 0
    (filled,) = m.run("prefill_encoder", features.numpy(), np.array([1, 0]))
    (prefill,) = m.run("step", decoder_ids[:, :4].numpy()[::-1].copy(), np.array([0, 0]), np.array([0, 1]))
    steps = [prefill[::-1]]
    for i in range(4, 7):
        (logit,) = m.run("step", decoder_ids[:, i : i + 1].numpy()[::-1].copy(), np.array([i, i]), np.array([0, 1]))
        steps.append(logit[::-1])
    deltas = {
        "encoder last_hidden_state [2, 24, 32] (encode)": max_abs_diff(states, states_ref),
        "encoder last_hidden_state [2, 24, 32] (prefill_encoder)": max_abs_diff(filled, states_ref),
        "logits [2, 7, 100] (forward)": max_abs_diff(logits, logits_ref),
        "logits of step: prefill 4 then 3 decode steps, two rows": max_abs_diff(
            np.stack(steps, axis=1), logits_ref[:, 3:]
        ),
    }
    label = device_label(backend, device)
    for what, delta in deltas.items():
        record(f"small Whisper ({label}) {what}", delta, model="whisper", backend=label, checkpoint=CHECKPOINT)
    logits_atol, atol = (TPU_ATOL, TPU_ATOL) if device == "tpu" else (LOGITS_ATOL, STATES_ATOL)
    assert deltas["logits [2, 7, 100] (forward)"] < logits_atol
    assert max(deltas.values()) < atol


def transformers_tokens(ref, features, **kwargs) -> list[int]:
    """`generate`'s tokens for one 30 s window, decoded once as `Transcriber` does: without
    `force_unique_generate_call` transformers re-decodes a window whose tokens hold two timestamp tokens at
    0.00 (the random model's `<|0.00|><|0.00|>`) from the same seek position forever."""
    with torch.inference_mode():
        out = ref.generate(features, max_new_tokens=24, force_unique_generate_call=True, **kwargs)[0].tolist()
    return out[out.index(ref.generation_config.no_timestamps_token_id) + 1 :]  # that call returns the prompt too


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_greedy_transcription_equals_transformers_generate(small_whisper, backend):
    """The same tokens as `generate` for a given language, a detected one (the folder's `forced_decoder_ids`
    leave it open) and translation; suppressed tokens never come out, though the model ranks them first
    somewhere (they would without suppression)."""
    from linnet.runtimes.sampling import SamplingParams
    from linnet.runtimes.transcription import Transcriber, WhisperGenerationConfig

    folder, ref = small_whisper
    m = load(backend, folder)
    speech = Transcriber(m, WhisperGenerationConfig.from_folder(folder, m.config))
    features, _ = inputs()
    params = SamplingParams(max_new_tokens=24)
    for clip in range(2):
        for kwargs in ({"language": "en"}, {}, {"language": "fr", "task": "translate"}):
            theirs = transformers_tokens(ref, features[clip : clip + 1], **kwargs)
            result = speech.transcribe(features[clip].numpy(), params, **kwargs)
            assert result.token_ids == theirs, (clip, kwargs)
            assert not set(result.token_ids) & set(SUPPRESS_TOKENS)
        assert speech.last_prompt[2:] == [95, 98]  # <|translate|><|notimestamps|>
    detected = ref.detect_language(features).tolist()
    speech.transcribe(features[1].numpy(), params)
    assert speech.last_prompt == [91, detected[1], 96, 98]
    # without suppression the model picks a suppressed token: the test above sees the processor
    plain = Transcriber(m, replace(WhisperGenerationConfig.from_folder(folder, m.config), suppress_tokens=()))
    assert set(plain.transcribe(features[0].numpy(), params, language="en").token_ids) & set(SUPPRESS_TOKENS)


def test_generation_stops_at_the_eos_token(small_whisper):
    """With an EOS id the model produces mid-way, both stop there (the EOS token not in the output)."""
    from linnet.runtimes.sampling import SamplingParams
    from linnet.runtimes.transcription import Transcriber, WhisperGenerationConfig

    folder, ref = small_whisper
    features, _ = inputs()
    full = transformers_tokens(ref, features[:1], language="en")
    eos = full[6]
    theirs = transformers_tokens(ref, features[:1], language="en", eos_token_id=eos)
    m = load("torch", folder)
    settings = replace(WhisperGenerationConfig.from_folder(folder, m.config), eos_token_ids=frozenset({eos}))
    result = Transcriber(m, settings).transcribe(features[0].numpy(), SamplingParams(max_new_tokens=24), language="en")
    assert result.finish_reason == "stop" and result.stop_token_id == eos
    assert result.token_ids == theirs[:-1] == full[: full.index(eos)]
