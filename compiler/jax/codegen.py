"""Core IR to JAX source: one statement per op, readable, pure and functional.

`generate(program)` writes a module with one function per entry (`linnet jax FILE -o
model.py`): `def step(p, input_ids, positions, rows)` reads parameters, state and folded
constants from the dict `p` by checkpoint name and returns its outputs; an entry that writes
state (the KV cache) returns `(outputs..., {checkpoint name: new value})`, so the cache is
threaded through the call (and donated by the runtime, so XLA updates it in place). This
file does not import jax: the language server shows generated code in its own process.

Numerics (ARCHITECTURE.md): a `composite` runs as a native function when that function is
what the reference implementation computes (`jax.nn.softmax`, `jax.nn.silu`, erf
`jax.nn.gelu`), otherwise as its body, op by op, in transformers' op order; attention is
transformers' eager attention with the query heads of one KV head batched together (the
same dot products as `repeat_kv`, without copying the cache), and keys and values read from
the KV cache are contracted one KV head at a time, so XLA writes the donated cache in place
(see `_grouped_attention`). Under `equivalent`, matmuls ask for full f32 precision
(`PRECISION = "highest"`: no TF32 or bf16 passes on GPUs/TPUs; on CPU f32 dots are f32 either
way, and it measured no slower).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable

from linnet.ir.core import Graph, Op, Program, Value, format_tensor_type
from linnet.ir.render import (
    GraphEmitter,
    RenderError,
    add_constant,
    all_ops,
    dim_text,
    dims_text,
    index_text,
    infix_emitter,
    np_dtype_name,
    python_infix,
    python_reserved,
)
from linnet.ops.rearrange import rearrange_plan
from linnet.types.dims import Dim

JAX_DTYPES = {
    "f64": "jnp.float64",
    "f32": "jnp.float32",
    "f16": "jnp.float16",
    "bf16": "jnp.bfloat16",
    "i64": "jnp.int64",
    "i32": "jnp.int32",
    "bool": "jnp.bool_",
}
NUMERICS = ("equivalent", "fast")
RESERVED = python_reserved("jax", "jnp", "lax", "p", "math", "PRECISION", "constants", "write_cache")

# Registry ops the JAX backend cannot express, with the reason (none at present: the test
# accepts an op that is either lowered or listed here).
UNSUPPORTED: dict[str, str] = {}


class CodegenError(RenderError):
    """An op or argument the JAX backend cannot express (names the op)."""


def fused_key(names: list[str]) -> str:
    """The parameter key of weights fused for one dot: their checkpoint names as
    `prefix{a,b,c}suffix` (`model.layers.0.self_attn.{q,k,v}_proj.weight`); `fused_names`
    reads it back."""
    prefix = os.path.commonprefix(names)
    suffix = os.path.commonprefix([n[len(prefix) :][::-1] for n in names])[::-1]
    middles = [n[len(prefix) : len(n) - len(suffix)] for n in names]
    return f"{prefix}{{{','.join(middles)}}}{suffix}"


def split_fused_key(key: str) -> tuple[str, list[str], str] | None:
    """`prefix{a,b,c}suffix` as (prefix, [a, b, c], suffix); None for a plain checkpoint name."""
    m = re.fullmatch(r"([^{}]*)\{([^{}]*)\}([^{}]*)", key)
    return None if m is None else (m[1], m[2].split(","), m[3])


def fused_names(key: str) -> list[str] | None:
    """The checkpoint names of a `fused_key`, in order (concatenated along dim 0); None for a
    plain checkpoint name."""
    parts = split_fused_key(key)
    return None if parts is None else [parts[0] + middle + parts[2] for middle in parts[1]]


def state_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the JAX backend holds a state tensor in: a KV cache [max_batch, H, T, D] (rank 4,
    what `cache_write` writes) as [max_batch * H, T, D], other state as declared.

    Why: the attention dots then read a cache row's heads as one batched operand with no reshape,
    and XLA on CPU writes the donated cache in place and lets the dots read it where it lies. Read
    through a reshape ([1, H, T, D] viewed as [H, T, D]), XLA fuses the cache write into the
    reshape once per reader and copies the cache for each fused write; read one head at a time,
    each head's slice is a copy (5 ms of a 36 ms SmolLM2 decode step, measured)."""
    return (shape[0] * shape[1], *shape[2:]) if len(shape) == 4 else tuple(shape)


