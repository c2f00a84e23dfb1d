"""Audio in: WAV files read with the standard library, resampled to the model's rate, and Whisper's log-mel features.

    samples = read_wav("speech.wav", sampling_rate=16000)  # f32 [N], mono, in [-1, 1), at 16 kHz
    features = FeatureExtractor.from_folder(folder).features(samples)  # f32 [n_mels, 3000]

numpy only (no torch, librosa or soundfile). The features follow transformers' WhisperFeatureExtractor on its numpy
path (`_np_extract_fbank_features`, with `audio_utils.spectrogram`, `mel_filter_bank` and `window_function`), which
is OpenAI's `whisper/audio.py` `log_mel_spectrogram`: pad or cut to 30 s, a centred STFT with reflect padding and a
periodic Hann window (n_fft 400, hop 160), the power spectrum through a Slaney mel filter bank (0-8 kHz), `log10`
floored at 1e-10, clipped to 8 below its maximum, then `(x + 4) / 4`; the last STFT frame is dropped (3000 frames).
"""

from __future__ import annotations

import json
import math
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linnet.errors import AudioError

__all__ = ["FeatureExtractor", "read_wav", "resample", "mel_filter_bank"]

# WAV sample widths in bytes -> (numpy dtype of a sample, full scale). 8-bit WAV is unsigned, offset by 128.
_PCM = {1: (np.uint8, 128.0), 2: (np.dtype("<i2"), 32768.0), 4: (np.dtype("<i4"), 2147483648.0)}


def read_wav(path: str | Path, sampling_rate: int | None = None) -> np.ndarray:
    """The samples of the WAV file at `path`: f32 `[N]` in [-1, 1), stereo (or more channels) averaged to mono as
    ffmpeg's `-ac 1` does (transformers' `ffmpeg_read`), integer PCM scaled by its full scale (16-bit: / 32768).
    With `sampling_rate` (Hz) the samples are resampled to it when the file's rate differs (`resample`).

    Takes integer PCM of 8, 16 or 32 bits (the `wave` module reads no float or compressed WAV). Raises AudioError
    naming the path for a missing or unreadable file, a file that is not a RIFF/WAVE file, another sample format
    or an empty file."""
    path = Path(path)
    if not path.exists():
        raise AudioError(f"{path}: no such audio file")
    if path.is_dir():
        raise AudioError(f"{path}: is a folder, not an audio file")
    try:
        with wave.open(str(path), "rb") as f:
            channels, width, rate, count = f.getnchannels(), f.getsampwidth(), f.getframerate(), f.getnframes()
            data = f.readframes(count)
    except wave.Error as err:
        # the wave module's messages: "file does not start with RIFF id", "unknown format: 3" (3 is IEEE float)
        detail = str(err)
        if detail.startswith("unknown format: 3"):
            detail = "32-bit float samples"
        elif detail.startswith("unknown format"):
            detail = f"a compressed or unknown sample format ({detail})"
        raise AudioError(
            f"{path}: not a WAV file linnet can read ({detail}); it reads integer PCM WAV (8, 16 or 32-bit), "
            "e.g. `ffmpeg -i INPUT -ar 16000 -ac 1 -c:a pcm_s16le OUT.wav`"
        ) from None
    except EOFError:  # shorter than a RIFF header
        raise AudioError(f"{path}: not a WAV file linnet can read (it ends inside its header)") from None
    except OSError as err:
        raise AudioError(f"{path}: cannot read the audio file ({err.strerror or err})") from None
    if width not in _PCM:
        raise AudioError(f"{path}: {8 * width}-bit samples; linnet reads 8, 16 or 32-bit integer PCM WAV")
    dtype, full_scale = _PCM[width]
    usable = len(data) // (width * channels) * width * channels
    if usable == 0:
        raise AudioError(f"{path}: holds no audio samples")
    samples = np.frombuffer(data[:usable], dtype=dtype).astype(np.float32)
    if width == 1:
        samples -= 128.0
    samples = (samples / full_scale).reshape(-1, channels).mean(axis=1, dtype=np.float32)
    if sampling_rate is not None and rate != sampling_rate:
        samples = resample(samples, rate, sampling_rate)
    return samples


def resample(samples: np.ndarray, orig_freq: int, new_freq: int) -> np.ndarray:
    """`samples` (f32 `[N]`) at `orig_freq` Hz resampled to `new_freq` Hz: f32 `[ceil(N * new_freq / orig_freq)]`.

    Band-limited sinc interpolation with a Hann window, torchaudio.functional.resample's default
    (`sinc_interp_hann`, `lowpass_filter_width=6`, `rolloff=0.99`), which transformers' ASR pipeline applies to
    audio at another rate; the same kernels, computed here in f64. Raises AudioError for a rate that is not a
    positive integer."""
    for name, value in (("orig_freq", orig_freq), ("new_freq", new_freq)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise AudioError(f"cannot resample: {name} must be a positive integer (Hz), got {value!r}")
    samples = np.asarray(samples, dtype=np.float32)
    if orig_freq == new_freq:
        return samples
    gcd = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // gcd, int(new_freq) // gcd
    lowpass_filter_width, rolloff = 6, 0.99
    base_freq = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base_freq)
    idx = np.arange(-width, width + orig, dtype=np.float64) / orig
    t = (np.arange(0, -new, -1, dtype=np.float64)[:, None] / new + idx[None, :]) * base_freq
    t = np.clip(t, -lowpass_filter_width, lowpass_filter_width)
    window = np.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t *= math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        kernels = np.where(t == 0, 1.0, np.sin(t) / t) * window * (base_freq / orig)  # [new, 2 * width + orig]
    length = samples.shape[0]
    padded = np.pad(samples.astype(np.float64), (width, width + orig))
    frames = np.lib.stride_tricks.sliding_window_view(padded, kernels.shape[1])[::orig]  # [n, 2 * width + orig]
    out = (frames @ kernels.T).reshape(-1)
    return out[: math.ceil(new * length / orig)].astype(np.float32)


