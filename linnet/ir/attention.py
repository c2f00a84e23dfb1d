"""Attention: which native form each `attention` composite runs, and the layout KV caches are held in.

The `attention` composite (linnet/std/attention.linnet) means transformers' eager attention:
`softmax(mask(q @ k^T * scale)) @ v`, query head h reading KV head h // G. Every backend runs
it natively with the G query heads of one KV head batched together instead of repeating the
keys and values (the same dot products, without copying the cache G times). Beyond that, a
backend may run rewrites that change no value, each one a *variant* this pass records in the
op's `attrs["variant"]` when it applies (so the emitters only emit, and each variant is tested
against the body):

- `scale_queries`: a power-of-two scale multiplies the queries instead of the scores (exact:
  a power of two scales every product the same way);
- `trim_keys`: prefill (S > 1) over a cache of fixed length drops the keys after the last one
  any query attends, whose weights are exact zeros (a host synchronisation in PyTorch, a
  sliced branch in ONNX); PyTorch's eager SDPA does it in decode steps on the CPU too, and
  drops the mask where it says nothing more (`attended_keys` in the generated module);
- `keys_first`: decode (S = 1) computes `k @ q^T` and transposes, reading the keys where they
  lie (ONNX Runtime);
- `prefill_blocks`: prefill in blocks of query rows, each over the keys up to its own last
  attended one (ONNX Runtime: about 3/8 of a causal prefill's scores are never computed);
- `kv_flat`: keys and values come from caches held in a layout of `hold_caches` (below), read where
  they lie (the variant's value is the layout);
- `sdpa`: the framework's fused kernel, under `fast`, and under `equivalent` where the composite
  upcasts its softmax or the dtype is f32 already: it is what transformers' default attention
  (`attn_implementation="sdpa"`) calls, its softmax in f32 inside the kernel (close to the
  eager form, not exact).

Which keys each query attends (causal, padding, a sliding window: `std.attention`'s
`causal_mask`, `sliding_window_mask`, `padding_mask`) is the op's `mask` operand, and every
variant reads the attended keys from it: `trim_keys` and `prefill_blocks` end at the last key
some query attends, and keys before a window's start stay in, masked, with weights of exact
zeros. So a window changes no backend's code, and each variant stays exact under it
(tests/compiler/test_composites.py runs them with a window shorter than the prefill).

`hold_caches`: KV caches declared [max_batch, H, T, D] are held in one of two layouts
(`Program.state_layouts`), their reads, writes and row gathers marked `attrs["layout"]` with its name:

- `"flat"`, [max_batch * H, T, D] (XLA on the CPU): the attention dots then read a cache row's heads
  as one batched operand with no reshape, and XLA writes the donated cache in place and lets the dots
  read it where it lies; through a reshape, XLA fuses the cache write into the reshape once per reader
  and copies the cache for each (5 ms of a 36 ms SmolLM2 decode step, measured).
- `"token_major"`, [max_batch, T, H * D] (XLA on a TPU): a position's heads are one row of H * D
  values, so a decode step's write of one position in each of B rows is one scatter of B windows
  that XLA runs as a single fusion, and a head dim of 64 does not pad the TPU's 128 lanes. Held flat
  there, XLA copied every cache into another layout for the scatter and looped over its windows one
  by one: 18 of the 20 ms of TinyLlama's decode step at batch 32 (bench/results/tpu_serve_*).
"""

from __future__ import annotations

import math

from .core import Graph, Op, Program, Value

VARIANTS = ("scale_queries", "trim_keys", "keys_first", "prefill_blocks", "kv_flat", "sdpa")
CACHE_LAYOUTS = ("flat", "token_major")
PREFILL_BLOCKS = 4


def choose_attention_variants(program: Program, wanted: tuple[str, ...], numerics: str) -> None:
    """Record in each `attention` composite the variants of `wanted` that apply to it (in
    place). `sdpa` applies under `fast`, and under `equivalent` where the softmax is in f32."""
    unknown = set(wanted) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown attention variants: {', '.join(sorted(unknown))}")
    for g in program.graphs():
        for op in _attention_ops(g):
            op.attrs["variant"] = {
                name: value for name in wanted if (value := _applies(name, op, numerics, program.max_positions))
            }


