"""The serving engine on the embedded SmolLM2 (torch backend): many requests in one batch each get exactly what
`Generator.generate` (`linnet generate`) gives them alone, greedy and seeded; stop strings, EOS, chunked prefill,
cancellation, the bounded queue and its errors."""

from __future__ import annotations

import asyncio
import time

import pytest

from linnet.runtimes.generation import Generator
from linnet.runtimes.sampling import SamplingParams
from linnet.runtimes.serve import ContextLengthExceeded, Delta, Finished, QueueFull
from tests.runtimes.serve.conftest import (
    MAX_BATCH,
    MAX_POSITIONS,
    PROMPTS,
    ContinuationLM,
    Recording,
    collect,
    request,
    solo,
)

pytestmark = [pytest.mark.torch]


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2.step_model()


@pytest.fixture(scope="module")
def tok(smollm2):
    return smollm2.tokenizer()


@pytest.fixture(scope="module")
def greedy16(model, tok):
    """{prompt: `Generator.generate`'s result for 16 greedy tokens}, each prompt alone, as `linnet generate`."""
    return {p: solo(model, tok, tok.encode(p), SamplingParams(), 16) for p in PROMPTS}


def tokens_of(deltas: list[Delta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def test_eight_greedy_prompts_together_give_their_solo_tokens(model, tok, greedy16, make_engine):
    prompts = [tok.encode(p) for p in PROMPTS]
    assert len(prompts) == MAX_BATCH and len({len(p) for p in prompts}) > 4
    engine = make_engine(model, tok)
    handles = [engine.submit(request(p, 16)) for p in prompts]
    for text, prompt, handle in zip(PROMPTS, prompts, handles, strict=True):
        want = greedy16[text]
        deltas, finished = collect(handle)
        assert tokens_of(deltas) == want.token_ids
        assert "".join(d.text for d in deltas) == want.text
        assert finished.finish_reason == want.finish_reason
        assert (finished.prompt_tokens, finished.completion_tokens) == (len(prompt), len(want.token_ids))
        assert finished.ttft_s is not None and finished.e2e_s >= finished.ttft_s >= finished.queued_s >= 0
        assert len(finished.inter_token_s) == want.decode_steps
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.rows_in_use, stats.max_batch) == (0, 0, 0, MAX_BATCH)
    assert stats.prompt_tokens_total == sum(map(len, prompts))
    drawn = sum(len(w.token_ids) + (w.finish_reason == "stop") for w in greedy16.values())  # an EOS is drawn too
    assert stats.generation_tokens_total == drawn


def test_equal_length_prompts_are_prefilled_in_one_step_and_give_their_solo_tokens(model, tok, make_engine):
    # the first 3 tokens of each prompt: 8 different prompts of one length, waiting before the engine starts
    prompts = [tok.encode(p)[:3] for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 1 and len({tuple(p) for p in prompts}) == MAX_BATCH
    expected = [solo(model, tok, p, SamplingParams(), 12).token_ids for p in prompts]
    recording = Recording(model)
    engine = make_engine(recording, tok, start=False)
    handles = [engine.submit(request(p, 12)) for p in prompts]
    engine.start()
    assert [tokens_of(collect(h)[0]) for h in handles] == expected
    # one [8, 3] prefill (the weights read once for the eight prompts), then [8, 1] decode steps
    assert recording.calls[0] == (MAX_BATCH, 3, list(range(MAX_BATCH))), recording.calls[:3]
    assert all(s == 1 for _, s, _ in recording.calls[1:])


def test_a_burst_whose_first_request_comes_early_is_prefilled_in_one_step(model, tok, make_engine):
    # a closed loop's next wave: the first client's request reaches the idle engine a moment before the others.
    # Without `max_queue_delay_s` it took a [1, 3] step of its own (a pass over every weight for one prompt), then
    # the others a [7, 3] step beside its [1, 1] decode, and it stayed a step ahead of them to the end.
    prompts = [tok.encode(p)[:3] for p in PROMPTS]
    expected = [solo(model, tok, p, SamplingParams(), 6).token_ids for p in prompts]
    recording = Recording(model)
    engine = make_engine(recording, tok, max_queue_delay_s=30.0)  # ends early: 8 requests fill the 8 free rows
    first = engine.submit(request(prompts[0], 6))
    time.sleep(0.05)
    handles = [first] + [engine.submit(request(p, 6)) for p in prompts[1:]]
    assert [tokens_of(collect(h)[0]) for h in handles] == expected
    assert recording.calls[0] == (MAX_BATCH, 3, list(range(MAX_BATCH))), recording.calls[:3]
    assert [c[:2] for c in recording.calls[1:]] == [(MAX_BATCH, 1)] * 5  # all decode in step, none left behind


def test_more_requests_than_rows_wait_and_reuse_rows(model, tok, greedy16, make_engine):
    prompts = PROMPTS * 2  # 16 requests on 8 rows: the second half waits, then reuses rows
    engine = make_engine(model, tok)
    handles = [engine.submit(request(tok.encode(p), 8)) for p in prompts]
    assert [tokens_of(collect(h)[0]) for h in handles] == [greedy16[p].token_ids[:8] for p in prompts]


def test_seeded_sampling_gives_the_solo_tokens_whatever_the_batch(model, tok, greedy16, make_engine):
    cases = [(PROMPTS[0], 1), (PROMPTS[0], 2), (PROMPTS[1], 1), (PROMPTS[2], 7)]
    params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=seed) for _, seed in cases]
    expected = [solo(model, tok, tok.encode(p), q, 10).token_ids for (p, _), q in zip(cases, params, strict=True)]
    assert expected[0] != expected[1] and expected[0] != greedy16[PROMPTS[0]].token_ids[:10]  # it really samples
    engine = make_engine(model, tok)
    handles = [engine.submit(request(tok.encode(p), 10, params=q)) for (p, _), q in zip(cases, params, strict=True)]
    together = [tokens_of(collect(h)[0]) for h in handles]
    alone = tokens_of(collect(engine.submit(request(tok.encode(cases[3][0]), 10, params=params[3])))[0])
    assert together == expected and alone == expected[3]


