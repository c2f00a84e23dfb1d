"""Which requests take part in the next engine step, and with how many tokens: FCFS admission into free cache rows,
chunked prefill under a per-step token budget, batched decode of every running row.

Pure bookkeeping (no model, no threads): the engine's loop asks `schedule()` for a `StepPlan`, runs it, and tells
the scheduler what happened (`prefilled`, `finish`).

The fairness rule (docs/runtimes.md, "Serving engine"):

1. Every row that is decoding takes part in every step with one token: a running request is never paused.
2. Waiting requests are admitted into free rows in arrival order (first come, first served); one is admitted only
   while the step's token budget has room for its first chunk, so a request never holds a row it cannot use.
3. Prompts are prefilled in chunks of `prefill_chunk` tokens that start at multiples of `prefill_chunk` (so the
   split, and hence the numbers the model computes, never depend on what else is running). After the decode
   tokens, the budget goes to the prefilling rows in admission order, one chunk each, while it lasts; the oldest
   prefilling row always gets its chunk, even past the budget.

So a long prompt delays the others' decode by at most one chunk of prefill per step, and is itself never starved:
it gets a chunk at every step once it is the oldest prefilling row, and only requests that arrived before it can
be that. Short requests that arrive after it still get the budget it leaves (the default budget is two chunks).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

__all__ = ["PrefillChunk", "Scheduler", "Sequence", "StepPlan"]


@dataclass(eq=False)
class Sequence:
    """One request's place in the cache: its prompt, its cache row once admitted, how much of the prompt is in the
    cache (`prefilled`) and the tokens generated so far (`generated`; the last one is fed back by the next decode).
    """

    prompt_ids: list[int]
    row: int | None = None
    prefilled: int = 0
    generated: list[int] = field(default_factory=list)

    @property
    def decoding(self) -> bool:
        """True once the prompt is in the cache and a first token has been drawn."""
        return self.prefilled == len(self.prompt_ids) and bool(self.generated)

    @property
    def next_position(self) -> int:
        """The position the next decode step writes (that of the last generated token)."""
        return len(self.prompt_ids) + len(self.generated) - 1


@dataclass(frozen=True)
class PrefillChunk:
    """`sequence`'s prompt tokens `start .. start + length - 1`, written at those positions of its row."""

    sequence: Sequence
    start: int
    length: int

    @property
    def ids(self) -> list[int]:
        return self.sequence.prompt_ids[self.start : self.start + self.length]

    @property
    def last(self) -> bool:
        """True when this chunk ends the prompt (its logits give the first token)."""
        return self.start + self.length == len(self.sequence.prompt_ids)


@dataclass
class StepPlan:
    """One step: `decode`, the decoding sequences (in row order: one batched `step` [B, 1]); `prefill`, the chunks
    (one `step` [1, length] each); `admitted`, the sequences that got a row in this plan."""

    decode: list[Sequence]
    prefill: list[PrefillChunk]
    admitted: list[Sequence]

    @property
    def tokens(self) -> int:
        return len(self.decode) + sum(c.length for c in self.prefill)


class Scheduler:
    """FCFS admission, chunked prefill and batched decode over `max_batch` cache rows (module docstring).

    `prefill_chunk` (>= 1): the most prompt tokens one step writes for one request. `step_token_budget` (>= 1): the
    tokens (decode tokens plus prefill chunks) one step aims at; it can be exceeded only by the oldest prefilling
    row's chunk. Raises ValueError for values out of range.
    """

    def __init__(self, max_batch: int, *, prefill_chunk: int = 256, step_token_budget: int = 512) -> None:
        for name, value in (
            ("max_batch", max_batch),
            ("prefill_chunk", prefill_chunk),
            ("step_token_budget", step_token_budget),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.step_token_budget = step_token_budget
        self.waiting: list[Sequence] = []  # arrival order
        self.running: list[Sequence] = []  # admission order
        self._free_rows = list(range(max_batch))  # a heap: the lowest free row first

    @property
    def rows_in_use(self) -> int:
        return self.max_batch - len(self._free_rows)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, sequence: Sequence) -> None:
        """Queue a new request (it waits for a row)."""
        self.waiting.append(sequence)

    def finish(self, sequence: Sequence) -> None:
        """Drop a finished, cancelled or failed request, waiting or running; its row is free for the next step."""
        if sequence in self.waiting:
            self.waiting.remove(sequence)
        if sequence in self.running:
            self.running.remove(sequence)
            heapq.heappush(self._free_rows, sequence.row)

    def schedule(self) -> StepPlan:
        """The next step under the fairness rule (module docstring). Empty when there is nothing to do."""
        decode = sorted((s for s in self.running if s.decoding), key=lambda s: s.row)
        budget = self.step_token_budget - len(decode)
        prefill: list[PrefillChunk] = []
        for sequence in self.running:
            if sequence.prefilled < len(sequence.prompt_ids):
                chunk = self._chunk(sequence)
                if prefill and chunk.length > budget:
                    continue
                prefill.append(chunk)
                budget -= chunk.length
        admitted: list[Sequence] = []
        while self.waiting and self._free_rows:
            chunk = self._chunk(self.waiting[0])
            if prefill and chunk.length > budget:
                break
            sequence = self.waiting.pop(0)
            sequence.row = heapq.heappop(self._free_rows)
            self.running.append(sequence)
            admitted.append(sequence)
            prefill.append(chunk)
            budget -= chunk.length
        return StepPlan(decode, prefill, admitted)

    def _chunk(self, sequence: Sequence) -> PrefillChunk:
        start = sequence.prefilled
        end = min(len(sequence.prompt_ids), (start // self.prefill_chunk + 1) * self.prefill_chunk)
        return PrefillChunk(sequence, start, end - start)
