"""What a program costs before anything runs: parameters, FLOPs, KV cache, activations.

Everything is read off a `Program` (the Core IR of one preset), so it is what the backends run:

- parameters: every tensor of `Program.params` once (a tied head reads the embedding and adds
  nothing, as transformers' `num_parameters()` counts it); bytes at f32, bf16 and f16;
- FLOPs of an entry at batch `B` and sequence length `S`: the sum of the registry's `flops` rule
  of every op it runs (loops counted once per layer, calls once per call, composites by their
  bodies). Convention: 2 x multiply-adds of `matmul` and `linear` only; elementwise ops,
  reductions, softmax and the rest count 0 (torch.utils.flop_counter's convention, and the
  "2N per token" of Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1).
  Attention is the matmuls inside `attention` composites (QK^T and AV), counted at the shapes
  the IR computes: `forward` attends over its S tokens (the causal mask hides half, nothing
  skips it); `step` attends over the whole cache of `max_positions` positions (masked), so a
  decode step (S = 1) costs what a full cache costs;
- KV cache: the bytes of `Program.state` at `max_batch` rows x `max_positions` positions, and
  per token (per position of one row);
- peak activations of an entry: the most bytes of intermediate values alive at once when its
  ops run in order and each value is freed after its last use (parameters and state not
  counted; layout ops are views, as in PyTorch; every other value its own buffer: no in-place
  updates, no fusion), an estimate of what the eager backends hold.

Imports neither torch nor numpy.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ..ops import REGISTRY
from ..types.core import BF16, F16, F32
from ..types.dims import Dim, evaluate, product
from .core import Graph, Op, Program, Value

PARAM_DTYPES = (F32, BF16, F16)  # the working dtypes parameters are held in
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions")  # the config's context window (HF names)


@dataclass(frozen=True)
class EntryCost:
    """One entry run once on `batch` sequences of `seq_len` tokens.

    matmul_flops: FLOPs of the `matmul`/`linear` ops outside attention (projections, MLPs, head).
    attention_flops: FLOPs of the matmuls inside `attention` composites (QK^T and AV).
    peak_activation_bytes: the estimate described in the module docstring."""

    entry: str
    batch: int
    seq_len: int
    matmul_flops: int
    attention_flops: int
    peak_activation_bytes: int

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.attention_flops

    @property
    def flops_per_token(self) -> float:
        """FLOPs divided by the tokens it processes (batch x seq_len)."""
        return self.flops / (self.batch * self.seq_len)


@dataclass(frozen=True)
class ProgramCost:
    """The cost of a program (see the module docstring for each number and its formula).

    param_bytes: dtype name -> bytes of every parameter held in it (non-float parameters at
        their own size). kv_bytes: the state at max_batch x max_positions; kv_bytes_per_token:
        of one position of one row; state_fixed_bytes: state that does not grow with positions.
    context_positions: the config's context window (`max_position_embeddings`), if it has one.
    entries: each entry at `seq_len` and, for entries that use the cache, at S = 1 (decode); an
        entry without a sequence dim `S` at S = 1 (its "per token" is per example).
    skipped: entry -> why it has no cost (a dim besides B and S without a size)."""

    model: str
    preset: str | None
    dtype: str
    max_batch: int
    max_positions: int
    param_count: int
    param_bytes: dict[str, int]
    kv_bytes: int
    kv_bytes_per_token: int
    state_fixed_bytes: int
    context_positions: int | None
    entries: list[EntryCost] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def kv_bytes_at_context(self) -> int | None:
        """The cache of one row at the config's whole context window."""
        if self.context_positions is None:
            return None
        return self.kv_bytes_per_token * self.context_positions + self.state_fixed_bytes // self.max_batch

    def as_json(self) -> dict:
        """The numbers with their units in the key names (`linnet check --summary --format json`)."""
        return {
            "model": self.model,
            "preset": self.preset,
            "dtype": self.dtype,
            "max_batch": self.max_batch,
            "max_positions": self.max_positions,
            "parameters": self.param_count,
            "parameter_bytes": dict(self.param_bytes),
            "kv_cache_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_bytes": self.kv_bytes,
            "state_fixed_bytes": self.state_fixed_bytes,
            "context_positions": self.context_positions,
            "kv_cache_bytes_at_context": self.kv_bytes_at_context,
            "entries": [
                {
                    "entry": e.entry,
                    "batch": e.batch,
                    "seq_len": e.seq_len,
                    "flops": e.flops,
                    "matmul_flops": e.matmul_flops,
                    "attention_flops": e.attention_flops,
                    "flops_per_token": e.flops_per_token,
                    "peak_activation_bytes": e.peak_activation_bytes,
                }
                for e in self.entries
            ],
            "skipped_entries": dict(self.skipped),
        }