@dataclass
class Emitter(GraphEmitter):
    """Emits the JAX statements of one graph (tables below; machinery in linnet.ir.render).

    Values in `flat` are KV caches held as [rows * H, T, D] (`state_shape`): the state, its
    `cache_write` results and the rows `take`n from them. `r` renders them as their declared
    [rows, H, T, D] (a reshape) for any op; `flat_name` gives the array as held, for the ops that
    work on it directly (cache_write, take, attention and the returned state)."""

    flat: dict[int, str] = field(default_factory=dict)  # value id -> its declared shape's text
    fused: dict[str, list[str]] = field(default_factory=dict)  # fused weight key -> checkpoint names
    fused_ops: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # matmul id -> key, start, stop
    fused_vars: dict[str, str] = field(default_factory=dict)  # fused weight key -> its dot's variable
    unfused: frozenset[str] = frozenset()  # fused keys not to make (a member is also read alone)

    def flat_name(self, v: Value) -> str:
        return super().r(v)

    def r(self, v) -> str:
        if isinstance(v, Value) and id(v) in self.flat:
            return f"{super().r(v)}.reshape({self.flat[id(v)]})"
        return super().r(v)

    def mark_flat(self, g: Graph) -> None:
        for op in g.ops:
            v = op.results[0] if op.results else None
            if op.name == "state" and v.rank == 4:
                self.flat[id(v)] = dims_text(v.dims)
            elif op.name == "cache_write" and id(op.args["cache"]) in self.flat:
                self.flat[id(v)] = dims_text(v.dims)
            elif op.name == "take" and id(op.args["x"]) in self.flat and op.args["dim"] in (0, -4) and v.rank == 4:
                self.flat[id(v)] = dims_text(v.dims)

    def prepare_graph(self, g: Graph) -> None:
        """`x @ transpose(w)` with a 2-d `w` used once contracts `w` where it lies, as a
        linear layer: `jnp.einsum("...i,oi->...o", x, w)` (XLA then reads the weight in its
        stored layout instead of materialising its transpose)."""
        self.mark_flat(g)
        for op in g.ops:
            if op.name != "matmul":
                continue
            y = op.args["y"]
            t = y.producer
            if (
                t is not None
                and t.name == "transpose"
                and t.args["x"].rank == 2
                and {t.args["dim0"], t.args["dim1"]} in ({-2, -1}, {0, 1})
                and self.uses.get(id(y)) == 1
            ):
                self.skipped.add(id(t))
                op.attrs["linear_weight"] = t.args["x"]
        self.fuse_linear_layers(g)

    def fuse_linear_layers(self, g: Graph) -> None:
        """Linear layers of one input whose weights are parameters read only there (q, k and v;
        gate and up) become one dot over the weights concatenated along the output dim, under the
        key `fused_key(names)`; each layer's result is a slice of it. XLA on CPU runs each dot as
        a library call over the whole weight, so at batch 1 fewer, larger calls are faster (a
        SmolLM2 decode step: 33 ms against 37, measured). The weights are concatenated once, at
        load (`fuse_weights`)."""
        in_graph = {id(op) for op in g.ops}
        groups: dict[int, list[Op]] = {}
        for op in g.ops:
            w = op.attrs.get("linear_weight") if op.name == "matmul" else None
            if (
                w is not None
                and w.producer is not None
                and w.producer.name == "param"
                and id(w.producer) in in_graph
                and self.uses.get(id(w)) == 1
                and w.dims[0].as_int() is not None
                and not set("{},") & set(w.producer.attrs["path"])
            ):
                groups.setdefault(id(op.args["x"]), []).append(op)
        for ops in groups.values():
            weights = [op.attrs["linear_weight"] for op in ops]
            if len(ops) < 2 or len({(w.dims[1].key(), w.dtype.name) for w in weights}) != 1:
                continue
            names = [w.producer.attrs["path"] for w in weights]
            key = fused_key(names)
            if key in self.unfused:
                continue
            self.fused[key] = names
            start = 0
            for op, w in zip(ops, weights):
                self.skipped.add(id(w.producer))
                stop = start + w.dims[0].as_int()
                self.fused_ops[id(op)] = (key, start, stop)
                start = stop

    def float_text(self, v: float) -> str:
        if v != v:
            return "jnp.nan"
        if v in (float("inf"), float("-inf")):
            return "jnp.inf" if v > 0 else "-jnp.inf"
        return repr(v)


