"""Fixtures of the serving engine's tests: the embedded SmolLM2-135M-Instruct on a backend, and engines that are
always shut down (their thread joined) when the test ends."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from linnet.runtimes.generation import Generator
from linnet.runtimes.sampling import SamplingParams
from linnet.runtimes.serve import Delta, Engine, Finished, Request
from tests.runtimes.conftest import LLAMA

MAX_BATCH = 8
MAX_POSITIONS = 96

# Different prompts of different lengths (4 to 16 tokens), plain and chat-like.
PROMPTS = [
    "The three primary colors are",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The capital of France is",
    "Water boils at",
    "A haiku about autumn leaves:",
    "List three uses of a paperclip:\n1.",
    "Translate to French: good morning",
]


def load_smollm2(backend: str, max_batch: int = MAX_BATCH, max_positions: int = MAX_POSITIONS):
    """The embedded SmolLM2 on `backend` (registry name), skipped when the backend cannot run here."""
    from linnet.runtimes.backends import get_backend

    b = get_backend(backend)
    reason = b.unavailable(probe=False)
    if reason:
        pytest.skip(reason)
    return b.load(LLAMA, max_batch=max_batch, max_positions=max_positions, progress=False)


@pytest.fixture(scope="module")
def smollm2(one_torch_thread):
    """SmolLM2-135M-Instruct (GGUF, f32) on the torch backend, 8 cache rows of 96 positions."""
    pytest.importorskip("torch")
    return load_smollm2("torch")


@pytest.fixture
def make_engine():
    """`make_engine(model, tokenizer, **options)` -> a started Engine, shut down after the test."""
    engines: list[Engine] = []

    def make(model, tokenizer, start: bool = True, **options) -> Engine:
        engine = Engine(model, tokenizer, **options)
        engines.append(engine)
        if start:
            engine.start()
        return engine

    yield make
    for engine in engines:
        engine.shutdown()
        assert engine._thread is None or not engine._thread.is_alive()


def solo(model, tokenizer, prompt_ids: list[int], params: SamplingParams, max_tokens: int, **options):
    """What `linnet generate` gives for this prompt alone: `Generator.generate`'s result (row 0)."""
    return Generator(model, tokenizer, **options).generate(prompt_ids, replace(params, max_new_tokens=max_tokens))


def collect(handle) -> tuple[list[Delta], Finished]:
    """All of a request's events: its Deltas and its Finished (which must come last, once)."""
    events = list(handle.events())
    deltas, finished = events[:-1], events[-1]
    assert isinstance(finished, Finished) and all(isinstance(e, Delta) for e in deltas), events
    return deltas, finished


def request(prompt_ids, max_tokens=16, **fields) -> Request:
    params = fields.pop("params", SamplingParams())
    return Request(list(prompt_ids), params, max_tokens, **fields)


class ContinuationLM:
    """A `StepModel` with a real per-row cache of the token ids written: after each step it looks up the row's
    tokens so far among `sequences` (prompt + continuation) and puts all the probability on the next token of the
    one it starts (token 0 when none), so a test decides exactly which tokens a request draws."""

    def __init__(self, sequences: list[list[int]], vocab_size: int, max_batch: int = 4, max_positions: int = 64):
        self.sequences, self.vocab_size = [list(s) for s in sequences], vocab_size
        self.max_batch, self.max_positions = max_batch, max_positions
        self.cache = np.full((max_batch, max_positions), -1, dtype=np.int64)
        self.calls: list[list[int]] = []  # the rows of each step

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        self.calls.append(rows.tolist())
        logits = np.zeros((len(rows), self.vocab_size), dtype=np.float32)
        for b, (row, start) in enumerate(zip(rows.tolist(), positions.tolist(), strict=True)):
            end = start + input_ids.shape[1]
            self.cache[row, start:end] = input_ids[b]
            written = self.cache[row, :end].tolist()
            follow = [s[end] for s in self.sequences if len(s) > end and s[:end] == written]
            logits[b, follow[0] if follow else 0] = 1.0
        return logits


class Recording:
    """A `StepModel` that forwards to `model` and records each step's (B, S, rows), in order."""

    def __init__(self, model) -> None:
        self.model = model
        self.max_batch, self.max_positions, self.vocab_size = model.max_batch, model.max_positions, model.vocab_size
        self.calls: list[tuple[int, int, list[int]]] = []

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        self.calls.append((*input_ids.shape, rows.tolist()))
        return self.model.step(input_ids, positions, rows)