def _hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa's `htk=False`): linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    mels[log_region] = 15.0 + np.log(freq[log_region] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    freq = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    freq[log_region] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[log_region] - 15.0))
    return freq


def mel_filter_bank(num_frequency_bins: int, num_mel_filters: int, sampling_rate: int, max_frequency: float):
    """f64 `[num_frequency_bins, num_mel_filters]`: triangular filters spaced evenly on Slaney's mel scale from 0 Hz
    to `max_frequency`, each scaled to unit area (Slaney's normalisation, `2 / bandwidth`): transformers'
    `mel_filter_bank(..., norm="slaney", mel_scale="slaney")`, librosa's `filters.mel`."""
    mel_freqs = np.linspace(0.0, _hertz_to_mel(np.array([float(max_frequency)]))[0], num_mel_filters + 2)
    filter_freqs = _mel_to_hertz(mel_freqs)
    fft_freqs = np.linspace(0, sampling_rate // 2, num_frequency_bins)
    slopes = filter_freqs[None, :] - fft_freqs[:, None]
    filter_diff = np.diff(filter_freqs)
    down = -slopes[:, :-2] / filter_diff[:-1]
    up = slopes[:, 2:] / filter_diff[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (filter_freqs[2 : num_mel_filters + 2] - filter_freqs[:num_mel_filters]))[None, :]


@dataclass(frozen=True)
class FeatureExtractor:
    """Whisper's log-mel features (transformers' WhisperFeatureExtractor; the field names are its
    preprocessor_config.json keys): `feature_size` mel bins (80; 128 for large-v3), `sampling_rate` Hz,
    `hop_length` and `n_fft` in samples, `chunk_length` s of audio per input."""

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_length: int = 30
    n_fft: int = 400

    @classmethod
    def from_folder(cls, folder: str | Path, num_mel_bins: int | None = None) -> FeatureExtractor:
        """The extractor a checkpoint folder's preprocessor_config.json describes; without that file, the defaults
        with `num_mel_bins` (the model config's) mel bins. Raises AudioError for an unreadable file."""
        path = Path(folder) / "preprocessor_config.json"
        if not path.is_file():
            return cls() if num_mel_bins is None else cls(feature_size=int(num_mel_bins))
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise AudioError(f"{path}: cannot read the feature extractor's settings ({err})") from None
        fields = {k: int(values[k]) for k in cls.__dataclass_fields__ if k in values}
        return cls(**fields)

    @property
    def n_samples(self) -> int:
        """Samples per input: `chunk_length * sampling_rate` (480 000: 30 s at 16 kHz)."""
        return self.chunk_length * self.sampling_rate

    @property
    def nb_max_frames(self) -> int:
        """Frames per input: `n_samples // hop_length` (3000)."""
        return self.n_samples // self.hop_length

    def features(self, samples: np.ndarray) -> np.ndarray:
        """The log-mel features of `samples` (f32 `[N]` at `sampling_rate`, mono): f32 `[feature_size,
        nb_max_frames]`. The audio is padded with zeros or cut to `n_samples` first (transformers'
        `padding="max_length"`, `truncation=True`): one input holds the first 30 s."""
        audio = np.zeros(self.n_samples, dtype=np.float32)
        audio[: min(len(samples), self.n_samples)] = np.asarray(samples, dtype=np.float32)[: self.n_samples]
        half = self.n_fft // 2
        padded = np.pad(audio, (half, half), mode="reflect").astype(np.float64)
        window = np.hanning(self.n_fft + 1)[:-1]  # periodic Hann
        frames = np.lib.stride_tricks.sliding_window_view(padded, self.n_fft)[:: self.hop_length]  # [frames, n_fft]
        # transformers keeps the STFT in complex64 before taking the power in f64: the same rounding here
        spectrum = np.fft.rfft(frames * window, axis=-1).astype(np.complex64)
        power = np.abs(spectrum, dtype=np.float64) ** 2  # [frames, n_fft / 2 + 1]
        filters = mel_filter_bank(1 + half, self.feature_size, self.sampling_rate, 8000.0)
        # `spectrogram` returns f32; the clip and the scaling run on that, as there
        log_spec = np.log10(np.maximum(1e-10, filters.T @ power.T)).astype(np.float32)[:, :-1]  # [mels, frames - 1]
        log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0