# ----------------------------------------------------------------------------- op emitters

Emit = Callable[[Emitter, Op], "str | tuple[list[str], str]"]
EMITTERS: dict[str, Emit] = {}


def _unary(name: str, fmt: str) -> None:
    EMITTERS[name] = lambda e, op: fmt.format(x=e.r(op.args["x"]))


for _name, _fmt in {
    "exp": "jnp.exp({x})",
    "log": "jnp.log({x})",
    "sqrt": "jnp.sqrt({x})",
    "rsqrt": "lax.rsqrt({x})",
    "sin": "jnp.sin({x})",
    "cos": "jnp.cos({x})",
    "tanh": "jnp.tanh({x})",
    "sigmoid": "jax.nn.sigmoid({x})",
    "erf": "jax.scipy.special.erf({x})",
    "abs": "jnp.abs({x})",
    "neg": "-{x}",
    "logical_not": "~{x}",
}.items():
    _unary(_name, _fmt)

for _name, _sym in python_infix().items():
    EMITTERS[_name] = infix_emitter(_sym)

EMITTERS["maximum"] = lambda e, op: f"jnp.maximum({e.r(op.args['x'])}, {e.r(op.args['y'])})"
EMITTERS["minimum"] = lambda e, op: f"jnp.minimum({e.r(op.args['x'])}, {e.r(op.args['y'])})"


def _reduction(fn: str) -> Emit:
    return lambda e, op: f"jnp.{fn}({e.r(op.args['x'])}, axis={op.args['dim']}, keepdims={e.r(op.args['keepdim'])})"


for _name, _fn in {"sum": "sum", "mean": "mean", "max": "max", "min": "min", "argmax": "argmax"}.items():
    EMITTERS[_name] = _reduction(_fn)


def _sum(e: Emitter, op: Op) -> str:
    # jnp.sum of bool counts in the default int (i64 under x64), as the registry's dtype rule says.
    text = _reduction("sum")(e, op)
    return text if op.args["x"].dtype.name != "bool" else f"{text[:-1]}, dtype=jnp.int64)"


EMITTERS["sum"] = _sum


def _matmul(e: Emitter, op: Op) -> "str | tuple[list[str], str]":
    fused = e.fused_ops.get(id(op))
    if fused is not None:
        key, start, stop = fused
        lines = []
        if key not in e.fused_vars:  # the group's first layer: the one dot
            middles = split_fused_key(key)[1]
            hint = "_".join(middles) if all(m.isidentifier() for m in middles) else "fused"
            e.fused_vars[key] = var = e.fresh(hint)
            lines.append(f'{var} = jnp.einsum("...i,oi->...o", {e.r(op.args["x"])}, p[{key!r}], precision=PRECISION)')
        return lines, f"{e.fused_vars[key]}[..., {start}:{stop}]"
    w = op.attrs.get("linear_weight")
    if w is not None:
        return f'jnp.einsum("...i,oi->...o", {e.r(op.args["x"])}, {e.r(w)}, precision=PRECISION)'
    return f"jnp.matmul({e.r(op.args['x'])}, {e.r(op.args['y'])}, precision=PRECISION)"


