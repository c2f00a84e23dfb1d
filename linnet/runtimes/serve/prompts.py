"""Tokenizing `linnet serve`'s prompts without stalling the other requests (issue 42).

A 10 MB prompt once froze every stream and `/health` for seconds: `tokenizers`' `Tokenizer.encode` holds the GIL
for the whole text (8 s for 10 MB of English here), so a thread did not help. Three things keep that from
happening:

1. `PromptEncoder.too_long(text)` refuses, from its length alone, a text that provably cannot fit the cache
   (`max_prompt_chars` says why the bound is safe), before any tokenizing: a 10 MB prompt is answered at once.
2. What is tokenized runs in a small pool of its own threads, and `Tokenizer.encode` hands long texts to
   `encode_batch`, which releases the GIL while the Rust code runs; so the event loop and the engine's thread
   keep running. A pool of `WORKERS` threads, not asyncio's default of up to 32: each thread that allocates a
   large text gets a malloc arena of its own, which glibc keeps after the text is freed.
3. The HTTP layer refuses bodies over `--max-request-bytes` (http.py), so parsing JSON stays short too.
"""

from __future__ import annotations

import asyncio
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from linnet.runtimes.inputs.chat import chat_prompt_text

__all__ = ["LengthBound", "PromptEncoder", "PromptTooLong", "length_bound"]

WORKERS = 2

# The most input characters Unicode normalization (NFC, NFD, NFKC, NFKD) turns into one character: normalization
# never deletes a character, it only composes; a composed character stands for its canonical decomposition, at
# most 4 code points (U+1FAF, Greek omega with dasia, perispomeni and prosgegrammeni; Python's unicodedata agrees,
# tests/runtimes/serve/test_prompts.py checks it), and each input character gives at least one of them.
NORMALIZATION_SHRINK = 4
_NORMALIZATIONS = {"NFC", "NFD", "NFKC", "NFKD"}
# pre-tokenizers that only split (or map a character to one or more others), never dropping a character
_SPLITTING = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation"}


class PromptTooLong(Exception):
    """A prompt of `chars` characters is at least `min_tokens` tokens, more than the cache can hold: no token of
    the tokenizer spans more than `chars_per_token` characters."""

    def __init__(self, chars: int, min_tokens: int, chars_per_token: int) -> None:
        self.chars, self.min_tokens, self.chars_per_token = chars, min_tokens, chars_per_token
        super().__init__(
            f"the prompt has {chars} characters, so at least {min_tokens} tokens (no token of this model's "
            f"tokenizer spans more than {chars_per_token} characters)"
        )


@dataclass(frozen=True)
class LengthBound:
    """A prompt with more than `max_chars` characters, not counting those in `dropped` (characters the tokenizer
    drops without a token), cannot fit the cache: no token spans more than `span` characters."""

    max_chars: int
    span: int
    dropped: tuple[str, ...] = ()

    def kept_chars(self, text: str) -> int:
        """The characters of `text` that some token covers, at least (C-speed `str.count` scans)."""
        return len(text) - sum(text.count(c) for c in self.dropped) if self.dropped else len(text)


def length_bound(tokenizer: Any, max_positions: int) -> LengthBound | None:
    """The bound on a prompt's characters past which it cannot fit `max_positions` positions, or None when no
    such bound is known for `tokenizer` (`linnet.runtimes.formats.tokenizer.Tokenizer`).

    Why the bound is safe (it must never refuse a prompt that fits): a prompt fits only with at most
    `max_positions - 1` tokens (a request generates at least one). Tokenizing is normalizer, pre-tokenizer, model,
    post-processor. The bound is given only when no step can turn an unbounded run of characters into fewer
    tokens:

    - the normalizer is none, Unicode normalization (one output character from at most NORMALIZATION_SHRINK
      input ones), `Prepend`, or `Replace` of one literal character by a non-empty string;
    - the pre-tokenizers only split (`ByteLevel` turns a character into 1-4 byte characters, `Metaspace` a space
      into "▁"; `Split` and `Punctuation` not in "removed" mode);
    - the model is BPE or Unigram with byte fallback (and all 256 byte tokens), BPE with one unknown token per
      unknown character (`fuse_unk` off), or BPE behind `ByteLevel`, which drops the bytes missing from its
      vocabulary one by one (SmolLM2 lacks 0x04, 0x06, ...: 10 MB of U+0004 is no token at all): the characters
      made only of such bytes are not counted (`LengthBound.dropped`; a missing continuation byte, or such a
      model behind a normalizer, gives None);
    - no added token strips the whitespace around it (`lstrip`, `rstrip`); the post-processor only adds tokens;
      truncation is off (`Tokenizer.from_file`).

    Then the tokens partition what is kept of the normalized text and each spans at most `span` of its
    characters, `span` being the longest vocabulary or added token's text, so a prompt of `c` kept characters has
    at least `c / (shrink * span)` tokens: more than `max_positions - 1` when `c > shrink * span * (max_positions
    - 1)`. Anything else (WordPiece's one [UNK] for a whole long word, a whitespace pre-tokenizer that drops
    spaces, a `Strip` normalizer) gets None: such prompts are always tokenized (off the GIL, in the pool).
    """
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str())
    except (AttributeError, ValueError, TypeError):
        return None
    shrink = _normalizer_shrink(spec.get("normalizer"))
    pre = _pre_tokenizer_types(spec.get("pre_tokenizer"))
    added = spec.get("added_tokens") or []
    if shrink is None or pre is None or any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None
    vocab = backend.get_vocab(with_added_tokens=True)
    dropped = _dropped_characters(spec.get("model") or {}, pre, vocab) if vocab else None
    if dropped is None or (dropped and shrink != 1):
        return None
    span = shrink * max(len(token) for token in vocab)
    return LengthBound(span * max(0, max_positions - 1), span, dropped)