def test_a_stop_string_spanning_two_tokens_ends_the_text_before_it(model, tok, greedy16, make_engine):
    want = greedy16[PROMPTS[0]]
    pieces = [tok.decode([t]) for t in want.token_ids]
    i = next(i for i in range(3, len(pieces) - 1) if len(pieces[i]) >= 3 and len(pieces[i + 1]) >= 3)
    stop = pieces[i][-2:] + pieces[i + 1][:2]
    visible = want.text[: want.text.index(stop)]
    assert visible == "".join(pieces[:i]) + pieces[i][:-2]  # it starts inside token i, ends inside token i + 1
    engine = make_engine(model, tok)
    deltas, finished = collect(engine.submit(request(tok.encode(PROMPTS[0]), 16, stop=("never there", stop))))
    assert "".join(d.text for d in deltas) == visible
    assert (finished.finish_reason, finished.stop_reason) == ("stop", stop)
    assert tokens_of(deltas) == want.token_ids[: i + 2] and finished.completion_tokens == i + 2


def test_a_stop_string_whose_character_is_split_across_tokens(tok, make_engine):
    prompt = tok.encode("Say hello:")
    reply = tok.encode(" Hello 世界 world", add_special_tokens=False)
    eos = next(iter(tok.eos_token_ids))
    lm = ContinuationLM([prompt + reply + [eos]], vocab_size=49152)
    engine = make_engine(lm, tok)
    stopped = engine.submit(request(prompt, 20, stop=("界 w",)))
    plain = engine.submit(request(prompt, 20))
    deltas, finished = collect(stopped)
    assert "".join(d.text for d in deltas) == " Hello 世" and all("\ufffd" not in d.text for d in deltas)
    assert (finished.finish_reason, finished.stop_reason) == ("stop", "界 w")
    deltas, finished = collect(plain)
    assert "".join(d.text for d in deltas) == " Hello 世界 world" and tokens_of(deltas) == reply
    assert (finished.finish_reason, finished.stop_reason, finished.completion_tokens) == ("stop", None, len(reply))


