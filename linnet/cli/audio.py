"""`linnet run FILE --audio x.wav`: a WAV file as the entry's `input_features`, the log-mel features transformers'
WhisperFeatureExtractor makes of it (`linnet.runtimes.inputs.audio`, as `linnet transcribe` reads audio).

The extractor's settings come from the `--weights` folder's preprocessor_config.json when it has one, else they are
WhisperFeatureExtractor's defaults (16 kHz, n_fft 400, hop 160, 30 s windows) with the model config's `num_mel_bins`
(80 for whisper-tiny, 128 for large-v3). One file, one batch entry (as `--image`). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class AudioInput:
    """The features of the WAV file and what `linnet run` reports about them."""

    input_features: np.ndarray  # f32[1, n_mels, T]
    described: str  # the preprocessing, one line


def prepare(args, graph, model) -> AudioInput:
    """Read `args.audio` and make its log-mel features for entry `graph`, whose inputs include `input_features:
    [B, n_mels, T]` (`cli_inputs.check_arguments`), with the settings of `model`'s weights folder or config; set
    `args.batch` to 1 when B is a dim variable. Raises AudioError (a missing or unreadable WAV, a sample format the
    reader does not take, an unreadable preprocessor_config.json) and ValueError (`input_features` of rank other
    than 3, or features of another size than the entry's mel bins or frames, naming both)."""
    from linnet.cli.inputs import size_dims, target
    from linnet.runtimes.inputs.audio import FeatureExtractor, read_wav
    from linnet.types.dims import dim_variables, evaluate, format_dim

    value = target(graph, "audio", 3)
    n_mels = model.config.get("num_mel_bins")
    folder = Path(model.weights) if model.weights is not None and Path(model.weights).is_dir() else None
    if folder is not None:
        extractor = FeatureExtractor.from_folder(folder, n_mels)
    else:
        extractor = FeatureExtractor() if n_mels is None else FeatureExtractor(feature_size=int(n_mels))
    if folder is not None and (folder / "preprocessor_config.json").is_file():
        source = str(folder / "preprocessor_config.json")
    else:
        source = "WhisperFeatureExtractor's defaults and the config's num_mel_bins"
    # the sizes are checked before the file is read: a model the settings do not fit is the error, whatever the file
    made = (extractor.feature_size, extractor.nb_max_frames)
    for axis, (d, size) in enumerate(zip(value.dims[1:], made)):
        if not dim_variables(d) and evaluate(d, {}) != size:
            wanted = ", ".join(format_dim(x) for x in value.dims)
            raise ValueError(
                f"--audio: entry `{graph.name}` takes `input_features: [{wanted}]`, but the features of {source} are "
                f"[{made[0]}, {made[1]}] ({extractor.chunk_length} s at hop {extractor.hop_length}): the "
                f"{('mel bins', 'frames')[axis]} differ"
            )
    samples = read_wav(args.audio, sampling_rate=extractor.sampling_rate)
    features = extractor.features(samples)[None]  # [1, n_mels, nb_max_frames]
    size_dims(args, value, features.shape)
    seconds = len(samples) / extractor.sampling_rate
    window = extractor.chunk_length
    fitted = f"cut to its first {window} s" if seconds > window else f"padded with silence to {window} s"
    described = (
        f"{seconds:.2f} s of audio at {extractor.sampling_rate} Hz, {fitted}; Whisper log-mel features from "
        f"{source}: {extractor.feature_size} mel bins x {extractor.nb_max_frames} frames "
        f"(n_fft {extractor.n_fft}, hop {extractor.hop_length})"
    )
    return AudioInput(features, described)
