"""A seeded shrunk Whisper checkpoint folder, as transformers saves it, for the parity, generation and CLI tests.

2 encoder and 2 decoder layers, 32 wide, 16 mel bins, 24 encoder positions (48 log-mel frames), 40 decoder positions,
a vocabulary of 100 whose last ten ids are Whisper's special tokens laid out as in the real vocabulary
(`<|endoftext|>`, `<|startoftranscript|>`, three languages, the two tasks, `<|nospeech|>`, `<|notimestamps|>`),
every parameter perturbed (norms away from 1, biases away from 0). The folder holds what a real checkpoint holds:
config.json, generation_config.json (language and task tokens, `forced_decoder_ids`, suppressed tokens),
preprocessor_config.json (a feature extractor whose 1 s window is the model's 48 frames: hop 333) and a word-level
tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path

from tests.runtimes.conftest import perturb

VOCAB = 100
EOT, SOT, EN, FR, DE, TRANSLATE, TRANSCRIBE, NO_SPEECH, NO_TIMESTAMPS = 90, 91, 92, 93, 94, 95, 96, 97, 98
SPECIAL = {
    EOT: "<|endoftext|>", SOT: "<|startoftranscript|>", EN: "<|en|>", FR: "<|fr|>", DE: "<|de|>",
    TRANSLATE: "<|translate|>", TRANSCRIBE: "<|transcribe|>", NO_SPEECH: "<|nospeech|>",
    NO_TIMESTAMPS: "<|notimestamps|>", 99: "<|startofprev|>",
}  # fmt: skip
N_MELS, FRAMES = 16, 48
# the feature extractor of the folder: 1 s at 16 kHz in frames of 333 samples is 48 frames, the model's input
FEATURES = dict(feature_size=N_MELS, sampling_rate=16000, hop_length=333, chunk_length=1, n_fft=400)
# suppressed at every step (every third id below 40), and at the first step the EOS and id 5 (the real
# checkpoints' `begin_suppress_tokens` are " " and `<|endoftext|>`)
SUPPRESS_TOKENS = list(range(0, 40, 3))
BEGIN_SUPPRESS_TOKENS = [5, EOT]


def small_config(transformers, **changes):
    values = dict(
        vocab_size=VOCAB, num_mel_bins=N_MELS, d_model=32, encoder_layers=2, encoder_attention_heads=4,
        encoder_ffn_dim=48, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=48,
        max_source_positions=FRAMES // 2, max_target_positions=40, pad_token_id=EOT, bos_token_id=EOT,
        eos_token_id=EOT, decoder_start_token_id=SOT, begin_suppress_tokens=BEGIN_SUPPRESS_TOKENS,
        suppress_tokens=SUPPRESS_TOKENS, attn_implementation="eager",
    )  # fmt: skip
    return transformers.WhisperConfig(**{**values, **changes})


def tokenizer_json() -> str:
    """A word-level tokenizer: ids 0..89 are the words `w0`..`w89`, the rest Whisper's special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(EOT)} | {text: i for i, text in SPECIAL.items()}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    tok.add_special_tokens([AddedToken(SPECIAL[i], special=True) for i in sorted(SPECIAL)])
    return tok.to_str()


def save_small_whisper(folder: Path, seed: int = 0):
    """Save the seeded shrunk model into `folder`; returns the transformers model (eval mode)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(small_config(transformers)).eval()
    perturb(model, seed=seed + 2, scale=0.5)  # large enough that greedy decoding wanders over the vocabulary
    generation = model.generation_config
    generation.lang_to_id = {SPECIAL[EN]: EN, SPECIAL[FR]: FR, SPECIAL[DE]: DE}
    generation.task_to_id = {"translate": TRANSLATE, "transcribe": TRANSCRIBE}
    generation.no_timestamps_token_id = NO_TIMESTAMPS
    generation.is_multilingual = True
    generation.forced_decoder_ids = [[1, None], [2, TRANSCRIBE]]
    generation.max_length = 40
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(
        json.dumps({"feature_extractor_type": "WhisperFeatureExtractor", **FEATURES}), encoding="utf-8"
    )
    (folder / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    return model