EMITTERS["matmul"] = _matmul
EMITTERS["reshape"] = lambda e, op: f"{e.r(op.args['x'])}.reshape({_shape(op.args['shape'])})"
EMITTERS["transpose"] = lambda e, op: f"jnp.swapaxes({e.r(op.args['x'])}, {op.args['dim0']}, {op.args['dim1']})"
EMITTERS["permute"] = lambda e, op: f"jnp.transpose({e.r(op.args['x'])}, ({_tuple(op.args['dims'])}))"
EMITTERS["unsqueeze"] = lambda e, op: f"jnp.expand_dims({e.r(op.args['x'])}, {op.args['dim']})"
EMITTERS["squeeze"] = lambda e, op: f"jnp.squeeze({e.r(op.args['x'])}, {op.args['dim']})"
EMITTERS["expand"] = lambda e, op: f"jnp.broadcast_to({e.r(op.args['x'])}, ({_tuple(op.args['shape'])}))"
EMITTERS["concat"] = lambda e, op: f"jnp.concatenate({e.r(op.args['xs'])}, axis={op.args['dim']})"
EMITTERS["cast"] = lambda e, op: f"{e.r(op.args['x'])}.astype({e.r(op.args['dtype'])})"


def _tuple(dims) -> str:
    text = dims_text(dims)
    return text + "," if len(dims) == 1 else text


def _shape(dims) -> str:
    """Reshape arguments: `(n,)` for one dim (JAX's reshape takes a tuple or several ints)."""
    return f"({_tuple(dims)})" if len(dims) == 1 else dims_text(dims)


def _split(e: Emitter, op: Op) -> str:
    x: Value = op.args["x"]
    start = Dim.of(0)
    parts = []
    for size in op.args["sizes"]:
        stop = start + size
        a = "" if start.as_int() == 0 else dim_text(start)
        parts.append(f"{e.r(x)}[{index_text(x.rank, op.args['dim'], f'{a}:{dim_text(stop)}')}]")
        start = stop
    return ", ".join(parts)


def _repeat_interleave(e: Emitter, op: Op) -> str:
    x: Value = op.args["x"]
    dim = op.args["dim"]
    total = op.result.dims[dim]
    return (
        f"jnp.repeat({e.r(x)}, {e.r(op.args['repeats'])}, axis={dim}, total_repeat_length={dim_text(total)})"
        if total.as_int() is None
        else f"jnp.repeat({e.r(x)}, {e.r(op.args['repeats'])}, axis={dim})"
    )


EMITTERS["split"] = _split
EMITTERS["repeat_interleave"] = _repeat_interleave


def _rearrange(e: Emitter, op: Op) -> str:
    x: Value = op.args["x"]
    expanded, perm, out = rearrange_plan(list(x.dims), op.args["pattern"], dict(op.args["sizes"]))
    text = e.r(x)
    if [d.key() for d in expanded] != [d.key() for d in x.dims]:
        text += f".reshape({_shape(expanded)})"
    if perm != list(range(len(perm))):
        moved = [i for i, p in enumerate(perm) if p != i]
        if len(moved) == 2:
            text = f"jnp.swapaxes({text}, {moved[0]}, {moved[1]})"
        else:
            text = f"jnp.transpose({text}, ({_tuple(perm)}))"
    if [d.key() for d in out] != [d.key() for d in expanded] or len(out) != len(expanded):
        permuted = [expanded[i] for i in perm]
        if [d.key() for d in out] != [d.key() for d in permuted]:
            text += f".reshape({_shape(out)})"
    return text


EMITTERS["rearrange"] = _rearrange


def _take(e: Emitter, op: Op) -> str:
    x, idx, dim = op.args["x"], op.args["indices"], op.args["dim"]
    if id(op.result) in e.flat:
        # Rows of a cache held as [rows * H, T, D], held the same way: [B * H, T, D].
        b, h, t, d = op.result.dims
        rows = (
            f"jnp.broadcast_to({e.r(x)}, ({_tuple(op.result.dims)}))"  # one cache row: every valid index is 0
            if x.dims[0].as_int() == 1
            else f"jnp.take({e.r(x)}, {e.r(idx)}, axis=0, mode='clip')"
        )
        return f"{rows}.reshape({dims_text([b * h, t, d])})"
    if (dim == 0 or dim == -x.rank) and x.dims[0].as_int() == 1 and x.producer is not None:
        if x.producer.name in ("state", "cache_write"):
            # One cache row: every valid index is 0, so reading rows is reading the cache (no gather).
            return f"jnp.broadcast_to({e.r(x)}, ({_tuple(op.result.dims)}))"
    # An index out of range reads the nearest row (a gather cannot raise under jit).
    return f"jnp.take({e.r(x)}, {e.r(idx)}, axis={dim}, mode='clip')"


