"""Several greedy decode steps of a serving batch in one dispatch (`GreedySteps`, the JAX backends' multi-step
decode on an accelerator, turned on here on the CPU), and several prompts' full chunks prefilled in one step
(`PrefillBatches`): each request still gets the tokens it gets alone, a request that ends inside a dispatch (a stop
token, `max_tokens`) drops the steps past its end, non-finite logits end only their own request, a request arriving
meanwhile is served, and the padded rows of a batched prefill write nothing (both cache layouts)."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.sampling import SamplingParams
from tests.runtimes.conftest import LLAMA, layer_states
from tests.runtimes.serve.conftest import collect, request, solo

pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402
from linnet.runtimes.backends import jax_backend  # noqa: E402
from linnet.runtimes.backends.jax_loop import BATCH_STEPS  # noqa: E402
from tests.runtimes.serve.test_engine_greedy_step import PROMPTS, SMALL  # noqa: E402

SAME_LENGTH = [[5, 17, 3, 40, 2, 9], [88, 41, 9, 12, 60, 2], [7, 8, 1, 1, 50, 3]]


@pytest.fixture(scope="module")
def model():
    return lj.load(LLAMA, config=SMALL, max_batch=4, max_positions=48, random_weights=True, seed=4, progress=False)


def finished_tokens(handle) -> tuple[list[int], object]:
    deltas, finished = collect(handle)
    return [t for d in deltas for t in d.token_ids], finished


class Counting:
    """The step model with multi-step decode on, recording the steps each dispatch ran."""

    def __init__(self, step_model):
        self.inner, self.dispatches = step_model, []
        self.max_batch, self.max_positions, self.vocab_size = (
            step_model.max_batch, step_model.max_positions, step_model.vocab_size
        )  # fmt: skip
        self.max_greedy_steps = step_model.max_greedy_steps

    def step(self, input_ids, positions, rows):
        return self.inner.step(input_ids, positions, rows)

    def step_greedy(self, input_ids, positions, rows):
        return self.inner.step_greedy(input_ids, positions, rows)

    def step_greedy_steps(self, input_ids, positions, rows, steps):
        self.dispatches.append(steps)
        return self.inner.step_greedy_steps(input_ids, positions, rows, steps)


def test_multi_step_decode_gives_each_request_its_solo_tokens(model, make_engine):
    """Lengths that are not multiples of the dispatch's steps (the last dispatch runs fewer), and a request whose
    max_tokens ends inside a dispatch that others continue past."""
    step_model = Counting(model.step_model(decode_loop=True))
    assert step_model.max_greedy_steps == BATCH_STEPS
    lengths = [BATCH_STEPS * 2 + 3, 5, BATCH_STEPS + 1, 11]
    expected = [solo(model.step_model(), None, p, SamplingParams(), n).token_ids for p, n in zip(PROMPTS, lengths)]
    engine = make_engine(step_model, None, start=False)
    handles = [engine.submit(request(p, n)) for p, n in zip(PROMPTS, lengths, strict=True)]
    engine.start()
    got = [finished_tokens(h) for h in handles]
    assert [tokens for tokens, _ in got] == expected
    assert all(f.finish_reason == "length" for _, f in got)
    assert max(step_model.dispatches) == BATCH_STEPS and 1 < len(step_model.dispatches)


def test_a_stop_token_inside_a_dispatch_ends_its_request_there(model, make_engine):
    alone = solo(model.step_model(), None, PROMPTS[1], SamplingParams(), 12).token_ids
    stop = alone[4]  # the 5th token: inside the first multi-step dispatch
    first = alone.index(stop)
    step_model = Counting(model.step_model(decode_loop=True))
    engine = make_engine(step_model, None, start=False)
    stopped = engine.submit(request(PROMPTS[1], 12, stop_token_ids=[stop]))
    other = engine.submit(request(PROMPTS[0], 12))
    engine.start()
    tokens, finished = finished_tokens(stopped)
    assert tokens == alone[:first] and finished.finish_reason == "stop" and finished.stop_reason == stop
    assert finished_tokens(other)[0] == solo(model.step_model(), None, PROMPTS[0], SamplingParams(), 12).token_ids
    assert any(n > 1 for n in step_model.dispatches)


def test_non_finite_logits_inside_a_dispatch_end_only_their_request(model, make_engine):
    """Row 1's logits are NaN from the 3rd step of the first multi-step dispatch: its request ends with the
    runner's error at that position, after the two tokens before it; the other request is not touched."""
    inner = model.step_model(decode_loop=True)

    class NanInRowOne(Counting):
        def step_greedy_steps(self, input_ids, positions, rows, steps):
            tokens, bad = super().step_greedy_steps(input_ids, positions, rows, steps)
            if len(self.dispatches) == 1:
                bad = np.array(bad)
                bad[1, 2] = (5, 0)
                self.nan_position = int(positions[1]) + 2
            return tokens, bad

    step_model = NanInRowOne(inner)
    engine = make_engine(step_model, None, start=False)
    handles = [engine.submit(request(p, 10)) for p in PROMPTS[:2]]
    engine.start()
    healthy, failed = finished_tokens(handles[0]), finished_tokens(handles[1])
    assert healthy[0] == solo(model.step_model(), None, PROMPTS[0], SamplingParams(), 10).token_ids
    assert failed[1].finish_reason == "error"
    assert f"NaN (5 of 96 values) at position {step_model.nan_position} (row 1" in failed[1].error
    alone = solo(model.step_model(), None, PROMPTS[1], SamplingParams(), 10).token_ids
    assert failed[0] == alone[: len(failed[0])] and len(failed[0]) == 1 + 2  # the prefill's token and two steps


