"""The length check that refuses a prompt before tokenizing it (linnet/runtimes/serve/prompts.py, issue 42): it must
never refuse a prompt that fits. Checked against the real tokenizers: SmolLM2's byte-level BPE (which drops some
control characters without a token) and a SentencePiece-style one with byte fallback; tokenizers whose pipeline
can swallow unbounded text (WordPiece's [UNK] for a long word, a whitespace pre-tokenizer, a `Strip` normalizer)
get no bound at all."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.runtimes.serve.prompts import NORMALIZATION_SHRINK, PromptTooLong, length_bound

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def smollm2():
    from linnet.runtimes.formats.checkpoints import open_checkpoint

    return open_checkpoint("smollm2-135m-instruct").tokenizer()


def test_unicode_normalization_makes_one_character_of_at_most_four():
    """The shrink factor the bound assumes: no character's canonical decomposition is longer (Python's data)."""
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert longest == NORMALIZATION_SHRINK


def test_smollm2_has_a_bound_that_skips_the_control_characters_it_drops(smollm2):
    bound = length_bound(smollm2, 128)
    assert bound is not None and bound.span == 81 and bound.max_chars == 81 * 127
    # SmolLM2's vocabulary lacks the byte-level characters of 0x04, 0x06, ...: 100 of them encode to no token
    assert "\x04" in bound.dropped and smollm2.encode("\x04" * 100) == []
    assert bound.kept_chars("a\x04\x04b") == 2


PIECES = st.one_of(
    st.characters(codec="utf-8"),  # any character UTF-8 can carry
    st.sampled_from(["\x04", "\x06", "\x13", " ", "\n", "\t", "=", "<|im_start|>", " " * 80]),  # dropped, long
)
TEXT = st.lists(PIECES, max_size=200).map("".join)


@pytest.fixture(scope="module")
def smollm2_bound(smollm2):
    """Made once: `length_bound` reads the whole vocabulary (made per example, 19-33 s of the suite's time)."""
    return length_bound(smollm2, 128)


@settings(max_examples=100, deadline=None)
@given(text=TEXT, repeat=st.integers(1, 8))
def test_no_text_has_fewer_tokens_than_the_bound_says(smollm2, smollm2_bound, text, repeat):
    """The bound's claim, tokens >= kept characters / span, on the real tokenizer."""
    bound = smollm2_bound
    text = text * repeat
    assert len(smollm2.encode(text, add_special_tokens=False)) * bound.span >= bound.kept_chars(text)


def _tokenizer(model, normalizer=None, pre_tokenizer=None, added=()):
    from tokenizers import AddedToken, Tokenizer

    from linnet.runtimes.formats.tokenizer import Tokenizer as LinnetTokenizer

    backend = Tokenizer(model)
    backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizer
    backend.add_special_tokens([AddedToken(t, lstrip=True) for t in added])
    return LinnetTokenizer(backend)


def test_tokenizers_that_can_swallow_text_get_no_bound():
    from tokenizers import models, normalizers, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3}
    word_piece = _tokenizer(models.WordPiece(vocab, unk_token="[UNK]"), pre_tokenizer=pre_tokenizers.Whitespace())
    # one [UNK] for a whole word of 10,000 characters: a bound would refuse a prompt of 1 token
    assert word_piece.encode("c" * 10_000, add_special_tokens=False) == [0]
    assert length_bound(word_piece, 8) is None
    bpe = models.BPE(vocab, [("a", "b")], unk_token="[UNK]", fuse_unk=False)  # one [UNK] per unknown character
    assert length_bound(_tokenizer(bpe), 8) is not None
    fused = models.BPE(vocab, [("a", "b")], unk_token="[UNK]", fuse_unk=True)
    assert _tokenizer(fused).encode("c" * 1000, add_special_tokens=False) == [0]
    assert length_bound(_tokenizer(fused), 8) is None
    assert length_bound(_tokenizer(bpe, normalizer=normalizers.Strip()), 8) is None  # strips any run of spaces
    assert length_bound(_tokenizer(bpe, pre_tokenizer=pre_tokenizers.WhitespaceSplit()), 8) is None
    assert length_bound(_tokenizer(bpe, added=("<mask>",)), 8) is None  # lstrip eats the spaces before it
    nfkc = length_bound(_tokenizer(bpe, normalizer=normalizers.NFKC()), 8)
    assert nfkc.span == NORMALIZATION_SHRINK * len("[UNK]")


def test_prompt_too_long_says_how_many_tokens_at_least():
    err = PromptTooLong(10_000_000, 123_457, 81)
    assert "10000000 characters" in str(err) and "at least 123457 tokens" in str(err)


def test_a_long_text_is_encoded_to_the_same_ids_through_encode_batch(smollm2):
    """`Tokenizer.encode` hands texts over RELEASE_GIL_CHARS to `encode_batch` (which releases the GIL while the
    Rust code runs; bench/serve_abuse.py measures what that does): the ids are `encode`'s, special tokens too."""
    from linnet.runtimes.formats.tokenizer import RELEASE_GIL_CHARS

    text = "<|im_start|>user\nThe quick brown fox jumps over the lazy dog. 1234 ünïcödé 中文\n" * 2_000
    assert len(text) > RELEASE_GIL_CHARS
    for special in (True, False):
        assert (
            smollm2.encode(text, add_special_tokens=special)
            == smollm2.backend.encode(text, add_special_tokens=special).ids
        )