def test_stop_token_ids_eos_and_ignore_eos(model, tok, make_engine):
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
    assert tokens_of(deltas)[: len(want.token_ids) + 1] == [*want.token_ids, want.stop_token_id]

    third = want.token_ids[2]
    deltas, finished = collect(engine.submit(request(prompt, 40, stop_token_ids=(third,))))
    assert tokens_of(deltas) == want.token_ids[:2] and (finished.finish_reason, finished.stop_reason) == ("stop", third)


def test_a_long_prompt_is_prefilled_in_chunks_between_the_others_decode_steps(model, tok, greedy16, make_engine):
    long_prompt = tok.encode(" ".join(["The history of the printing press begins in the fifteenth century."] * 6))
    assert 64 < len(long_prompt) <= MAX_POSITIONS - 8
    chunked = Generator(model, tok, prefill_chunk=16).generate(long_prompt, SamplingParams(max_new_tokens=8))
    recording = Recording(model)
    engine = make_engine(recording, tok, prefill_chunk=16, step_token_budget=24)
    shorts = [engine.submit(request(tok.encode(p), 16)) for p in PROMPTS[:3]]
    long_handle = engine.submit(request(long_prompt, 8))
    assert tokens_of(collect(long_handle)[0]) == chunked.token_ids
    for p, handle in zip(PROMPTS, shorts, strict=False):
        assert tokens_of(collect(handle)[0]) == greedy16[p].token_ids
    # Every chunk of the long prompt is one [1, 16] step (the last shorter), and decode steps run between them.
    long_steps = [i for i, (b, s, _) in enumerate(recording.calls) if s > 1 and s in (16, len(long_prompt) % 16)]
    assert len(long_steps) == -(-len(long_prompt) // 16)
    between = [recording.calls[i + 1] for i in long_steps[:-1]]
    assert all(s == 1 and b >= 1 for b, s, _ in between), recording.calls


def test_aevents_streams_the_same_as_events(model, tok, greedy16, make_engine):
    engine = make_engine(model, tok)

    async def stream(prompt):
        return [e async for e in engine.submit(request(tok.encode(prompt), 10)).aevents()]

    async def main():
        return await asyncio.gather(*(stream(p) for p in PROMPTS[:3]))

    for prompt, events in zip(PROMPTS, asyncio.run(main()), strict=False):
        assert isinstance(events[-1], Finished) and all(isinstance(e, Delta) for e in events[:-1])
        assert tokens_of(events[:-1]) == greedy16[prompt].token_ids[:10]


def test_cancel_frees_the_row_within_one_step(model, tok, make_engine):
    recording = Recording(model)
    engine = make_engine(recording, tok)
    handle = engine.submit(request(tok.encode(PROMPTS[0]), 80))
    events = handle.events()
    assert isinstance(next(events), Delta)
    handle.cancel()
    steps_at_cancel = len(recording.calls)
    rest = list(events)
    assert rest[-1].finish_reason == "cancelled" and rest[-1].completion_tokens < 80
    assert len(recording.calls) - steps_at_cancel <= 1  # at most the step already under way
    assert engine.stats().rows_in_use == 0
    handle.cancel()  # idempotent after the end


def test_a_consumer_that_stops_reading_cancels(model, tok, make_engine):
    engine = make_engine(model, tok)

    async def first_delta():
        async for event in engine.submit(request(tok.encode(PROMPTS[1]), 80)).aevents():
            return event

    assert isinstance(asyncio.run(first_delta()), Delta)
    follow = engine.submit(request(tok.encode(PROMPTS[2]), 2))
    collect(follow)  # served after the cancellation was applied: the loop handles cancellations first
    assert engine.stats().rows_in_use == 0


def test_the_queue_is_bounded(model, tok, greedy16, make_engine):
    engine = make_engine(model, tok, start=False, max_queue=2)  # not started: nothing leaves the queue
    # MAX_BATCH requests take the free rows, two more wait: all accepted (the queue counts what waits, issue 42)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(MAX_BATCH + 2)]
    first = [engine.submit(request(tok.encode(p), 4)) for p in prompts]
    with pytest.raises(QueueFull, match="2 requests are already waiting for a row"):
        engine.submit(request(tok.encode(PROMPTS[2]), 4))
    assert engine.stats().waiting == MAX_BATCH + 2  # the gauge: every request not yet admitted
    engine.start()
    assert [tokens_of(collect(h)[0]) for h in first] == [greedy16[p].token_ids[:4] for p in prompts]
    collect(engine.submit(request(tok.encode(PROMPTS[2]), 4)))  # room again


def test_requests_taking_free_rows_are_not_queued(model, tok, make_engine):
    """Issue 42: with 2 rows and a queue of 2, three requests at once were answered [200, 200, 429]: the engine
    counted the requests about to take a free row as queued."""
    engine = make_engine(model, tok, start=False, max_queue=1)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(MAX_BATCH + 1)]
    handles = [engine.submit(request(tok.encode(p), 2)) for p in prompts]  # was QueueFull at the second
    with pytest.raises(QueueFull):
        engine.submit(request(tok.encode(PROMPTS[0]), 2))
    engine.start()
    assert all(collect(h)[1].finish_reason == "length" for h in handles)


