"""The GGUF tokenizer gives transformers' token ids (with SmolLM2's own pre-tokenizer); HF-folder tokenizers read
their configs. Each `tokenizer.ggml.pre` type against its family's tokenizer.json: test_gguf_pretokenizers.py."""

from __future__ import annotations

import json

import pytest

from linnet.runtimes.formats.embedded import EmbeddedError, resolve_embedded
from linnet.runtimes.formats.gguf_reader import GGUFFile
from linnet.runtimes.formats.tokenizer import Tokenizer, TokenizerError

TEXTS = [
    "Hello world",
    "What is the capital of France?",
    "café, naïve, Ålborg, é",
    "中文测试，日本語のテキスト",
    "emoji 😀🎉👍🏽 and a flag 🇫🇷",
    "12345 3.14159 -0.5e10 1,000,000",
    "a  1   b",
    "spaces    and\n\n\nnewlines\r\n  \n\t\tend   ",
    "   leading spaces",
    "def f(x):\n\tif x > 0:\n        return x * 2  # double\n\treturn None\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>glued<|endoftext|> and <repo_name>x",
    "I'm sure they'll say it's 'quoted' — ok?",
    "",
]


@pytest.fixture(scope="module")
def smollm2_path():
    try:
        path, _ = resolve_embedded("smollm2-135m-instruct")
    except EmbeddedError as e:
        pytest.skip(str(e))
    return path


@pytest.fixture(scope="module")
def ours(smollm2_path):
    return Tokenizer.from_gguf(GGUFFile(smollm2_path))


