"""The serving engine: continuous batching of many requests over one `StepModel`'s fixed cache rows.

One background thread owns the model and runs the loop; `submit` (any thread) queues a `Request` and returns a
`RequestHandle` whose `events()` (blocking) or `aevents()` (asyncio) yield `Delta`s of text and end with one
`Finished`. Each loop iteration is one *step*:

1. apply cancellations (a cancelled request's row is free for this very step);
2. ask the `Scheduler` for a plan (FCFS admission into free rows, every decoding row, prefill chunks under the
   per-step token budget: scheduler.py states the fairness rule);
3. run the prefill chunks (one `model.step` `[1, chunk]` each, as `Generator` prefills; on a model that compiles
   nothing per shape, the chunks of equal start and length as one `[k, chunk]` step, and on one that compiled such
   steps (`PrefillBatches`: the JAX backends on an accelerator) up to `prefill_batch(chunk)` of them) and one
   batched decode `model.step` `[B, 1]` of every decoding row (in row order, as `Generator.generate_batch`
   decodes). When every decoding row is greedy, nothing else waits and the model can (`GreedySteps`: the JAX
   backends on an accelerator), up to `max_greedy_steps` decode steps run in one dispatch (vLLM's multi-step
   scheduling): a request arriving meanwhile waits for them, and a row that ends inside them drops the rest;
4. sample each row's next token from its own logits with its own RNG (`SamplingParams.make_rng()`, seeded from the
   request's own seed), check stop token ids, stop strings and `max_tokens`, and hand out the events.

So a request gets exactly the tokens `Generator.generate` (`linnet generate`) gives it alone, whatever else is in
the batch, as long as the backend's logits of a row do not depend on the batch (see docs/runtimes.md, "Serving
engine", for the backends where B = 1 and B = 8 matmuls differ) and its prompt is prefilled the same way (one step
when the prompt is at most `prefill_chunk` tokens, which is how `linnet generate` prefills every prompt).

Backend-neutral: numpy only, never torch, jax nor onnxruntime.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..generation import Generator, StepModel, Tokenizer
from ..sampling import SamplingParams, sample
from .scheduler import PrefillChunk, Scheduler, Sequence, StepPlan
from .stops import StopResult, TextStream, stop_token_ids


@dataclass(frozen=True)
class Request:
    """One generation request.

    - `prompt_ids`: the prompt's token ids (1 <= length; `len(prompt_ids) + max_tokens <= max_positions`).
    - `params`: temperature, top_k, top_p and seed (`SamplingParams`; its `max_new_tokens` is not used, `max_tokens`
      is; its `stop_token_ids` are added to `stop_token_ids`).
    - `max_tokens` (>= 1): the most new tokens; reaching it finishes with reason "length".
    - `stop`: stop strings, matched across token boundaries; the text from the stop string on is never emitted.
    - `stop_token_ids`: token ids that end the request (finish "stop"), besides the tokenizer's EOS ids.
    - `ignore_eos`: when True, the tokenizer's EOS ids do not end the request.
    """

    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


# the least seconds between two calls of an engine's `on_idle`
IDLE_EVERY_S = 30.0
# `Engine.max_queue_delay_s`'s default: no wait, as Triton's default. Measured with `bench/serve_speed.py`'s closed
# loop on the shared 2-core machine, a burst's requests reached the server over 80-300 ms (new connections, CPUs held
# by other jobs): 20 ms seldom caught them (1-2 lone prefills in 4 waves of 32; 2 without the wait) and cost every
# lone request 20 ms; 300 ms aligned 8 clients' waves (64 model calls for 2 waves instead of 66-71) but would add
# 300 ms to a lone request's first token.
MAX_QUEUE_DELAY_S = 0.0


class QueueFull(Exception):
    """`submit` found `max_queue` requests already waiting for a row, none free for this one (HTTP: 429 with
    Retry-After)."""


class ContextLengthExceeded(Exception):
    """`submit` got a prompt whose length plus `max_tokens` exceeds the cache's `max_positions` (HTTP 400
    `context_length_exceeded`). `prompt_tokens`, `max_tokens`, `max_positions` say by how much."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_positions: int) -> None:
        self.prompt_tokens, self.max_tokens, self.max_positions = prompt_tokens, max_tokens, max_positions
        super().__init__(
            f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is {prompt_tokens + max_tokens} "
            f"tokens, more than the {max_positions} positions the cache was compiled for (--max-positions)"
        )


