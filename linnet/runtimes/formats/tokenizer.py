"""Tokenizers for checkpoints: a thin wrapper over `tokenizers.Tokenizer` (the Rust library transformers uses),
built from a Hugging Face directory (`tokenizer.json` + `tokenizer_config.json`) or from a GGUF file's metadata.

The GGUF builder gives the token ids of the model's own tokenizer.json (the `tokenizers` reference), which is
what llama.cpp's tokenizer reproduces too; transformers 5's GGUF loader (`gguf_tokenizer_mapping.py`) is followed
where it agrees:

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE over `tokenizer.ggml.tokens` / `.merges`; tokens outside the
  GPT-2 byte alphabet are respelled byte by byte (GPT-2's `bytes_to_unicode`).
- `tokenizer.ggml.model == "llama"`: SentencePiece BPE with byte fallback, as transformers' LlamaConverter builds
  it (see `_from_gguf_spm`); ids are SentencePiece's.
- tokens of `tokenizer.ggml.token_type` 3 (control) become special added tokens, 4 (user-defined) plain added
  tokens; the bos/eos/unk/pad tokens are special too. Added tokens are matched whole in any text.
- `tokenizer.ggml.pre` names the family's normalizer and pre-tokenizer, each one mapped explicitly in
  `GGUF_PRE_TOKENIZERS` (llama.cpp's regexes in src/llama-vocab.cpp, as the family's tokenizer.json writes them);
  any other value, or none, is refused by name: a guessed split changes ids silently (llama.cpp #7881). Unlike
  transformers, which gives `smollm` GPT-2's split, `smollm` isolates every digit first as SmolLM2's tokenizer.json
  and llama.cpp do ("a  1": `a ĠĠ 1`, not `a Ġ Ġ1`).
- BOS/EOS are added by a `TemplateProcessing` post-processor from `tokenizer.ggml.add_bos_token` /
  `add_eos_token` (both false for SmolLM2), as transformers' `update_post_processor` does; without the key, BOS
  follows llama.cpp's default for the pre-tokenizer type (added for Llama 3 and tekken).

Only the `tokenizers` library is needed (no torch, no transformers).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from linnet.errors import CheckpointError, RunError

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "GGUF_PRE_TOKENIZERS",
    "PreTokenizerType",
    "byte_level_spelling",
    "hf_eos_token_ids",
]

# Texts longer than this are encoded through `encode_batch`, which releases the GIL while the Rust code runs
# (`encode` holds it: 8 s for 10 MB, during which no other Python thread ran); shorter ones take under a few ms.
RELEASE_GIL_CHARS = 4096


class TokenizerError(CheckpointError):
    """A tokenizer cannot be built: missing or malformed files, or an unsupported GGUF tokenizer model."""


# Split regexes of llama.cpp's src/llama-vocab.cpp (`llm_tokenizer_bpe`), as the models' own tokenizer.json files
# write them for a `Split` pre-tokenizer.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizerType:
    """How a `tokenizer.ggml.pre` value is tokenized: the normalizer and pre-tokenizer of the model family's own
    tokenizer.json (`reference`), whether its BPE takes a whole pre-token found in the vocabulary before merging
    (`ignore_merges`, tokenizer.json's and llama.cpp's), and whether BOS is added when the file does not say
    (`add_bos`, llama.cpp's per-type default for an absent tokenizer.ggml.add_bos_token)."""

    reference: str
    split: str | None = None  # a Split regex before a regex-less ByteLevel; None: ByteLevel's own GPT-2 regex
    digits: bool = False  # each digit its own pre-token first (tokenizers' Digits(individual_digits=True))
    nfc: bool = False
    ignore_merges: bool = False
    add_bos: bool = False

    def pre_tokenizer(self) -> Any:
        from tokenizers import Regex, pre_tokenizers

        if self.split is None:
            steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        else:
            steps = [
                pre_tokenizers.Split(Regex(self.split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        if self.digits:
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
        return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


_LLAMA3 = PreTokenizerType("meta-llama/Llama-3.x", split=_LLAMA3_SPLIT, ignore_merges=True, add_bos=True)
_STARCODER = PreTokenizerType("bigcode/starcoder2, HuggingFaceTB/SmolLM2", digits=True)
# `tokenizer.ggml.pre` -> its tokenization. Every value is explicit: a guessed split changes token ids without a
# word (llama.cpp #7881), so any other value is refused by name.
GGUF_PRE_TOKENIZERS: dict[str, PreTokenizerType] = {
    "gpt-2": PreTokenizerType("openai-community/gpt2"),
    "smollm": _STARCODER,
    "starcoder": _STARCODER,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "qwen2": PreTokenizerType("Qwen/Qwen2.5", split=_QWEN2_SPLIT, nfc=True),
    "tekken": PreTokenizerType(
        "mistralai/Mistral-Nemo (tekken)", split=_TEKKEN_SPLIT, ignore_merges=True, add_bos=True
    ),
}

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp `llama_token_type` values in tokenizer.ggml.token_type


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (openai/gpt-2 encoder.py `bytes_to_unicode`)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_level_spelling() -> dict[int, str]:
    """Byte -> the character GPT-2's byte-level BPE spells it with (`ByteLevel`'s alphabet), for the 256 bytes."""
    return dict(_bytes_to_unicode())


def _token_text(value: Any) -> str | None:
    """A token as tokenizer_config.json writes it: a string or an AddedToken dict with "content"."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read JSON ({e})") from None
    except RecursionError:
        raise TokenizerError(f"{path}: cannot read JSON (arrays or objects nested too deeply)") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


# where a Hugging Face folder keeps its special token ids (generation_config.json's win for bos; eos ids: both count)
_HF_ID_FILES = ("config.json", "generation_config.json")


def hf_eos_token_ids(path: str | os.PathLike[str]) -> list[int]:
    """The `eos_token_id`s (each an int or a list) of a Hugging Face folder's config.json and
    generation_config.json, in that order, the ids transformers' `generate` stops at; a folder
    without them gives []. Raises TokenizerError for a file that is not a JSON object."""
    folder = Path(path)
    ids: list[int] = []
    for name in _HF_ID_FILES:
        if (folder / name).is_file():
            ids += _ids(_read_json(folder / name).get("eos_token_id"))
    return ids


class Tokenizer:
    """Text <-> token ids for one checkpoint.

    Attributes:
        backend: the `tokenizers.Tokenizer` doing the work.
        bos_token_id / eos_token_id: ints or None. `eos_token_ids`: every id that ends generation (the tokenizer's
            eos plus the checkpoint config's and generation config's `eos_token_id`, int or list).
        add_bos_token: whether `encode(..., add_special_tokens=True)` puts BOS first (observed, not just declared).
        chat_template: the Jinja chat template, or None.
        special_tokens: text -> id of every special added token (skipped by `decode(skip_special_tokens=True)`).
    """

    def __init__(
        self,
        backend: Any,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        eos_token_ids: set[int] | None = None,
        chat_template: str | None = None,
        source: str = "",
    ):
        self.backend = backend
        self.source = source
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.eos_token_ids: set[int] = set(eos_token_ids or ())
        if eos_token_id is not None:
            self.eos_token_ids.add(eos_token_id)
        self.chat_template = chat_template
        self.special_tokens: dict[str, int] = {
            tok.content: i for i, tok in sorted(backend.get_added_tokens_decoder().items()) if tok.special
        }
        probe = backend.encode("a", add_special_tokens=True).ids
        self.add_bos_token = bool(bos_token_id is not None and probe and probe[0] == bos_token_id)

    # -- use ---------------------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (e.g. `<|im_start|>`) are always matched whole;
        `add_special_tokens` only controls the post-processor (BOS/EOS, BERT's [CLS]/[SEP]).

        Long texts are encoded without holding the GIL (RELEASE_GIL_CHARS), so other threads run meanwhile.
        Raises RunError for `text` that is not a str or not valid Unicode (a lone surrogate, which is how Python
        hands over a command-line byte that is not UTF-8); `tokenizers` would raise a TypeError."""
        if not isinstance(text, str):
            raise RunError(f"text to encode must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            bad = text[err.start]
            raise RunError(
                f"text to encode is not valid Unicode: {bad!r} at character {err.start} (a byte that is not UTF-8?)"
            ) from None
        if len(text) > RELEASE_GIL_CHARS:  # the same ids; other threads run meanwhile
            return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; special tokens are dropped when `skip_special_tokens`. Byte-level tokens that end in the
        middle of a UTF-8 character decode to U+FFFD, so decode whole sequences, not single tokens."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, tok: str) -> int | None:
        """The id of a token string as the vocabulary spells it (e.g. "<|im_end|>", "Ġthe"), or None."""
        return self.backend.token_to_id(tok)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary spelling of `token_id`, or None."""
        return self.backend.id_to_token(token_id)

    @property
    def bos_token(self) -> str | None:
        """The BOS token's text (for chat templates' `bos_token`), or None."""
        return self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else None

    @property
    def eos_token(self) -> str | None:
        """The EOS token's text (for chat templates' `eos_token`), or None."""
        return self.id_to_token(self.eos_token_id) if self.eos_token_id is not None else None

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __repr__(self) -> str:
        ids = f"bos={self.bos_token_id}, eos={sorted(self.eos_token_ids)}"
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, {ids})"

    # -- construction ------------------------------------------------------------------------------------------

    @classmethod
    def from_file(cls, tokenizer_json: str | os.PathLike[str], config: Mapping[str, Any] | None = None) -> Tokenizer:
        """From a `tokenizer.json` and a dict merging what tokenizer_config.json / config.json /
        generation_config.json say: `bos_token`, `eos_token` (strings or AddedToken dicts), `bos_token_id`,
        `eos_token_id` (int or list), `add_bos_token`, `add_eos_token`, `chat_template` (string, or a list of
        `{"name", "template"}` from which "default" is taken).

        As transformers 5 does (`TokenizersBackend.__init__`), an explicit `add_bos_token`/`add_eos_token`, or a
        tokenizer.json without a post-processor, replaces the post-processor with one adding exactly those.
        Padding and truncation stored in tokenizer.json are switched off: `encode` returns every id.
        Raises TokenizerError for a missing or malformed file.
        """
        from tokenizers import Tokenizer as _Backend

        path = Path(tokenizer_json)
        config = dict(config or {})
        try:
            backend = _Backend.from_file(str(path))
        except Exception as e:  # tokenizers raises its own Exception subclass with the parse error
            raise TokenizerError(f"{path}: cannot load tokenizer ({e})") from None
        backend.no_padding()
        backend.no_truncation()

        def token_id(key: str) -> int | None:
            text = _token_text(config.get(key))
            return backend.token_to_id(text) if text is not None else None

        bos_id = token_id("bos_token")
        if bos_id is None:
            bos_id = next(iter(_ids(config.get("bos_token_id"))), None)
        eos_id = token_id("eos_token")
        eos_ids = set(_ids(config.get("eos_token_id")))
        if eos_id is None and eos_ids:
            eos_id = min(eos_ids)
        if "add_bos_token" in config or "add_eos_token" in config or backend.post_processor is None:
            _set_post_processor(
                backend,
                bos=(_token_text(config.get("bos_token")), bos_id) if config.get("add_bos_token") else None,
                eos=(_token_text(config.get("eos_token")), eos_id) if config.get("add_eos_token") else None,
            )
        template = config.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        return cls(
            backend,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
            eos_token_ids=eos_ids,
            chat_template=template if isinstance(template, str) else None,
            source=str(path),
        )

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> Tokenizer | None:
        """From a Hugging Face model folder: tokenizer.json, tokenizer_config.json, special_tokens_map.json,
        chat_template.jinja / chat_template.json, and the eos ids of generation_config.json and config.json.
        Whether BOS/EOS are added is tokenizer.json's post-processor's say alone: tokenizer_config.json's
        `add_bos_token` / `add_eos_token` are ignored, as the pinned transformers 5 ignores them when tokenizer.json
        exists (a folder hand-edited to `add_bos_token: false` still gets its BOS there; docs/runtimes.md).
        Returns None when the folder has no tokenizer.json (a slow-only tokenizer is not converted).
        Raises TokenizerError for malformed files."""
        folder = Path(path)
        if not (folder / "tokenizer.json").is_file():
            return None
        config: dict[str, Any] = {}
        for name in _HF_ID_FILES:
            if (folder / name).is_file() and "bos_token_id" in (data := _read_json(folder / name)):
                config["bos_token_id"] = data["bos_token_id"]
        if eos := hf_eos_token_ids(folder):
            config["eos_token_id"] = eos
        if (folder / "special_tokens_map.json").is_file():
            config.update(
                {k: v for k, v in _read_json(folder / "special_tokens_map.json").items() if k.endswith("_token")}
            )
        if (folder / "tokenizer_config.json").is_file():
            tc = _read_json(folder / "tokenizer_config.json")
            # not add_bos_token / add_eos_token: transformers 5 drops them when tokenizer.json exists
            # (`PreTrainedTokenizerBase._from_pretrained`), so tokenizer.json's post-processor decides BOS and EOS
            for key in ("bos_token", "eos_token", "chat_template"):
                if key in tc and tc[key] is not None:
                    config[key] = tc[key]
        if (folder / "chat_template.json").is_file() and "chat_template" not in config:
            config["chat_template"] = _read_json(folder / "chat_template.json").get("chat_template")
        if (folder / "chat_template.jinja").is_file():
            config["chat_template"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        return cls.from_file(folder / "tokenizer.json", config)

    @classmethod
    def from_gguf(cls, reader: Any) -> Tokenizer:
        """From GGUF metadata (see the module docstring for the rules). `reader` is a
        `linnet.runtimes.formats.gguf_reader.GGUFFile`, a `gguf.GGUFReader`, or a path to a .gguf file.
        Raises TokenizerError when the file has no tokenizer, one other than `gpt2` (byte-level BPE) or `llama`
        (SentencePiece BPE), or a `tokenizer.ggml.pre` not in `GGUF_PRE_TOKENIZERS`."""
        md = _gguf_metadata(reader)
        where = str(getattr(reader, "path", reader))
        kind = md.get("tokenizer.ggml.model")
        if kind is None or "tokenizer.ggml.tokens" not in md:
            raise TokenizerError(f"{where}: no tokenizer in the GGUF metadata (tokenizer.ggml.model/tokens)")
        for key, kinds, what in (
            ("tokens", (str,), "strings"),
            ("merges", (str,), "strings"),
            ("token_type", (int,), "integers"),
            ("scores", (int, float), "numbers"),
        ):
            values = md.get(f"tokenizer.ggml.{key}", [])
            if not isinstance(values, list) or not all(isinstance(v, kinds) for v in values):
                raise TokenizerError(f"{where}: GGUF metadata tokenizer.ggml.{key} is not a list of {what}")
        if kind == "llama":
            return cls._from_gguf_spm(md, where)
        if kind != "gpt2":
            raise TokenizerError(
                f"{where}: GGUF tokenizer model {kind!r} is not supported (Linnet reads 'gpt2', byte-level BPE, and "
                "'llama', SentencePiece BPE)"
            )
        if "tokenizer.ggml.merges" not in md:
            raise TokenizerError(f"{where}: GGUF byte-level BPE tokenizer without tokenizer.ggml.merges")
        _check_gguf_tokenizer_types(md, where)
        pre = md.get("tokenizer.ggml.pre")
        supported = ", ".join(repr(p) for p in GGUF_PRE_TOKENIZERS)
        if pre not in GGUF_PRE_TOKENIZERS:
            said = "has no tokenizer.ggml.pre" if pre is None else f"has tokenizer.ggml.pre = {pre!r}"
            raise TokenizerError(
                f"{where}: GGUF tokenizer {said}, which Linnet does not read (supported: {supported}); a guessed "
                "pre-tokenizer changes token ids without a word (llama.cpp #7881)"
            )
        return cls._from_gguf_bpe(md, where, GGUF_PRE_TOKENIZERS[pre])

    @classmethod
    def _from_gguf_bpe(cls, md: Mapping[str, Any], where: str, pre: PreTokenizerType) -> Tokenizer:
        from tokenizers import Tokenizer as _Backend
        from tokenizers import decoders, normalizers
        from tokenizers.models import BPE

        tokens: list[str] = list(md["tokenizer.ggml.tokens"])
        spelling = _bytes_to_unicode()
        alphabet = set(spelling.values())
        # transformers byte_level_tokenizer(): keep tokens already in the byte alphabet, respell the others
        vocab = {
            tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
            for i, tok in enumerate(tokens)
        }
        merges = [tuple(m.split(" ")) for m in md["tokenizer.ggml.merges"]]
        try:
            backend = _Backend(
                BPE(
                    vocab=vocab,
                    merges=merges,
                    dropout=None,
                    continuing_subword_prefix="",
                    end_of_word_suffix="",
                    fuse_unk=False,
                    ignore_merges=pre.ignore_merges,
                )
            )
        except Exception as e:
            raise TokenizerError(f"{where}: GGUF vocabulary/merges do not form a BPE model ({e})") from None
        if pre.nfc:
            backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre.pre_tokenizer()
        backend.decoder = decoders.ByteLevel()

        return cls._from_gguf_backend(
            backend, md, where, tokens, in_vocab=lambda t: t in vocab and set(t) <= alphabet, add_bos=pre.add_bos
        )

    @classmethod
    def _from_gguf_spm(cls, md: Mapping[str, Any], where: str) -> Tokenizer:
        """SentencePiece BPE (`tokenizer.ggml.model` "llama": Llama 1/2, TinyLlama, Mistral 7B) as transformers'
        LlamaConverter builds it for a tokenizer.json: a BPE with byte fallback whose merges are every split of a
        token into two tokens, ranked by the merged token's score (`SentencePieceExtractor`), which is how
        SentencePiece and llama.cpp's `llm_tokenizer_spm` merge; spaces become "▁" and, with
        `tokenizer.ggml.add_space_prefix` (default true), one is put before the text and after each special
        token, as llama.cpp does. `tokenizer.ggml.pre` must be absent or "default" (llama.cpp reads none for
        SentencePiece); `remove_extra_whitespaces` true is refused (not read)."""
        from tokenizers import Tokenizer as _Backend
        from tokenizers import decoders, normalizers
        from tokenizers.models import BPE

        pre = md.get("tokenizer.ggml.pre")
        if pre not in (None, "default"):
            raise TokenizerError(
                f"{where}: GGUF SentencePiece tokenizer with tokenizer.ggml.pre = {pre!r}, which Linnet does not read "
                "(SentencePiece files have 'default' or none; llama.cpp #7881)"
            )
        if md.get("tokenizer.ggml.remove_extra_whitespaces"):
            raise TokenizerError(
                f"{where}: GGUF tokenizer.ggml.remove_extra_whitespaces = true is not supported (Linnet reads "
                "SentencePiece tokenizers that keep every space, as Llama's do)"
            )
        tokens: list[str] = list(md["tokenizer.ggml.tokens"])
        scores: list[float] = list(md.get("tokenizer.ggml.scores") or [])
        if len(scores) != len(tokens):
            raise TokenizerError(
                f"{where}: GGUF SentencePiece tokenizer has {len(scores)} tokenizer.ggml.scores for "
                f"{len(tokens)} tokens"
            )
        vocab = {t: i for i, t in enumerate(tokens)}
        ranked = []  # (-score of the merged token, its id, id of left, id of right, left, right)
        for i, (merged, score) in enumerate(zip(tokens, scores)):
            for cut in range(1, len(merged)):
                left, right = merged[:cut], merged[cut:]
                if left in vocab and right in vocab:
                    ranked.append((-score, i, vocab[left], vocab[right], left, right))
        merges = [(left, right) for *_, left, right in sorted(ranked, key=lambda m: m[:4])]
        unk = md.get("tokenizer.ggml.unknown_token_id")
        try:
            backend = _Backend(
                BPE(
                    vocab=vocab,
                    merges=merges,
                    unk_token=tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None,
                    fuse_unk=True,
                    byte_fallback=True,
                    dropout=None,
                )
            )
        except Exception as e:
            raise TokenizerError(f"{where}: GGUF SentencePiece vocabulary does not form a BPE model ({e})") from None
        prefix = md.get("tokenizer.ggml.add_space_prefix", True)
        steps = [normalizers.Prepend("▁")] if prefix else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
        decode = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        backend.decoder = decoders.Sequence([*decode, decoders.Strip(" ", 1, 0)] if prefix else decode)
        return cls._from_gguf_backend(backend, md, where, tokens, in_vocab=vocab.__contains__, add_bos=True)

    @classmethod
    def _from_gguf_backend(
        cls, backend: Any, md: Mapping[str, Any], where: str, tokens: list[str], *, in_vocab: Any, add_bos: bool
    ) -> Tokenizer:
        """Special and user-defined tokens, BOS/EOS and the chat template, common to both GGUF tokenizer models.
        `in_vocab(token)`: whether a token text is the backend vocabulary's spelling; `add_bos`: the default
        when `tokenizer.ggml.add_bos_token` is absent. Raises TokenizerError for a BOS, EOS, EOT, EOM or unknown
        token id outside the vocabulary, naming the key and the vocabulary size: such a BOS was silently not
        added, such an EOS never stopped generation."""
        from tokenizers import AddedToken

        for key in ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id"):
            i = md.get(f"tokenizer.ggml.{key}")
            if isinstance(i, int) and not isinstance(i, bool) and not 0 <= i < len(tokens):
                raise TokenizerError(
                    f"{where}: GGUF metadata tokenizer.ggml.{key} = {i} is outside the vocabulary of {len(tokens)} "
                    f"tokens (ids 0..{len(tokens) - 1})"
                )

        types: list[int] = list(md.get("tokenizer.ggml.token_type") or [])

        def token_of(key: str) -> str | None:
            i = md.get(f"tokenizer.ggml.{key}")
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

        named = [token_of(k) for k in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")]
        special = [t for t in named if t is not None and in_vocab(t)]
        special += [t for t, ty in zip(tokens, types) if ty == _CONTROL and in_vocab(t)]
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in dict.fromkeys(special)])
        user = [t for t, ty in zip(tokens, types) if ty == _USER_DEFINED and in_vocab(t)]
        if user:
            backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

        bos, eos = md.get("tokenizer.ggml.bos_token_id"), md.get("tokenizer.ggml.eos_token_id")
        _set_post_processor(
            backend,
            bos=(token_of("bos_token_id"), bos) if md.get("tokenizer.ggml.add_bos_token", add_bos) else None,
            eos=(token_of("eos_token_id"), eos) if md.get("tokenizer.ggml.add_eos_token") else None,
        )
        eos_ids = {md[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in md}
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_id=eos,
            eos_token_ids=eos_ids,
            chat_template=md.get("tokenizer.chat_template"),
            source=where,
        )


# GGUF tokenizer keys and the type each must have: (a check of a value, what it should be)
def _is_list_of(kind: type):
    return lambda v: isinstance(v, list) and all(isinstance(t, kind) and not isinstance(t, bool) for t in v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# GGUF tokenizer keys and the type each must have: (a check of a value, what it should be)
_GGUF_TOKENIZER_TYPES = {
    "tokenizer.ggml.tokens": (_is_list_of(str), "a list of strings"),
    "tokenizer.ggml.merges": (_is_list_of(str), "a list of strings"),
    "tokenizer.ggml.token_type": (_is_list_of(int), "a list of integers"),
    **{
        f"tokenizer.ggml.{key}": (_is_int, "an integer")
        for key in ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id")
    },
    "tokenizer.chat_template": (lambda v: isinstance(v, str), "a string"),
}


def _check_gguf_tokenizer_types(md: Mapping[str, Any], where: str) -> None:
    """Refuse GGUF tokenizer metadata of the wrong type (a corrupt or hand-made file), naming the key. Raises
    TokenizerError."""
    for key, (ok, want) in _GGUF_TOKENIZER_TYPES.items():
        if key in md and not ok(md[key]):
            raise TokenizerError(f"{where}: GGUF metadata {key} must be {want}, got {type(md[key]).__name__}")


def _set_post_processor(backend: Any, bos: tuple[str | None, int | None] | None, eos: tuple | None) -> None:
    """transformers' `TokenizersBackend.update_post_processor`: `[bos] $A [eos]` (pair: `... [bos] $B [eos]`)."""
    from tokenizers import processors

    if bos is not None and (bos[0] is None or bos[1] is None):
        bos = None
    if eos is not None and (eos[0] is None or eos[1] is None):
        eos = None
    single = f"{bos[0] + ':0 ' if bos else ''}$A:0{' ' + eos[0] + ':0' if eos else ''}"
    pair = f"{single}{' ' + bos[0] + ':1' if bos else ''} $B:1{' ' + eos[0] + ':1' if eos else ''}"
    special = [t for t in (bos, eos) if t is not None]
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def _gguf_metadata(reader: Any) -> Mapping[str, Any]:
    """Metadata of a GGUFFile, a gguf.GGUFReader, or a path."""
    from linnet.runtimes.formats.gguf_reader import GGUFError, GGUFFile

    if isinstance(reader, GGUFFile):
        return reader.metadata
    if isinstance(reader, (str, os.PathLike)):
        try:
            with GGUFFile(reader) as f:
                return f.metadata
        except (OSError, GGUFError) as e:
            raise TokenizerError(f"{reader}: cannot read GGUF metadata ({e})") from None
    fields = getattr(reader, "fields", None)
    if fields is not None:  # gguf.GGUFReader
        return {k: f.contents() for k, f in fields.items() if k.startswith("tokenizer.")}
    raise TypeError(f"expected a GGUFFile, gguf.GGUFReader or path, got {type(reader).__name__}")
