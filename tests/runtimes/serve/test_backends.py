"""The same engine on every backend that runs `step`: the embedded SmolLM2 with 4 cache rows, a few short prompts
greedy and one seeded, each equal to what `Generator.generate` gives it alone on that backend; and how far a row's
logits move between a decode step of B = 1 and of B = 4 (batched matmuls may sum in another order)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from linnet.runtimes.generation import Generator
from linnet.runtimes.sampling import SamplingParams
from tests.runtimes.conftest import LOGITS_ATOL, report
from tests.runtimes.serve.conftest import PROMPTS, collect, load_smollm2, request

# torch (generated) is covered by test_engine.py on every run; ONNX Runtime is the cheapest other framework. Of the
# rest, one per way of running `step`: compiled PyTorch (inductor) and XLA (the exported StableHLO). torch-interpret
# runs the same IR ops as generated PyTorch, one by one, and jax the same XLA computation as xla, jitted rather than
# exported, so they add minutes of compiling and interpreting to the suite and no new path through the engine.
BACKENDS = [
    pytest.param("torch-compile", marks=pytest.mark.slow),
    pytest.param("xla", marks=pytest.mark.slow),
    "onnxruntime",
]
ROWS = 4
NEW_TOKENS = 6


@pytest.fixture(scope="module", params=BACKENDS)
def backend_model(request):
    if request.param.startswith("torch"):
        request.getfixturevalue("one_torch_thread")
    return request.param, load_smollm2(request.param, max_batch=ROWS, max_positions=40)


def test_decode_logits_of_a_row_barely_depend_on_the_batch(backend_model):
    name, loaded = backend_model
    model, tok = loaded.step_model(), loaded.tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[:ROWS]]
    first = []
    for row, prompt in enumerate(prompts):
        logits = model.step(np.array([prompt]), np.array([0]), np.array([row]))
        first.append(int(np.argmax(logits)))
    ids, positions, rows = np.array([[t] for t in first]), np.array([len(p) for p in prompts]), np.arange(ROWS)
    together = model.step(ids, positions, rows)
    alone = np.concatenate([model.step(ids[r : r + 1], positions[r : r + 1], rows[r : r + 1]) for r in range(ROWS)])
    delta = float(np.abs(together - alone).max())
    report(f"SmolLM2 on {name}: decode logits of a row, B = {ROWS} against B = 1", delta)
    assert delta < LOGITS_ATOL


def test_the_engine_gives_each_request_its_solo_tokens(backend_model, make_engine):
    name, loaded = backend_model
    model, tok = loaded.step_model(), loaded.tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[:ROWS]]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=5)
    params = [SamplingParams()] * (ROWS - 1) + [seeded]
    expected = []
    for prompt, p in zip(prompts, params, strict=True):
        expected.append(Generator(model, tok).generate(prompt, replace(p, max_new_tokens=NEW_TOKENS)).token_ids)
    engine = make_engine(model, tok, start=False)
    engine.warm_up()  # compiles where the backend does; writes dummy cache entries the requests overwrite
    engine.start()
    handles = [engine.submit(request(prompt, NEW_TOKENS, params=p)) for prompt, p in zip(prompts, params, strict=True)]
    got = [[t for d in collect(h)[0] for t in d.token_ids] for h in handles]
    assert got == expected, name
