"""`linnet run --audio x.wav`: a WAV file's log-mel features as Whisper's `input_features`, through a shrunk Whisper
folder's encoder, against transformers (WhisperFeatureExtractor on the WAV's samples, WhisperModel's encoder); with
random weights, the features of the preset's mel bins (80 for whisper-tiny, 128 for large-v3); and
what it refuses, as one line on stderr and an exit status (1: the entry or the model, 2: the file or the options).
Whisper's encoder itself is compared element by element in tests/runtimes/test_parity_whisper.py; the features in
tests/runtimes/test_audio.py."""

from __future__ import annotations

import json
import shutil
import wave

import numpy as np
import pytest

from linnet.cli import main
from tests.conftest import EXAMPLES
from tests.runtimes.whisper_checkpoint import FEATURES, FRAMES, N_MELS, save_small_whisper

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.torch

WHISPER = str(EXAMPLES / "whisper.linnet")
RATE = FEATURES["sampling_rate"]


def write_wav(path, seconds: float, width: int = 2) -> None:
    """A seeded 440 Hz tone with noise, mono at RATE, as integer PCM of `width` bytes (2, or 3: 24-bit)."""
    t = np.arange(int(seconds * RATE)) / RATE
    noise = np.random.default_rng(0).standard_normal(t.size)
    ints = np.round((0.4 * np.sin(2 * np.pi * 440 * t) + 0.05 * noise) * (2 ** (8 * width - 1) - 1)).astype("<i4")
    data = ints.view(np.uint8).reshape(-1, 4)[:, :width].tobytes()  # the low `width` bytes, little-endian
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(width)
        f.setframerate(RATE)
        f.writeframes(data)


@pytest.fixture(scope="module")
def whisper_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whisper")
    return folder, save_small_whisper(folder)


@pytest.fixture
def speech(tmp_path):
    path = tmp_path / "speech.wav"
    write_wav(path, 0.7)
    return path


