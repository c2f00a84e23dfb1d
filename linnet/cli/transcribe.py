"""`linnet transcribe`: speech to text with an encoder-decoder (Whisper) on any backend of the registry.

    linnet transcribe examples/whisper.linnet --weights whisper-tiny/ --audio speech.wav [--language en]

Reads the WAV file (`linnet.runtimes.inputs.audio.read_wav`: integer PCM, mono or stereo, resampled to the feature
extractor's rate), makes the log-mel features of its first 30 s as the folder's preprocessor_config.json says, and
generates with `linnet.runtimes.transcription.Transcriber`: the text on stdout, the prompt, timings and notes on
stderr. Without FILE, the zoo's source for the folder's `model_type` is used. A missing or unreadable WAV, or one
of a sample format the reader does not take, is a usage error (exit 2) naming the file.
"""

from __future__ import annotations

import argparse
import sys

from linnet.cli.common import (
    BACKEND_HELP,
    BACKEND_NAMES,
    EXIT_OK,
    EXIT_USAGE,
    FAILURES,
    UsageError,
    add_common,
    fail,
    load_model,
    print_notes,
)
from linnet.cli.generate import pick_example
from linnet.errors import AudioError


def cmd_transcribe(args: argparse.Namespace) -> int:
    from linnet.runtimes.inputs.audio import FeatureExtractor, read_wav
    from linnet.runtimes.sampling import SamplingParams
    from linnet.runtimes.transcription import PREFILL_ENCODER, Transcriber, WhisperGenerationConfig

    try:
        if args.file is None and args.weights is None:
            raise UsageError("give a source FILE, or --weights alone to pick the example for its model_type")
        params = SamplingParams(
            temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens or 10**9
        )
    except ValueError as err:
        return fail("transcribe", UsageError(str(err)))
    try:
        if args.file is None:
            pick_example(args)
        model = load_model(args, random_weights=False)
    except FAILURES as err:
        return fail("transcribe", err)
    print_notes(model)
    if PREFILL_ENCODER not in model.entries:
        needs = f"{args.file}: transcription needs an encoder-decoder (`entry fn {PREFILL_ENCODER}`)"
        return fail("transcribe", ValueError(needs))
    try:
        extractor = FeatureExtractor.from_folder(model.weights, model.config.get("num_mel_bins"))
        samples = read_wav(args.audio, sampling_rate=extractor.sampling_rate)
    except AudioError as err:
        print(f"linnet transcribe: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        features = extractor.features(samples)
        settings = WhisperGenerationConfig.from_folder(model.weights, model.config)
        speech = Transcriber(model, settings, model.tokenizer())
        result = speech.transcribe(features, params, language=args.language, task=args.task)
    except FAILURES as err:
        return fail("transcribe", err)
    seconds = len(samples) / extractor.sampling_rate
    if seconds > extractor.chunk_length:
        cut = f"transcribed its first {extractor.chunk_length} s"
        print(f"note: {args.audio} is {seconds:.1f} s long; {cut}", file=sys.stderr)
    print(f"decoder prompt: {','.join(map(str, speech.last_prompt))}", file=sys.stderr)
    print(result.text if speech.tokenizer is not None else ",".join(map(str, result.token_ids)))
    print(
        f"{len(result.token_ids)} tokens ({result.finish_reason}); encode and first token {result.prefill_s:.2f} s, "
        f"decode {result.decode_tokens_per_s:.1f} tokens/s",
        file=sys.stderr,
    )
    return EXIT_OK


def register(sub) -> None:
    tr = sub.add_parser("transcribe", help="speech to text with an encoder-decoder (Whisper); the text on stdout")
    add_common(
        tr,
        file_help="a .linnet source with an encoder-decoder root model; without it, the shipped example for "
        "--weights' model_type",
    )
    tr.set_defaults(max_positions=448)
    tr.add_argument("--audio", required=True, metavar="WAV", help="a WAV file (integer PCM, mono or stereo)")
    tr.add_argument("--language", help="the spoken language as a code (en) or token (<|en|>); detected when absent")
    tr.add_argument("--task", choices=("transcribe", "translate"), help="default: transcribe")
    tr.add_argument("--max-new-tokens", type=int, default=None, metavar="N", help="default: the decoder's positions")
    tr.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    tr.add_argument("--seed", type=int, default=None)
    tr.add_argument("--backend", choices=BACKEND_NAMES, default="torch", metavar="BACKEND", help=BACKEND_HELP)
    tr.add_argument("--provider", action="append", choices=("cpu", "cuda", "tensorrt"), help="onnxruntime providers")
    tr.set_defaults(func=cmd_transcribe)
