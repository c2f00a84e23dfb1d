"""`tokenizer.ggml.pre` (issue 14, item 2): each supported pre-tokenizer type gives the token ids of its family's
own tokenizer.json, loaded by the `tokenizers` library, over one real vocabulary (SmolLM2's 49152 tokens and
merges); any other value, or none, is refused by name (llama.cpp #7881).

The references below are written from the families' tokenizer.json files (normalizer, pre_tokenizer, BPE
`ignore_merges`), not from Linnet's tables, so a wrong or missing mapping shows as different ids."""

from __future__ import annotations

import json

import pytest

from linnet.runtimes.formats.checkpoints import CheckpointError, open_checkpoint
from linnet.runtimes.formats.embedded import EmbeddedError, resolve_embedded
from linnet.runtimes.formats.gguf_reader import GGUFFile
from linnet.runtimes.formats.tokenizer import GGUF_PRE_TOKENIZERS, Tokenizer, TokenizerError

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _split_then_bytes(pattern: str) -> dict:
    return {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            _byte_level(False),
        ],
    }


# The `pre_tokenizer`, `normalizer` and BPE `ignore_merges` of each family's tokenizer.json.
_GPT2 = {"pre_tokenizer": _byte_level(True)}  # openai-community/gpt2
_STARCODER = {  # bigcode/starcoder2-*, HuggingFaceTB/SmolLM2-*
    "pre_tokenizer": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _byte_level(True)],
    }
}
_LLAMA3 = {  # meta-llama/Llama-3.1-8B
    "pre_tokenizer": _split_then_bytes(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+"
    ),
    "ignore_merges": True,
}
_QWEN2 = {  # Qwen/Qwen2.5-0.5B
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": _split_then_bytes(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+"
    ),
}
_TEKKEN = {  # mistralai/Mistral-Nemo-Instruct-2407
    "pre_tokenizer": _split_then_bytes(
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "ignore_merges": True,
}
REFERENCES = {
    "gpt-2": _GPT2,
    "smollm": _STARCODER,
    "starcoder": _STARCODER,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "qwen2": _QWEN2,
    "tekken": _TEKKEN,
}

TEXTS = [
    "Hello world",
    "a  1   b",
    "12345 3.14159 -0.5e10 1,000,000 and 2024-12-01",
    "I'M sure they'LL say it's 'quoted' -- ok?",
    "HTTPRequest parseJSONValue camelCase ABCdef",
    "caf\u00e9 vs cafe\u0301, na\u00efve, \u212bngstr\u00f6m",  # precomposed and decomposed: NFC matters
    "\u4e2d\u6587\u6d4b\u8bd5\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "emoji \U0001f600\U0001f389 and a flag \U0001f1eb\U0001f1f7",
    "spaces    and\n\n\nnewlines\r\n  \n\t\tend   ",
    "path/to/file.py: //comment\n/* block */",
    "def f(x):\n\tif x > 0:\n        return x * 2  # double\n",
]


@pytest.fixture(scope="module")
def vocab():
    """SmolLM2's tokens, token types and merges, from the embedded GGUF."""
    try:
        path, _ = resolve_embedded("smollm2-135m-instruct")
    except EmbeddedError as e:
        pytest.skip(str(e))
    with GGUFFile(path) as f:
        md = f.metadata
        return [list(md[f"tokenizer.ggml.{k}"]) for k in ("tokens", "token_type", "merges")]


def write_tokenizer_gguf(path, tokens, types, merges, pre: str | None):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_string("tokenizer.ggml.pre", pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(tokens, merges, family: dict):
    """The family's tokenizer.json over these tokens and merges (all SmolLM2's tokens are in the byte alphabet)."""
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": family.get("normalizer"),
        "pre_tokenizer": family["pre_tokenizer"],
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": family.get("ignore_merges", False),
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ") for m in merges],
        },
    }
    return tokenizers.Tokenizer.from_str(json.dumps(doc))


@pytest.fixture(scope="module")
def gpt2_ids(vocab):
    tokens, _, merges = vocab
    ref = reference(tokens, merges, _GPT2)
    return [ref.encode(t, add_special_tokens=False).ids for t in TEXTS]


def test_every_supported_type_has_a_reference():
    assert set(REFERENCES) == set(GGUF_PRE_TOKENIZERS)


