"""The scheduler's fairness rule, step by step without a model: FCFS admission into free rows, every decoding row in
every step, prefill chunks at fixed boundaries under the token budget, the oldest prefill never starved."""

from __future__ import annotations

import pytest

from linnet.runtimes.serve.scheduler import Scheduler, Sequence, StepPlan


def run_step(scheduler: Scheduler, max_tokens: dict[int, int]) -> StepPlan:
    """Schedule one step and apply it as the engine would (each token drawn is 0); sequences with
    `max_tokens[id]` tokens finish."""
    plan = scheduler.schedule()
    for chunk in plan.prefill:
        chunk.sequence.prefilled += chunk.length
        if chunk.last:
            chunk.sequence.generated.append(0)
    for sequence in plan.decode:
        sequence.generated.append(0)
    for sequence in list(scheduler.running):
        if len(sequence.generated) >= max_tokens.get(id(sequence), 10**9):
            scheduler.finish(sequence)
    return plan


def test_fcfs_admission_into_the_lowest_free_rows():
    scheduler = Scheduler(2, prefill_chunk=8, step_token_budget=64)
    a, b, c = (Sequence([1] * 4) for _ in range(3))
    for s in (a, b, c):
        scheduler.add(s)
    plan = scheduler.schedule()
    assert plan.admitted == [a, b] and (a.row, b.row) == (0, 1) and scheduler.waiting == [c]
    scheduler.finish(a)
    plan = scheduler.schedule()
    assert plan.admitted == [c] and c.row == 0  # a's row, at the next step


def test_every_decoding_row_is_in_every_step_in_row_order():
    scheduler = Scheduler(4, prefill_chunk=4, step_token_budget=4)
    sequences = [Sequence([1] * 3) for _ in range(4)]
    for s in sequences:
        scheduler.add(s)
    steps = [run_step(scheduler, {}) for _ in range(6)]
    for plan in steps[1:]:
        decoding = [s for s in sequences if s.prefilled == 3 and len(s.generated) > 0]
        assert set(plan.decode) <= set(decoding)
    assert [s.row for s in steps[-1].decode] == [0, 1, 2, 3]  # all four decode together, in row order
    assert all(plan.tokens <= 4 or len(plan.prefill) == 1 for plan in steps)


def test_chunks_start_at_multiples_of_prefill_chunk_whatever_the_budget():
    alone = Scheduler(2, prefill_chunk=16, step_token_budget=20)
    crowded = Scheduler(4, prefill_chunk=16, step_token_budget=20)
    long_alone, long_crowded = Sequence(list(range(50))), Sequence(list(range(50)))
    alone.add(long_alone)
    for s in (Sequence([1] * 5), Sequence([1] * 3), long_crowded):
        crowded.add(s)

    def starts(scheduler, sequence):
        seen = []
        while sequence.prefilled < len(sequence.prompt_ids):
            seen += [(c.start, c.length) for c in run_step(scheduler, {}).prefill if c.sequence is sequence]
        return seen

    assert starts(alone, long_alone) == starts(crowded, long_crowded) == [(0, 16), (16, 16), (32, 16), (48, 2)]


def test_a_long_prompt_delays_short_ones_by_one_chunk_per_step_and_is_not_starved():
    chunk, budget = 32, 64
    scheduler = Scheduler(4, prefill_chunk=chunk, step_token_budget=budget)
    running = [Sequence([1] * 4), Sequence([1] * 4)]  # two short requests already decoding
    long = Sequence([1] * 300)
    max_tokens = {id(s): 10**9 for s in running}
    for s in running:
        scheduler.add(s)
    run_step(scheduler, max_tokens)
    scheduler.add(long)
    newcomers: list[Sequence] = []  # short requests keep arriving, one per step
    steps = 0
    while long.prefilled < len(long.prompt_ids):
        newcomer = Sequence([1] * 6)
        newcomers.append(newcomer)
        max_tokens[id(newcomer)] = 2  # each short one finishes quickly, freeing its row for the next
        scheduler.add(newcomer)
        plan = run_step(scheduler, max_tokens)
        steps += 1
        assert set(running) <= set(plan.decode)  # the decoding rows never pause
        long_tokens = sum(c.length for c in plan.prefill if c.sequence is long)
        assert long_tokens <= chunk  # it takes at most one chunk of each step
        assert long_tokens == chunk or long.prefilled == len(long.prompt_ids)  # and gets one every step
        assert plan.tokens <= budget
    assert steps == -(-300 // chunk)
    # The one free row served short requests meanwhile: each takes two steps (prefill + first token, one decode).
    assert sum(len(s.generated) == 2 for s in newcomers) == steps // 2


def test_a_prompt_longer_than_the_budget_still_runs_alone():
    scheduler = Scheduler(2, prefill_chunk=64, step_token_budget=8)
    long = Sequence([1] * 100)
    scheduler.add(long)
    plan = scheduler.schedule()
    assert [(c.start, c.length) for c in plan.prefill] == [(0, 64)]  # the oldest prefill gets its chunk


@pytest.mark.parametrize("field", ["max_batch", "prefill_chunk", "step_token_budget"])
def test_bad_settings(field):
    kwargs = {"max_batch": 2, "prefill_chunk": 8, "step_token_budget": 8, field: 0}
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 1, got 0"):
        Scheduler(kwargs.pop("max_batch"), **kwargs)