def _applies(name: str, op: Op, numerics: str, max_positions: int):
    q, k, v = op.args["q"], op.args["k"], op.args["v"]
    # Keys of the KV cache's length read from module state: a cache's positions, of which prefill attends a prefix.
    # Keys of another fixed length are all attended: an encoder's over a fixed-size image (SigLIP's 196 patches),
    # Whisper's encoder and cross-attention keys (its 1500 audio positions, a cache of their own); trimming them
    # would only cost a host synchronisation that torch.compile cannot trace.
    cached = k.dims[2].as_int() == max_positions and _reads_state(k)
    prefill = q.dims[2].as_int() != 1
    if name == "scale_queries":
        scale = op.args.get("scale")
        return isinstance(scale, float) and scale > 0 and math.frexp(scale)[0] == 0.5
    if name == "trim_keys":
        return cached and prefill
    if name == "keys_first":
        return cached and q.dims[2].as_int() in (None, 1)
    if name == "prefill_blocks":
        return PREFILL_BLOCKS if cached and prefill else None
    if name == "kv_flat":
        layout = held_layout(k)
        return layout if layout is not None and held_layout(v) == layout else None
    if name == "sdpa":
        return numerics == "fast" or op.args.get("upcast", True) is not False or q.dtype.name in ("f32", "f64")
    return None


def _attention_ops(g: Graph):
    for op in g.ops:
        if op.name == "composite" and op.attrs.get("name") == "attention":
            yield op
        if op.name == "loop":
            yield from _attention_ops(op.body)


def _reads_state(v: Value) -> bool:
    """Whether `v` is computed, in its graph, from module state (a `state` read or a `cache_write`)."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        op = stack.pop().producer
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        if op.name in ("state", "cache_write"):
            return True
        for arg in op.args.values():
            for item in arg if isinstance(arg, (list, tuple)) else (arg,):
                if isinstance(item, Value):
                    stack.append(item)
    return False


def held_layout(v) -> str | None:
    """The layout (`CACHE_LAYOUTS`) `v` is held in, a KV cache or rows of one; None when held as declared."""
    return v.producer.attrs.get("layout") if v.producer is not None else None


def held_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """The shape a KV cache declared `shape` [max_batch, H, T, D] is held in under `layout`."""
    b, h, t, d = shape
    return (b * h, t, d) if layout == "flat" else (b, t, h * d)


def hold_caches(program: Program, layout: str = "flat") -> None:
    """Hold every rank-4 state tensor (a KV cache) in `layout` (the module docstring): record
    its held shape and mark the ops that read, write or gather it (in place). Run before
    `choose_attention_variants`, so that `kv_flat` sees the marks. Raises ValueError for an
    unknown layout."""
    if layout not in CACHE_LAYOUTS:
        raise ValueError(f"cache layout must be one of {', '.join(CACHE_LAYOUTS)}, got {layout!r}")
    if _assigned_state(program):  # a state tensor assigned whole keeps its declared shape
        return
    for spec in program.state:
        if len(spec.shape) == 4:
            program.state_layouts[spec.path] = held_shape(tuple(spec.shape), layout)
    if not program.state_layouts:
        return
    for g in program.graphs():
        _mark(g, layout)


def _mark(g: Graph, layout: str) -> None:
    for op in g.ops:
        if op.name == "state" and op.result.rank == 4:
            op.attrs["layout"] = layout
        elif op.name == "cache_write" and held_layout(op.args["cache"]):
            op.attrs["layout"] = layout
        elif op.name == "take" and held_layout(op.args["x"]) and op.args["dim"] in (0, -4) and op.result.rank == 4:
            op.attrs["layout"] = layout
        elif op.name == "loop":
            _mark(op.body, layout)


def _assigned_state(program: Program) -> bool:
    """Whether some graph assigns a state tensor other than by `cache_write` (rare: the flat
    layout is then not used at all, rather than tracked per tensor)."""

    def assigns(g: Graph) -> bool:
        if any(v.producer is not None and v.producer.name not in ("cache_write", "call", "state")
               for v in g.state_updates.values()):  # fmt: skip
            return True
        return any(op.body is not None and op.name == "loop" and assigns(op.body) for op in g.ops)

    return any(assigns(g) for g in program.graphs())
