"""Which pairs of computations a source promises agree, read from its entries' signatures, and the entry calls that
test each (`Check`): `linnet verify` runs them (`runner`) and compares them (`compare`).

- cache: a decoder's `forward(input_ids)` (or an encoder-decoder's `forward(..., decoder_input_ids)`) against a
  prefill `step` of the first tokens and then one `step` (and, where the source has it, one `decode`) per token
  through the KV cache; an encoder-decoder's encoder runs first through the entry that takes `forward`'s other
  inputs and `rows` (`prefill_encoder`).
- batch: every entry on a batch of two against each row alone (the leading dim of its first output, where some
  input leads with it too); a decoder's `step` on two cache rows against each row alone.
- padding: an entry taking `attention_mask` on right-padded tokens (the mask 0 on the padding) against the tokens
  unpadded.
- same result: two entries with the same output whose inputs differ only by `rows` (`encode` and
  `prefill_encoder`).

Left padding is not checked: a model with learned or rotary positions counted from the first token (BERT,
ModernBERT, as transformers computes them) gives left-padded tokens other positions, so it legitimately differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from linnet.ir.core import Graph, Program
from linnet.runtimes.model import DECODE_ENTRY, concrete_dim, random_inputs

CACHE_TOKENS = 7  # tokens through `forward` in a cache check
PREFILL_TOKENS = 3  # of them, those the first `step` takes at once (prefill); the rest one a step
BATCH_TOKENS = 5  # tokens a row in the batch and padding checks
PADDING_TOKENS = 3  # pad tokens added on the right in the padding check
OTHER_DIM = 8  # the size of a dim variable other than the batch and the sequence, unless `dims` gives it
STEP_INPUTS = ["input_ids", "positions", "rows"]
IDS_INPUTS = ("input_ids", "decoder_input_ids")


@dataclass
class Run:
    """One entry call: `entry` on `inputs` (numpy arrays in the entry's argument order)."""

    entry: str
    inputs: list[np.ndarray]


@dataclass
class Piece:
    """A run of the second way and where it sits in the first way's outputs: along the compared axis it has
    `length` items, of which `take` (start, end) are compared with the first way's `place` (start, end)."""

    run: Run
    length: int
    take: tuple[int, int]
    place: tuple[int, int]


@dataclass
class Stage:
    """One run of the first way (`a`) against the pieces of the second, which tile `total` items of `a`'s compared
    axis; `setup` runs come before the pieces (an encoder-decoder's `prefill_encoder`), their modules compared whole
    with `a`'s."""

    a: Run
    pieces: list[Piece]
    total: int
    setup: list[Run] = field(default_factory=list)


@dataclass
class Check:
    """A pair of computations that must agree: `kind` (cache, batch, padding, same result), the two ways as entry
    names (`ways`: ("forward", "step")), what it does in words, the axis its positions count ("position": tokens,
    "row": batch rows) and its stages, run in order (all of the first way, then all of the second)."""

    kind: str
    ways: tuple[str, str]
    description: str
    axis: str
    stages: list[Stage]
    reads: tuple[frozenset[str], ...] = ()  # the entries of each way, whose parameter reads must be the same


def plan_checks(program: Program, dims: dict[str, int] | None = None, seed: int = 0) -> tuple[list[Check], list[str]]:
    """Every check `program`'s entries call for (see the module docstring), with seeded inputs, and why a check its
    entries suggest cannot run (a sentence each); `dims` sizes the dim variables other than `B` and `S` (`OTHER_DIM`
    for one it lacks). No checks: nothing to compare."""
    maker = _Inputs(program, dims or {}, seed)
    skipped: list[str] = []
    checks = _cache_checks(program, maker, skipped) + _batch_checks(program, maker, skipped)
    checks += _padding_checks(program, maker) + _same_result_checks(program, maker)
    return checks, skipped


class _Inputs:
    """Seeded inputs for an entry at given `B` and `S`: token ids in the vocabulary, N(0, 1) floats, an all-ones
    attention mask (`model.random_inputs`), each call with the next seed."""

    def __init__(self, program: Program, dims: dict[str, int], seed: int):
        self.program, self.dims, self.seed = program, dims, seed
        self.vocab = int(program.config.get("vocab_size", 100) or 100)

    def make(self, graph: Graph, batch: int, tokens: int) -> list[np.ndarray]:
        names = _dim_names(graph)
        fixed = self.dims | {"B": batch, "S": tokens}
        if graph.inputs and graph.inputs[0].dims and _var(graph.inputs[0].dims[0]) not in (None, "B"):
            fixed[_var(graph.inputs[0].dims[0])] = batch  # a batch dim named otherwise (SigLIP's text `T`)
        sizes = self._positive(graph, {d: OTHER_DIM for d in names} | fixed, free=names - set(fixed))
        self.seed += 1
        return random_inputs(graph, sizes, self.seed, self.vocab)

    @staticmethod
    def _positive(graph: Graph, sizes: dict[str, int], free: set[str]) -> dict[str, int]:
        """`sizes`, with the `free` dim variables (those `--dim` does not set) made smaller, all alike, until every
        input dim is at least 1 (a UNet's `text_embeds` is 58 - 8 * N wide in a shrunk config: N = 8 makes it
        negative). Raises ValueError naming the input and its dim when no size does."""
        from linnet.ir.render import dim_text

        def first_bad(trial):
            for v in graph.inputs:
                for d in v.dims:
                    if concrete_dim(d, trial) < 1:
                        return v, d
            return None

        bad = first_bad(sizes)
        for size in range(OTHER_DIM - 1, 0, -1) if bad and free else ():
            trial = sizes | dict.fromkeys(free, size)
            if first_bad(trial) is None:
                return trial
        if bad is None:
            return sizes
        v, d = bad
        given = ", ".join(f"{k}={sizes[k]}" for k in sorted(sizes) if k in set(_dim_names(graph)))
        raise ValueError(
            f"input `{v.name}` of this entry has dim {dim_text(d)} = {concrete_dim(d, sizes)} with {given}, and no "
            "smaller size of the other dims makes it positive: pass --dim NAME=SIZE"
        )


def _dim_names(graph: Graph) -> set[str]:
    from linnet.types.dims import dim_variables

    return {name for v in graph.inputs for d in v.dims for name in dim_variables(d)}


def _var(dim) -> str | None:
    """The dim variable a dim is, alone (`B`), or None (a number, an expression)."""
    from linnet.types.dims import dim_variables

    names = dim_variables(dim)
    if len(names) != 1:
        return None
    name = next(iter(names))
    try:
        return name if concrete_dim(dim, {name: 7}) == 7 else None
    except Exception:  # noqa: BLE001 - an expression the algebra cannot evaluate alone is not a plain variable
        return None


def _names(graph: Graph) -> list[str]:
    return [v.name for v in graph.inputs]


def _is_step(program: Program, name: str) -> bool:
    return name in program.entries and _names(program.entries[name]) == STEP_INPUTS


def _prefill_entry(program: Program, extra: list[str]) -> str | None:
    """The entry that takes `forward`'s inputs beside the token ids, and `rows`: it fills the cache the steps read
    (an encoder-decoder's `prefill_encoder`)."""
    for name, graph in program.entries.items():
        if _names(graph) == [*extra, "rows"]:
            return name
    return None


def _cache_checks(program: Program, maker: _Inputs, skipped: list[str]) -> list[Check]:
    entries = program.entries
    if "forward" not in entries or not _is_step(program, "step"):
        if "step" in entries or ("forward" in entries and program.state):
            skipped.append(
                "no cache check: it needs `entry fn forward(input_ids)` and `entry fn step(input_ids, positions, rows)`"
            )
        return []
    forward = entries["forward"]
    names = _names(forward)
    ids_at = next((i for i, n in enumerate(names) if n in IDS_INPUTS), None)
    if ids_at is None:
        skipped.append(f"no cache check: `forward` takes no {' or '.join(IDS_INPUTS)}")
        return []
    extra = _encoder_inputs(names)
    prefill = _prefill_entry(program, extra) if extra else None
    if extra and prefill is None:
        skipped.append(_no_prefill(extra))
        return []
    ways = ["step"] + ([DECODE_ENTRY] if _is_step(program, DECODE_ENTRY) else [])
    checks = []
    for one_token in ways:
        inputs = maker.make(forward, 1, CACHE_TOKENS)
        ids = inputs[ids_at]
        setup = [Run(prefill, [inputs[names.index(n)] for n in extra] + [_i64([0])])] if prefill else []
        pieces = [
            Piece(
                Run("step", [ids[:, :PREFILL_TOKENS], _i64([0]), _i64([0])]),
                PREFILL_TOKENS,
                (0, PREFILL_TOKENS),
                (0, PREFILL_TOKENS),
            )
        ]
        for j in range(PREFILL_TOKENS, CACHE_TOKENS):
            pieces.append(Piece(Run(one_token, [ids[:, j : j + 1], _i64([j]), _i64([0])]), 1, (0, 1), (j, j + 1)))
        steps = "step" if one_token == "step" else "a prefill `step`, then `decode`"
        described = (
            f"`forward` on {CACHE_TOKENS} tokens against {steps} through the KV cache "
            f"({PREFILL_TOKENS} tokens at once, then one a step)" + (f", after `{prefill}`" if prefill else "")
        )
        b_entries = frozenset(["step", one_token] + ([prefill] if prefill else []))
        stage = Stage(Run("forward", inputs), pieces, CACHE_TOKENS, setup)
        checks.append(
            Check("cache", ("forward", one_token), described, "position", [stage], (frozenset(["forward"]), b_entries))
        )
    return checks


def _i64(values: list[int]) -> np.ndarray:
    """Positions or cache rows as an i64 array."""
    return np.asarray(values, dtype=np.int64)


def _encoder_inputs(names: list[str]) -> list[str]:
    """`forward`'s inputs that an entry must turn into cache before the steps (an encoder-decoder's
    `input_features`): all but the token ids and an attention mask (all ones here, as a step has none)."""
    return [n for n in names if n not in (*IDS_INPUTS, "attention_mask")]


def _no_prefill(extra: list[str]) -> str:
    takes = ", ".join(extra)
    return f"no cached check: `forward` takes {takes} beside the token ids, and no entry takes ({takes}, rows)"


def _batch_checks(program: Program, maker: _Inputs, skipped: list[str]) -> list[Check]:
    checks = []
    for name, graph in program.entries.items():
        if _is_step(program, name) or "rows" in _names(graph) or not graph.outputs or not graph.outputs[0].dims:
            continue
        batch = _var(graph.outputs[0].dims[0])
        led = [i for i, v in enumerate(graph.inputs) if v.dims and _var(v.dims[0]) == batch]
        if batch is None or not led:
            continue
        two = maker.make(graph, 2, BATCH_TOKENS)
        pieces = [Piece(Run(name, _row(two, led, r)), 1, (0, 1), (r, r + 1)) for r in (0, 1)]
        described = f"`{name}` on a batch of two against each row alone"
        checks.append(Check("batch", (name, name), described, "row", [Stage(Run(name, two), pieces, 2)]))
    if _is_step(program, "step") and program.max_batch < 2:
        skipped.append("no cached batch check: the cache has one row (--max-batch 1)")
    elif _is_step(program, "step"):
        checks.append(_cached_batch_check(program, maker))
    return [c for c in checks if c is not None]


def _row(inputs: list[np.ndarray], led: list[int], r: int) -> list[np.ndarray]:
    return [a[r : r + 1] if i in led else a for i, a in enumerate(inputs)]


def _cached_batch_check(program: Program, maker: _Inputs) -> Check | None:
    """`step` (and the encoder's prefill before it) on cache rows 0 and 1 at once against each row alone: a prefill
    of `BATCH_TOKENS` tokens, then one decode step."""
    stages = []
    forward = program.entries.get("forward")
    extra: list[str] = []
    if forward is not None:
        names = _names(forward)
        extra = _encoder_inputs(names)
    prefill = _prefill_entry(program, extra) if extra else None
    if extra and prefill is None:
        return None
    if prefill:
        graph = program.entries[prefill]
        two = maker.make(graph, 2, BATCH_TOKENS)
        two[-1] = _i64([0, 1])
        led = list(range(len(two) - 1))
        pieces = [Piece(Run(prefill, _row(two, led, r)[:-1] + [_i64([r])]), 1, (0, 1), (r, r + 1)) for r in (0, 1)]
        stages.append(Stage(Run(prefill, two), pieces, 2))
    ids = maker.make(program.entries["step"], 2, BATCH_TOKENS + 1)[0]
    one = DECODE_ENTRY if _is_step(program, DECODE_ENTRY) else "step"
    for entry, span, at in (
        ("step", slice(0, BATCH_TOKENS), 0),
        (one, slice(BATCH_TOKENS, BATCH_TOKENS + 1), BATCH_TOKENS),
    ):
        a = Run(entry, [ids[:, span], _i64([at, at]), _i64([0, 1])])
        pieces = [
            Piece(Run(entry, [ids[r : r + 1, span], _i64([at]), _i64([r])]), 1, (0, 1), (r, r + 1)) for r in (0, 1)
        ]
        stages.append(Stage(a, pieces, 2))
    described = (
        f"`step` on cache rows 0 and 1 at once ({BATCH_TOKENS} tokens, then one more) against each row alone"
        + (f", after `{prefill}`" if prefill else "")
    )
    return Check("batch", ("step", "step"), described, "row", stages)


def _padding_checks(program: Program, maker: _Inputs) -> list[Check]:
    checks = []
    for name, graph in program.entries.items():
        names = _names(graph)
        if "attention_mask" not in names or "input_ids" not in names:
            continue
        inputs = maker.make(graph, 1, BATCH_TOKENS)
        padded = list(inputs)
        ids_at, mask_at = names.index("input_ids"), names.index("attention_mask")
        pad = np.zeros((1, PADDING_TOKENS), dtype=inputs[ids_at].dtype)
        padded[ids_at] = np.concatenate([inputs[ids_at], pad], axis=1)
        padded[mask_at] = np.concatenate([inputs[mask_at], pad], axis=1)
        length = BATCH_TOKENS + PADDING_TOKENS
        piece = Piece(Run(name, padded), length, (0, BATCH_TOKENS), (0, BATCH_TOKENS))
        described = f"`{name}` on {BATCH_TOKENS} tokens right-padded by {PADDING_TOKENS} (mask 0) against them unpadded"
        checks.append(
            Check("padding", (name, name), described, "position", [Stage(Run(name, inputs), [piece], BATCH_TOKENS)])
        )
    return checks


def _same_result_checks(program: Program, maker: _Inputs) -> list[Check]:
    checks = []
    for name, graph in program.entries.items():
        names = _names(graph)
        for other, og in program.entries.items():
            if (
                other == name
                or _names(og) != [*names, "rows"]
                or [v.type for v in og.outputs] != [v.type for v in graph.outputs]
            ):
                continue
            inputs = maker.make(graph, 1, BATCH_TOKENS)
            piece = Piece(Run(other, [*inputs, _i64([0])]), 1, (0, 1), (0, 1))
            described = f"`{name}` against `{other}` (the same inputs and a cache row)"
            checks.append(Check("same result", (name, other), described, "row", [Stage(Run(name, inputs), [piece], 1)]))
    return checks


__all__ = ["Check", "Stage", "Piece", "Run", "plan_checks"]