def program_cost(program: Program, seq_len: int | None = None, batch: int | None = None) -> ProgramCost:
    """The cost of `program`: its entries at `batch` sequences (default `max_batch`) of `seq_len`
    tokens (default `max_positions`). Raises ValueError for a size below 1."""
    seq_len = program.max_positions if seq_len is None else seq_len
    batch = program.max_batch if batch is None else batch
    if seq_len < 1 or batch < 1:
        raise ValueError(f"batch and sequence length are at least 1, got {batch} and {seq_len}")
    count = sum(math.prod(p.shape) for p in program.params)
    param_bytes: dict[str, int] = {}
    for dtype in PARAM_DTYPES:
        param_bytes[dtype.name] = sum(
            math.prod(p.shape) * (dtype if p.type.dtype.is_float else p.type.dtype).itemsize for p in program.params
        )
    rows_positions = program.max_batch * program.max_positions
    kv, fixed = 0, 0
    for s in program.state:
        nbytes = math.prod(s.shape) * s.type.dtype.itemsize
        if program.max_positions in s.shape and nbytes % rows_positions == 0:
            kv += nbytes
        else:
            fixed += nbytes
    context = next((program.config[f] for f in CONTEXT_FIELDS if isinstance(program.config.get(f), int)), None)
    entries, skipped = [], {}
    for name, graph in program.entries.items():
        if "S" not in graph.dim_vars:  # no sequence (an MLP over [B, features]): per example
            runs = [1]
        else:
            runs = [seq_len] + ([1] if graph.uses_state and seq_len != 1 else [])
        try:
            entries += [entry_cost(graph, batch, s) for s in runs]
        except ValueError as err:
            skipped[name] = str(err)
    return ProgramCost(
        program.model,
        program.preset,
        program.dtype.name,
        program.max_batch,
        program.max_positions,
        count,
        param_bytes,
        kv + fixed,
        kv // rows_positions,
        fixed,
        context,
        entries,
        skipped,
    )


def entry_cost(graph: Graph, batch: int, seq_len: int) -> EntryCost:
    """The FLOPs and peak activations of one call of `graph` with dims B = `batch`, S = `seq_len`.
    Raises ValueError when a dim needs another size (an entry with a dim besides B and S)."""
    sizes = {"B": batch, "S": seq_len}
    flops = graph_flops(graph, sizes)
    return EntryCost(graph.name, batch, seq_len, flops["matmul"], flops["attention"], peak_bytes(graph, sizes))


def graph_flops(graph: Graph, sizes: dict[str, int], kind: str = "matmul", _seen: dict | None = None) -> Counter:
    """FLOPs of one run of `graph` by kind ("matmul", "attention": inside an `attention`
    composite), with the dim variables set by `sizes`. Raises ValueError (`types.dims.evaluate`).
    A graph called many times (a layer's, an expert's) is counted once per kind (`_seen`, by identity:
    GPT-OSS's 1,848 calls made hovering a module's parameters after each edit take 0.1 s)."""
    seen: dict = {} if _seen is None else _seen
    key = (id(graph), kind)
    if key in seen:
        return seen[key]
    out: Counter = Counter()
    for op in graph.ops:
        if op.name == "call":
            out += graph_flops(op.callee, sizes, kind, seen)
        elif op.name == "loop":
            body = graph_flops(op.body, sizes, kind, seen)
            out += Counter({k: v * op.attrs["count"] for k, v in body.items()})
        elif op.name == "composite":
            out += graph_flops(op.body, sizes, "attention" if op.attrs["name"] == "attention" else kind, seen)
        else:
            n = op_flops(op)
            if n is not None:
                out[kind] += evaluate(n, sizes)
    seen[key] = out
    return out


