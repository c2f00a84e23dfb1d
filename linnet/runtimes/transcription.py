"""Encoder-decoder generation: speech to text with Whisper, on the decoder `Generator`'s sampling and stop code.

    model = get_backend("torch").load("examples/whisper.linnet", weights=folder, max_positions=448)
    speech = Transcriber(model, WhisperGenerationConfig.from_folder(folder, model.config), model.tokenizer())
    result = speech.transcribe(features, SamplingParams(max_new_tokens=448), language="en")
    result.text

The model is an encoder-decoder (ARCHITECTURE.md and docs/runtimes.md, "Encoder-decoders"): `prefill_encoder`
encodes the audio into a cache row's cross-attention keys and values, then the decoder's `step` runs with the
generation runner as any decoder's does (prefill of the decoder prompt, decode, sampling, stop tokens). What this
module adds is transformers' `WhisperGenerationMixin.generate` for one 30 s window (short-form, no timestamps):
- the decoder prompt (`_retrieve_init_tokens`): `<|startoftranscript|>`, the language (given, or detected from the
  decoder's first logits over the language tokens, `detect_language`), the task (`<|transcribe|>` unless told),
  `<|notimestamps|>`;
- `suppress_tokens` never generated, `begin_suppress_tokens` not as the first token (transformers'
  `SuppressTokensLogitsProcessor`, `SuppressTokensAtBeginLogitsProcessor`), from generation_config.json;
- at most `max_target_positions` decoder tokens in all (the prompt included).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import LoadError, RunError

from .generation import GenerationResult, Generator, Tokenizer
from .model import LoadedModel
from .sampling import SamplingParams

__all__ = ["WhisperGenerationConfig", "Transcriber", "PREFILL_ENCODER"]

PREFILL_ENCODER = "prefill_encoder"
TASKS = ("transcribe", "translate")


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))


@dataclass(frozen=True)
class WhisperGenerationConfig:
    """What Whisper's generation reads from generation_config.json (transformers' `GenerationConfig` fields of the
    same names); `eos_token_ids` is its `eos_token_id` as a set."""

    decoder_start_token_id: int
    eos_token_ids: frozenset[int] = frozenset()
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    lang_to_id: dict[str, int] = field(default_factory=dict)
    task_to_id: dict[str, int] = field(default_factory=dict)
    no_timestamps_token_id: int | None = None
    forced_decoder_ids: tuple[tuple[int, int | None], ...] = ()
    is_multilingual: bool | None = None

    @classmethod
    def from_folder(cls, folder: str | Path | None, config: dict[str, Any]) -> WhisperGenerationConfig:
        """From `folder`'s generation_config.json, its missing keys from the model `config` (config.json: the
        token ids, `suppress_tokens`, `begin_suppress_tokens`), as transformers' `GenerationConfig.from_model_config`
        does. Raises LoadError for an unreadable file or no `decoder_start_token_id` anywhere."""
        values: dict[str, Any] = {}
        path = Path(folder) / "generation_config.json" if folder is not None else None
        if path is not None and path.is_file():
            try:
                values = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:
                raise LoadError(f"{path}: cannot read the generation config ({err})") from None
        merged = {**{k: v for k, v in config.items() if v is not None}, **values}
        if merged.get("decoder_start_token_id") is None:
            where = path if path is not None else "the config"
            raise LoadError(f"{where}: no `decoder_start_token_id`: Whisper's decoder prompt starts with it")
        forced = tuple((int(i), None if t is None else int(t)) for i, t in merged.get("forced_decoder_ids") or ())
        return cls(
            decoder_start_token_id=int(merged["decoder_start_token_id"]),
            eos_token_ids=frozenset(_ids(merged.get("eos_token_id"))),
            suppress_tokens=_ids(merged.get("suppress_tokens")),
            begin_suppress_tokens=_ids(merged.get("begin_suppress_tokens")),
            lang_to_id={str(k): int(v) for k, v in (merged.get("lang_to_id") or {}).items()},
            task_to_id={str(k): int(v) for k, v in (merged.get("task_to_id") or {}).items()},
            no_timestamps_token_id=merged.get("no_timestamps_token_id"),
            forced_decoder_ids=forced,
            is_multilingual=merged.get("is_multilingual"),
        )

    def language_id(self, language: str) -> int:
        """The token of `language`, a code (`en`) or a token (`<|en|>`). Raises RunError naming the languages."""
        token = language if language.startswith("<|") else f"<|{language.lower()}|>"
        if token not in self.lang_to_id:
            known = ", ".join(k.strip("<|>") for k in self.lang_to_id) or "none: an English-only model"
            raise RunError(f"unknown language `{language}` (this model's languages: {known})")
        return self.lang_to_id[token]

    def prompt(self, language_id: int | None, task: str | None, *, told: bool) -> list[int]:
        """The decoder prompt (transformers' `_retrieve_init_tokens` without timestamps): the start token, the
        language token `language_id` (None: none), the task's token, `<|notimestamps|>`. `told`: whether the
        caller gave a language or a task; when neither, the old `forced_decoder_ids` fill the prompt first, as
        transformers does. Raises RunError for an unknown task or a task this model has no token for."""
        tokens: list[int | None] = [self.decoder_start_token_id]
        if not told and self.forced_decoder_ids and self.forced_decoder_ids[0][0] == 1:
            for i, (index, token) in enumerate(self.forced_decoder_ids, start=1):
                if index != i:
                    break
                tokens.append(token)
        if language_id is not None:
            if len(tokens) > 1:
                tokens[1] = language_id
            else:
                tokens.append(language_id)
        task_ids = set(self.task_to_id.values())
        if task is not None:
            if task not in TASKS or task not in self.task_to_id:
                raise RunError(f"unknown task `{task}` (this model's tasks: {', '.join(self.task_to_id) or 'none'})")
            at = next((i for i, t in enumerate(tokens) if t in task_ids), None)
            if at is None:
                tokens.append(self.task_to_id[task])
            else:
                tokens[at] = self.task_to_id[task]
        elif told and self.task_to_id and not any(t in task_ids for t in tokens):
            tokens.append(self.task_to_id["transcribe"])
        if self.no_timestamps_token_id is not None and tokens[-1] != self.no_timestamps_token_id:
            tokens.append(int(self.no_timestamps_token_id))
        return [int(t) for t in tokens if t is not None]

    def needs_language(self, told: bool) -> bool:
        """Whether the prompt's language is detected: a multilingual model (one with `lang_to_id`) and no language
        given, nor one in `forced_decoder_ids` (transformers' `is_lang_id_undefined`)."""
        if not self.lang_to_id or told:
            return False
        forced = dict(self.forced_decoder_ids)
        return forced.get(1) is None


class Transcriber:
    """Speech to text with an encoder-decoder `model` (a `LoadedModel` with `prefill_encoder` and `step`), the
    `WhisperGenerationConfig` `settings` and the checkpoint's `tokenizer` (None: `text` stays empty).

    The decoder's prompt and generated tokens must fit `model.max_positions` (load with `max_positions` =
    `max_target_positions`, 448). Raises RunError for a model without `prefill_encoder`."""

    def __init__(self, model: LoadedModel, settings: WhisperGenerationConfig, tokenizer: Tokenizer | None = None):
        if PREFILL_ENCODER not in model.entries:
            raise RunError(
                f"the model has no `{PREFILL_ENCODER}` entry (entries: {', '.join(model.entries)}): transcription "
                'needs an encoder-decoder (docs/runtimes.md, "Encoder-decoders")'
            )
        self.model = model
        self.settings = settings
        self.tokenizer = tokenizer
        self.steps = model.step_model()
        stops = _StopTokens(tokenizer, settings.eos_token_ids)
        self.generator = Generator(self.steps, stops, logits_processor=self._suppress)
        self.last_prompt: list[int] = []

    def _suppress(self, logits: np.ndarray, n_new: int) -> np.ndarray:
        """`suppress_tokens` at every step and `begin_suppress_tokens` at the first generated token, set to -inf
        (transformers applies them in this order, on the logits before any warper)."""
        banned = list(self.settings.suppress_tokens) + (list(self.settings.begin_suppress_tokens) if n_new == 0 else [])
        if not banned:
            return logits
        out = np.array(logits, dtype=np.float32, copy=True)
        out[:, [t for t in banned if 0 <= t < out.shape[1]]] = -np.inf
        return out

    def encode(self, features: np.ndarray, row: int = 0) -> None:
        """Encode `features` (f32 `[n_mels, frames]`, one 30 s window) into cache row `row`'s cross-attention
        caches."""
        self.model.run(PREFILL_ENCODER, np.asarray(features, dtype=np.float32)[None], np.array([row], dtype=np.int64))

    def detect_language(self, row: int = 0) -> int:
        """The language token the decoder's first logits (after the start token) rank highest among the language
        tokens (transformers' `detect_language`), for the audio encoded in `row`."""
        start = np.array([[self.settings.decoder_start_token_id]], dtype=np.int64)
        logits = self.generator.checked_step(start, np.zeros(1, dtype=np.int64), np.array([row], dtype=np.int64))
        ids = np.array(sorted(self.settings.lang_to_id.values()))
        return int(ids[int(np.argmax(logits[0, ids]))])

    def transcribe(
        self,
        features: np.ndarray,
        params: SamplingParams,
        *,
        language: str | None = None,
        task: str | None = None,
        row: int = 0,
    ) -> GenerationResult:
        """Generate the text of `features` (f32 `[n_mels, frames]`) in cache row `row`: encode, build the decoder
        prompt (`language` as a code or token, detected when None on a multilingual model; `task` "transcribe" or
        "translate"), generate until an EOS token, `params.max_new_tokens`, or `max_positions` decoder tokens.
        The prompt used is kept in `last_prompt`. Raises RunError for an unknown language or task."""
        told = language is not None or task is not None
        language_id = self.settings.language_id(language) if language is not None else None
        self.encode(features, row)
        if language_id is None and self.settings.needs_language(told):
            language_id = self.detect_language(row)
        prompt = self.settings.prompt(language_id, task, told=told)
        self.last_prompt = prompt
        room = int(self.steps.max_positions) - len(prompt)
        if room < 1:
            raise RunError(
                f"the decoder prompt of {len(prompt)} tokens leaves no room in {self.steps.max_positions} positions"
            )
        params = replace(params, max_new_tokens=min(params.max_new_tokens, room))
        return self.generator.generate(prompt, params, row=row)


class _StopTokens:
    """The tokenizer as the runner sees it, with generation_config's `eos_token_id`s as its stop tokens (Whisper's
    tokenizer files name `<|endoftext|>` too; the generation config is what transformers' `generate` stops on)."""

    def __init__(self, tokenizer: Tokenizer | None, eos_token_ids: frozenset[int]):
        self._tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text) if self._tokenizer is not None else []

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) if self._tokenizer else ""