@dataclass
class Delta:
    """New text that can no longer be part of a stop string, and the tokens behind it (the tokens drawn since the
    previous `Delta`; their text may be in a later `Delta` when held back). Stop and EOS tokens are never in it."""

    text: str
    token_ids: list[int]


@dataclass
class Finished:
    """The last event of every request.

    - `finish_reason`: "stop" (EOS, a stop token id or a stop string), "length" (`max_tokens`), "cancelled"
      (`cancel()`, or the consumer stopped iterating) or "error" (`error` says what failed).
    - `prompt_tokens`, `completion_tokens`: usage; `completion_tokens` counts the tokens in the `Delta`s (the stop or
      EOS token that ended the request is not counted, as in `GenerationResult.token_ids`).
    - `stop_reason`: the matched stop string, or the stop token id from `stop_token_ids`; None at EOS, at "length"
      and otherwise (as vLLM's `stop_reason`).
    - Timings in seconds from `time.monotonic()`: `queued_s` (submit to admission into a row), `ttft_s` (submit to
      the first token, None when none was drawn), `e2e_s` (submit to finish), `inter_token_s` (the gap before
      each token after the first).
    """

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stop_reason: str | int | None
    error: str | None = None
    queued_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    inter_token_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot: requests `running` (holding a row) and `waiting`, `rows_in_use` of `max_batch`, and the tokens
    prefilled (`prompt_tokens_total`) and generated (`generation_tokens_total`) since start."""

    running: int
    waiting: int
    rows_in_use: int
    max_batch: int
    prompt_tokens_total: int
    generation_tokens_total: int


class RequestHandle:
    """A submitted request: its `id`, its events, and `cancel()`.

    Events come from the engine's thread; `events()` blocks on a condition variable and `aevents()` awaits an
    `asyncio.Event` the engine sets through `loop.call_soon_threadsafe` (no polling). A consumer that stops
    iterating before `Finished` (break, an exception, a closed generator) cancels the request.
    """

    def __init__(self, request_id: str, engine: Engine) -> None:
        self.id = request_id
        self._engine = engine
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._events: deque[Delta | Finished] = deque()
        self._wakers: list[Callable[[], None]] = []
        self.cancelled = False

    def events(self) -> Iterator[Delta | Finished]:
        """The request's events, blocking until each arrives; ends after `Finished`."""
        done = False
        try:
            while not done:
                with self._lock:
                    while not self._events:
                        self._ready.wait()
                    event = self._events.popleft()
                done = isinstance(event, Finished)
                yield event
        finally:
            if not done:
                self.cancel()

    async def aevents(self) -> AsyncIterator[Delta | Finished]:
        """The request's events for asyncio; ends after `Finished`."""
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(arrived.set)
            except RuntimeError:  # the loop is closed: nobody listens any more
                pass

        with self._lock:
            self._wakers.append(wake)
        done = False
        try:
            while not done:
                with self._lock:
                    event = self._events.popleft() if self._events else None
                    if event is None:
                        arrived.clear()  # under the lock: an event put after this sets it again
                if event is None:
                    await arrived.wait()
                    continue
                done = isinstance(event, Finished)
                yield event
        finally:
            with self._lock:
                self._wakers.remove(wake)
            if not done:
                self.cancel()

    def cancel(self) -> None:
        """Stop the request: it frees its row at the next step and ends with `Finished("cancelled")` (unless it has
        already finished). Thread-safe, idempotent."""
        self._engine._cancel(self)

    def _put(self, event: Delta | Finished) -> None:
        with self._lock:
            self._events.append(event)
            self._ready.notify_all()
            wakers = list(self._wakers)
        for wake in wakers:
            wake()