def op_flops(op: Op) -> Dim | None:
    """The registry's FLOP rule of a primitive op at its argument and result types; None for an
    op without one (counted 0) and for structural ops."""
    rule = REGISTRY[op.name].flops if op.name in REGISTRY else None
    if rule is None:
        return None
    args = {k: (v.type if isinstance(v, Value) else v) for k, v in op.args.items()}
    return rule(args, [v.type for v in op.results])


def peak_bytes(graph: Graph, sizes: dict[str, int], _seen: dict[int, int] | None = None) -> int:
    """The most bytes of values `graph` defines that are alive at once while it runs (its inputs
    are its caller's), ops in order, each value freed after its last use; a call, loop or
    composite adds the peak of what it runs (which includes what it returns) on top of what is
    alive around it. Ops whose registry entry says `view` (layout ops, `slice`, `select`) make
    views, as in PyTorch: no bytes of their own, and they keep what they view alive. Parameters
    and state (reads, cache writes, written state returned by calls) are not activations. A graph called many
    times (a layer's, an expert's) is measured once (`_seen`, by identity: GPT-OSS's 1,848 calls took 1.4 s of the
    first hover on a module's parameters after each edit, profiled; 0.1-0.2 s unprofiled)."""
    seen: dict[int, int] = {} if _seen is None else _seen
    if id(graph) in seen:
        return seen[id(graph)]
    root: dict[int, int] = {}  # a view -> the value whose memory it shares
    for op in graph.ops:
        if is_view(op):
            source = id(op.args["x"])
            root[id(op.result)] = root.get(source, source)
    last_use: dict[int, int] = {}
    for i, op in enumerate(graph.ops):
        for v in op.inputs():
            last_use[root.get(id(v), id(v))] = i
    for v in list(graph.outputs) + list(graph.state_updates.values()):
        last_use[root.get(id(v), id(v))] = len(graph.ops)
    live: dict[int, int] = {}
    peak = 0
    for i, op in enumerate(graph.ops):
        inner = 0
        if op.name == "call":
            inner = peak_bytes(op.callee, sizes, seen)
        elif op.body is not None:
            inner = peak_bytes(op.body, sizes, seen)
        made = {} if is_view(op) else {id(v): value_bytes(v, sizes) for v in _activations(op)}
        # what a call, loop or composite returns is made inside it, so its own peak includes it
        peak = max(peak, sum(live.values()) + max(inner, sum(made.values())))
        live.update(made)
        for key in [k for k in live if last_use.get(k, i) <= i]:
            del live[key]
    seen[id(graph)] = peak
    return peak


def is_view(op: Op) -> bool:
    """Whether `op` is a primitive whose registry entry says its result is a view of `x`."""
    entry = REGISTRY.get(op.name)
    return entry is not None and entry.view


def _activations(op: Op) -> list[Value]:
    """The results of `op` that are activations: not parameters, state or new state."""
    if op.name in ("param", "state", "cache_write"):
        return []
    if op.name == "call" and op.writes:
        return op.results[: len(op.results) - len(op.writes)]
    return op.results


def value_bytes(v: Value, sizes: dict[str, int]) -> int:
    n = evaluate(product(v.dims), sizes)
    return n * (v.dtype.itemsize or F32.itemsize)  # a dtype of no fixed size (`work`) counted as f32


def module_param_counts(program: Program) -> dict[str, int]:
    """Parameters of one instance of each module class (`Program.modules` key), its submodules'
    included: what `LlamaDecoderLayer` holds once, which a list of layers holds count times."""
    counts: dict[str, int] = {}

    def visit(key: str) -> int:
        if key not in counts:
            m = program.modules[key]
            own = sum(math.prod(tuple(d.as_int() for d in t.shape.dims)) for t in m.params.values())
            counts[key] = own + sum(visit(child) * (n or 1) for child, n in m.children.values())
        return counts[key]

    for key in program.modules:
        visit(key)
    return counts


def module_instances(program: Program) -> dict[str, int]:
    """How many instances of each module class (`Program.modules` key) the root model holds
    (the root once; a class in a list of 30 layers 30 times per holder)."""
    counts: dict[str, int] = {}

    def visit(key: str, times: int) -> None:
        counts[key] = counts.get(key, 0) + times
        for child, n in program.modules[key].children.values():
            visit(child, times * (n or 1))

    if program.root in program.modules:
        visit(program.root, 1)
    return counts