def test_a_cancelled_request_does_not_count_against_the_queue(model, tok, make_engine):
    """Issue 42: a request right after a client disconnected got 429 although the disconnected request's row (or
    place in the queue) was about to be freed: the engine counted it until its loop dropped it."""
    engine = make_engine(model, tok, start=False, max_queue=1)  # not started: the cancellation stays pending
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(MAX_BATCH + 1)]
    handles = [engine.submit(request(tok.encode(p), 2)) for p in prompts]
    with pytest.raises(QueueFull):
        engine.submit(request(tok.encode(PROMPTS[0]), 2))
    handles[0].cancel()
    late = engine.submit(request(tok.encode(PROMPTS[0]), 2))  # was QueueFull
    engine.start()
    assert collect(handles[0])[1].finish_reason == "cancelled"
    assert all(collect(h)[1].finish_reason == "length" for h in [*handles[1:], late])


def test_shutdown_cancels_what_is_running_and_waiting(model, tok, make_engine):
    engine = make_engine(model, tok, max_queue=len(PROMPTS))
    handles = [engine.submit(request(tok.encode(p), 80)) for p in PROMPTS]
    engine.shutdown()
    assert [collect(h)[1].finish_reason for h in handles] == ["cancelled"] * len(PROMPTS)
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit(request(tok.encode(PROMPTS[0]), 4))
    with pytest.raises(RuntimeError, match="before start"):
        engine.warm_up()


def test_bad_requests_are_refused_at_submit(model, tok, make_engine):
    engine = make_engine(model, tok)
    prompt = tok.encode(PROMPTS[0])
    with pytest.raises(ContextLengthExceeded, match=f"more than the {MAX_POSITIONS} positions"):
        engine.submit(request(prompt, MAX_POSITIONS - len(prompt) + 1))
    full = (prompt * MAX_POSITIONS)[: MAX_POSITIONS - 2]
    with pytest.raises(ContextLengthExceeded, match=r"\(94 tokens\) plus max_tokens \(3\) is 97 tokens"):
        engine.submit(request(full, 3))
    assert collect(engine.submit(request(full, 2)))[1].completion_tokens == 2  # exactly full is fine
    with pytest.raises(ValueError, match="empty"):
        engine.submit(request([], 4))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit(request([10**6], 4))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit(request(prompt, 0))
    with pytest.raises(ValueError, match="non-empty strings"):
        engine.submit(request(prompt, 4, stop=("",)))
    assert engine.stats().waiting == 0


def test_a_failing_step_ends_its_requests_with_error_and_the_engine_keeps_serving(tok, make_engine):
    prompt = tok.encode("Say hello:")
    reply = tok.encode(" Hello world, how are you today?", add_special_tokens=False)
    assert len(reply) > 4

    class FailsOnce(ContinuationLM):
        def step(self, input_ids, positions, rows):
            if len(self.calls) == 2:  # the first decode step after the two prefills
                self.calls.append(rows.tolist())
                raise RuntimeError("device lost")
            return super().step(input_ids, positions, rows)

    engine = make_engine(FailsOnce([prompt + reply], vocab_size=49152), tok, start=False)
    handles = [engine.submit(request(prompt, 4)) for _ in range(2)]
    engine.start()
    for handle in handles:
        finished = collect(handle)[1]
        assert (finished.finish_reason, finished.error) == ("error", "RuntimeError: device lost")
    deltas, finished = collect(engine.submit(request(prompt, 4)))
    assert finished.finish_reason == "length" and tokens_of(deltas) == reply[:4]
    assert engine.stats().rows_in_use == 0


