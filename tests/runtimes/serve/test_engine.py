"""The serving engine on the embedded SmolLM2 (torch backend): many requests in one batch each get exactly what
`Generator.generate` (`linnet generate`) gives them alone; events, cancellation, the queue and its errors."""

from __future__ import annotations

import asyncio

import pytest

from linnet.runtimes.sampling import SamplingParams
from linnet.runtimes.serve import ContextLengthExceeded, Delta, Finished
from tests.runtimes.serve.conftest import MAX_BATCH, MAX_POSITIONS, PROMPTS, collect, request, solo

pytestmark = [pytest.mark.torch]


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2.step_model()


@pytest.fixture(scope="module")
def tok(smollm2):
    return smollm2.tokenizer()


def test_eight_greedy_prompts_together_give_their_solo_tokens(model, tok, make_engine):
    prompts = [tok.encode(p) for p in PROMPTS]
    assert len(prompts) == MAX_BATCH and len({len(p) for p in prompts}) > 4
    expected = [solo(model, tok, p, SamplingParams(), 16) for p in prompts]

    engine = make_engine(model, tok)
    handles = [engine.submit(request(p, 16)) for p in prompts]
    for handle, want in zip(handles, expected, strict=True):
        deltas, finished = collect(handle)
        assert [t for d in deltas for t in d.token_ids] == want.token_ids
        assert "".join(d.text for d in deltas) == want.text
        assert finished.finish_reason == want.finish_reason
        assert finished.completion_tokens == len(want.token_ids)
        assert finished.prompt_tokens == len(handle_prompt := prompts[handles.index(handle)]) > 0, handle_prompt
        assert finished.ttft_s is not None and finished.e2e_s >= finished.ttft_s >= finished.queued_s >= 0
        assert len(finished.inter_token_s) == want.decode_steps
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.rows_in_use) == (0, 0, 0)
    assert stats.prompt_tokens_total == sum(map(len, prompts))


def test_more_requests_than_rows_wait_and_reuse_rows(model, tok, make_engine):
    prompts = [tok.encode(p) for p in PROMPTS] * 2  # 16 requests, 8 rows: the second half reuses rows
    expected = [solo(model, tok, p, SamplingParams(), 8).token_ids for p in prompts[:MAX_BATCH]] * 2
    engine = make_engine(model, tok)
    handles = [engine.submit(request(p, 8)) for p in prompts]
    got = [[t for d in collect(h)[0] for t in d.token_ids] for h in handles]
    assert got == expected


def test_eos_ends_with_stop_and_ignore_eos_runs_on(model, tok, make_engine):
    prompt = tok.encode("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    want = solo(model, tok, prompt, SamplingParams(), 40)
    assert want.finish_reason == "stop" and want.stop_token_id in tok.eos_token_ids  # the reply ends with EOS
    engine = make_engine(model, tok)
    deltas, finished = collect(engine.submit(request(prompt, 40)))
    assert "".join(d.text for d in deltas) == want.text
    assert (finished.finish_reason, finished.stop_reason) == ("stop", None)

    n = len(want.token_ids) + 3
    deltas, finished = collect(engine.submit(request(prompt, n, ignore_eos=True)))
    assert finished.finish_reason == "length" and finished.completion_tokens == n
    assert [t for d in deltas for t in d.token_ids][: len(want.token_ids) + 1] == [*want.token_ids, want.stop_token_id]


def test_aevents_streams_the_same_as_events(model, tok, make_engine):
    engine = make_engine(model, tok)
    prompts = [tok.encode(p) for p in PROMPTS[:3]]

    async def stream(prompt):
        return [e async for e in engine.submit(request(prompt, 10)).aevents()]

    async def main():
        return await asyncio.gather(*(stream(p) for p in prompts))

    for prompt, events in zip(prompts, asyncio.run(main()), strict=True):
        assert isinstance(events[-1], Finished) and all(isinstance(e, Delta) for e in events[:-1])
        assert [t for e in events[:-1] for t in e.token_ids] == solo(model, tok, prompt, SamplingParams(), 10).token_ids


def test_cancel_frees_the_row_and_ends_with_cancelled(model, tok, make_engine):
    engine = make_engine(model, tok)
    handle = engine.submit(request(tok.encode(PROMPTS[0]), 100))
    events = handle.events()
    assert isinstance(next(events), Delta)
    handle.cancel()
    rest = list(events)
    assert rest[-1].finish_reason == "cancelled" and rest[-1].completion_tokens < 100
    assert engine.stats().rows_in_use == 0


def test_a_consumer_that_stops_reading_cancels(model, tok, make_engine):
    engine = make_engine(model, tok)

    async def first_delta():
        async for event in engine.submit(request(tok.encode(PROMPTS[1]), 100)).aevents():
            return event

    assert isinstance(asyncio.run(first_delta()), Delta)
    follow = engine.submit(request(tok.encode(PROMPTS[2]), 2))  # runs after the cancellation was applied
    collect(follow)
    assert engine.stats().rows_in_use == 0


def test_queue_full_and_context_length_exceeded(model, tok, make_engine):
    engine = make_engine(model, tok, max_queue=2)
    prompt = tok.encode(PROMPTS[0])
    with pytest.raises(ContextLengthExceeded, match=f"more than the {MAX_POSITIONS} positions"):
        engine.submit(request(prompt, MAX_POSITIONS - len(prompt) + 1))
    with pytest.raises(ValueError, match="empty"):
        engine.submit(request([], 4))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit(request([10**6], 4))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit(request(prompt, 0))
    engine.shutdown()  # nothing runs any more: the queue only fills
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit(request(prompt, 4))