def run_json(capsys, *args: str) -> dict:
    rc = main(["run", WHISPER, *args, "--format", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_the_encoder_runs_on_whisper_feature_extractors_features(whisper_folder, speech, capsys):
    folder, ref = whisper_folder
    report = run_json(capsys, "--weights", str(folder), "--audio", str(speech))
    assert report["entry"] == "encode"
    assert report["inputs"] == [{"name": "input_features", "shape": [1, N_MELS, FRAMES], "dtype": "float32"}]
    assert report["audio"]["preprocessing"].startswith("0.70 s of audio at 16000 Hz, padded with silence to 1 s")

    # the reference: the WAV's samples read with the standard library, transformers' extractor, WhisperModel's encoder
    with wave.open(str(speech), "rb") as f:
        samples = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").astype(np.float32) / 32768
    features = transformers.WhisperFeatureExtractor(**FEATURES)(samples, sampling_rate=RATE, return_tensors="pt")
    with torch.inference_mode():
        states = ref.model.encoder(features.input_features).last_hidden_state.double().numpy()
    (out,) = report["outputs"]
    assert out["shape"] == list(states.shape) == [1, FRAMES // 2, 32]
    expected = [states.mean(), states.std(ddof=1), states.min(), states.max()]
    ours = [out["mean"], out["std"], out["min"], out["max"]]
    assert np.allclose(ours, expected, rtol=1e-4, atol=1e-5), (ours, expected)

    # the same entry on random features (no --audio) is far from it: the statistics tell the two inputs apart
    random = run_json(capsys, "--weights", str(folder))["outputs"][0]
    assert not np.allclose([random["mean"], random["std"], random["min"], random["max"]], expected, atol=1e-2)


@pytest.mark.parametrize(("preset", "n_mels"), [("whisper_tiny", 80), ("whisper_large_v3", 128)])
def test_without_a_folder_the_features_have_the_presets_mel_bins(preset, n_mels, speech):
    """Random weights: WhisperFeatureExtractor's defaults (30 s windows) with the preset's `num_mel_bins`, value for
    value what transformers' extractor makes of the same samples (its torch STFT: f32 rounding apart)."""
    from types import SimpleNamespace

    from linnet.cli import audio as cli_audio
    from linnet.ir import build

    program = build(WHISPER, preset=preset, entries=["encode"])
    model = SimpleNamespace(config=program.config, weights=None, program=program)
    args = SimpleNamespace(audio=str(speech), batch=4, seq=8, dim=None)
    features = cli_audio.prepare(args, program.entries["encode"], model).input_features
    assert features.shape == (1, n_mels, 3000) and args.batch == 1
    with wave.open(str(speech), "rb") as f:
        samples = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").astype(np.float32) / 32768
    reference = transformers.WhisperFeatureExtractor(feature_size=n_mels)
    expected = reference(samples, sampling_rate=RATE, return_tensors="np").input_features
    assert np.abs(features - expected).max() < 1e-4


def refused(capsys, status: int, *args: str) -> str:
    """The one error line of `linnet run WHISPER *args`, checked: the exit status, no traceback, nothing on stdout."""
    rc = main(["run", *args])
    out, err = capsys.readouterr()
    assert rc == status, (rc, out, err)
    assert out == "" and "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_a_wav_that_cannot_be_read_is_a_usage_error(whisper_folder, tmp_path, capsys):
    folder, _ = whisper_folder
    base = (WHISPER, "--weights", str(folder), "--audio")
    missing = tmp_path / "none.wav"
    assert refused(capsys, 2, *base, str(missing)) == f"linnet run: {missing}: no such audio file"
    (tmp_path / "text.wav").write_text("hi\n")
    line = refused(capsys, 2, *base, str(tmp_path / "text.wav"))
    assert line.endswith("text.wav: not a WAV file linnet can read (it ends inside its header)")
    write_wav(tmp_path / "24bit.wav", 0.1, width=3)
    line = refused(capsys, 2, *base, str(tmp_path / "24bit.wav"))
    assert line.endswith("24bit.wav: 24-bit samples; linnet reads 8, 16 or 32-bit integer PCM WAV")


def test_an_entry_without_input_features_is_refused(whisper_folder, speech, tmp_path, capsys):
    folder, _ = whisper_folder
    line = refused(capsys, 1, WHISPER, "--weights", str(folder), "--entry", "step", "--audio", str(speech))
    assert line == (
        "linnet run: --audio: entry `step` takes no `input_features` (its inputs: input_ids, positions, rows)"
    )
    line = refused(capsys, 1, WHISPER, "--weights", str(folder), "--entry", "nope", "--audio", str(speech))
    assert line == "linnet run: no entry `nope` (entries: encode, forward, prefill_encoder, step)"
    mlp = (str(EXAMPLES / "mlp.linnet"), "--preset", "tiny", "--audio", str(speech))
    assert refused(capsys, 1, *mlp) == "linnet run: --audio: entry `forward` takes no `input_features` (its inputs: x)"
    image = tmp_path / "x.png"  # never read: the entry is refused first
    assert refused(capsys, 1, *mlp, "--image", str(image)) == (
        "linnet run: --image and --audio: entry `forward` takes neither `pixel_values` nor `input_features` "
        "(its inputs: x)"
    )
    assert refused(capsys, 1, WHISPER, "--weights", str(folder), "--audio", str(speech), "--image", str(image)) == (
        "linnet run: --image: entry `encode` takes no `pixel_values` (its inputs: input_features)"
    )


def test_features_of_another_size_than_the_entrys_are_refused(whisper_folder, speech, tmp_path, capsys):
    # a folder without preprocessor_config.json: WhisperFeatureExtractor's 30 s defaults, not the model's 48 frames
    folder = tmp_path / "no-extractor"
    shutil.copytree(whisper_folder[0], folder, ignore=shutil.ignore_patterns("preprocessor_config.json"))
    assert refused(capsys, 1, WHISPER, "--weights", str(folder), "--audio", str(speech)) == (
        f"linnet run: --audio: entry `encode` takes `input_features: [B, {N_MELS}, {FRAMES}]`, but "
        f"the features of WhisperFeatureExtractor's defaults and the config's num_mel_bins are [{N_MELS}, 3000] "
        "(30 s at hop 160): "
        "the frames differ"
    )


def test_audio_with_compare_is_a_usage_error(speech, capsys):
    line = refused(capsys, 2, WHISPER, "--audio", str(speech), "--compare")
    assert line == "linnet run: --audio runs the audio on one backend; drop --compare (or compare on random inputs)"
