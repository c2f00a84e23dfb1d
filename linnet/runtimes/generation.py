"""The one backend-neutral generation runner: prefill, decode, sampling and stop conditions over a `StepModel`.

Every backend (torch, XLA, ONNX Runtime, ...) hands the runner an object with a `step` entry point that reads and
writes its own KV cache (ARCHITECTURE.md, "Models and entry points"); the runner works in numpy only, so the same
prompt, parameters and seed give the same tokens on every backend whose logits agree.

Cache layout: `max_batch` fixed rows of `max_positions` positions. A request in row r with a prompt of P tokens
is prefilled at positions 0..P-1 (one `step` with S = P, or chunks of `prefill_chunk` tokens); each generated
token that is fed back is written at the next position by a decode `step` with S = 1. A row is reused by simply
prefilling it again from position 0: `step` attends only to positions below the ones it writes, so stale entries
further on are never read and no explicit reset is needed. A sequence (prompt plus generated tokens) never
exceeds `max_positions` tokens, so the runner never writes past the cache.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Generator as _PyGenerator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from linnet.errors import RunError

from .sampling import SamplingParams, sample

__all__ = [
    "DecodeLoop",
    "GreedyStep",
    "GenerationResult",
    "Generator",
    "IncrementalDetokenizer",
    "StepModel",
    "Tokenizer",
    "WarmUp",
]


@runtime_checkable
class StepModel(Protocol):
    """What every backend hands the runner.

    - `max_batch`: the number of fixed cache rows.
    - `max_positions`: the number of positions per row ("compiled for N positions", `--max-positions`).
    - `vocab_size`: V, the width of the logits.
    - `step(input_ids, positions, rows)`: `input_ids` i64 `[B, S]`, `positions` i64 `[B]` (the position of each
      entry's first token), `rows` i64 `[B]` (the cache row of each entry), B <= max_batch; writes the KV cache of
      row `rows[b]` at positions `positions[b] .. positions[b] + S - 1` and returns f32 `[B, V]`, the logits of
      each entry's last token. A backend runs a decoder's `decode` entry for the steps of one token a row when the
      source has one (`model.step_entry`), `step` otherwise.
    """

    max_batch: int
    max_positions: int
    vocab_size: int

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray: ...


class WarmUp(Protocol):
    """What a `StepModel` that compiles (or builds a session, or captures a graph) may add, so that the work is
    done and timed before generation and neither the time to first token nor the decode rate includes it:

    - `compile_kind`: what `warm_up` does, as the timing line names it ("compile", "session build", "graph
      capture"; "" when nothing).
    - `warm_up(prefill_lengths, batch_sizes)`: do it now for prefill steps of these lengths (one entry each) and
      decode steps of these batch sizes. It may run `step` on dummy tokens in rows 0..B-1 from position 0, whose
      cache entries the runner overwrites before it reads them.
    """

    compile_kind: str

    def warm_up(self, prefill_lengths: list[int], batch_sizes: list[int]) -> None: ...


class GreedyStep(Protocol):
    """What a `StepModel` may add to take a greedy step's tokens on its device, so that a batch's `[B, V]` logits
    never travel to the host (4 MB a step for 32 rows of a 32k vocabulary, plus the host's argmax over them):

    - `step_greedy(input_ids, positions, rows)`: `step`, then for each entry the argmax of its logits (the first
      maximum, as `sampling.sample` takes it) and how many of them are NaN and infinite. Returns (i64 `[B]` tokens,
      i64 `[B, 2]` NaN and Inf counts).

    The serving engine uses it for decode steps whose requests are all greedy.
    """

    def step_greedy(
        self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...


class GreedySteps(Protocol):
    """What a `StepModel` may add to run several greedy decode steps of a whole batch in one dispatch on its device
    (the serving engine's multi-step decode, as vLLM's `num_scheduler_steps`): one host round trip per step is a
    fixed cost on an accelerator, a fifth of a 1.1B model's batched step on a TPU.

    - `max_greedy_steps`: the most steps one call runs (0: none; then the engine steps one at a time).
    - `step_greedy_steps(input_ids, positions, rows, steps)`: `steps` greedy decode steps of the `[B, 1]`
      `input_ids` at `positions` (i64 `[B]`) of cache `rows`, each row fed its own argmax at its next position.
      Returns (i64 `[B, steps]` tokens, i64 `[B, steps, 2]` the NaN and Inf counts of the logits each came from).
      Each token is the first maximum of its step's logits, as `sample` takes it. The caller keeps every row's
      positions inside the cache.
    """

    max_greedy_steps: int

    def step_greedy_steps(
        self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray, steps: int
    ) -> tuple[np.ndarray, np.ndarray]: ...


class PrefillBatches(Protocol):
    """What a compiling `StepModel` may add to prefill several requests' chunks of one length in one step
    (`[k, length]`, the weights read once for the k chunks) without compiling in the middle of serving:

    - `warm_up_prefill(length, counts)`: compile now the steps of k chunks of `length` tokens for each k of
      `counts` (it may round them up, and may write dummy entries into rows 0..k-1 from position 0).
    - `prefill_batch(length)`: the most chunks of `length` tokens one step takes (1: one chunk a step).
    """

    def warm_up_prefill(self, length: int, counts: list[int]) -> None: ...

    def prefill_batch(self, length: int) -> int: ...


class DecodeLoop(Protocol):
    """What a `StepModel` may add to run many greedy decode steps of one row per dispatch on its device, with the
    argmax, the stop check and the KV cache kept there, instead of one host round trip per token (which is most of a
    small model's step on an accelerator):

    - `decode_greedy(token, position, row, steps, stop_ids)`: feed `token` at `position` of cache row `row`, then
      each argmax token at the next position, for at most `steps` steps; stop after a step whose argmax is in
      `stop_ids` or whose logits are not all finite. Yields, as they come back from the device, chunks
      `(tokens, bad)`: `tokens` i64 `[n]` the argmax of each step of the chunk in order (a stop token included, as
      the last), and `bad` None, or `(nan_count, inf_count)` of the logits of the step after `tokens` (the last
      step run; the loop ran no further). Each token is the first maximum of its step's logits, as `sample`
      takes it; the steps are the model's own decode step, though compiled anew (a backend says how far its
      logits may differ from the stand-alone step's).

    The runner uses it for `generate` and `stream_text` when decoding is greedy and there is no `logits_processor`.
    """

    def decode_greedy(
        self, token: int, position: int, row: int, steps: int, stop_ids: frozenset[int]
    ) -> Iterator[tuple[np.ndarray, tuple[int, int] | None]]: ...


class Tokenizer(Protocol):
    """What the runner needs of a tokenizer: `encode(text) -> list[int]`, `decode(ids, skip_special_tokens=True)
    -> str` and `eos_token_ids: set[int]`, the ids that end a generation."""

    eos_token_ids: set[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass
class GenerationResult:
    """One finished generation.

    - `token_ids`: the new tokens only (not the prompt, not the stop token).
    - `text`: `tokenizer.decode(token_ids, skip_special_tokens=True)`.
    - `finish_reason`: "stop" (an EOS or stop token was drawn; it is in `stop_token_id`, not in `token_ids`) or
      "length" (`max_new_tokens` reached, or the row's `max_positions` are full).
    - `prompt_tokens`: the prompt's length in tokens.
    - `prefill_s`: seconds from the start of the request's prefill to its first sampled token (time to first
      token), spent in `step` and sampling.
    - `decode_s`: seconds spent in the decode steps (S = 1) and their sampling; for `generate_batch`, the wall time
      of the shared batched steps until this row finished.
    - `decode_steps`: the number of decode steps this request took part in.
    - `decode_tokens_per_s`: `decode_steps / decode_s` (tokens/s), 0.0 when there was no decode step.
    - `row`: the cache row used.
    """

    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    decode_steps: int
    decode_tokens_per_s: float
    row: int
    stop_token_id: int | None = None


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces that are safe to show.

    The usual incremental-detokenize scheme (as in text-generation-inference and vLLM): keep a small window of ids
    `ids[prefix_offset:]`; after each new id, `decode(window) - decode(window without the ids not yet shown)` is the
    new text, released only when the decoded window no longer ends in U+FFFD (a multi-byte UTF-8 character split
    across tokens). Decoding both from the same start keeps tokenizers that strip a leading space consistent.
    `flush()` releases whatever remains at the end, so for tokenizers whose decode of a prefix is a prefix of the
    decode of the whole (byte-level BPE, bytes), the pieces concatenate to `decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True) if ids else ""

    def push(self, token_id: int) -> str:
        """Add one token id; returns the newly complete text ("" when nothing is complete yet)."""
        self.ids.append(int(token_id))
        prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            piece = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
            self.emitted += piece
            return piece
        return ""

    def flush(self) -> str:
        """The text not yet released: `decode(all ids)` minus what `push` returned (it may end in U+FFFD when the
        ids end inside a character)."""
        full = self._decode(self.ids)
        piece = full[len(self.emitted) :] if full.startswith(self.emitted) else ""
        self.emitted += piece
        return piece


def non_finite_logits(nan: int, inf: int, width: int, position: int, row: int, step: int) -> RunError:
    """The error for logits of one entry holding `nan` NaN and `inf` infinite values of `width` (V), at `position`
    of cache `row`, in decode step `step` (0: the prefill): sampling from them would give a token anyway (an argmax
    of NaN is 0, often a special token), so the text came out empty or garbled with no error."""
    kinds = " and ".join(k for k, n in (("NaN", nan), ("Inf", inf)) if n)
    when = f"decode step {step}" if step else "the prefill"
    return RunError(
        f"the model's logits hold {kinds} ({nan + inf} of {width} values) at position {position} (row {row}, "
        f"{when}); no token can be sampled from them: the weights or the config make the model compute non-finite "
        "values (try --dtype f32 if it runs in f16)"
    )


class Generator:
    """Drives a `StepModel` to generate text: prefill, decode, sampling and stop conditions.

    `model`: the backend's step model (see `StepModel`). `tokenizer`: see `Tokenizer`; its `eos_token_ids` stop
    generation (None: no EOS ids, and results have empty `text`). `prefill_chunk`: when set (>= 1), prompts are
    prefilled in steps of at most this many tokens (each at its own positions) instead of one step of the whole
    prompt. `logits_processor`: when set, `logits_processor(logits, n_new)` (f32 `[B, V]` -> `[B, V]`, where every
    row has generated `n_new` tokens so far) runs on the checked logits before each token is sampled and may set
    logits to -inf (transformers' `LogitsProcessor`s before its warpers: Whisper's suppressed tokens).

    Raises `ValueError` when the model's `max_batch`, `max_positions` or `vocab_size` is not a positive integer
    (`max_positions` must be >= 2) or `prefill_chunk` is < 1.
    """

    def __init__(
        self,
        model: StepModel,
        tokenizer: Tokenizer | None,
        *,
        prefill_chunk: int | None = None,
        logits_processor: Callable[[np.ndarray, int], np.ndarray] | None = None,
    ) -> None:
        for name, least in (("max_batch", 1), ("max_positions", 2), ("vocab_size", 1)):
            value = getattr(model, name, None)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
                raise ValueError(f"model.{name} must be an integer >= {least}, got {value!r}")
        if prefill_chunk is not None and (not isinstance(prefill_chunk, (int, np.integer)) or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk must be an integer >= 1 or None, got {prefill_chunk!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.prefill_chunk = None if prefill_chunk is None else int(prefill_chunk)
        self.logits_processor = logits_processor
        self.last_result: GenerationResult | None = None

    # ---- public API -------------------------------------------------------------------------------------------

    def warm_up(self, prompt_tokens: int, batch_size: int = 1) -> None:
        """Compile now what generating from a prompt of `prompt_tokens` tokens with `batch_size` rows decoding
        together will run (the prefill steps, chunked as `prefill_chunk` says, and the decode step), when the
        model does such work (`WarmUp`; `model.compile_kind` names it). Time it apart (`caches.watch`):
        afterwards `GenerationResult.prefill_s` and `decode_s` exclude it."""
        warm_up = getattr(self.model, "warm_up", None)
        if warm_up is None:
            return
        prompt_tokens = min(max(1, int(prompt_tokens)), self.max_positions - 1)
        chunk = self.prefill_chunk or prompt_tokens
        lengths = sorted({min(chunk, prompt_tokens - start) for start in range(0, prompt_tokens, chunk)})
        warm_up(lengths, [max(1, min(int(batch_size), int(self.model.max_batch)))])

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        row: int = 0,
        on_token: Callable[[int], None] | None = None,
    ) -> GenerationResult:
        """Generate from `prompt_ids` (token ids, 1 <= length <= max_positions - 1) in cache row `row`.

        One prefill (`step` with B = 1, S = prompt length, or chunks of `prefill_chunk`), then decode steps with
        B = 1, S = 1 until a stop token (finish "stop"), `params.max_new_tokens` tokens, or a full row (prompt plus
        generated tokens = max_positions; finish "length"). `on_token(token_id)` is called for each new token as
        it is drawn (not for the stop token). Samples with `params.make_rng()`.

        Raises `ValueError` for an empty prompt, a token id outside [0, vocab_size), a prompt that does not fit the
        cache ("prompt of N tokens does not fit the cache compiled for M positions (--max-positions)"), a row
        outside [0, max_batch), or a model whose `step` returns logits that are not `[B, vocab_size]`.
        """
        steps = self._run(prompt_ids, params, row)
        try:
            while True:
                token = next(steps)
                if on_token is not None:
                    on_token(token)
        except StopIteration as done:
            result: GenerationResult = done.value
        self.last_result = result
        return result

    def stream_text(self, prompt_ids: Sequence[int], params: SamplingParams, *, row: int = 0) -> Iterator[str]:
        """Generate as `generate` does, yielding decoded text pieces as they become complete (see
        `IncrementalDetokenizer`); the pieces concatenate to the final `text`. When the iterator is exhausted the
        `GenerationResult` is in `self.last_result` (and is the iterator's return value). Raises as `generate`
        does, at the call (the arguments are checked before the iterator is returned)."""
        return self._stream(self._run(prompt_ids, params, row))

    def _stream(self, steps: _PyGenerator[int, None, GenerationResult]) -> _PyGenerator[str, None, GenerationResult]:
        detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer is not None else None
        try:
            while True:
                token = next(steps)
                if detok is not None and (piece := detok.push(token)):
                    yield piece
        except StopIteration as done:
            result: GenerationResult = done.value
        if detok is not None and (piece := detok.flush()):
            yield piece
        self.last_result = result
        return result

    def generate_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[GenerationResult]:
        """Generate for several prompts at once, prompt i in cache row i (so len(prompts) <= max_batch).

        Each row is prefilled on its own (B = 1, S = its length, or chunks), then all rows still running decode
        together: one `step` per token with B = the number of active rows (in row order), `input_ids` `[B, 1]`,
        per-row `positions`; a row that stops drops out of the batch. `params` is one `SamplingParams` for all
        or one per prompt; each row samples with its own `params.make_rng()`, so each row gets exactly the tokens
        `generate` would give it alone (given a deterministic model). Returns one result per prompt, in order.

        Raises `ValueError` as `generate` does (naming the prompt), for more prompts than `max_batch`, or for a
        `params` list of the wrong length.
        """
        n = len(prompts)
        if n == 0:
            return []
        if n > self.model.max_batch:
            raise ValueError(f"{n} prompts do not fit the cache compiled for {self.model.max_batch} rows (--max-batch)")
        if isinstance(params, SamplingParams):
            per_row = [params] * n
        else:
            per_row = list(params)
            if len(per_row) != n:
                raise ValueError(f"got {len(per_row)} SamplingParams for {n} prompts")
        checked = []
        for i, prompt in enumerate(prompts):
            try:
                checked.append(self.check_prompt(prompt))
            except ValueError as error:
                raise ValueError(f"prompt {i}: {error}") from None
        stop_ids = [self._stop_ids(p) for p in per_row]
        rngs = [None if p.greedy else p.make_rng() for p in per_row]
        tokens: list[list[int]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        stop_token: list[int | None] = [None] * n
        prefill_s = [0.0] * n
        decode_s = [0.0] * n
        decode_steps = [0] * n

        def take(i: int, token: int) -> None:
            """Record row i's new token and decide whether the row is finished."""
            if token in stop_ids[i]:
                finish[i], stop_token[i] = "stop", token
                return
            tokens[i].append(token)
            if len(tokens[i]) >= per_row[i].max_new_tokens or len(checked[i]) + len(tokens[i]) >= self.max_positions:
                finish[i] = "length"

        for i in range(n):
            start = time.perf_counter()
            logits = self._process(self._prefill(checked[i], i), 0)
            take(i, int(sample(logits, per_row[i], rngs[i])[0]))
            prefill_s[i] = time.perf_counter() - start

        while active := [i for i in range(n) if finish[i] is None]:
            start = time.perf_counter()
            input_ids = np.array([[tokens[i][-1]] for i in active], dtype=np.int64)
            positions = np.array([len(checked[i]) + len(tokens[i]) - 1 for i in active], dtype=np.int64)
            step = 1 + min(decode_steps[i] for i in active)
            logits = self.checked_step(input_ids, positions, np.array(active, dtype=np.int64), step)
            for b, i in enumerate(active):
                take(i, int(sample(self._process(logits[b : b + 1], len(tokens[i])), per_row[i], rngs[i])[0]))
            elapsed = time.perf_counter() - start
            for i in active:
                decode_s[i] += elapsed
                decode_steps[i] += 1

        return [
            self._result(
                tokens[i], finish[i], len(checked[i]), prefill_s[i], decode_s[i], decode_steps[i], i, stop_token[i]
            )
            for i in range(n)
        ]

    # ---- internals --------------------------------------------------------------------------------------------

    @property
    def max_positions(self) -> int:
        return int(self.model.max_positions)

    def check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        """`prompt_ids` as a list of ints, checked as `generate` checks them (the serving engine too). Raises
        ValueError for an empty prompt, ids outside [0, vocab_size), or a prompt of max_positions tokens or more."""
        ids = [operator.index(t) for t in prompt_ids]
        if not ids:
            raise ValueError("the prompt is empty; generation needs at least one prompt token")
        vocab = int(self.model.vocab_size)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if len(ids) > self.max_positions - 1:
            raise ValueError(
                f"prompt of {len(ids)} tokens does not fit the cache compiled for {self.max_positions} positions "
                f"(--max-positions): it needs at least {len(ids) + 1}, one position more than the prompt for a "
                "generated token"
            )
        return ids

    def _check_row(self, row: int) -> int:
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < self.model.max_batch:
            raise ValueError(f"row {row!r} is outside the cache's rows [0, {self.model.max_batch}) (--max-batch)")
        return int(row)

    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        eos = getattr(self.tokenizer, "eos_token_ids", None) or ()
        return frozenset(int(t) for t in eos) | params.stop_token_ids

    def checked_step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray, step: int = 0) -> np.ndarray:
        """One `model.step` (every step of `generate`, `generate_batch` and the serving engine goes through it);
        checks that it returned `[B, vocab_size]` logits, all finite. `step` is 0 for the prefill, k for the k-th
        decode step (for the message). Raises RunError (a ValueError) for NaN or infinite logits, naming the row,
        the position and the step: sampling from them gave a token anyway (an argmax of NaN is 0, often a special
        token), so the text came out empty or garbled with no error. Cost: one `np.isfinite(...).all()` over B x V
        values, microseconds against the step itself."""
        logits = np.asarray(self.model.step(input_ids, positions, rows))
        expected = (input_ids.shape[0], int(self.model.vocab_size))
        if logits.shape != expected:
            raise ValueError(f"model.step returned logits of shape {tuple(logits.shape)}, expected {expected}")
        if not np.isfinite(logits).all():
            b = int(np.argwhere(~np.isfinite(logits).all(axis=1))[0][0])
            nan, inf = int(np.isnan(logits[b]).sum()), int(np.isinf(logits[b]).sum())
            position = int(positions[b]) + input_ids.shape[1] - 1
            raise non_finite_logits(nan, inf, logits.shape[1], position, int(rows[b]), step)
        return logits

    def checked_greedy_step(
        self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray, step: int = 0
    ) -> np.ndarray | None:
        """The greedy tokens (i64 `[B]`) of one step taken on the device (`GreedyStep.step_greedy`), checked as
        `checked_step` checks logits (the same RunError for non-finite ones); None when the model cannot (no
        `step_greedy`) or a `logits_processor` must see the logits first: then call `checked_step`."""
        step_greedy = getattr(self.model, "step_greedy", None)
        if step_greedy is None or self.logits_processor is not None:
            return None
        tokens, bad = (np.asarray(a) for a in step_greedy(input_ids, positions, rows))
        if tokens.shape != (input_ids.shape[0],) or bad.shape != (input_ids.shape[0], 2):
            raise ValueError(f"model.step_greedy returned shapes {tokens.shape} and {bad.shape}")
        if bad.any():
            b = int(np.argwhere(bad.any(axis=1))[0][0])
            position = int(positions[b]) + input_ids.shape[1] - 1
            raise non_finite_logits(
                int(bad[b, 0]), int(bad[b, 1]), int(self.model.vocab_size), position, int(rows[b]), step
            )
        return tokens.astype(np.int64)

    def checked_greedy_steps(
        self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray, steps: int, step: int = 0
    ) -> tuple[np.ndarray, list[tuple[int, RunError] | None]] | None:
        """`steps` greedy decode steps of the batch in one dispatch (`GreedySteps.step_greedy_steps`): i64
        `[B, steps]` tokens, and for each row None, or (j, the RunError `checked_step` would raise) for the first
        step j whose logits were not all finite (that row's tokens from column j on are not to be used). `step` is the
        first step's number (for the message). None when the model cannot (`max_greedy_steps` 0 or absent, fewer than
        `steps`) or a `logits_processor` must see the logits first."""
        if getattr(self.model, "max_greedy_steps", 0) < steps or self.logits_processor is not None:
            return None
        tokens, bad = (np.asarray(a) for a in self.model.step_greedy_steps(input_ids, positions, rows, steps))
        b = input_ids.shape[0]
        if tokens.shape != (b, steps) or bad.shape != (b, steps, 2):
            raise ValueError(f"model.step_greedy_steps returned shapes {tokens.shape} and {bad.shape}")
        errors: list[tuple[int, RunError] | None] = []
        for r in range(b):
            first = np.flatnonzero(bad[r].any(axis=1))
            if not len(first):
                errors.append(None)
                continue
            j = int(first[0])
            vocab = int(self.model.vocab_size)
            nan, inf = (int(v) for v in bad[r, j])
            errors.append((j, non_finite_logits(nan, inf, vocab, int(positions[r]) + j, int(rows[r]), step + j)))
        return tokens.astype(np.int64), errors

    def _process(self, logits: np.ndarray, n_new: int) -> np.ndarray:
        """`logits` through `logits_processor` (unchanged without one)."""
        return logits if self.logits_processor is None else self.logits_processor(logits, n_new)

    def _prefill(self, ids: list[int], row: int) -> np.ndarray:
        """Write `ids` into `row` at positions 0..len-1; returns f32 `[1, V]`, the logits of the last token."""
        chunk = self.prefill_chunk or len(ids)
        rows = np.array([row], dtype=np.int64)
        logits = None
        for start in range(0, len(ids), chunk):
            piece = np.array([ids[start : start + chunk]], dtype=np.int64)
            logits = self.checked_step(piece, np.array([start], dtype=np.int64), rows)
        return logits

    def _run(
        self, prompt_ids: Sequence[int], params: SamplingParams, row: int
    ) -> _PyGenerator[int, None, GenerationResult]:
        """Validate eagerly, then return the generator that yields each new token and returns the result."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        ids = self.check_prompt(prompt_ids)
        row = self._check_row(row)
        return self._tokens(ids, params, row)

    def _tokens(self, ids: list[int], params: SamplingParams, row: int) -> _PyGenerator[int, None, GenerationResult]:
        stop_ids = self._stop_ids(params)
        rng = None if params.greedy else params.make_rng()
        rows = np.array([row], dtype=np.int64)
        tokens: list[int] = []
        finish, stop_token = None, None
        decode_s, decode_steps = 0.0, 0

        start = time.perf_counter()
        logits = self._process(self._prefill(ids, row), 0)
        token = int(sample(logits, params, rng)[0])
        prefill_s = time.perf_counter() - start
        on_device = self._decode_loop(params)
        drawn: Iterator[int] | None = None  # the device loop's tokens, once it runs
        while True:
            if token in stop_ids:
                finish, stop_token = "stop", token
                break
            tokens.append(token)
            yield token
            if len(tokens) >= params.max_new_tokens or len(ids) + len(tokens) >= self.max_positions:
                finish = "length"
                break
            start = time.perf_counter()
            position = len(ids) + len(tokens) - 1
            if on_device is not None:
                if drawn is None:
                    steps = min(params.max_new_tokens - len(tokens), self.max_positions - position - 1)
                    drawn = self._drawn_on_device(on_device, token, position, row, steps, stop_ids)
                token = next(drawn)
            else:
                step = np.array([[token]], dtype=np.int64)
                logits = self.checked_step(step, np.array([position], dtype=np.int64), rows, decode_steps + 1)
                token = int(sample(self._process(logits, len(tokens)), params, rng)[0])
            decode_s += time.perf_counter() - start
            decode_steps += 1
        return self._result(tokens, finish, len(ids), prefill_s, decode_s, decode_steps, row, stop_token)

    def _decode_loop(self, params: SamplingParams) -> Callable | None:
        """The model's `decode_greedy` (`DecodeLoop`) when this generation can use it: greedy, no logits processor."""
        loop = getattr(self.model, "decode_greedy", None)
        return loop if params.greedy and self.logits_processor is None else None

    def _drawn_on_device(
        self, loop: Callable, token: int, position: int, row: int, steps: int, stop_ids: frozenset[int]
    ) -> Iterator[int]:
        """The tokens of `steps` greedy decode steps run by the model's `DecodeLoop` from `token` at `position`, one
        at a time as its chunks come back. Raises RunError, as `checked_step` does, at the step whose logits are not
        all finite (after the tokens before it)."""
        done = 0
        for chunk, bad in loop(token, position, row, steps, stop_ids):
            for t in chunk.tolist():
                done += 1
                yield int(t)
            if bad is not None:
                raise non_finite_logits(*bad, int(self.model.vocab_size), position + done, row, done + 1)

    def _result(
        self,
        tokens: list[int],
        finish: str,
        prompt_tokens: int,
        prefill_s: float,
        decode_s: float,
        decode_steps: int,
        row: int,
        stop_token: int | None,
    ) -> GenerationResult:
        text = (
            self.tokenizer.decode(list(tokens), skip_special_tokens=True)
            if self.tokenizer is not None and tokens
            else ""
        )
        return GenerationResult(
            token_ids=list(tokens),
            text=text,
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            prefill_s=prefill_s,
            decode_s=decode_s,
            decode_steps=decode_steps,
            decode_tokens_per_s=decode_steps / decode_s if decode_steps and decode_s > 0 else 0.0,
            row=row,
            stop_token_id=stop_token,
        )