def _slice(e: Emitter, op: Op) -> str:
    x = op.args["x"]
    start, stop = op.args["start"], op.args["stop"]
    a = "" if start is None or (isinstance(start, Dim) and start.as_int() == 0) else e.r(start)
    b = "" if stop is None else e.r(stop)
    return f"{e.r(x)}[{index_text(x.rank, op.args['dim'], f'{a}:{b}')}]"


EMITTERS["take"] = _take
EMITTERS["slice"] = _slice
EMITTERS["select"] = lambda e, op: (
    f"{e.r(op.args['x'])}[{index_text(op.args['x'].rank, op.args['dim'], e.r(op.args['index']))}]"
)
EMITTERS["where"] = lambda e, op: f"jnp.where({e.r(op.args['cond'])}, {e.r(op.args['x'])}, {e.r(op.args['y'])})"


def _arange(e: Emitter, op: Op) -> str:
    """`lax.iota` of the result's length (symbolic lengths export cleanly), shifted and scaled."""
    start, stop, step = op.args["start"], op.args["stop"], op.args["step"]
    if stop is None:
        start, stop = Dim.of(0), start
    n = op.result.dims[0]
    text = f"lax.iota(jnp.int64, {dim_text(n)})"
    if step is not None and step.as_int() != 1:
        text = f"{text} * {e.r(step)}"
    if start.as_int() != 0:
        text = f"{e.r(start)} + {text}"
    return text


EMITTERS["arange"] = _arange
EMITTERS["full"] = lambda e, op: (
    f"jnp.full(({_tuple(op.args['shape'])}), {e.r(op.args['value'])}, dtype={e.r(op.args['dtype'])})"
)
EMITTERS["zeros"] = lambda e, op: f"jnp.zeros(({_tuple(op.args['shape'])}), dtype={e.r(op.args['dtype'])})"
EMITTERS["ones"] = lambda e, op: f"jnp.ones(({_tuple(op.args['shape'])}), dtype={e.r(op.args['dtype'])})"
EMITTERS["min_value"] = lambda e, op: (
    f"jnp.array(jnp.finfo({e.r(op.args['dtype'])}).min, dtype={e.r(op.args['dtype'])})"
)


def _cache_write(e: Emitter, op: Op) -> str:
    """A new cache: row `rows[b]`, positions `positions[b] + 0..S-1` set to `new[b]`. The two
    index arrays broadcast to [B, S] and are split by the head slice, so the indexed block is
    [B, S, H, D] (numpy's rule for separated advanced indices): `new` goes in as [B, S, H, D].
    Positions past the cache are dropped (a padded prefill's tail). A cache held as [rows * H, T,
    D] (`state_shape`) is written by the generated module's `write_cache` (WRITE_CACHE)."""
    if id(op.args["cache"]) in e.flat:
        rows, positions, new = (e.r(op.args[k]) for k in ("rows", "positions", "new"))
        return f"write_cache({e.flat_name(op.args['cache'])}, {rows}, {positions}, {new})"
    cache, rows, positions, new = (e.r(op.args[k]) for k in ("cache", "rows", "positions", "new"))
    s = dim_text(op.args["new"].dims[2])
    return (
        f"{cache}.at[{rows}[:, None], :, {positions}[:, None] + lax.iota(jnp.int64, {s})]"
        f".set(jnp.swapaxes({new}, 1, 2), mode='drop')"
    )


EMITTERS["cache_write"] = _cache_write