@dataclass(eq=False)
class _Active:
    """The engine's state of one request: the scheduler's `Sequence` plus sampling, stops and timings."""

    handle: RequestHandle
    request: Request
    sequence: Sequence
    stop_ids: frozenset[int]
    text: TextStream
    rng: np.random.Generator | None
    arrived: float
    admitted: float | None = None
    token_times: list[float] = field(default_factory=list)
    unsent: list[int] = field(default_factory=list)  # tokens drawn since the last Delta
    finished: bool = False


class Engine:
    """Continuous batching over `model` (module docstring). `tokenizer` decodes text and gives the EOS ids (None:
    token ids only, no stop strings).

    - `max_queue` (>= 1): the most requests waiting for a row (requests that can take a free row are not counted:
      an idle engine accepts `max_batch + max_queue` at once); `submit` raises `QueueFull` beyond it.
    - `prefill_chunk` (>= 1): the most prompt tokens one step prefills for one request.
    - `step_token_budget` (>= 1): the tokens one step aims at (decode tokens plus prefill chunks; scheduler.py).
    - `max_queue_delay_s` (>= 0): how long an idle engine (no request holding a row) holds the first request of a
      burst before its first step, while more arrive and rows are free for them, as Triton's dynamic batcher's
      `max_queue_delay_microseconds`: clients that send together are then prefilled in one batched step and decode
      in step with each other, where without it the first request took a step of its own (a whole pass over the
      weights for one prompt), rode one step ahead of the others to the end, and its next request repeated that
      at every wave of a closed loop. The wait ends as soon as the pending requests fill the free rows; it never
      delays a request while others decode (their tokens would wait too). 0 (the default): no wait.
    - `on_idle`: called on the engine's thread when it runs out of work after having had some, at most every
      IDLE_EVERY_S (`linnet serve` re-chooses torch's thread count there: a server started while the machine was
      busy kept 1 thread for its whole life). An exception from it is ignored.

    Raises ValueError for a model whose `max_batch`, `max_positions` or `vocab_size` is not a positive integer, or
    an argument out of range.
    """

    def __init__(
        self,
        model: StepModel,
        tokenizer: Tokenizer | None,
        *,
        max_queue: int = 256,
        prefill_chunk: int = 256,
        step_token_budget: int = 512,
        max_queue_delay_s: float = MAX_QUEUE_DELAY_S,
        on_idle: Callable[[], object] | None = None,
    ) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"max_queue must be an integer >= 1, got {max_queue!r}")
        if (
            isinstance(max_queue_delay_s, bool)
            or not isinstance(max_queue_delay_s, (int, float))
            or not (0 <= max_queue_delay_s < float("inf"))
        ):
            raise ValueError(f"max_queue_delay_s must be a finite number >= 0, got {max_queue_delay_s!r}")
        self.max_queue_delay_s = float(max_queue_delay_s)
        # The Generator checks the model and runs each step (shape and finiteness checks) exactly as `linnet
        # generate` does.
        self._runner = Generator(model, tokenizer, prefill_chunk=prefill_chunk)
        self.model = model
        # a new [k, length] shape costs a compiling backend a compile in the middle of serving
        self._batch_prefill = not getattr(model, "compile_kind", "")
        self.tokenizer = tokenizer
        self.max_queue = max_queue
        self._scheduler = Scheduler(
            int(model.max_batch), prefill_chunk=prefill_chunk, step_token_budget=step_token_budget
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._submitted: list[_Active] = []  # new requests, handed to the scheduler by the loop
        self._cancelled: set[RequestHandle] = set()
        self._active: dict[RequestHandle, _Active] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._on_idle = on_idle
        self._idle_due = False  # work was done since on_idle last ran
        self._last_idle = -IDLE_EVERY_S

    # ---- public API -------------------------------------------------------------------------------------------

    @property
    def max_positions(self) -> int:
        return int(self.model.max_positions)

    @property
    def max_batch(self) -> int:
        return int(self.model.max_batch)

    def warm_up(self) -> None:
        """Do now what a compiling backend (`WarmUp`: jax, xla, torch-compile; ONNX Runtime builds its session)
        would otherwise do during the first requests: the decode step of every batch size 1..max_batch and prefill
        steps of 2^k + 1 tokens up to `prefill_chunk` (the lengths at which a backend that pads prefill to
        power-of-two buckets changes bucket), and on a `PrefillBatches` model the steps of as many full chunks at
        once as `step_token_budget` holds. Call it before `start`: it writes dummy entries into rows from
        position 0. Raises RuntimeError after `start`."""
        with self._lock:
            if self._thread is not None or self._stopping:
                raise RuntimeError("warm_up() must come before start(): it writes into the cache rows")
        warm_up = getattr(self.model, "warm_up", None)
        if warm_up is None:
            return
        chunk = min(self._scheduler.prefill_chunk, self.max_positions - 1)
        lengths = sorted({min(chunk, 2**k + 1) for k in range(chunk.bit_length() + 1)})
        warm_up(lengths, list(range(1, self.max_batch + 1)))
        # full chunks of several prompts in one step (`PrefillBatches`), as many as the step's budget holds
        together = min(self._scheduler.step_token_budget // chunk, self.max_batch)
        warm_up_prefill = getattr(self.model, "warm_up_prefill", None)
        if warm_up_prefill is not None and together > 1:
            warm_up_prefill(chunk, list(range(2, together + 1)))

    def start(self) -> None:
        """Start the background thread that owns the model and runs the loop. Raises RuntimeError when started
        twice or after `shutdown`."""
        with self._lock:
            if self._thread is not None or self._stopping:
                raise RuntimeError("the engine was already started")
            self._thread = threading.Thread(target=self._loop, name="linnet-serve-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """Cancel every request (each ends with `Finished("cancelled")`) and join the thread. Idempotent."""
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            leftover = list(self._active.values()) + self._submitted
            self._submitted = []
        for active in leftover:
            self._finish(active, "cancelled")

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def submit(self, request: Request) -> RequestHandle:
        """Queue `request`; thread-safe. Returns its handle.

        Raises `ContextLengthExceeded` when `len(prompt_ids) + max_tokens > max_positions`, `QueueFull` when no
        row is free for it and `max_queue` requests already wait for one, ValueError for an empty prompt, token ids
        outside the vocabulary, `max_tokens` < 1, empty stop strings (or stop strings without a tokenizer), and
        RuntimeError after `shutdown`.
        """
        if not isinstance(request.params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(request.params).__name__}")
        max_tokens = request.max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        prompt = list(request.prompt_ids)
        if prompt and len(prompt) + max_tokens > self.max_positions:
            raise ContextLengthExceeded(len(prompt), max_tokens, self.max_positions)
        prompt = self._runner.check_prompt(prompt)
        text = TextStream(self.tokenizer, tuple(request.stop))
        stop_ids = stop_token_ids(
            self.tokenizer,
            set(request.stop_token_ids) | request.params.stop_token_ids,
            ignore_eos=request.ignore_eos,
        )
        with self._lock:
            if self._stopping:
                raise RuntimeError("the engine is shut down")
            # the queue holds what cannot take a free row: requests about to take one are not queued (a burst of
            # max_batch + max_queue requests on an idle engine is all accepted). Read without the scheduler's
            # own lock: the engine thread only ever moves a request from waiting to a row, which this may count
            # as one more free row for an instant, never as one fewer.
            pending = len(self._submitted) + len(self._scheduler.waiting)
            free_rows = self.max_batch - self._scheduler.rows_in_use
            # a cancelled request (a client that disconnected) the loop has not dropped yet frees its row or its
            # place in the queue at the next step: it is not counted, or a request right after it got a 429
            waiting = max(0, pending - free_rows - len(self._cancelled))
            if waiting >= self.max_queue:
                raise QueueFull(
                    f"{waiting} requests are already waiting for a row (the queue holds {self.max_queue}, "
                    f"beside {self.max_batch} rows)"
                )
            handle = RequestHandle(f"req-{next(self._ids)}", self)
            rng = None if request.params.greedy else request.params.make_rng()
            active = _Active(handle, request, Sequence(prompt), stop_ids, text, rng, arrived=time.monotonic())
            self._submitted.append(active)
            self._active[handle] = active
            self._wake.notify_all()
        return handle

    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters (thread-safe)."""
        with self._lock:
            return EngineStats(
                running=len(self._scheduler.running),
                waiting=len(self._scheduler.waiting) + len(self._submitted),
                rows_in_use=self._scheduler.rows_in_use,
                max_batch=self.max_batch,
                prompt_tokens_total=self._prompt_tokens_total,
                generation_tokens_total=self._generation_tokens_total,
            )

    # ---- the loop (engine thread) -----------------------------------------------------------------------------

    def _cancel(self, handle: RequestHandle) -> None:
        with self._lock:
            if handle in self._active:
                handle.cancelled = True
                self._cancelled.add(handle)
                self._wake.notify_all()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not (self._submitted or self._cancelled or self._scheduler.has_work()):
                    if self._idle_due and time.monotonic() - self._last_idle >= IDLE_EVERY_S:
                        self._run_idle_hook()  # releases the lock while the hook runs
                        continue
                    self._wake.wait()
                self._gather_burst()
                self._idle_due = self._on_idle is not None
                if self._stopping:
                    return
                for active in self._submitted:
                    self._scheduler.add(active.sequence)
                self._submitted = []
                cancelled = [self._active[h] for h in self._cancelled if h in self._active]
                self._cancelled.clear()
            try:
                for active in cancelled:
                    self._finish(active, "cancelled")
                plan = self._scheduler.schedule()
                if plan.tokens:
                    self._run(plan)
            except Exception as error:  # noqa: BLE001 - a bug must end the requests, not leave clients waiting
                with self._lock:
                    broken = list(self._active.values())
                for active in broken:
                    if active.sequence in self._scheduler.waiting or active.sequence in self._scheduler.running:
                        self._finish(active, "error", error=f"internal error: {type(error).__name__}: {error}")

    def _gather_burst(self) -> None:
        """On an idle engine, wait (with the lock held, released while waiting) until `max_queue_delay_s` after the
        first new request's arrival for more requests, or until they fill the free rows (`max_queue_delay_s`)."""
        if not self._submitted or self._scheduler.has_work():
            return
        deadline = self._submitted[0].arrived + self.max_queue_delay_s
        free_rows = self.max_batch - self._scheduler.rows_in_use
        while not self._stopping and not self._cancelled and len(self._submitted) < free_rows:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.wait(left)

    def _run_idle_hook(self) -> None:
        """Run `on_idle` without the lock (called with it held), so submits are not held up meanwhile."""
        self._idle_due, self._last_idle = False, time.monotonic()
        self._lock.release()
        try:
            self._on_idle()
        except Exception:  # noqa: BLE001 - a tuning hook must never stop the engine
            pass
        finally:
            self._lock.acquire()

    def _by_sequence(self) -> dict[int, _Active]:
        with self._lock:
            return {id(a.sequence): a for a in self._active.values()}

    def _run(self, plan: StepPlan) -> None:
        """Run one step's model calls and hand out what they produced."""
        by_sequence = self._by_sequence()
        now = time.monotonic()
        for sequence in plan.admitted:
            by_sequence[id(sequence)].admitted = now
        for group in self._prefill_groups(plan.prefill):
            actives = [by_sequence[id(chunk.sequence)] for chunk in group]
            try:
                logits = self._runner.checked_step(
                    np.array([chunk.ids for chunk in group], dtype=np.int64),
                    np.array([chunk.start for chunk in group], dtype=np.int64),
                    np.array([chunk.sequence.row for chunk in group], dtype=np.int64),
                )
            except Exception as error:  # noqa: BLE001 - these requests fail, the engine keeps serving
                for active in actives:
                    self._finish(active, "error", error=f"{type(error).__name__}: {error}")
                continue
            for b, (chunk, active) in enumerate(zip(group, actives, strict=True)):
                chunk.sequence.prefilled += chunk.length
                with self._lock:
                    self._prompt_tokens_total += chunk.length
                if chunk.last:
                    self._take(active, logits[b : b + 1])
        if plan.decode:
            decoding = [by_sequence[id(s)] for s in plan.decode]
            decoding = [a for a in decoding if not a.finished]
            if not decoding:
                return
            inputs = (
                np.array([[a.sequence.generated[-1]] for a in decoding], dtype=np.int64),
                np.array([a.sequence.next_position for a in decoding], dtype=np.int64),
                np.array([a.sequence.row for a in decoding], dtype=np.int64),
            )
            step = 1 + min(len(a.sequence.generated) for a in decoding)
            # all greedy: the tokens taken on the device where the model can (`GreedyStep`), no logits back
            greedy = all(a.request.params.greedy for a in decoding)
            steps = self._decode_steps(plan, decoding) if greedy else 1
            if steps > 1 and self._run_steps(decoding, inputs, steps, step):
                return
            try:
                tokens = self._runner.checked_greedy_step(*inputs, step=step) if greedy else None
                logits = self._runner.checked_step(*inputs, step=step) if tokens is None else None
            except Exception as error:  # noqa: BLE001 - the requests of this step fail, the engine keeps serving
                for active in decoding:
                    self._finish(active, "error", error=f"{type(error).__name__}: {error}")
                return
            for b, active in enumerate(decoding):
                if tokens is not None:
                    self._accept(active, int(tokens[b]))
                else:
                    self._take(active, logits[b : b + 1])

    def _decode_steps(self, plan: StepPlan, decoding: list[_Active]) -> int:
        """How many decode steps this step may run in one dispatch (`GreedySteps`): 1 unless the model can run
        several and nothing else waits for the engine (no prefill, no request waiting or cancelled: they would wait
        for the whole dispatch); at most what every row may still generate and hold in its cache."""
        most = int(getattr(self.model, "max_greedy_steps", 0))
        if most < 2 or plan.prefill or plan.admitted:
            return 1
        with self._lock:
            if self._submitted or self._cancelled or self._scheduler.waiting:
                return 1
        for active in decoding:
            left = active.request.max_tokens - len(active.sequence.generated)
            room = self.max_positions - active.sequence.next_position
            most = min(most, left, room)
        return max(most, 1)

    def _run_steps(self, decoding: list[_Active], inputs: tuple[np.ndarray, ...], steps: int, step: int) -> bool:
        """Run `steps` greedy decode steps of `decoding` in one dispatch and hand out their tokens, each row's
        only up to where its request ends (a stop token or string, `max_tokens`: the steps it ran past that are
        dropped, and their cache entries are past what the row holds) or its logits stopped being finite (that
        request alone fails). False when the model could not (the caller then runs one step)."""
        try:
            result = self._runner.checked_greedy_steps(*inputs, steps=steps, step=step)
        except Exception as error:  # noqa: BLE001 - the requests of this step fail, the engine keeps serving
            for active in decoding:
                self._finish(active, "error", error=f"{type(error).__name__}: {error}")
            return True
        if result is None:
            return False
        tokens, errors = result
        for b, active in enumerate(decoding):
            for j in range(steps):
                if active.finished:
                    break
                if errors[b] is not None and errors[b][0] == j:
                    error = errors[b][1]
                    self._finish(active, "error", error=f"{type(error).__name__}: {error}")
                    break
                self._accept(active, int(tokens[b, j]))
        return True

    def _prefill_groups(self, chunks: list[PrefillChunk]) -> list[list[PrefillChunk]]:
        """The step's prefill chunks as model calls: one `[1, length]` step each, or, where the model compiles
        nothing per shape (`compile_kind` "": eager PyTorch), the chunks of equal start and length together as one
        `[k, length]` step (rows in order), which reads the weights once for the k prompts. Each row's logits are
        those of its own `[1, length]` step (a row of a batched step is computed as the row alone; the tests
        check it against `Generator.generate`)."""
        prefill_batch = getattr(self.model, "prefill_batch", None)
        if not self._batch_prefill and prefill_batch is None:
            return [[chunk] for chunk in chunks]
        groups: dict[tuple[int, int], list[PrefillChunk]] = {}
        for chunk in chunks:
            groups.setdefault((chunk.start, chunk.length), []).append(chunk)
        calls = []
        for (_, length), group in groups.items():
            group.sort(key=lambda c: c.sequence.row)
            most = len(group) if self._batch_prefill else max(1, int(prefill_batch(length)))
            calls += [group[i : i + most] for i in range(0, len(group), most)]
        return calls

    def _take(self, active: _Active, logits: np.ndarray) -> None:
        """Sample `active`'s next token from its logits `[1, V]`, apply the stop conditions and emit events."""
        if active.finished:
            return
        try:
            token = int(sample(logits, active.request.params, active.rng)[0])
        except ValueError as error:  # this request's sampling cannot go on: it ends, not the batch it ran in
            self._finish(active, "error", error=f"{type(error).__name__}: {error}")
            return
        self._accept(active, token)

    def _accept(self, active: _Active, token: int) -> None:
        """`active`'s next token is `token`: apply the stop conditions and emit events."""
        if active.finished:
            return
        request = active.request
        active.token_times.append(time.monotonic())
        with self._lock:
            self._generation_tokens_total += 1
        if token in active.stop_ids:
            self._end(active, active.text.finish(), token)
            return
        active.sequence.generated.append(token)
        active.unsent.append(token)
        released = active.text.push(token)
        if released.stop is not None:
            self._end(active, released, None)
            return
        if len(active.sequence.generated) >= request.max_tokens:
            tail = active.text.finish()
            self._end(active, StopResult(released.text + tail.text, tail.stop), None)
            return
        if released.text or self.tokenizer is None:
            self._emit(active, released.text)

    def _emit(self, active: _Active, text: str) -> None:
        tokens, active.unsent = active.unsent, []
        active.handle._put(Delta(text, tokens))

    def _end(self, active: _Active, released: StopResult, stop_token: int | None) -> None:
        """Finish `active` after a stop token (`stop_token`), a stop string (`released.stop`) or `max_tokens`."""
        if released.text or active.unsent:
            self._emit(active, released.text)
        if released.stop is not None:
            self._finish(active, "stop", stop_reason=released.stop)
        elif stop_token is not None:
            asked = stop_token in active.request.stop_token_ids or stop_token in active.request.params.stop_token_ids
            self._finish(active, "stop", stop_reason=stop_token if asked else None)
        else:
            self._finish(active, "length")

    def _finish(self, active: _Active, reason: str, *, stop_reason: str | int | None = None, error: str | None = None):
        """Free `active`'s row and send its `Finished` (once)."""
        if active.finished:
            return
        active.finished = True
        self._scheduler.finish(active.sequence)
        with self._lock:
            self._active.pop(active.handle, None)
            self._cancelled.discard(active.handle)
        end = time.monotonic()
        times = active.token_times
        active.handle._put(
            Finished(
                finish_reason=reason,
                prompt_tokens=len(active.sequence.prompt_ids),
                completion_tokens=len(active.sequence.generated),
                stop_reason=stop_reason,
                error=error,
                queued_s=None if active.admitted is None else active.admitted - active.arrived,
                ttft_s=times[0] - active.arrived if times else None,
                e2e_s=end - active.arrived,
                inter_token_s=[b - a for a, b in itertools.pairwise(times)],
            )
        )
