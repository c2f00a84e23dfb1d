"""Greedy decode steps run on the device many per dispatch (`jax_loop.GreedyLoop`, the runner's `DecodeLoop`), on
the CPU with the loop turned on: each token is the argmax of the stand-alone step's logits for the same sequence
(teacher-forced, within a rounding tolerance: the loop compiles the step anew), generations that cross chunks, stop
mid-chunk or fill the row end as the per-token path's do, and non-finite logits raise the runner's RunError at the
same position."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.errors import RunError
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import LLAMA, layer_states

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402
from linnet.runtimes.backends.jax_loop import CHUNK  # noqa: E402
from linnet.runtimes.generation import Generator  # noqa: E402
from linnet.runtimes.sampling import SamplingParams  # noqa: E402

SMALL = {
    "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2,
}  # fmt: skip
MAX_POSITIONS = 128
# the loop's step is compiled anew inside a while loop: its logits may differ from the stand-alone step's in the
# last bits, so a loop token must be the stand-alone argmax up to this much (f32 logits of about 0.1)
ARGMAX_TOL = 1e-5


@pytest.fixture(scope="module", params=["generated", "stablehlo"])
def model(request):
    return lj.load(
        LLAMA, config=SMALL, mode=request.param, max_positions=MAX_POSITIONS, random_weights=True, seed=3,
        progress=False,
    )  # fmt: skip


def teacher_forced_gaps(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """For each generated token, how far its logit is below the stand-alone step's maximum, that step fed the
    prompt and the tokens before it (the per-token path, row 0)."""
    sm = model.step_model(decode_loop=False)
    one = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    logits = sm.step(np.array([prompt], dtype=np.int64), one(0), one(0))[0]
    gaps = []
    for k, token in enumerate(tokens):
        gaps.append(float(logits.max() - logits[token]))
        logits = sm.step(one([token]), one(len(prompt) + k), one(0))[0]
    return gaps


def test_the_loop_runs_on_the_cpu_only_when_asked(model):
    assert model.step_model().decode_greedy is None  # the CPU's default: a token a round trip
    assert model.step_model(decode_loop=True).decode_greedy is not None


@pytest.mark.parametrize("new", [1, 2, CHUNK, CHUNK + 1, 2 * CHUNK + 7])
def test_each_token_is_the_argmax_of_the_stand_alone_step(model, new):
    prompt = [5, 17, 2, 40, 9]
    loop = Generator(model.step_model(decode_loop=True), None).generate(prompt, SamplingParams(max_new_tokens=new))
    assert loop.finish_reason == "length" and len(loop.token_ids) == new
    assert loop.decode_steps == new - 1
    assert max(teacher_forced_gaps(model, prompt, loop.token_ids)) <= ARGMAX_TOL
    host = Generator(model.step_model(decode_loop=False), None).generate(prompt, SamplingParams(max_new_tokens=new))
    gaps = teacher_forced_gaps(model, prompt, host.token_ids)
    assert max(gaps) == 0.0  # the per-token path takes the argmax of exactly these logits


def test_a_stop_token_mid_chunk_ends_as_on_the_per_token_path(model):
    prompt = [1, 2, 3]
    host = Generator(model.step_model(decode_loop=False), None).generate(prompt, SamplingParams(max_new_tokens=50))
    stop = host.token_ids[CHUNK + 3]  # in the second chunk
    first = host.token_ids.index(stop)
    params = SamplingParams(max_new_tokens=50, stop_token_ids=frozenset({stop}))
    loop = Generator(model.step_model(decode_loop=True), None).generate(prompt, params)
    assert max(teacher_forced_gaps(model, prompt, loop.token_ids + [loop.stop_token_id])) <= ARGMAX_TOL
    if loop.token_ids == host.token_ids[:first]:  # (the same tokens unless a near-tie flipped one)
        assert (loop.finish_reason, loop.stop_token_id, loop.decode_steps) == ("stop", stop, first)


def test_a_full_row_ends_with_length(model):
    prompt = [i % SMALL["vocab_size"] for i in range(1, MAX_POSITIONS - 10)]
    loop = Generator(model.step_model(decode_loop=True), None).generate(prompt, SamplingParams(max_new_tokens=100))
    assert loop.finish_reason == "length" and len(prompt) + len(loop.token_ids) == MAX_POSITIONS


def test_stream_text_gives_the_tokens_as_they_come(model):
    class Digits:
        eos_token_ids: set[int] = set()

        def decode(self, ids, skip_special_tokens=True):
            return "".join(f"<{i}>" for i in ids)

    g = Generator(model.step_model(decode_loop=True), Digits())
    pieces = list(g.stream_text([4, 4, 4], SamplingParams(max_new_tokens=40)))
    assert "".join(pieces) == Digits().decode(g.last_result.token_ids)
    assert len(pieces) == 40


def test_non_finite_logits_raise_at_the_same_position_as_the_per_token_path():
    """GPT-2's learned position table with row 20 made NaN: the step at position 20 gives NaN logits (past the padded
    prefill's bucket, positions 0..15, whose padding would carry the NaN into the prompt's attention)."""
    messages = []
    for loop in (False, True):  # a model each: the failed step leaves NaN in its row's cache
        m = lj.load(
            EXAMPLES / "gpt2.linnet", config={"vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 2,
            "n_head": 4}, max_positions=32, random_weights=True, seed=0, progress=False,
        )  # fmt: skip
        key = next(k for k in m.params if k.endswith("wpe.weight"))
        m.params[key] = m.params[key].at[20].set(np.nan)
        g = Generator(m.step_model(decode_loop=loop), None)
        with pytest.raises(RunError) as err:
            g.generate([1, 2, 3], SamplingParams(max_new_tokens=20))
        messages.append(str(err.value))
    for text in messages:
        assert "NaN" in text and "position 20 (row 0, decode step 18)" in text, text


@pytest.mark.parametrize("mode", ["generated", "stablehlo"])
def test_a_decode_batch_padded_to_its_bucket_writes_only_its_own_rows(mode):
    """`batch_buckets` (on by default on an accelerator): 3 rows decode as 4, the fourth pointing past the cache.
    Its write is dropped (row 3's cache is untouched), and the 3 rows' logits are the bits of a real 4-row step's
    first rows (the same executable; a row's dot reads only its own input)."""
    m = lj.load(
        LLAMA, config=SMALL, mode=mode, max_batch=4, max_positions=32, random_weights=True, seed=5, progress=False
    )
    bucketed = m.step_model(batch_buckets=True)
    assert [bucketed.decode_batch(b) for b in (1, 2, 3, 4)] == [1, 2, 4, 4]
    assert m.step_model().decode_batch(3) == 3  # the CPU's default: no padding
    i64 = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    for row in range(4):
        bucketed.step(i64([1 + row, 2, 3]), i64(0), i64(row))
    held = {k: np.asarray(v) for k, v in m.state.items()}
    before = layer_states(held)
    logits = bucketed.step(i64([7], [8], [9]), i64(3, 3, 3), i64(0, 1, 2))
    assert logits.shape == (3, SMALL["vocab_size"])
    heads = SMALL["num_key_value_heads"]
    after = layer_states(m.state)
    assert len(after) == 2 * SMALL["num_hidden_layers"]
    for k, v in after.items():  # held [max_batch * H_kv, T, D]: row 3 is the last H_kv
        assert np.array_equal(v[3 * heads :], before[k][3 * heads :]), k
        assert not np.array_equal(v[: 3 * heads, 3], before[k][: 3 * heads, 3]), k
    m.state = {k: m.put_input(v) for k, v in held.items()}  # the same cache again, then a real 4-row step
    full = m.step_model(batch_buckets=False).step(i64([7], [8], [9], [10]), i64(3, 3, 3, 3), i64(0, 1, 2, 3))
    assert np.array_equal(logits, full[:3])
