"""Stop strings over the real SmolLM2 tokenizer (byte-level BPE, where CJK characters are split into byte tokens):
matched across token boundaries, held back while they could still match, never leaked; stop token ids and EOS."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.runtimes.serve.stops import TextStream, held_back_length, stop_token_ids


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("gguf")
    from linnet.runtimes.formats.checkpoints import open_checkpoint

    with open_checkpoint("smollm2-135m-instruct") as checkpoint:
        return checkpoint.tokenizer()


def stream(tok, text: str, stops: tuple[str, ...]) -> tuple[list[str], str | None, str]:
    """Push `text`'s tokens one by one: (the pieces released, the matched stop or None, decode of all tokens)."""
    ids = tok.encode(text, add_special_tokens=False)
    text_stream = TextStream(tok, stops)
    pieces: list[str] = []
    for token in ids:
        released = text_stream.push(token)
        pieces.append(released.text)
        if released.stop is not None:
            return pieces, released.stop, tok.decode(ids)
    end = text_stream.finish()
    return [*pieces, end.text], end.stop, tok.decode(ids)


def reference(tok, text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """The visible text and stop by definition: after each token whose text is complete (no trailing U+FFFD),
    the first stop string found in the decoded text ends it there."""
    ids = tok.encode(text, add_special_tokens=False)
    for k in range(1, len(ids) + 1):
        decoded = tok.decode(ids[:k])
        if decoded.endswith("\ufffd"):
            continue
        found = [(decoded.find(s), -len(s), s) for s in stops if s in decoded]
        if found:
            at, _, stop = min(found)
            return decoded[:at], stop
    return tok.decode(ids), None


def assert_never_leaks(pieces: list[str], visible: str) -> None:
    """Every released prefix of the stream is a prefix of the final visible text: nothing was taken back."""
    shown = ""
    for piece in pieces:
        shown += piece
        assert visible.startswith(shown), (shown, visible)
    assert shown == visible


def test_a_stop_string_spanning_two_tokens(tok):
    text = "The quick brown fox jumps over the lazy dog"
    assert "ck bro" not in [tok.decode([i]) for i in tok.encode(text)]  # it spans " quick" and " brown"
    pieces, stop, _ = stream(tok, text, ("ck bro",))
    assert stop == "ck bro"
    assert_never_leaks(pieces, "The qui")


@pytest.mark.parametrize(("stop", "visible"), [("界 w", "Hello 世"), ("世", "Hello "), ("\u754c", "Hello 世")])
def test_a_stop_string_whose_characters_are_split_across_byte_tokens(tok, stop, visible):
    text = "Hello 世界 world"
    ids = tok.encode(text)
    assert sum(tok.decode([i]) == "\ufffd" for i in ids) >= 4  # 世 and 界 are byte tokens: split characters
    pieces, matched, _ = stream(tok, text, (stop,))
    assert matched == stop
    assert_never_leaks(pieces, visible)
    assert all("\ufffd" not in piece for piece in pieces)


def test_held_back_text_is_released_when_it_can_no_longer_match(tok):
    text = "Hello world, and good night"
    pieces, stop, decoded = stream(tok, text, ("world!", "night owl"))
    assert stop is None
    assert_never_leaks(pieces, decoded)
    ids = tok.encode(text, add_special_tokens=False)
    # "world" stays back while "!" could follow; "," shows it cannot, and releases it with the comma.
    at_comma = [tok.decode([i]) for i in ids].index(",")
    assert "".join(pieces[:at_comma]) == "Hello " and "".join(pieces[: at_comma + 1]) == "Hello world,"
    assert pieces[-1] == "night"  # held back until the end: "night owl" could have followed


def test_the_earliest_stop_wins_and_the_longer_on_a_tie(tok):
    assert stream(tok, "one two three four", ("four", "two"))[1] == "two"
    assert stream(tok, "one two three four", ("two", "two three"))[1] == "two"  # "two" completes first
    pieces, stop, _ = stream(tok, "one two three four", ("tw", "two"))
    assert stop == "two" and "".join(pieces) == "one "  # both complete at " two": same start, the longer


TEXTS = st.text(alphabet=st.sampled_from(list("ab ,.\n") + ["é", "世", "界", "🙂", "ñ"]), min_size=1, max_size=24)


STOP = st.text(alphabet=st.sampled_from(list("ab ,.") + ["é", "世", "🙂"]), min_size=1, max_size=3)
STOPS = st.lists(STOP, max_size=3)


@given(text=TEXTS, stops=STOPS)
@settings(max_examples=150, deadline=None)
def test_streamed_text_equals_the_reference_and_never_leaks(tok, text, stops):
    stops = tuple(stops)
    pieces, stop, _ = stream(tok, text, stops)
    visible, expected_stop = reference(tok, text, stops)
    assert stop == expected_stop
    assert_never_leaks(pieces, visible)


def test_held_back_length():
    assert held_back_length("Hello wor", ("world",)) == 3
    assert held_back_length("Hello", ("world",)) == 0
    assert held_back_length("ab", ("abc", "bx")) == 2
    assert held_back_length("world", ("world",)) == 0  # a whole match is not held back, it is a match


def test_stop_token_ids_and_eos(tok):
    assert stop_token_ids(tok, {7}, ignore_eos=False) == {7} | set(tok.eos_token_ids)
    assert stop_token_ids(tok, {7}, ignore_eos=True) == {7}
    assert stop_token_ids(None, (), ignore_eos=False) == frozenset()


def test_bad_stop_strings_are_refused(tok):
    with pytest.raises(ValueError, match="non-empty strings"):
        TextStream(tok, ("",))
    with pytest.raises(ValueError, match="need a tokenizer"):
        TextStream(None, ("x",))
