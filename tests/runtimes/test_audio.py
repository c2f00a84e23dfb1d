"""linnet.runtimes.inputs.audio: WAV reading (stdlib `wave`), resampling, and Whisper's log-mel features against
transformers' WhisperFeatureExtractor (its numpy path, and the torch path its `__call__` takes when torch is
installed)."""

from __future__ import annotations

import wave

import numpy as np
import pytest

from linnet.errors import AudioError
from linnet.runtimes.inputs.audio import FeatureExtractor, read_wav, resample

RATE = 16000


def speech_like(seconds: float, rate: int = RATE, seed: int = 0) -> np.ndarray:
    """A 440 Hz and a 1.3 kHz tone with noise, in [-1, 1): f32 [seconds * rate]."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.size)
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 1300 * t) + 0.02 * noise).astype(np.float32)


def write_wav(path, samples: np.ndarray, rate: int = RATE, width: int = 2, channels: int = 1) -> None:
    """`samples` (f32 [N] or [N, channels]) as integer PCM of `width` bytes."""
    scale = {1: 127, 2: 32767, 4: 2**31 - 1}[width]
    ints = np.round(np.asarray(samples) * scale)
    data = (ints + 128).astype(np.uint8) if width == 1 else ints.astype({2: "<i2", 4: "<i4"}[width])
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(width)
        f.setframerate(rate)
        f.writeframes(data.tobytes())


@pytest.mark.parametrize("n_mels", [80, 128], ids=["tiny", "large_v3"])
@pytest.mark.parametrize("seconds", [3.0, 31.5], ids=["padded", "cut"])
def test_features_equal_transformers_numpy_path(n_mels, seconds):
    transformers = pytest.importorskip("transformers")
    audio = speech_like(seconds)
    ours = FeatureExtractor(feature_size=n_mels).features(audio)
    reference = transformers.WhisperFeatureExtractor(feature_size=n_mels)
    padded = np.zeros(480000, dtype=np.float32)
    padded[: min(audio.size, 480000)] = audio[:480000]
    theirs = reference._np_extract_fbank_features(padded[None], "cpu")[0]
    assert ours.shape == (n_mels, 3000) and ours.dtype == np.float32
    assert np.abs(ours - theirs).max() <= 1e-6
    # what `feature_extractor(audio)` returns (the torch STFT when torch is installed): f32 rounding apart
    called = reference(audio, sampling_rate=RATE, return_tensors="np").input_features[0]
    assert np.abs(ours - called).max() < 1e-4


def test_features_follow_the_folder_preprocessor_config(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text('{"feature_size": 128, "hop_length": 160, "n_fft": 400}')
    assert FeatureExtractor.from_folder(tmp_path).feature_size == 128
    assert FeatureExtractor.from_folder(tmp_path / "missing", num_mel_bins=80).feature_size == 80


@pytest.mark.parametrize("width", [1, 2, 4], ids=["8-bit", "16-bit", "32-bit"])
def test_read_wav_scales_integer_pcm(tmp_path, width):
    audio = speech_like(0.5)
    write_wav(tmp_path / "a.wav", audio, width=width)
    got = read_wav(tmp_path / "a.wav")
    assert got.dtype == np.float32 and got.shape == audio.shape
    assert np.abs(got - audio).max() < {1: 1.0 / 100, 2: 1e-4, 4: 1e-6}[width]


def test_read_wav_averages_stereo_to_mono(tmp_path):
    left, right = speech_like(0.5, seed=1), speech_like(0.5, seed=2)
    write_wav(tmp_path / "s.wav", np.stack([left, right], axis=1), channels=2)
    assert np.abs(read_wav(tmp_path / "s.wav") - (left + right) / 2).max() < 1e-4


def test_resample_keeps_a_tone(tmp_path):
    """A 440 Hz tone recorded at 44.1 kHz, resampled to 16 kHz, is the tone sampled at 16 kHz (away from the
    edges, where the filter sees the zero padding); the output has ceil(N * 16000 / 44100) samples."""
    tone = lambda rate: np.sin(2 * np.pi * 440 * np.arange(rate) / rate).astype(np.float32)  # noqa: E731
    write_wav(tmp_path / "cd.wav", 0.5 * tone(44100), rate=44100)
    got = read_wav(tmp_path / "cd.wav", sampling_rate=RATE)
    assert got.shape == (RATE,)
    assert np.abs(got[200:-200] - 0.5 * tone(RATE)[200:-200]).max() < 2e-3
    assert np.array_equal(resample(tone(RATE), RATE, RATE), tone(RATE))


def test_read_wav_errors_name_the_file(tmp_path):
    with pytest.raises(AudioError, match="missing.wav: no such audio file"):
        read_wav(tmp_path / "missing.wav")
    (tmp_path / "notes.wav").write_text("not audio")
    with pytest.raises(AudioError, match=r"notes.wav: not a WAV file .*integer PCM"):
        read_wav(tmp_path / "notes.wav")
    with wave.open(str(tmp_path / "wide.wav"), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(3)
        f.setframerate(RATE)
        f.writeframes(b"\0" * 30)
    with pytest.raises(AudioError, match="wide.wav: 24-bit samples"):
        read_wav(tmp_path / "wide.wav")
    write_wav(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32))
    with pytest.raises(AudioError, match="empty.wav: holds no audio samples"):
        read_wav(tmp_path / "empty.wav")
    float_wav = bytearray((tmp_path / "wide.wav").read_bytes())
    float_wav[20:22] = (3).to_bytes(2, "little")  # WAVE_FORMAT_IEEE_FLOAT
    (tmp_path / "float.wav").write_bytes(bytes(float_wav))
    with pytest.raises(AudioError, match="float.wav: not a WAV file linnet can read \\(32-bit float samples\\)"):
        read_wav(tmp_path / "float.wav")
    with pytest.raises(AudioError, match="is a folder"):
        read_wav(tmp_path)
