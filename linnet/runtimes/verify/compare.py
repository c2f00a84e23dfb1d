"""Comparing two ways of computing the same values: the tolerance of a numerics mode, the alignment of the second
way's pieces with the first way's tensor (along a token or batch axis), and the first module whose outputs part.

A difference counts when max |Δ| > tolerance, with tolerance = rtol · max(max |reference|, 1e-3): relative to the
largest value of the tensor compared (random weights give logits of a few tenths), so one rule holds for logits,
hidden states and a module's intermediate values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from linnet.runtimes.verify.plan import Piece
from linnet.runtimes.verify.trace import Call

# rtol by working dtype and numerics: f32 under `equivalent` follows the reference's op order, so two ways differ by
# reassociation only (a prefill's matmul against a decode step's: ~1e-6 of the largest value); `fast` fuses and may
# pick other kernels per shape; bf16 and f16 keep 8 and 11 bits, and a step's rounding differs from a whole
# sequence's.
RTOL = {("f32", "equivalent"): 1e-4, ("f32", "fast"): 1e-3, ("bf16", "equivalent"): 5e-2, ("bf16", "fast"): 5e-2}
RTOL |= {("f16", "equivalent"): 1e-2, ("f16", "fast"): 1e-2}
FLOOR = 1e-3  # the smallest scale a tolerance is relative to: a tensor of zeros still has a tolerance


def rtol_for(dtype: str, numerics: str) -> float:
    """The relative tolerance of working dtype `dtype` ("f32", "bf16", "f16") under `numerics`. Raises ValueError
    for another pair."""
    try:
        return RTOL[(dtype, numerics)]
    except KeyError:
        raise ValueError(f"no tolerance for dtype {dtype} under numerics {numerics}") from None


@dataclass
class Part:
    """How one aligned pair of tensors compares: the largest |Δ|, the tolerance, the first index along the compared
    axis (in the first way's frame) where |Δ| > tolerance (None: they agree, or the axis was not compared), the
    shapes of the two sides."""

    max_delta: float
    tolerance: float
    position: int | None
    shapes: tuple[tuple[int, ...], tuple[int, ...]]

    @property
    def parts(self) -> bool:
        return self.max_delta > self.tolerance


def aligned(a: torch.Tensor, parts: list[torch.Tensor], pieces: list[Piece], total: int):
    """The pairs (first-way slice, second-way slice, first index, axis) that tile `a` with `parts`: along the first
    axis where `a` has `total` items and each part its piece's `length` (other dims equal); else, where each part is
    `a` without that axis, the part against `a` at its piece's last place (a `step` returns its last token's
    logits); else, where every part has `a`'s shape, each part against all of `a` (a computation the pieces share).
    None when nothing aligns."""
    for ax in range(a.dim()):
        if a.shape[ax] != total:
            continue
        if all(_tiles(a, p, ax, piece.length) for p, piece in zip(parts, pieces)):
            return [
                (
                    a.narrow(ax, piece.place[0], piece.place[1] - piece.place[0]),
                    p.narrow(ax, piece.take[0], piece.take[1] - piece.take[0]),
                    piece.place[0],
                    ax,
                )
                for p, piece in zip(parts, pieces)
            ]
    for ax in range(a.dim()):
        if a.shape[ax] == total and all(tuple(p.shape) == a.shape[:ax] + a.shape[ax + 1 :] for p in parts):
            return [(a.select(ax, piece.place[1] - 1), p, piece.place[1] - 1, None) for p, piece in zip(parts, pieces)]
    if all(p.shape == a.shape for p in parts):
        return [(a, p, None, None) for p in parts]
    return None


def _tiles(a: torch.Tensor, p: torch.Tensor, ax: int, length: int) -> bool:
    return (
        p.dim() == a.dim()
        and p.shape[ax] == length
        and all(p.shape[d] == a.shape[d] for d in range(a.dim()) if d != ax)
    )


def compare_tensors(a: torch.Tensor, parts: list[torch.Tensor], pieces: list[Piece], total: int, rtol: float):
    """How `parts` (one tensor a piece) compare with `a` (`Part`), or None when they do not align."""
    pairs = aligned(a, parts, pieces, total)
    if pairs is None:
        return None
    tolerance = rtol * max(float(a.abs().max()) if a.numel() else 0.0, FLOOR)
    worst, first = 0.0, None
    for x, y, start, ax in pairs:
        delta = (x - y).abs()
        if not delta.numel():
            continue
        delta = torch.nan_to_num(delta, nan=float("inf"))
        worst = max(worst, float(delta.max()))
        bad = delta > tolerance
        if bool(bad.any()) and start is not None:
            where = start if ax is None else start + int(bad.movedim(ax, 0).flatten(1).any(1).nonzero()[0])
            first = where if first is None else min(first, where)
    return Part(worst, tolerance, first, (tuple(a.shape), tuple(parts[0].shape)))


def compare_lists(a: list[torch.Tensor], parts: list[list[torch.Tensor]], pieces, total, rtol) -> Part | None:
    """The worst `Part` over the tensors of a call's outputs (or inputs) matched by position; None when none
    aligns."""
    found = []
    for i, t in enumerate(a):
        if all(i < len(p) for p in parts):
            part = compare_tensors(t, [p[i] for p in parts], pieces, total, rtol)
            if part is not None:
                found.append(part)
    if not found:
        return None
    failing = [p for p in found if p.parts]
    return max(failing or found, key=lambda p: p.max_delta - p.tolerance)


@dataclass
class Parting:
    """The first module whose outputs part: its call in the first way, the matching method of the second, how its
    outputs compare, and the child it called with inputs that already part (None: they part in the module's own
    code, or in children not compared)."""

    call: Call
    other_method: str
    part: Part
    before: str | None


def first_parting(a_calls: list[Call], b_calls: list[list[Call]], setup_calls: list[Call], pieces, total, rtol):
    """The first module, in completion order of the first way's calls, whose outputs part from the second way's
    (`b_calls`: one list of calls a piece; `setup_calls`: the setup runs', compared whole); climbing to the caller
    while a call's own inputs already part (the difference is in the caller's code before the call). None when every
    module that aligns agrees."""
    matches = _matches(a_calls, b_calls, setup_calls)
    for i in sorted(matches, key=lambda i: a_calls[i].done):
        others, whole = matches[i]
        part = _outputs(a_calls[i], others, whole, pieces, total, rtol)
        if part is None or not part.parts:
            continue
        at, before = i, None
        while True:
            inputs = _inputs(a_calls[at], *matches.get(at, ([], False)), pieces, total, rtol)
            parent = a_calls[at].parent
            if inputs is None or not inputs.parts or parent is None or parent not in matches:
                break
            before, at = _call_name(a_calls[at]), parent
        if at != i:
            others, whole = matches[at]
            part = _outputs(a_calls[at], others, whole, pieces, total, rtol) or part
        other_method = matches[at][0][0].method if matches[at][0] else a_calls[at].method
        return Parting(a_calls[at], other_method, part, before if at != i else None)
    return None


def _call_name(call: Call) -> str:
    """How a call is named in a report: the module's path for its forward, step or decode (`model.layers.0`),
    `path.method()` for another method (`model.rotary()`)."""
    if call.key[1] == "main":
        return call.path or "the root module"
    return f"{call.path}.{call.method}()" if call.path else f"{call.method}()"


def _matches(a_calls, b_calls, setup_calls) -> dict[int, tuple[list[Call], bool]]:
    """For each of the first way's calls that has a counterpart: the second way's calls it compares with (one a
    piece, tiled; or one from the setup runs, whole) and whether it is the whole kind. Calls match by module path and
    method (`Call.key`) and by their rank among the calls of that key."""
    seen: dict = {}
    by_piece = [_ranked(calls) for calls in b_calls]
    setup = _ranked(setup_calls)
    out = {}
    for i, call in enumerate(a_calls):
        rank = seen.get(call.key, 0)
        seen[call.key] = rank + 1
        found = [ranked.get((call.key, rank)) for ranked in by_piece]
        if found and all(c is not None for c in found):
            out[i] = (found, False)
        elif (call.key, rank) in setup:
            out[i] = ([setup[(call.key, rank)]], True)
    return out


def _ranked(calls: list[Call]) -> dict:
    seen: dict = {}
    out = {}
    for call in calls:
        rank = seen.get(call.key, 0)
        seen[call.key] = rank + 1
        out[(call.key, rank)] = call
    return out


def _outputs(call: Call, others: list[Call], whole: bool, pieces, total, rtol) -> Part | None:
    return _compared(call.outputs, [o.outputs for o in others], whole, pieces, total, rtol)


def _inputs(call: Call, others: list[Call], whole: bool, pieces, total, rtol) -> Part | None:
    if not others:
        return None
    return _compared(call.inputs, [o.inputs for o in others], whole, pieces, total, rtol)


def _compared(a, parts, whole, pieces, total, rtol) -> Part | None:
    if whole:  # a setup run's call (the encoder in `prefill_encoder`): the same shapes, compared as they are
        same = [i for i, t in enumerate(a) if i < len(parts[0]) and parts[0][i].shape == t.shape]
        found = [compare_tensors(a[i], [parts[0][i]], [_WHOLE], 1, rtol) for i in same]
        found = [p for p in found if p is not None]
        return max(found, key=lambda p: p.max_delta - p.tolerance) if found else None
    return compare_lists(a, parts, pieces, total, rtol)


_WHOLE = Piece(None, 1, (0, 1), (0, 1))  # type: ignore[arg-type] - a stand-in piece: only its spans are read

__all__ = ["rtol_for", "Part", "Parting", "aligned", "compare_tensors", "compare_lists", "first_parting", "RTOL"]