def _normalizer_shrink(spec: dict | None) -> int | None:
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind in _NORMALIZATIONS:
        return NORMALIZATION_SHRINK
    if kind == "Prepend":
        return 1
    if kind == "Replace":
        pattern = (spec.get("pattern") or {}).get("String")
        ok = isinstance(pattern, str) and len(pattern) == 1 and spec.get("content")
        return 1 if ok else None
    if kind == "Sequence":
        total = 1
        for part in spec.get("normalizers") or []:
            factor = _normalizer_shrink(part)
            if factor is None:
                return None
            total *= factor
        return total
    return None


def _pre_tokenizer_types(spec: dict | None) -> set[str] | None:
    if spec is None:
        return set()
    kind = spec.get("type")
    if kind == "Sequence":
        kinds: set[str] = set()
        for part in spec.get("pretokenizers") or []:
            found = _pre_tokenizer_types(part)
            if found is None:
                return None
            kinds |= found
        return kinds
    if kind in _SPLITTING and str(spec.get("behavior", "")).lower() != "removed":
        return {kind}
    return None


def _dropped_characters(model: dict, pre: set[str], vocab: dict[str, int]) -> tuple[str, ...] | None:
    """The characters the model drops without a token, or None when it may turn several characters into one
    unknown token (or drop characters it cannot list)."""
    kind = model.get("type")
    all_bytes = all(f"<0x{b:02X}>" in vocab for b in range(256))
    if model.get("byte_fallback") and all_bytes and kind in ("BPE", "Unigram"):
        return ()  # an unknown character becomes its bytes' tokens
    if kind == "BPE" and model.get("unk_token") in vocab and not model.get("fuse_unk"):
        return ()  # one unknown token per unknown character
    if kind != "BPE" or "ByteLevel" not in pre:
        return None
    from linnet.runtimes.formats.tokenizer import byte_level_spelling

    missing = [b for b, char in byte_level_spelling().items() if char not in vocab]
    if any(0x80 <= b <= 0xBF for b in missing):
        return None  # then a multi-byte character could be dropped whole; every UTF-8 one holds such a byte
    return tuple(chr(b) for b in missing if b < 0x80)


class PromptEncoder:
    """Encodes prompts and renders chats in a pool of `WORKERS` threads, refusing first what cannot fit.

    `tokenizer`: `linnet.runtimes.formats.tokenizer.Tokenizer`; `max_positions`: the cache positions of a row.
    """

    def __init__(self, tokenizer: Any, max_positions: int) -> None:
        self.tokenizer = tokenizer
        self.bound = length_bound(tokenizer, max_positions)
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="linnet-tokenize")

    def check_length(self, text: str) -> None:
        """Raise `PromptTooLong` when `text` cannot fit the cache, judged from its length alone."""
        bound = self.bound
        if bound is None or len(text) <= bound.max_chars:
            return
        kept = bound.kept_chars(text)
        if kept > bound.max_chars:
            raise PromptTooLong(kept, math.ceil(kept / bound.span), bound.span)

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """`text`'s token ids, tokenized in the pool. Raises PromptTooLong (before tokenizing) and as
        `Tokenizer.encode` does (RunError, a ValueError, for text that is not valid Unicode)."""
        self.check_length(text)
        return await self._run(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)

    async def encode_chat(self, messages: list[dict]) -> list[int]:
        """The token ids of `messages` through the tokenizer's chat template (`inputs.chat.encode_chat`'s prompt),
        rendered and tokenized in the pool; the rendered text's length is checked before tokenizing (the
        template may trim or drop text, so the messages' own length proves nothing). Raises ValueError when the
        template fails, PromptTooLong, and as `encode`."""
        return await self._run(self._encode_chat, messages)

    def _encode_chat(self, messages: list[dict]) -> list[int]:
        text = chat_prompt_text(self.tokenizer, messages)
        self.check_length(text)
        # the template writes the special tokens itself (as `encode_chat`)
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def _run(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def shutdown(self) -> None:
        """Stop the pool's threads (after what they run)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