# The generated module's fused weights (`Emitter.fuse_linear_layers`), made from the checkpoint's.
FUSE_WEIGHTS = '''
# Weights of linear layers that share an input, concatenated along the output dim: the key
# `prefix{a,b}suffix` stands for the checkpoint names prefix + a + suffix, prefix + b + suffix.
FUSED_WEIGHTS = [
    KEYS
]


def fuse_weights(params):
    """The parameters the entries take, from `params` by checkpoint name: each group of
    FUSED_WEIGHTS concatenated under its key, in place of its members. Run once, at load."""
    out = dict(params)
    for key in FUSED_WEIGHTS:
        prefix, rest = key.split("{")
        middles, suffix = rest.split("}")
        out[key] = jnp.concatenate([out.pop(prefix + m + suffix) for m in middles.split(",")], axis=0)
    return out
'''.strip()

# The generated module's helper for caches held as [rows * H, T, D]: one scatter whose window is a
# row's H heads at one position, so a single-token write is one dynamic-update-slice in place.
WRITE_CACHE = '''
def write_cache(cache, rows, positions, new):
    """`cache` [max_batch * H, T, D] with `new` [B, H, S, D] written at row `rows[b]`, positions
    `positions[b] + 0..S-1`; positions past the cache are dropped (a padded prefill's tail)."""
    h, s = new.shape[1], new.shape[2]
    rows_and_positions = jnp.broadcast_arrays(rows[:, None] * h, positions[:, None] + lax.iota(jnp.int64, s))
    window = lax.ScatterDimensionNumbers(
        update_window_dims=(1, 3), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(0, 1)
    )
    return lax.scatter(
        cache, jnp.stack(rows_and_positions, axis=-1), new, window, mode=lax.GatherScatterMode.FILL_OR_DROP
    )
'''.strip()
EMITTERS["param"] = lambda e, op: f"p[{op.attrs['path']!r}]"
EMITTERS["state"] = lambda e, op: f"p[{op.attrs['path']!r}]"
EMITTERS["const"] = lambda e, op: f"p[{('const:' + e.names[('const', id(op))])!r}]"


# ----------------------------------------------------------------------------- native composites


def _grouped_attention(e: Emitter, op: Op):
    """transformers' eager attention (matmul, scale, mask with the dtype's minimum, softmax,
    matmul) with the query heads of one KV head batched together instead of repeating the
    keys and values (`repeat_kv`): the same dot products, without copying the cache G times.

    Keys and values read from a KV cache come held as [B * H_kv, T, D] (`state_shape`): the
    queries are grouped as [B * H_kv, G * S, D] and each product is one dot batched over
    B * H_kv, reading the cache where XLA wrote it."""
    q, k, v, mask = (op.args[n] for n in ("q", "k", "v", "mask"))
    b, h, s, d = (dim_text(x) for x in q.dims)
    hkv, t = dim_text(k.dims[1]), dim_text(k.dims[2])
    g = q.dims[1].as_int() // k.dims[1].as_int()
    dtype = JAX_DTYPES[q.dtype.name]
    scores, probs = e.fresh("scores"), e.fresh("probs")
    scale = e.r(op.args["scale"])
    note = f"  # {g} heads per KV head" if g > 1 else ""
    if id(k) in e.flat and id(v) in e.flat:
        kn, vn = e.flat_name(k), e.flat_name(v)
        rows = dims_text([q.dims[0] * k.dims[1]])
        qg = e.fresh("q_grouped")
        lines = [
            f"{qg} = {e.r(q)}.reshape({rows}, {g} * {s}, {d}){note}",
            f'{scores} = jnp.einsum("ksd,ktd->kst", {qg}, {kn}, precision=PRECISION)'
            f".reshape({b}, {h}, {s}, {t}) * {scale}",
        ]
        grouped = lambda x, n: f"{x}.reshape({rows}, {g} * {s}, {n})"  # noqa: E731
        product = lambda p: f'jnp.einsum("kst,ktd->ksd", {p}, {vn}, precision=PRECISION)'  # noqa: E731
    else:
        kn, vn = e.r(k), e.r(v)
        qg = e.r(q) if g == 1 else f"{e.r(q)}.reshape({b}, {hkv}, {g} * {s}, {d})"
        einsum = f'jnp.einsum("bhsd,bhtd->bhst", {qg}, {kn}, precision=PRECISION)'
        lines = (
            [f"{scores} = {einsum} * {scale}"]
            if g == 1
            else [f"{scores} = {einsum}{note}", f"{scores} = {scores}.reshape({b}, {h}, {s}, {t}) * {scale}"]
        )
        grouped = lambda x, n: x if g == 1 else f"{x}.reshape({b}, {hkv}, {g} * {s}, {n})"  # noqa: E731
        product = lambda p: f"jnp.matmul({p}, {vn}, precision=PRECISION)"  # noqa: E731
    lines.append(f"{scores} = jnp.where(jnp.expand_dims({e.r(mask)}, 1), {scores}, jnp.finfo({dtype}).min)")
    if op.args.get("upcast"):
        lines.append(f"{probs} = jax.nn.softmax({scores}.astype(jnp.float32), axis=-1).astype({dtype})")
    else:
        lines.append(f"{probs} = jax.nn.softmax({scores}, axis=-1)")
    out = product(grouped(probs, t))
    return lines, out if id(k) not in e.flat and g == 1 else f"{out}.reshape({b}, {h}, {s}, {d})"


