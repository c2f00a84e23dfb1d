"""`linnet transcribe`: a WAV file through the folder's feature extractor and a shrunk Whisper to text, against
transformers (WhisperFeatureExtractor on the same samples, `generate`, the tokenizer's decode); and a WAV that
cannot be read is one located line, exit 2."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cli.test_cli_errors import linnet, one_line
from tests.conftest import EXAMPLES
from tests.runtimes.test_audio import speech_like, write_wav
from tests.runtimes.whisper_checkpoint import FEATURES, save_small_whisper

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.torch

WHISPER = str(EXAMPLES / "whisper.linnet")


@pytest.fixture(scope="module")
def whisper_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whisper")
    return folder, save_small_whisper(folder)


def test_transcribe_prints_what_transformers_generates(whisper_folder, tmp_path):
    from tokenizers import Tokenizer

    folder, ref = whisper_folder
    audio = speech_like(0.8, rate=8000)
    write_wav(tmp_path / "speech.wav", np.stack([audio, audio * 0.5], axis=1), rate=8000, channels=2)
    r = linnet(
        "transcribe", WHISPER, "--weights", str(folder), "--audio", str(tmp_path / "speech.wav"), "--language", "en"
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr

    from linnet.runtimes.inputs.audio import read_wav  # 8 kHz stereo: averaged, resampled to the extractor's 16 kHz

    samples = read_wav(tmp_path / "speech.wav", sampling_rate=16000)
    features = transformers.WhisperFeatureExtractor(**FEATURES)(samples, sampling_rate=16000, return_tensors="pt")
    with torch.inference_mode():
        tokens = ref.generate(
            features.input_features, language="en", max_new_tokens=36, force_unique_generate_call=True
        )[0].tolist()
    text = Tokenizer.from_file(str(folder / "tokenizer.json")).decode(tokens, skip_special_tokens=True)
    assert text and r.stdout == text + "\n"
    assert "decoder prompt: 91,92,96,98" in r.stderr


def test_unreadable_audio_is_a_usage_error(whisper_folder, tmp_path):
    folder, _ = whisper_folder
    base = ("transcribe", WHISPER, "--weights", str(folder), "--audio")
    assert one_line(linnet(*base, str(tmp_path / "none.wav")), 2) == (
        f"linnet transcribe: {tmp_path / 'none.wav'}: no such audio file"
    )
    (tmp_path / "text.wav").write_text("hello")
    assert "text.wav: not a WAV file linnet can read" in one_line(linnet(*base, str(tmp_path / "text.wav")), 2)
    write_wav(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32))
    assert one_line(linnet(*base, str(tmp_path / "empty.wav")), 2).endswith("empty.wav: holds no audio samples")