def test_a_request_arriving_during_multi_step_decode_is_served(model, make_engine):
    expected_first = solo(model.step_model(), None, PROMPTS[0], SamplingParams(), 30).token_ids
    expected_late = solo(model.step_model(), None, PROMPTS[3], SamplingParams(), 6).token_ids
    step_model = Counting(model.step_model(decode_loop=True))
    engine = make_engine(step_model, None)  # the engine's thread owns the model from here
    first = engine.submit(request(PROMPTS[0], 30))
    events = first.events()
    began = next(events).token_ids  # decoding has begun
    late = engine.submit(request(PROMPTS[3], 6))
    assert finished_tokens(late)[0] == expected_late
    assert began + [t for e in events for t in getattr(e, "token_ids", [])] == expected_first


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("layout", ["flat", "token_major"])
def test_batched_prefill_pads_to_its_bucket_and_writes_only_its_own_rows(layout, scan, monkeypatch):
    """3 prompts' chunks prefilled as one step of 4 rows (batch buckets), the 4th pointing past the cache: row 3's
    cache is untouched (a dynamic-update-slice would have clamped the block onto it), and each row's logits are
    those of its prompt prefilled alone (within f32 rounding: the dots run at another batch size)."""
    monkeypatch.setattr(jax_backend, "cache_layout_for", lambda device: layout)
    m = lj.load(
        LLAMA, config=SMALL, max_batch=4, max_positions=32, random_weights=True, seed=6, progress=False,
        scan_layers=scan,
    )  # fmt: skip
    sm = m.step_model(batch_buckets=True)
    i64 = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    sm.step(i64([9, 9, 9, 9, 9, 9]), i64(0), i64(3))  # row 3 holds something
    # scanned, the writes go through the stacked caches' lead index (`model.layers.*.…`)
    assert all((".*." in k) == scan for k in m.state)
    before = layer_states(m.state)
    logits = sm.step(np.array(SAME_LENGTH, dtype=np.int64), i64(0, 0, 0), i64(0, 1, 2))
    assert (4, jax_backend.bucket_for(5, 32)) in sm.compiled_shapes  # padded to the power of two
    after = layer_states(m.state)
    assert after.keys() == before.keys() and len(after) == 2 * SMALL["num_hidden_layers"]
    for k, v in after.items():
        rows_of_3 = slice(3, 4) if layout == "token_major" else slice(3 * SMALL["num_key_value_heads"], None)
        assert np.array_equal(v[rows_of_3], before[k][rows_of_3]), k
    for b, prompt in enumerate(SAME_LENGTH):
        alone = m.step_model(batch_buckets=False).step(np.array([prompt], dtype=np.int64), i64(0), i64(b))
        np.testing.assert_allclose(logits[b], alone[0], atol=1e-4)


def test_the_engine_prefills_equal_chunks_together_where_the_model_compiled_them(model, make_engine):
    """`warm_up` compiles the steps of as many full chunks as the step's budget holds (`warm_up_prefill`); three
    prompts of one chunk each then prefill in one step, and each gets its solo tokens."""
    sm = model.step_model(batch_buckets=True)
    calls = []
    original = sm.step

    def step(input_ids, positions, rows):
        calls.append(input_ids.shape)
        return original(input_ids, positions, rows)

    sm.step = step
    engine = make_engine(sm, None, start=False, prefill_chunk=6, step_token_budget=3 * 6 + 4)
    engine.warm_up()
    assert sm.prefill_batch(6) == 4 and sm.prefill_batch(5) == 1
    calls.clear()
    handles = [engine.submit(request(p, 5)) for p in SAME_LENGTH]
    engine.start()
    got = [finished_tokens(h)[0] for h in handles]
    assert (3, 6) in calls  # one step for the three prompts
    assert got == [solo(model.step_model(), None, p, SamplingParams(), 5).token_ids for p in SAME_LENGTH]


def test_the_scanned_layers_serve_the_tokens_of_the_unrolled_ones(make_engine):
    """The multi-step decode (`jax_loop.BatchSteps`) and the batched prefill call the step whose layers run as one
    `lax.scan`: served together, each prompt gets the tokens the same weights give unrolled (`scan_layers=False`)."""
    model, unrolled = (
        lj.load(
            LLAMA,
            config=SMALL,
            max_batch=4,
            max_positions=48,
            random_weights=True,
            seed=4,
            progress=False,
            scan_layers=scan,
        )  # fmt: skip
        for scan in (True, False)
    )
    assert all(".*." in k for k in model.state) and not any(".*." in k for k in unrolled.state)
    lengths = [BATCH_STEPS + 3, 7, 12]
    expected = [
        solo(unrolled.step_model(), None, p, SamplingParams(), n).token_ids for p, n in zip(SAME_LENGTH, lengths)
    ]
    sm = model.step_model(decode_loop=True, batch_buckets=True)
    calls = []
    step, steps = sm.step, sm.step_greedy_steps
    sm.step = lambda input_ids, *a: calls.append(input_ids.shape) or step(input_ids, *a)
    sm.step_greedy_steps = lambda input_ids, *a: calls.append(a[-1]) or steps(input_ids, *a)
    engine = make_engine(sm, None, start=False, prefill_chunk=6, step_token_budget=3 * 6 + 4)
    engine.warm_up()
    calls.clear()
    handles = [engine.submit(request(p, n)) for p, n in zip(SAME_LENGTH, lengths, strict=True)]
    engine.start()
    assert [finished_tokens(h)[0] for h in handles] == expected
    assert (3, 6) in calls and any(isinstance(c, int) and c > 1 for c in calls)  # batched prefill, multi-step