@pytest.fixture(scope="module")
def reference(smollm2_path):
    """transformers' tokenizer for the GGUF, with SmolLM2's own pre-tokenizer (its tokenizer.json's: each digit
    first, then GPT-2's byte-level split, as llama.cpp's `smollm` type): transformers gives `smollm` GPT-2's split
    alone, which tokenizes spaces before a digit differently ("a  1")."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import pre_tokenizers

    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return tok


# -- against transformers ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_gguf_ids_match_transformers(ours, reference, text):
    assert ours.encode(text) == reference(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == reference(text, add_special_tokens=False)["input_ids"]


@pytest.mark.slow
def test_gguf_backend_is_transformers_backend(ours, reference):
    """Same vocabulary, merges, added tokens, pre-tokenizer, post-processor and decoder, field for field."""
    theirs = json.loads(reference.backend_tokenizer.to_str())
    mine = json.loads(ours.backend.to_str())
    for key in theirs:
        assert mine[key] == theirs[key], key


@pytest.mark.slow
def test_gguf_decode_matches_transformers(ours, reference):
    for text in TEXTS:
        ids = reference(text)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)


@pytest.mark.slow
def test_gguf_special_tokens_match_transformers(ours, reference):
    assert ours.bos_token_id == reference.bos_token_id
    assert ours.eos_token_id == reference.eos_token_id
    assert ours.chat_template == reference.chat_template
    assert ours.special_tokens == {t.content: i for i, t in reference.added_tokens_decoder.items() if t.special}


# -- on its own ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_decode_round_trips(ours, text):
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_gguf_known_ids(ours):
    """Ids transformers 5.24 gives (checked by the slow tests above); pinned so a fast run catches drift."""
    assert ours.encode("Hello world") == [19556, 905]
    assert ours.encode("<|im_start|>user\nhi<|im_end|>\n") == [1, 4093, 198, 6004, 2, 198]
    assert ours.encode("12345 3.14") == [33, 34, 35, 36, 37, 216, 35, 30, 33, 36]
    # SmolLM2's and llama.cpp's split (digits isolated first), not transformers' GGUF one (`a Ġ Ġ1` -> 81 216 216 33)
    assert ours.encode("a  1") == [81, 256, 33]


def test_gguf_fields(ours):
    assert ours.bos_token_id == 1 and ours.bos_token == "<|im_start|>"
    assert ours.eos_token_id == 2 and ours.eos_token == "<|im_end|>"
    assert ours.eos_token_ids == {2}
    assert ours.add_bos_token is False
    assert ours.special_tokens["<|im_start|>"] == 1 and ours.special_tokens["<|endoftext|>"] == 0
    assert len(ours.special_tokens) == 17
    assert ours.chat_template.startswith("{% for message in messages %}")
    assert ours.vocab_size == 49152
    assert ours.token_to_id("<|im_end|>") == 2 and ours.token_to_id("no such token") is None
    assert ours.decode(ours.encode("<|im_start|>user\nhi<|im_end|>")) == "user\nhi"


def test_gguf_from_path(ours, smollm2_path):
    text = "Tabs\tand <|im_end|> 中文"
    assert Tokenizer.from_gguf(smollm2_path).encode(text) == ours.encode(text)


def _write_tiny_gguf(
    path, *, add_bos: bool, model: str = "gpt2", pre: str = "smollm", bos: int = 0, eos: int = 1, extra=None
):
    """A GGUF holding only a tokenizer: two control tokens, the 256 byte characters and a few merges."""
    gguf = pytest.importorskip("gguf")
    from linnet.runtimes.formats.tokenizer import _bytes_to_unicode

    alphabet = sorted(set(_bytes_to_unicode().values()))
    tokens = ["<s>", "</s>", *alphabet, "ab", "Ġab", "<think>"]
    types = [3, 3] + [1] * (len(alphabet) + 2) + [4]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["a b", "Ġ ab"])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    for key, value in (extra or {}).items():
        w.add_uint32(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def test_gguf_add_bos_token_and_user_defined_tokens(tmp_path):
    tokens = _write_tiny_gguf(tmp_path / "bos.gguf", add_bos=True)
    tok = Tokenizer.from_gguf(tmp_path / "bos.gguf")
    ab, gab, think = tokens.index("ab"), tokens.index("Ġab"), tokens.index("<think>")
    assert tok.add_bos_token is True
    assert tok.encode("ab ab") == [0, ab, gab]
    assert tok.encode("ab ab", add_special_tokens=False) == [ab, gab]
    assert tok.encode("x<think>") == [0, tokens.index("x"), think]  # user-defined: matched whole, not special
    assert tok.decode([0, ab, think, 1]) == "ab<think>"
    assert "<think>" not in tok.special_tokens and tok.special_tokens == {"<s>": 0, "</s>": 1}


@pytest.mark.parametrize(
    "key, add_bos",
    [
        ("bos_token_id", True),  # was not added, without a word
        ("bos_token_id", False),
        ("eos_token_id", False),  # never stopped generation
        ("eot_token_id", False),
        ("unknown_token_id", False),
    ],
)
def test_gguf_token_id_outside_the_vocabulary_is_refused(tmp_path, key, add_bos):
    ids = {"bos": 999999} if key == "bos_token_id" else {"eos": 999999} if key == "eos_token_id" else {}
    extra = {} if ids else {f"tokenizer.ggml.{key}": 999999}
    tokens = _write_tiny_gguf(tmp_path / "oob.gguf", add_bos=add_bos, extra=extra, **ids)
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_gguf(tmp_path / "oob.gguf")
    msg = str(e.value)
    assert str(tmp_path / "oob.gguf") in msg and f"tokenizer.ggml.{key} = 999999" in msg, msg
    assert f"outside the vocabulary of {len(tokens)} tokens" in msg


def test_gguf_from_gguf_reader(tmp_path):
    gguf = pytest.importorskip("gguf")
    _write_tiny_gguf(tmp_path / "t.gguf", add_bos=True)
    text = "ab ab<think></s> é"
    from_reader = Tokenizer.from_gguf(gguf.GGUFReader(tmp_path / "t.gguf"))
    assert from_reader.encode(text) == Tokenizer.from_gguf(GGUFFile(tmp_path / "t.gguf")).encode(text)
    assert from_reader.add_bos_token and from_reader.special_tokens == {"<s>": 0, "</s>": 1}


def test_gguf_unsupported_tokenizer_model(tmp_path):
    _write_tiny_gguf(tmp_path / "wpm.gguf", add_bos=False, model="bert")
    with pytest.raises(TokenizerError, match="'bert' is not supported"):
        Tokenizer.from_gguf(tmp_path / "wpm.gguf")


def test_gguf_file_without_tokenizer(tmp_path):
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(tmp_path / "none.gguf"), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerError, match="no tokenizer"):
        Tokenizer.from_gguf(tmp_path / "none.gguf")


# -- Hugging Face folders ------------------------------------------------------------------------------------


def test_hf_dir_reads_configs(ours, tmp_path):
    """tokenizer_config.json's add_bos_token does not change tokenizer.json's post-processor (transformers 5 drops
    it; see test_hf_dir_adds_bos_as_transformers_does); chat_template.jinja wins over tokenizer_config.json; eos ids
    gather config.json and generation_config.json."""
    ours.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": {"content": "<|im_start|>", "__type": "AddedToken"},
                "eos_token": "<|im_end|>",
                "add_bos_token": True,
                "chat_template": "old",
            }
        )
    )
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}new")
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2, "bos_token_id": 1}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.add_bos_token is False
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.encode("Hello world", add_special_tokens=False) == [19556, 905]
    assert tok.bos_token_id == 1 and tok.eos_token_id == 2 and tok.eos_token_ids == {0, 2}
    assert tok.chat_template == "{{ bos_token }}new"


def test_hf_dir_without_tokenizer_json(tmp_path):
    assert Tokenizer.from_hf_dir(tmp_path) is None


def test_hf_dir_corrupt_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)


# tokenizer.json's post-processor: Llama 3's TemplateProcessing adding BOS, GPT-2's ByteLevel (adds nothing), none
POST_PROCESSORS = ["template-bos", "template-bos-eos", "bytelevel", "none"]


def _bos_folder(folder, post: str, tokenizer_config: dict):
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    backend.train_from_iterator(["Hello world, the quick brown fox"] * 4, trainer)
    if post.startswith("template"):
        eos = " <|end_of_text|>" if post.endswith("eos") else ""
        backend.post_processor = processors.TemplateProcessing(
            single=f"<|begin_of_text|> $A{eos}",
            pair=f"<|begin_of_text|> $A{eos} <|begin_of_text|> $B:1{eos}",
            special_tokens=[(specials[0], 0), (specials[1], 1)],
        )
    elif post == "bytelevel":
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))
    config = {"bos_token": specials[0], "eos_token": specials[1], "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config | tokenizer_config))
    return folder


@pytest.mark.parametrize("post", POST_PROCESSORS)
@pytest.mark.parametrize("add_bos", [False, True, None], ids=["add_bos-false", "add_bos-true", "add_bos-absent"])
@pytest.mark.parametrize("add_eos", [False, True, None], ids=["add_eos-false", "add_eos-true", "add_eos-absent"])
def test_hf_dir_adds_bos_as_transformers_does(tmp_path, post, add_bos, add_eos):
    """A Llama-3 folder hand-edited to `add_bos_token: false` (the usual way to avoid a double BOS) still gets its
    BOS from the pinned transformers 5 (constraints.txt), which drops tokenizer_config.json's add_bos_token /
    add_eos_token when tokenizer.json exists: Linnet gives the same ids, whatever the two files say (it used to
    follow tokenizer_config.json: other ids than transformers, SFT losses off by up to 0.41 against TRL)."""
    transformers = pytest.importorskip("transformers")
    flags = {k: v for k, v in (("add_bos_token", add_bos), ("add_eos_token", add_eos)) if v is not None}
    folder = _bos_folder(tmp_path / "tok", post, flags)
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = Tokenizer.from_hf_dir(folder)
    for text in ["Hello world", "the quick brown fox", ""]:
        assert ours.encode(text) == reference(text)["input_ids"], (text, flags)
        assert ours.encode(text, add_special_tokens=False) == reference(text, add_special_tokens=False)["input_ids"]
    assert ours.add_bos_token is post.startswith("template")
