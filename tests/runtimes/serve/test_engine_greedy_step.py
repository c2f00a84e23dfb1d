"""Decode steps whose requests are all greedy take their tokens on the device (`GreedyStep`, the JAX backends'
`step_greedy`): only the tokens come back, not the batch's logits. The engine then gives each request the tokens it
gets alone, mixes such steps with sampled requests (whose steps bring the logits back), and reports non-finite
logits as the logits path does."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.sampling import SamplingParams
from tests.runtimes.conftest import LLAMA
from tests.runtimes.serve.conftest import collect, request, solo

pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402

SMALL = {
    "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2,
}  # fmt: skip
PROMPTS = [[5, 17, 3], [88, 41, 9, 12, 60, 2], [7, 8], [30, 31, 32, 33]]  # no one-token prompt: its prefill is S = 1


@pytest.fixture(scope="module")
def model():
    return lj.load(LLAMA, config=SMALL, max_batch=4, max_positions=48, random_weights=True, seed=4, progress=False)


def tokens_of(handle) -> list[int]:
    deltas, finished = collect(handle)
    assert finished.finish_reason == "length", finished
    return [t for d in deltas for t in d.token_ids]


class Counting:
    """The step model, counting how its decode steps were taken."""

    def __init__(self, step_model):
        self.inner, self.greedy_steps, self.logits_steps = step_model, 0, 0
        self.max_batch, self.max_positions, self.vocab_size = (
            step_model.max_batch, step_model.max_positions, step_model.vocab_size
        )  # fmt: skip

    def step(self, input_ids, positions, rows):
        self.logits_steps += input_ids.shape[1] == 1
        return self.inner.step(input_ids, positions, rows)

    def step_greedy(self, input_ids, positions, rows):
        self.greedy_steps += 1
        return self.inner.step_greedy(input_ids, positions, rows)


def test_greedy_requests_get_their_solo_tokens_with_no_logits_brought_back(model, make_engine):
    step_model = Counting(model.step_model())
    expected = [solo(model.step_model(), None, p, SamplingParams(), 10).token_ids for p in PROMPTS]
    engine = make_engine(step_model, None)
    handles = [engine.submit(request(p, 10)) for p in PROMPTS]
    assert [tokens_of(h) for h in handles] == expected
    assert step_model.greedy_steps > 0 and step_model.logits_steps == 0


def test_a_sampled_request_in_the_batch_brings_the_logits_back(model, make_engine):
    step_model = Counting(model.step_model())
    seeded = SamplingParams(temperature=0.8, seed=11)
    params = [SamplingParams(), seeded, SamplingParams(), SamplingParams()]
    expected = [solo(model.step_model(), None, p, q, 8).token_ids for p, q in zip(PROMPTS, params, strict=True)]
    engine = make_engine(step_model, None)
    handles = [engine.submit(request(p, 8, params=q)) for p, q in zip(PROMPTS, params, strict=True)]
    assert [tokens_of(h) for h in handles] == expected
    assert step_model.logits_steps > 0


def test_non_finite_logits_in_a_greedy_step_end_the_step_with_the_runners_error(model, make_engine):
    """A step whose logits hold NaN: its requests end with the same error `checked_step` gives, naming the
    position and the row; the engine keeps serving."""
    inner = model.step_model()

    class NanAfterPrefill(Counting):
        def step_greedy(self, input_ids, positions, rows):
            tokens, bad = self.inner.step_greedy(input_ids, positions, rows)
            if self.greedy_steps == 0:
                bad = np.array(bad)
                bad[-1] = (3, 0)
            self.greedy_steps += 1
            return tokens, bad

    engine = make_engine(NanAfterPrefill(inner), None)
    handles = [engine.submit(request(p, 4)) for p in PROMPTS[:2]]
    for handle in handles:
        finished = collect(handle)[1]
        assert finished.finish_reason == "error"
        assert "NaN (3 of 96 values) at position 6 (row 1, decode step 2)" in finished.error, finished.error
    assert (
        tokens_of(engine.submit(request(PROMPTS[2], 4))) == solo(inner, None, PROMPTS[2], SamplingParams(), 4).token_ids
    )