NATIVE: dict[str, tuple[tuple[str, ...], Callable[[Emitter, Op], "str | tuple[list[str], str]"]]] = {
    "softmax": (NUMERICS, lambda e, op: f"jax.nn.softmax({e.r(op.args['x'])}, axis=-1)"),
    "silu": (NUMERICS, lambda e, op: f"jax.nn.silu({e.r(op.args['x'])})"),
    "gelu": (NUMERICS, lambda e, op: f"jax.nn.gelu({e.r(op.args['x'])}, approximate=False)"),
    "gelu_tanh": (("fast",), lambda e, op: f"jax.nn.gelu({e.r(op.args['x'])}, approximate=True)"),
    "attention": (NUMERICS, _grouped_attention),
}


# ----------------------------------------------------------------------------- whole functions


def function_source(
    g: Graph,
    numerics: str = "equivalent",
    constants: dict | None = None,
    fused: dict | None = None,
    unfused: frozenset[str] = frozenset(),
) -> str:
    """The source of one entry as `def NAME(p, inputs...)`; an entry that writes state returns
    `(outputs..., {path: new value})`. Its folded constants are added to `constants`, the weights
    it reads fused (`fused_key` -> checkpoint names, except the keys in `unfused`) to `fused`."""
    e = Emitter(numerics, unfused=unfused)
    e.dim_names = set(g.dim_vars)
    e.taken |= e.dim_names
    args = [e.bind(v) for v in g.inputs]
    sig = ", ".join(format_tensor_type(v.type) for v in g.inputs)
    outs = ", ".join(format_tensor_type(v.type) for v in g.outputs)
    if g.state_updates:
        outs += ", {new state by checkpoint name}"
    lines = [f"def {g.name}(p, {', '.join(args)}):", f'    """{sig} -> {outs}"""']
    constants = {} if constants is None else constants
    for op in all_ops(g):
        if op.name == "const":
            e.names[("const", id(op))] = add_constant(constants, op.result.name or "c", op.attrs["value"])
    body = ["    " + line for line in e.graph_lines(g)]
    used = set(re.findall(r"[A-Za-z_]\w*", "\n".join(body) + " ".join(e.r(v) for v in g.outputs)))
    by_input: dict[int, list[tuple[int, str]]] = {}
    for name, (i, axis) in g.dim_sources.items():
        if name in used:
            by_input.setdefault(i, []).append((axis, name))
    for i, dims in by_input.items():
        rank = g.inputs[i].rank
        if sorted(a for a, _ in dims) == list(range(rank)):
            lines.append(f"    {', '.join(n for _, n in sorted(dims))} = {args[i]}.shape")
        else:
            for axis, name in dims:
                lines.append(f"    {name} = {args[i]}.shape[{axis}]")
    lines += body
    rets = [e.r(v) for v in g.outputs]
    if g.state_updates:
        for path, v in g.state_updates.items():
            if v.producer is None or v.producer.name != "cache_write":
                raise CodegenError(f"state `{path}` is updated by `{v.producer.name}`; only cache_write writes state")
        lines.append("    state = {")
        lines += [f"        {path!r}: {e.flat_name(v)}," for path, v in g.state_updates.items()]
        lines.append("    }")
        rets.append("state")
    lines.append(f"    return {', '.join(rets)}")
    if fused is not None:
        fused.update(e.fused)
    return "\n".join(lines)


