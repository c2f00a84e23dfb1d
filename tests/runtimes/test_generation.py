"""`linnet.runtimes.generation`: the runner over a toy numpy language model with a real per-row KV cache, checked
against the same model recomputed without a cache; batching, stop conditions, the cache limit, streaming text."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.generation import Generator, IncrementalDetokenizer, StepModel
from linnet.runtimes.sampling import SamplingParams

# ---- a toy language model -----------------------------------------------------------------------------------


class ToyLM:
    """One attention layer in numpy with a real KV cache of `[max_batch, max_positions, dim]` per K and V.

    A token t at position p has `x = emb[t] + pos[p]`; its key and value `x @ wk`, `x @ wv` are written to the
    cache of its row at p; its output attends (softmax of q.k / sqrt(dim)) over the row's positions 0..p and
    the logits are `tanh(x + attention) @ wo`. The cache starts as NaN, so reading a position nobody wrote poisons
    the logits. `forward(ids)` recomputes every position from scratch, no cache: the reference."""

    def __init__(self, vocab: int = 40, dim: int = 16, max_batch: int = 4, max_positions: int = 32, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.vocab_size, self.max_batch, self.max_positions, self.dim = vocab, max_batch, max_positions, dim
        self.emb = rng.normal(size=(vocab, dim))
        self.pos = rng.normal(size=(max_positions, dim)) * 0.5
        self.wq, self.wk, self.wv = (rng.normal(size=(dim, dim)) / np.sqrt(dim) for _ in range(3))
        self.wo = rng.normal(size=(dim, vocab)) * 2
        self.k_cache = np.full((max_batch, max_positions, dim), np.nan)
        self.v_cache = np.full((max_batch, max_positions, dim), np.nan)
        self.calls: list[tuple[tuple[int, int], list[int], list[int]]] = []
        self.returned: list[np.ndarray] = []

    def _out(self, x: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        scores = keys @ (x @ self.wq) / np.sqrt(self.dim)
        weights = np.exp(scores - scores.max())
        return np.tanh(x + (weights / weights.sum()) @ values) @ self.wo

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        assert input_ids.dtype == positions.dtype == rows.dtype == np.int64
        batch, length = input_ids.shape
        assert positions.shape == rows.shape == (batch,) and 1 <= batch <= self.max_batch
        assert len(set(rows.tolist())) == batch, "two entries of one step share a cache row"
        self.calls.append(((batch, length), positions.tolist(), rows.tolist()))
        logits = np.empty((batch, self.vocab_size), dtype=np.float32)
        for b in range(batch):
            row, first = int(rows[b]), int(positions[b])
            assert 0 <= row < self.max_batch
            assert 0 <= first and first + length <= self.max_positions, "write past the cache"
            for s in range(length):
                p = first + s
                x = self.emb[input_ids[b, s]] + self.pos[p]
                self.k_cache[row, p], self.v_cache[row, p] = x @ self.wk, x @ self.wv
                out = self._out(x, self.k_cache[row, : p + 1], self.v_cache[row, : p + 1])
            logits[b] = out
        self.returned.append(logits.copy())
        return logits

    def forward(self, ids: list[int]) -> np.ndarray:
        """f32 `[S, V]`: logits at every position of `ids`, recomputed from scratch."""
        xs = np.stack([self.emb[t] + self.pos[p] for p, t in enumerate(ids)])
        keys, values = xs @ self.wk, xs @ self.wv
        return np.stack([self._out(xs[p], keys[: p + 1], values[: p + 1]) for p in range(len(ids))]).astype(np.float32)


class ScriptLM:
    """Returns logits that make `script[p]` the next token after the token at position p (regardless of the
    tokens; `script` may also be one list per cache row), and checks that nothing is written past
    `max_positions`."""

    def __init__(self, script: list, vocab: int, max_positions: int = 64, max_batch: int = 2):
        self.script, self.vocab_size, self.max_positions, self.max_batch = script, vocab, max_positions, max_batch
        self.calls: list[tuple[tuple[int, int], list[int], list[int]]] = []

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        batch, length = input_ids.shape
        self.calls.append(((batch, length), positions.tolist(), rows.tolist()))
        logits = np.zeros((batch, self.vocab_size), dtype=np.float32)
        for b in range(batch):
            last = int(positions[b]) + length - 1
            assert last < self.max_positions, "write past the cache"
            script = self.script[int(rows[b])] if isinstance(self.script[0], list) else self.script
            logits[b, script[last]] = 10.0
        return logits


class NamesTokenizer:
    """Token t decodes to "t<t> "; no EOS unless given."""

    def __init__(self, eos: set[int] | None = None):
        self.eos_token_ids = set(eos or ())

    def encode(self, text: str) -> list[int]:
        return [int(word[1:]) for word in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"t{t} " for t in ids if not (skip_special_tokens and t in self.eos_token_ids))


class BytesTokenizer:
    """Ids 0..255 are single bytes; 256 is EOS (special); 257.. are multi-byte pieces from `extra`."""

    EOS = 256

    def __init__(self, extra: list[bytes] = ()):
        self.pieces = [bytes([i]) for i in range(256)] + [b"<eos>"] + list(extra)
        self.eos_token_ids = {self.EOS}

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        data = b"".join(self.pieces[t] for t in ids if not (skip_special_tokens and t == self.EOS))
        return data.decode("utf-8", errors="replace")


def script_after(prompt_len: int, tokens: list[int], filler: int = 0, total: int = 64) -> list[int]:
    """A script where the tokens generated after a prompt of `prompt_len` are `tokens`, then `filler`."""
    script = [filler] * total
    script[prompt_len - 1 : prompt_len - 1 + len(tokens)] = tokens
    return script


PROMPT = [3, 17, 5, 9, 22, 1]


def test_toy_models_satisfy_the_protocol():
    assert isinstance(ToyLM(), StepModel)
    assert isinstance(ScriptLM([0], 4), StepModel)


# ---- cached decode equals uncached recompute -----------------------------------------------------------------


@pytest.mark.parametrize("prefill_chunk", [None, 1, 4])
def test_cached_greedy_decode_matches_uncached_recompute(prefill_chunk):
    model = ToyLM()
    runner = Generator(model, NamesTokenizer(), prefill_chunk=prefill_chunk)
    result = runner.generate(PROMPT, SamplingParams(max_new_tokens=20))
    assert result.finish_reason == "length" and len(result.token_ids) == 20
    assert len(set(result.token_ids)) > 3, "the toy model should not be degenerate"
    step_logits = model.returned[-20:]  # the prefill's last step, then one per decode step
    for i, token in enumerate(result.token_ids):
        reference = model.forward(PROMPT + result.token_ids[:i])[-1]
        assert int(np.argmax(reference)) == token, f"token {i} differs from the uncached model"
        np.testing.assert_allclose(step_logits[i][0], reference, rtol=1e-5, atol=1e-5)


def test_sampled_decode_matches_uncached_recompute():
    model = ToyLM(seed=1)
    params = SamplingParams(temperature=0.9, top_k=10, top_p=0.9, seed=5, max_new_tokens=15)
    result = Generator(model, NamesTokenizer()).generate(PROMPT, params)
    from linnet.runtimes.sampling import sample

    rng = params.make_rng()
    for i, token in enumerate(result.token_ids):
        reference = model.forward(PROMPT + result.token_ids[:i])[-1:]
        assert int(sample(reference, params, rng)[0]) == token


def test_prefill_and_decode_step_shapes():
    model = ToyLM()
    Generator(model, NamesTokenizer()).generate(PROMPT, SamplingParams(max_new_tokens=4), row=2)
    assert model.calls == [
        ((1, 6), [0], [2]),
        ((1, 1), [6], [2]),
        ((1, 1), [7], [2]),
        ((1, 1), [8], [2]),
    ]


def test_chunked_prefill_steps_at_the_right_positions():
    model = ToyLM()
    plain = Generator(ToyLM(), NamesTokenizer()).generate(PROMPT + [7, 8, 2], SamplingParams(max_new_tokens=6))
    chunked = Generator(model, NamesTokenizer(), prefill_chunk=4).generate(
        PROMPT + [7, 8, 2], SamplingParams(max_new_tokens=6)
    )
    assert chunked.token_ids == plain.token_ids
    assert [call for call in model.calls if call[0][1] > 1 or call[1][0] < 9] == [
        ((1, 4), [0], [0]),
        ((1, 4), [4], [0]),
        ((1, 1), [8], [0]),
    ]


def test_a_reused_row_gives_what_a_fresh_model_gives():
    model = ToyLM()
    runner = Generator(model, NamesTokenizer())
    runner.generate(list(range(20)), SamplingParams(max_new_tokens=8))  # leaves stale entries up to position 27
    again = runner.generate(PROMPT, SamplingParams(max_new_tokens=10))
    fresh = Generator(ToyLM(), NamesTokenizer()).generate(PROMPT, SamplingParams(max_new_tokens=10))
    assert again.token_ids == fresh.token_ids


def test_same_seed_same_tokens_different_seed_different_tokens():
    def run(seed):
        params = SamplingParams(temperature=1.5, seed=seed, max_new_tokens=20)
        return Generator(ToyLM(), NamesTokenizer()).generate(PROMPT, params).token_ids

    assert run(11) == run(11)
    assert run(11) != run(12)


# ---- batching ------------------------------------------------------------------------------------------------


def test_generate_batch_gives_each_row_what_generate_gives_it_alone():
    prompts = [[4, 8, 15], [16, 23, 42 % 40, 7, 1, 30, 2]]
    params = [
        SamplingParams(max_new_tokens=6),
        SamplingParams(temperature=1.2, top_k=8, seed=3, max_new_tokens=11),
    ]
    model = ToyLM()
    batch = Generator(model, NamesTokenizer()).generate_batch(prompts, params)
    for row, (prompt, p) in enumerate(zip(prompts, params)):
        alone = Generator(ToyLM(), NamesTokenizer()).generate(prompt, p, row=row)
        alone_row0 = Generator(ToyLM(), NamesTokenizer()).generate(prompt, p)
        assert batch[row].token_ids == alone.token_ids == alone_row0.token_ids
        assert batch[row].text == alone.text
        assert batch[row].finish_reason == "length" and batch[row].row == row
        assert batch[row].prompt_tokens == len(prompt)
    # two separate prefills, then decode steps over both rows, then over row 1 alone once row 0 is done
    assert model.calls[:2] == [((1, 3), [0], [0]), ((1, 7), [0], [1])]
    decode = model.calls[2:]
    assert [c[0] for c in decode] == [(2, 1)] * 5 + [(1, 1)] * 5
    assert decode[0][1:] == ([3, 7], [0, 1])
    assert decode[5][1:] == ([12], [1])
    assert batch[0].decode_steps == 5 and batch[1].decode_steps == 10


def test_generate_batch_with_one_params_and_stops():
    # Row 0's prompt has 2 tokens, row 1's has 4: row 0 draws EOS as its 3rd token, row 1 never does.
    tok = BytesTokenizer()
    scripts = [script_after(2, [ord("a"), ord("b"), tok.EOS]), script_after(4, [ord("b")], filler=ord("z"))]
    model = ScriptLM(scripts, tok.vocab_size, max_positions=10)
    results = Generator(model, tok).generate_batch([[1, 2], [1, 2, 3, 4]], SamplingParams(max_new_tokens=50))
    assert results[0].text == "ab" and results[0].finish_reason == "stop" and results[0].stop_token_id == tok.EOS
    assert results[1].finish_reason == "length"  # the cache is full: 4 prompt + 6 new = 10 positions
    assert len(results[1].token_ids) == 6 and results[1].text == "b" + "z" * 5
    assert [call[0][0] for call in model.calls] == [1, 1, 2, 2, 1, 1, 1]  # row 0 drops out after its EOS


def test_generate_batch_errors():
    runner = Generator(ToyLM(max_batch=2), NamesTokenizer())
    assert runner.generate_batch([], SamplingParams()) == []
    with pytest.raises(ValueError, match="3 prompts do not fit the cache compiled for 2 rows"):
        runner.generate_batch([[1], [2], [3]], SamplingParams())
    with pytest.raises(ValueError, match="prompt 1: the prompt is empty"):
        runner.generate_batch([[1], []], SamplingParams())
    with pytest.raises(ValueError, match="2 prompts"):
        runner.generate_batch([[1], [2]], [SamplingParams()])


# ---- stop conditions -----------------------------------------------------------------------------------------


def test_stops_at_eos_without_it_in_the_text():
    tok = BytesTokenizer()
    prompt = tok.encode("hi")
    model = ScriptLM(script_after(len(prompt), [*b"ok!", tok.EOS, *b"never"]), tok.vocab_size)
    seen = []
    result = Generator(model, tok).generate(prompt, SamplingParams(max_new_tokens=50), on_token=seen.append)
    assert result.finish_reason == "stop" and result.stop_token_id == tok.EOS
    assert result.text == "ok!" and result.token_ids == list(b"ok!") == seen
    assert len(model.calls) == 4  # prefill, then 3 decode steps (the last one draws EOS)


def test_stops_at_a_stop_token_id():
    tok = BytesTokenizer()
    model = ScriptLM(script_after(1, [*b"one\ntwo"]), tok.vocab_size)
    result = Generator(model, tok).generate([65], SamplingParams(stop_token_ids={ord("\n")}))
    assert (result.text, result.finish_reason, result.stop_token_id) == ("one", "stop", ord("\n"))


def test_eos_as_first_token():
    tok = BytesTokenizer()
    model = ScriptLM(script_after(1, [tok.EOS]), tok.vocab_size)
    result = Generator(model, tok).generate([65], SamplingParams())
    assert (result.token_ids, result.text, result.finish_reason, result.decode_steps) == ([], "", "stop", 0)


def test_max_new_tokens_finishes_with_length():
    model = ToyLM()
    result = Generator(model, NamesTokenizer()).generate(PROMPT, SamplingParams(max_new_tokens=7))
    assert result.finish_reason == "length" and len(result.token_ids) == 7
    assert len(model.calls) == 7  # prefill + 6 decode steps: the 7th token is never fed back
    assert result.text == "".join(f"t{t} " for t in result.token_ids)


def test_a_full_cache_finishes_with_length_and_never_writes_past_it():
    model = ToyLM(max_positions=10)
    result = Generator(model, NamesTokenizer()).generate(PROMPT, SamplingParams(max_new_tokens=100))
    assert result.finish_reason == "length" and len(result.token_ids) == 4  # 6 + 4 = 10 positions
    assert max(call[1][0] + call[0][1] for call in model.calls) == 9  # the last token sits at 9, never fed back


def test_a_prompt_of_max_positions_minus_one_gets_one_token():
    model = ToyLM(max_positions=7)
    result = Generator(model, NamesTokenizer()).generate(PROMPT, SamplingParams(max_new_tokens=100))
    assert result.finish_reason == "length" and len(result.token_ids) == 1 and len(model.calls) == 1


def test_prompt_errors():
    runner = Generator(ToyLM(max_positions=6), NamesTokenizer())
    with pytest.raises(
        ValueError,
        match=r"prompt of 6 tokens does not fit the cache compiled for 6 positions \(--max-positions\): it needs at "
        r"least 7, one position more than the prompt for a generated token",
    ):
        runner.generate(PROMPT, SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        runner.generate([], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        runner.generate([1, 40], SamplingParams())
    with pytest.raises(ValueError, match="row 4"):
        runner.generate([1], SamplingParams(), row=4)
    with pytest.raises(ValueError, match="empty"):
        runner.stream_text([], SamplingParams())


def test_model_and_option_errors():
    with pytest.raises(ValueError, match="max_positions"):
        Generator(ToyLM(max_positions=1), NamesTokenizer())
    with pytest.raises(ValueError, match="prefill_chunk"):
        Generator(ToyLM(), NamesTokenizer(), prefill_chunk=0)

    class Wrong(ToyLM):
        def step(self, input_ids, positions, rows):
            return super().step(input_ids, positions, rows)[:, :-1]

    with pytest.raises(ValueError, match=r"logits of shape \(1, 39\), expected \(1, 40\)"):
        Generator(Wrong(), NamesTokenizer()).generate(PROMPT, SamplingParams())


def test_timings():
    result = Generator(ToyLM(), NamesTokenizer()).generate(PROMPT, SamplingParams(max_new_tokens=5))
    assert result.prompt_tokens == 6 and result.decode_steps == 4
    assert result.prefill_s > 0 and result.decode_s > 0
    assert result.decode_tokens_per_s == pytest.approx(4 / result.decode_s)


# ---- streaming text ------------------------------------------------------------------------------------------


def test_stream_text_waits_for_whole_characters():
    tok = BytesTokenizer()
    text = "añ€😀 ok"
    model = ScriptLM(script_after(1, [*text.encode("utf-8"), tok.EOS]), tok.vocab_size)
    runner = Generator(model, tok)
    pieces = list(runner.stream_text([65], SamplingParams(max_new_tokens=50)))
    assert pieces == ["a", "ñ", "€", "😀", " ", "o", "k"]
    assert "".join(pieces) == runner.last_result.text == text
    assert runner.last_result.finish_reason == "stop"


def test_stream_text_with_tokens_that_split_a_character_inside_them():
    # 257 = b"x\xf0\x9f" (an ASCII letter and the first half of 😀), 258 = b"\x98\x80y" (its second half)
    tok = BytesTokenizer(extra=[b"x\xf0\x9f", b"\x98\x80y"])
    model = ScriptLM(script_after(1, [257, 258, *b"\xe2\x82", 259, tok.EOS]), tok.vocab_size + 1)
    tok.pieces.append(b"\xac!")  # 259 completes the euro sign
    runner = Generator(model, tok)
    pieces = list(runner.stream_text([65], SamplingParams()))
    assert "".join(pieces) == runner.last_result.text == "x😀y€!"
    assert not any("\ufffd" in piece for piece in pieces)
    assert pieces == ["x😀y", "€!"]


def test_stream_text_cut_inside_a_character_flushes_the_rest():
    tok = BytesTokenizer()
    model = ScriptLM(script_after(1, [*"ab€".encode("utf-8")]), tok.vocab_size)
    runner = Generator(model, tok)
    pieces = list(runner.stream_text([65], SamplingParams(max_new_tokens=4)))  # stops after b"\xe2\x82"
    assert runner.last_result.finish_reason == "length"
    assert "".join(pieces) == runner.last_result.text == "ab\ufffd"


def test_stream_text_equals_generate_text_on_the_toy_model():
    params = SamplingParams(temperature=1.0, seed=9, max_new_tokens=25)
    runner = Generator(ToyLM(), NamesTokenizer())
    pieces = list(runner.stream_text(PROMPT, params))
    assert "".join(pieces) == runner.last_result.text
    assert runner.last_result.token_ids == Generator(ToyLM(), NamesTokenizer()).generate(PROMPT, params).token_ids


def test_incremental_detokenizer_with_special_tokens_skipped():
    tok = BytesTokenizer()
    detok = IncrementalDetokenizer(tok)
    out = [detok.push(t) for t in [*b"a", tok.EOS, *"é".encode("utf-8"), *b"b"]]
    assert out == ["a", "", "", "é", "b"]
    assert detok.flush() == ""


class PoisonedLM(ToyLM):
    """ToyLM whose logits turn NaN (or Inf) from position `at` on, as an f16 overflow or NaN weights would."""

    def __init__(self, at: int, value: float = np.nan, **kw):
        super().__init__(**kw)
        self.at, self.value = at, value

    def step(self, input_ids, positions, rows):
        logits = super().step(input_ids, positions, rows)
        for b in range(len(rows)):
            if int(positions[b]) + input_ids.shape[1] - 1 >= self.at:
                logits[b, 3] = self.value
        return logits


@pytest.mark.parametrize("value, kind", [(np.nan, "NaN"), (np.inf, "Inf")])
def test_non_finite_logits_are_refused_naming_position_and_step(value, kind):
    """NaN logits used to sample token 0 or an argmax anyway: empty text, exit 0. Now a RunError (a ValueError,
    which the CLI reports in one line) names the position and the step."""
    from linnet.errors import RunError

    gen = Generator(PoisonedLM(at=6, value=value), None)
    with pytest.raises(RunError) as e:
        gen.generate([1, 2, 3, 4], SamplingParams(max_new_tokens=10))  # prefill ends at 3; decode step 3 is at 6
    assert f"logits hold {kind} (1 of 40 values) at position 6 (row 0, decode step 3)" in str(e.value)
    with pytest.raises(RunError, match=r"at position 7 \(row 0, the prefill\)"):
        gen.generate(list(range(1, 9)), SamplingParams(max_new_tokens=2))
    with pytest.raises(RunError, match=r"at position 6 \(row 1, decode step 3\)"):
        gen.generate_batch([[1, 2, 3], [1, 2, 3, 4]], SamplingParams(max_new_tokens=10))
    assert Generator(PoisonedLM(at=64), None).generate([1, 2], SamplingParams(max_new_tokens=5)).token_ids  # finite


def test_the_finiteness_check_costs_little():
    """The check is one isfinite().all() over [B, V]: for a 49k vocabulary, well under 0.1 ms a step."""
    import time

    logits = np.random.default_rng(0).standard_normal((1, 49152)).astype(np.float32)
    start = time.perf_counter()
    for _ in range(100):
        np.isfinite(logits).all()
    assert (time.perf_counter() - start) / 100 < 1e-3