def test_many_requests_with_random_cancellations_leave_nothing_behind(tok, make_engine):
    """A small soak on a model that costs nothing: 120 requests from 4 threads, a third cancelled at random
    moments, some abandoned mid-stream; every one ends once, and rows, queue and bookkeeping are back to idle."""
    import random
    import threading

    prompt = tok.encode("Count:")
    lm = ContinuationLM([prompt + tok.encode(" one two three four five six seven eight nine ten")], 49152)
    engine = make_engine(lm, tok, max_queue=200)
    outcomes: list[str] = []
    abandoned = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(30):
            handle = engine.submit(request(prompt, rng.randint(1, 12)))
            events = handle.events()
            if rng.random() < 0.3:
                handle.cancel()
            elif rng.random() < 0.2:
                next(events)
                events.close()  # the consumer walks away: that cancels
                outcomes.append("abandoned")
                abandoned.append(handle)
                continue
            outcomes.append(list(events)[-1].finish_reason)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 120 and set(outcomes) <= {"length", "cancelled", "abandoned"}
    assert "cancelled" in outcomes and "length" in outcomes
    for handle in abandoned:  # what was left in their queues ends with one Finished
        assert collect(handle)[1].finish_reason in ("cancelled", "length")
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.rows_in_use) == (0, 0, 0)
    assert not engine._active and not engine._cancelled and not engine._scheduler.has_work()


def test_on_idle_runs_on_the_engine_thread_once_work_is_done(make_engine, monkeypatch):
    """`linnet serve` re-chooses torch's threads there (issue 42: a server started on a busy machine kept 1 thread
    for its whole life): called on the engine's thread after work, not before any, at most every IDLE_EVERY_S."""
    import threading
    import time

    from linnet.runtimes.serve import engine as engine_module

    calls: list[str] = []
    called = threading.Event()

    def on_idle() -> None:
        calls.append(threading.current_thread().name)
        called.set()

    lm = ContinuationLM([[1, 2, 3, 4, 5]], vocab_size=8)
    engine = make_engine(lm, None, on_idle=on_idle)
    assert not called.wait(0.3)  # no work yet: nothing to re-tune after
    collect(engine.submit(request([1, 2], 2)))
    assert called.wait(10) and calls == ["linnet-serve-engine"]
    collect(engine.submit(request([1, 2], 2)))  # again idle within IDLE_EVERY_S: not called again
    time.sleep(0.3)
    assert len(calls) == 1
    monkeypatch.setattr(engine_module, "IDLE_EVERY_S", 0.0)
    called.clear()
    collect(engine.submit(request([1, 2], 2)))
    assert called.wait(10) and len(calls) == 2


def test_a_request_whose_sampling_fails_ends_alone(tok, make_engine, monkeypatch):
    """A sampler error (`sample` raised for a subnormal temperature) failed every request of the step; now it ends
    its own request only, and the others run on."""
    import linnet.runtimes.serve.engine as engine_module

    prompt = tok.encode("Say hello:")
    reply = tok.encode(" Hello world, how are you today?", add_special_tokens=False)
    real = engine_module.sample

    def failing(logits, params, rng=None):
        if params.temperature == 0.7:
            raise ValueError("logits rows [0] have no finite value to sample from")
        return real(logits, params, rng)

    monkeypatch.setattr(engine_module, "sample", failing)
    engine = make_engine(ContinuationLM([prompt + reply], vocab_size=49152), tok, start=False)
    doomed = engine.submit(request(prompt, 4, params=SamplingParams(temperature=0.7, seed=1)))
    fine = engine.submit(request(prompt, 4))
    engine.start()
    finished = collect(doomed)[1]
    assert finished.finish_reason == "error" and "no finite value" in finished.error
    deltas, finished = collect(fine)
    assert finished.finish_reason == "length" and tokens_of(deltas) == reply[:4]