def generate(program: Program, numerics: str = "equivalent", fused: dict | None = None) -> str:
    """A Python module with one function per entry, each `f(p, *inputs)` where `p` maps
    checkpoint names (parameters and state), the keys of the weights fused for one dot (made by
    its `fuse_weights`; also added to `fused`: key -> checkpoint names) and the `const:` keys of
    `constants()` to arrays. Imports only jax."""
    if numerics not in NUMERICS:
        raise CodegenError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    fused = {} if fused is None else fused
    unfused: frozenset[str] = frozenset()
    while True:
        funcs, constants = [], {}
        fused.clear()
        for g in program.entries.values():
            funcs.append(function_source(g, numerics, constants, fused, unfused))
        # An entry that reads a member of another entry's group alone: that group stays unfused.
        alone = {k for k, names in fused.items() for n in names if any(f"p[{n!r}]" in f for f in funcs)}
        if not alone:
            break
        unfused |= alone
    head = [
        f'"""{program.model} from {program.source}, generated by linnet.',
        "",
        f"Preset {program.preset or '(defaults)'}, working dtype {program.dtype.name}, numerics {numerics}, "
        f"max_batch {program.max_batch}, max_positions {program.max_positions}.",
        "Each entry takes `p`, the parameters and state by checkpoint name plus the constants",
        "from `constants()`, and is pure: an entry that writes state (the KV cache) returns its",
        "outputs and a dict of the new state by checkpoint name. Integer inputs are i64",
        '(run with `jax.config.update("jax_enable_x64", True)`).',
    ]
    head += [
        "Pass `p = {**fuse_weights(params), **state, **constants()}`: linear layers that share an",
        "input are one dot over their weights fused (FUSED_WEIGHTS), made once by `fuse_weights`.",
    ]
    if any(len(t.shape) == 4 for t in program.state):
        head += [
            "KV caches declared [max_batch, H, T, D] are held as [max_batch * H, T, D], so that XLA",
            "writes them in place (when the caller donates them: `jax.jit(..., donate_argnums=...)`)",
            "and the attention dots read them where they lie.",
        ]
    head += [
        '"""',
        "",
        "import jax",
        "import jax.numpy as jnp",
        "import jax.scipy.special",
        "from jax import lax",
        "",
        f"PRECISION = {'highest' if numerics == 'equivalent' else None!r}",
        "",
        "",
        "def constants():",
        '    """Small folded constants (no weights)."""',
        "    return {",
    ]
    for k, v in constants.items():
        head.append(f"        {k!r}: jnp.array({v.tolist()!r}, dtype={JAX_DTYPES[np_dtype_name(v)]}),")
    head.append("    }")
    if any("write_cache(" in f for f in funcs):
        funcs.insert(0, WRITE_CACHE)
    # Emitted with no groups too, so every generated module has the same API.
    keys = "".join(f"\n    {k!r}," for k in fused)
    funcs.insert(0, FUSE_WEIGHTS.replace("[\n    KEYS\n]", f"[{keys}\n]" if keys else "[]"))
    return "\n".join(head + [""] + ["\n" + f + "\n" for f in funcs]).rstrip() + "\n"


Emitter.dtypes = JAX_DTYPES
Emitter.emitters = EMITTERS
Emitter.native = NATIVE
Emitter.reserved = RESERVED
Emitter.backend = "JAX"
Emitter.error = CodegenError