@pytest.mark.parametrize("pre", list(REFERENCES))
def test_pre_tokenizer_gives_the_reference_ids(tmp_path, vocab, gpt2_ids, pre):
    tokens, types, merges = vocab
    write_tokenizer_gguf(tmp_path / "t.gguf", tokens, types, merges, pre)
    ours = Tokenizer.from_gguf(tmp_path / "t.gguf")
    ref = reference(tokens, merges, REFERENCES[pre])
    for text in TEXTS:
        # special tokens aside (the reference has none), every id agrees
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == ref.decode(ref.encode(text).ids)
    if REFERENCES[pre] is not _GPT2:  # the type matters: GPT-2's split (the old fallback) gives other ids
        assert [ref.encode(t, add_special_tokens=False).ids for t in TEXTS] != gpt2_ids


@pytest.mark.parametrize("pre, whole", [("llama-bpe", True), ("tekken", True), ("gpt-2", False), ("qwen2", False)])
def test_ignore_merges(tmp_path, pre, whole):
    """A pre-token found whole in the vocabulary is one token for Llama 3 and tekken (their tokenizer.json's
    `ignore_merges`, llama.cpp's `ignore_merges`), even without the merges that would build it."""
    from linnet.runtimes.formats.tokenizer import _bytes_to_unicode

    tokens = [*sorted(set(_bytes_to_unicode().values())), "xy", "xyz"]
    write_tokenizer_gguf(tmp_path / "t.gguf", tokens, [1] * len(tokens), ["x y"], pre)
    ids = Tokenizer.from_gguf(tmp_path / "t.gguf").encode("xyz", add_special_tokens=False)
    assert ids == ([tokens.index("xyz")] if whole else [tokens.index("xy"), tokens.index("z")])


@pytest.mark.parametrize("pre, bos", [("llama-bpe", True), ("tekken", True), ("gpt-2", False), ("smollm", False)])
def test_bos_default_when_the_file_does_not_say(tmp_path, pre, bos):
    """llama.cpp adds BOS for Llama 3 and tekken unless tokenizer.ggml.add_bos_token says otherwise."""
    from linnet.runtimes.formats.tokenizer import _bytes_to_unicode

    tokens = ["<s>", *sorted(set(_bytes_to_unicode().values())), "ab"]
    w = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = Tokenizer.from_gguf(tmp_path / "b.gguf")
    assert tok.add_bos_token is bos
    assert (tok.encode("a")[0] == 0) is bos


@pytest.mark.parametrize("pre", ["deepseek-llm", "falcon", "gpt-4o", "default", "SMOLLM", None])
def test_other_pre_tokenizers_are_refused_by_name(tmp_path, vocab, pre):
    tokens, types, merges = vocab
    path = tmp_path / "t.gguf"
    write_tokenizer_gguf(path, tokens, types, merges, pre)
    with pytest.raises(TokenizerError, match="llama.cpp #7881") as e:
        Tokenizer.from_gguf(path)
    message = str(e.value)
    assert str(path) in message
    assert (f"tokenizer.ggml.pre = {pre!r}" if pre is not None else "has no tokenizer.ggml.pre") in message


def test_refusal_reaches_the_checkpoint(tmp_path, vocab):
    """Through `open_checkpoint(...).tokenizer()`, as `linnet generate` reads it: a CheckpointError naming it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.runtimes.gguf_writing import write_llama_gguf

    tokens, types, merges = vocab
    config = transformers.LlamaConfig(
        vocab_size=len(tokens), hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
    )
    torch.manual_seed(0)
    path = tmp_path / "m.gguf"
    extra = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "falcon3",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
    }
    write_llama_gguf(path, transformers.LlamaForCausalLM(config), extra_metadata=extra)
    with open_checkpoint(path) as ckpt, pytest.raises(CheckpointError) as e:
        ckpt.tokenizer()
    assert "tokenizer.ggml.pre = 'falcon3'" in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("key", ["tokens", "merges"])
def test_arrays_of_the_wrong_type_are_refused(tmp_path, key):
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_string("tokenizer.ggml.pre", "gpt-2")
    w.add_array("tokenizer.ggml.tokens", [1, 2, 3] if key == "tokens" else ["a", "b", "ab"])
    w.add_array("tokenizer.ggml.merges", [7] if key == "merges" else ["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerError, match=f"tokenizer.ggml.{key} is not a list of strings"):
        Tokenizer.from_gguf(tmp_path / "t.gguf")
