"""SentencePiece tokenizers in GGUF (`tokenizer.ggml.model` "llama": Llama 1/2, TinyLlama, Mistral 7B): a small
SentencePiece BPE model trained here with Llama 2's settings (byte fallback, identity normalisation, spaces kept),
written to GGUF as llama.cpp's convert_hf_to_gguf.py `_create_vocab_sentencepiece` does, gives SentencePiece's own
ids and text back."""

from __future__ import annotations

import io
import random

import pytest

from linnet.runtimes.formats.tokenizer import Tokenizer, TokenizerError

spm = pytest.importorskip("sentencepiece")
gguf = pytest.importorskip("gguf")

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and   runs of   spaces  ",
    "numbers 12345 and 3.14159, 2024-12-01",
    "caf\u00e9 na\u00efve \u00c5lborg",  # characters the model may lack: byte fallback
    "\u4e2d\u6587 and emoji \U0001f600",
    "tabs\tand\nnewlines\n\nend",
    "I'm sure they'll say it's fine.",
    "",
]

WORDS = (
    "the of and to in is was for on that with as by at from his her they this are have had not but what all were "
    "when we there can an your which their said if do will each about how up out them then she many some so these "
    "would other into has more two like him see time could no make than first been its who now people my made over "
    "did down only way find use may water long little very after words called just where most know"
).split()


@pytest.fixture(scope="module")
def sp_model():
    """A 600-piece SentencePiece BPE model with Llama 2's normaliser and trainer settings, trained on a seeded
    word salad (with digits and accented words)."""
    rng = random.Random(0)
    lines = [
        " ".join(rng.choice(WORDS) for _ in range(12)) + f" {rng.randint(0, 99999)} caf\u00e9 {rng.choice(WORDS)}."
        for _ in range(3000)
    ]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=600,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        character_coverage=0.9999,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def write_spm_gguf(path, sp, pre="default", **extra):
    """llama.cpp's `_create_vocab_sentencepiece` + `SpecialVocab`: pieces, scores, token types, bos/eos/unk."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        kind = 1
        if sp.is_unknown(i):
            kind = 2
        elif sp.is_control(i):
            kind = 3
        elif sp.is_unused(i):
            kind = 5
        elif sp.is_byte(i):
            kind = 6
        types.append(kind)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    for key, value in extra.items():
        (w.add_bool if isinstance(value, bool) else w.add_string)(f"tokenizer.ggml.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def ours(sp_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "t.gguf"
    write_spm_gguf(path, sp_model)
    return Tokenizer.from_gguf(path)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_text_match_sentencepiece(sp_model, ours, text):
    expected = sp_model.encode(text)
    assert ours.encode(text, add_special_tokens=False) == expected
    assert ours.encode(text) == [sp_model.bos_id(), *expected]  # llama.cpp adds BOS by default for SentencePiece
    assert ours.decode(expected) == sp_model.decode(expected)


def test_the_cases_exercise_byte_fallback_and_merges(sp_model):
    pieces = [p for t in TEXTS for p in sp_model.encode(t, out_type=str)]
    assert any(p.startswith("<0x") for p in pieces) and any(len(p) > 3 for p in pieces)


def test_special_tokens(ours, sp_model):
    assert ours.bos_token_id == sp_model.bos_id() and ours.eos_token_id == sp_model.eos_id()
    assert ours.special_tokens == {"<s>": sp_model.bos_id(), "</s>": sp_model.eos_id(), "<unk>": sp_model.unk_id()}
    # a special token in the text is matched whole, and a space prefix follows it, as llama.cpp does
    assert ours.encode("</s>Hello", add_special_tokens=False) == [sp_model.eos_id(), *sp_model.encode("Hello")]


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"pre": "llama-bpe"}, "tokenizer.ggml.pre = 'llama-bpe'"),
        ({"remove_extra_whitespaces": True}, "remove_extra_whitespaces = true is not supported"),
    ],
)
def test_refusals(sp_model, tmp_path, extra, words):
    path = tmp_path / "t.gguf"
    write_spm_gguf(path, sp_model, **extra)
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_gguf(path)
    assert words in str(e.value) and str(path) in str(e.value)
