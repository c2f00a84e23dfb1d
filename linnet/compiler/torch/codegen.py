"""Core IR to PyTorch source: a model file a person can read.

`generate(program)` writes one `nn.Module` class per module class with methods (its parameters
and state declared by checkpoint name, its submodules as children), one function per Linnet
function, and the entries as methods of the root model's class (`linnet torch FILE -o
model.py`; the PyTorch backend runs the same text). The helpers the code calls (the `Module`
base class, `linear`, `attended_keys`, ...) are the real module `prelude.py`: generated code
imports them from it, and a standalone file (`linnet torch`, `standalone=True`) carries their
definitions instead and imports only torch. The interpreter (`interpret.py`) runs the
flattened program one op at a time with the same statements. This file does not import
torch: the language server shows generated code in its own process.

What runs natively is decided by the passes (`PASSES`, `linnet.ir.pipeline`), not here:
a composite runs as a native kernel when that kernel is what the reference implementation
calls (softmax, SiLU, erf GELU and layer norm; attention as SDPA, transformers' default, where
its softmax is in f32), RMS norm as `F.rms_norm` between the reference's casts (bit for bit its
body), and, under `fast`, also where it is only close (RMS norm with its weight inside, tanh
GELU); otherwise its body, op by op, in transformers' op order. Attention that runs eagerly runs
grouped (see `_grouped_attention`) with the variants the passes found exact for each call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from linnet.errors import CodegenError
from linnet.ir import render
from linnet.ir.core import Op, Program, Value
from linnet.ir.fusion import joined_linears
from linnet.ir.pipeline import NUMERICS, PassOptions, prepare
from linnet.ir.render import (
    GraphEmitter,
    ModuleWriter,
    Prelude,
    constant_values,
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

from .liveness import release_dead_values
from .spatial import EMITTERS as SPATIAL_EMITTERS

TORCH_DTYPES = {
    "f64": "torch.float64",
    "f32": "torch.float32",
    "f16": "torch.float16",
    "bf16": "torch.bfloat16",
    "i64": "torch.int64",
    "i32": "torch.int32",
    "bool": "torch.bool",
}
RESERVED = python_reserved(
    "torch",
    "F",
    "nn",
    "self",
    "device",
    "math",
    "Module",
    "training",
    "linear",
    "linears",
    "attended_keys",
    "cache_rows",
    "one_row_attention",
    "linears_joined_under_compile",
)
# The helpers generated code calls (`Module`, `linear`, ...): a real module, which imports torch, so read as text here.
PRELUDE = Prelude("linnet.compiler.torch.prelude", Path(__file__).with_name("prelude.py"))

# What the passes do for this backend: composites native under these numerics, and the
# attention variants `_grouped_attention` (and SDPA, under fast) can emit.
PASSES = PassOptions(
    native={
        "softmax": NUMERICS,
        "silu": NUMERICS,
        "gelu": NUMERICS,
        "layer_norm": NUMERICS,
        "gelu_tanh": ("fast",),
        "rms_norm": NUMERICS,
        "attention": NUMERICS,
        "gather_matmul": NUMERICS,
    },
    attention=("scale_queries", "trim_keys", "sdpa"),
)

# Registry ops the PyTorch backend cannot express, with the reason (none at present: the op
# coverage test accepts an op that is either emitted or listed here).
UNSUPPORTED: dict[str, str] = {}


@dataclass
class Emitter(GraphEmitter):
    """Emits the PyTorch statements of one graph (tables below; machinery in linnet.ir.render).
    `tensors` collects the names it binds to tensors (what `liveness` may free)."""

    tensors: set[str] = field(default_factory=set)
    joined: dict[int, dict] = field(default_factory=dict)  # id(graph) -> its `fusion.joined_linears`, found once
    row_reads: dict[int, tuple[str, str]] = field(default_factory=dict)  # id(value) -> (cache, rows): `_take`

    def bind(self, v: Value, hint: str | None = None) -> str:
        name = super().bind(v, hint)
        if v.rank:
            self.tensors.add(name)
        return name

    def store_state(self, path: str, value: Value) -> str:
        # in place: the buffer keeps its storage (CUDA graphs replay on it), and the verifier
        # guarantees its old value is not read again
        return f"{self.member(path)}.copy_({self.r(value)})"


# ----------------------------------------------------------------------------- op emitters

Emit = Callable[[Emitter, Op], "str | tuple[list[str], str]"]
EMITTERS: dict[str, Emit] = {}


def _unary(name: str, fmt: str) -> None:
    EMITTERS[name] = lambda e, op: fmt.format(x=e.r(op.args["x"]))


for _name, _fmt in {
    "exp": "torch.exp({x})",
    "log": "torch.log({x})",
    "sqrt": "torch.sqrt({x})",
    "rsqrt": "torch.rsqrt({x})",
    "sin": "torch.sin({x})",
    "cos": "torch.cos({x})",
    "tanh": "torch.tanh({x})",
    "sigmoid": "torch.sigmoid({x})",
    "erf": "torch.erf({x})",
    "abs": "torch.abs({x})",
    "neg": "-{x}",
    "logical_not": "~{x}",
}.items():
    _unary(_name, _fmt)

for _name, _sym in python_infix().items():
    EMITTERS[_name] = infix_emitter(_sym)


def _minmax(fn: str, clamp: str) -> Emit:
    def emit(e: Emitter, op: Op) -> str:
        x, y = op.args["x"], op.args["y"]
        if isinstance(x, Value) and isinstance(y, Value):
            return f"torch.{fn}({e.r(x)}, {e.r(y)})"
        t, s = (x, y) if isinstance(x, Value) else (y, x)
        return f"torch.clamp({e.r(t)}, {clamp}={e.r(s)})"

    return emit


EMITTERS["maximum"] = _minmax("maximum", "min")
EMITTERS["minimum"] = _minmax("minimum", "max")


def _reduction(method: str) -> Emit:
    return lambda e, op: f"{e.r(op.args['x'])}.{method}(dim={op.args['dim']}, keepdim={e.r(op.args['keepdim'])})"


for _name, _method in {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin", "argmax": "argmax"}.items():
    EMITTERS[_name] = _reduction(_method)


EMITTERS["matmul"] = lambda e, op: f"{e.r(op.args['x'])} @ {e.r(op.args['y'])}"
EMITTERS["linear"] = lambda e, op: f"F.linear({e.r(op.args['x'])}, {e.r(op.args['weight'])})"
EMITTERS["reshape"] = lambda e, op: f"{e.r(op.args['x'])}.reshape({dims_text(op.args['shape'])})"
EMITTERS["transpose"] = lambda e, op: f"{e.r(op.args['x'])}.transpose({op.args['dim0']}, {op.args['dim1']})"
EMITTERS["permute"] = lambda e, op: f"{e.r(op.args['x'])}.permute({', '.join(map(str, op.args['dims']))})"
EMITTERS["unsqueeze"] = lambda e, op: f"{e.r(op.args['x'])}.unsqueeze({op.args['dim']})"
EMITTERS["squeeze"] = lambda e, op: f"{e.r(op.args['x'])}.squeeze({op.args['dim']})"
EMITTERS["expand"] = lambda e, op: f"{e.r(op.args['x'])}.expand({dims_text(op.args['shape'])})"
EMITTERS["concat"] = lambda e, op: f"torch.cat({e.r(op.args['xs'])}, dim={op.args['dim']})"
EMITTERS["split"] = lambda e, op: (
    f"torch.split({e.r(op.args['x'])}, {dims_text(op.args['sizes'], True)}, dim={op.args['dim']})"
)
# A stable descending sort, cut at k: torch.topk leaves the order of equal entries unspecified (on CPU it does not
# put the lower index first), the registry's `top_k` does.
EMITTERS["top_k"] = lambda e, op: (
    f"(lambda s: (s.values[..., :{e.r(op.args['k'])}], s.indices[..., :{e.r(op.args['k'])}]))"
    f"(torch.sort({e.r(op.args['x'])}, dim=-1, descending=True, stable=True))"
)
EMITTERS["repeat_interleave"] = lambda e, op: (
    f"{e.r(op.args['x'])}.repeat_interleave({e.r(op.args['repeats'])}, dim={op.args['dim']})"
)
EMITTERS["cast"] = lambda e, op: f"{e.r(op.args['x'])}.to({e.r(op.args['dtype'])})"


def _rearrange(e: Emitter, op: Op) -> str:
    x: Value = op.args["x"]
    expanded, perm, out = rearrange_plan(list(x.dims), op.args["pattern"], dict(op.args["sizes"]))
    text = e.r(x)
    if [d.key() for d in expanded] != [d.key() for d in x.dims]:
        text += f".reshape({dims_text(expanded)})"
    if perm != list(range(len(perm))):
        moved = [i for i, p in enumerate(perm) if p != i]
        if len(moved) == 2:
            text += f".transpose({moved[0]}, {moved[1]})"
        else:
            text += f".permute({', '.join(map(str, perm))})"
    if [d.key() for d in out] != [d.key() for d in expanded] or len(out) != len(expanded):
        permuted = [expanded[i] for i in perm]
        if [d.key() for d in out] != [d.key() for d in permuted]:
            text += f".reshape({dims_text(out)})"
    return text


EMITTERS["rearrange"] = _rearrange


def _take(e: Emitter, op: Op) -> str | tuple[list[str], None]:
    x, idx, dim = op.args["x"], op.args["indices"], op.args["dim"]
    cache = x.producer is not None and x.producer.name in ("state", "cache_write") and (dim == 0 or dim == -x.rank)
    if cache and x.dims[0].as_int() == 1:
        # One cache row: every valid index is 0, so reading rows is reading the cache (no copy).
        return f"{e.r(x)}.expand({dims_text(op.result.dims)})"
    if cache and _read_by_trimmed_attention(e, op.result):
        # Rows of a cache that only attention reads: read there, once `attended_keys` knows how many positions
        # it attends (`cache_rows`), instead of copying every position of every row here.
        e.row_reads[id(op.result)] = (e.r(x), e.r(idx))
        e.names[id(op.result)] = f"{e.r(x)}[{e.r(idx)}]"
        return [], None
    if (dim == 0 or dim == -x.rank) and x.rank == 2:
        return f"F.embedding({e.r(idx)}, {e.r(x)})"
    return f"{e.r(x)}[{index_text(x.rank, dim, e.r(idx))}]"


def _read_by_trimmed_attention(e: Emitter, v: Value) -> bool:
    """True when the graph being emitted reads `v` once, as the keys or values of an SDPA attention with
    `trim_keys` (the calls `_grouped_attention` reads through `attended_keys`), and `v` is not one of its results."""
    g = e.graph
    if g is None or any(out is v for out in (*g.outputs, *g.state_updates.values())):
        return False
    users = [op for op in g.ops if any(arg is v for arg in op.inputs())]
    if len(users) != 1:
        return False
    op = users[0]
    variant = op.attrs.get("variant", {})
    attention = op.name == "composite" and op.attrs.get("name") == "attention" and op.attrs.get("native")
    args = [op.args.get(n) for n in ("q", "k", "v", "mask")]
    return (
        bool(attention and variant.get("sdpa") and variant.get("trim_keys"))
        and sum(a is v for a in args) == 1
        and (args[1] is v or args[2] is v)
    )


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
EMITTERS["where"] = lambda e, op: f"torch.where({e.r(op.args['cond'])}, {e.r(op.args['x'])}, {e.r(op.args['y'])})"


def _arange(e: Emitter, op: Op) -> str:
    start, stop, step = op.args["start"], op.args["stop"], op.args["step"]
    parts = [e.r(start)] if stop is None else [e.r(start), e.r(stop)]
    if stop is not None and step is not None and step.as_int() != 1:
        parts.append(e.r(step))
    return f"torch.arange({', '.join(parts)}, device=device)"


EMITTERS["arange"] = _arange
EMITTERS["full"] = lambda e, op: (
    f"torch.full(({dims_text(op.args['shape'])},), {e.r(op.args['value'])}, "
    f"dtype={e.r(op.args['dtype'])}, device=device)"
)
EMITTERS["tensor"] = lambda e, op: (
    f"torch.tensor({e.r(op.args['values'])}, dtype={e.r(op.args['dtype'])}, device=device)"
)
EMITTERS["zeros"] = lambda e, op: (
    f"torch.zeros(({dims_text(op.args['shape'])},), dtype={e.r(op.args['dtype'])}, device=device)"
)
EMITTERS["ones"] = lambda e, op: (
    f"torch.ones(({dims_text(op.args['shape'])},), dtype={e.r(op.args['dtype'])}, device=device)"
)
EMITTERS["min_value"] = lambda e, op: (
    f"torch.full((), torch.finfo({e.r(op.args['dtype'])}).min, dtype={e.r(op.args['dtype'])}, device=device)"
)


def _cache_write(e: Emitter, op: Op):
    """In place: row `rows[b]`, positions `positions[b] + 0..S-1` (the verifier guarantees the
    old cache value is not read again, so the result is the cache itself). The index tensors
    are made once per function, and a decode step (S = 1) makes no `arange`: every layer of
    every step writes its cache, so that is two ops fewer per layer where steps are shortest."""
    cache, rows, positions, new = (e.r(op.args[k]) for k in ("cache", "rows", "positions", "new"))
    size = op.args["new"].dims[2]
    s = dim_text(size)
    stmts = []
    key = ("cache_index", rows, positions, s)
    if key not in e.names:
        r, t = e.fresh("row_index"), e.fresh("position_index")
        spread = f"{positions}[:, None] + torch.arange({s}, device=device)"
        if size.as_int() == 1:
            spread = f"{positions}[:, None]"
        elif size.as_int() is None:
            spread = f"{positions}[:, None] if {s} == 1 else {spread}"
        stmts += [f"{r} = {rows}[:, None]", f"{t} = {spread}"]
        e.names[key] = (r, t)
    r, t = e.names[key]
    stmts.append(f"{cache}[{r}, :, {t}] = {new}.transpose(1, 2)")
    e.names[id(op.result)] = cache
    return stmts, None


EMITTERS["cache_write"] = _cache_write


def _dropout(e: Emitter, op: Op) -> str:
    """`F.dropout(x, p, training)` with PyTorch's own switch (`GraphEmitter.training_flag`): the module's
    `self.training` in a method (the trainer calls `module.train()` for its steps; a loaded model is in `eval()`),
    else the `training` argument. p = 0 is the identity."""
    x, p = op.args["x"], op.args["p"]
    if p == 0:
        return e.r(x)
    return f"F.dropout({e.r(x)}, {e.r(float(p))}, {e.training_flag()})"


EMITTERS["dropout"] = _dropout


def _const(e: Emitter, op: Op) -> str:
    value = op.attrs["value"]
    return f"torch.tensor({constant_values(e, op)}, dtype={TORCH_DTYPES[np_dtype_name(value)]}, device=device)"


EMITTERS["const"] = _const
EMITTERS.update(SPATIAL_EMITTERS)  # convolutions, pooling, padding, resampling (spatial.py)


# ----------------------------------------------------------------------------- native composites


def _grouped_attention(e: Emitter, op: Op, one_row: bool = False):
    """Attention as the passes chose it (`linnet.ir.attention`). `sdpa`: `F.scaled_dot_product_attention`, the kernel
    transformers' default attention calls, the mask as its bool `attn_mask`; with `trim_keys`, the cache read up to
    the last key any query attends, unmasked or causal where the mask says nothing more (`attended_keys`: the calls
    transformers makes; eagerly only, decode on the CPU only, so compiled steps and CUDA graphs read the whole
    cache, masked: the keys after the last attended one add exact zeros). Otherwise
    transformers' eager attention (matmul, scale, mask with the dtype's minimum, softmax, matmul) with the query
    heads of one KV head batched together instead of repeating the keys and values (`repeat_kv`): the same dot
    products, without copying the cache G times; `scale_queries` scales the queries by a power of two instead of
    the scores, `trim_keys` drops, in prefill, the keys after the last one any query attends. `one_row`: the SDPA
    call over the trimmed cache is the prelude's `one_row_attention`."""
    q, k, v, mask = (op.args[n] for n in ("q", "k", "v", "mask"))
    variant = op.attrs.get("variant", {})
    s = dim_text(q.dims[2])
    kn, vn, mn = e.r(k), e.r(v), e.r(mask)
    if variant.get("sdpa"):
        if not variant.get("trim_keys"):
            # a padded query attends no key: the reference's mask of the dtype's minimum gives it the mean of the
            # values, where a bool mask gives 0 (ModernBERT compares every position), so the mask is additive
            additive = e.fresh("additive_mask")
            qn = e.r(q)
            line = f"{additive} = torch.where({mn}, 0.0, torch.finfo({qn}.dtype).min).to({qn}.dtype).unsqueeze(1)"
            return [line], _sdpa(e, op, kn, vn, additive, per_head=True)
        keys, attend, causal = e.fresh("keys"), e.fresh("attend"), e.fresh("causal")
        lines = [f"{keys}, {attend}, {causal} = attended_keys({mn}, {dim_text(k.dims[2])})"]
        kt, vt = (
            f"cache_rows({e.row_reads[id(x)][0]}, {e.row_reads[id(x)][1]}, {keys})"
            if id(x) in e.row_reads
            else f"{n}[:, :, :{keys}]"
            for x, n in ((k, kn), (v, vn))
        )
        if one_row:
            qn, scale = e.r(op.args["q"]), e.r(op.args["scale"])
            return lines, f"one_row_attention({qn}, {kt}, {vt}, {attend}, {causal}, {scale})"
        sdpa = _sdpa(e, op, kt, vt, attend, per_head=True)
        return lines, sdpa.replace(", scale=", f", is_causal={causal}, scale=", 1)
    lines = []
    t = dim_text(k.dims[2])
    if variant.get("trim_keys"):
        keys, kt, vt, mt = e.fresh("keys"), e.fresh("k_used"), e.fresh("v_used"), e.fresh("mask_used")
        lines += [
            f"{keys}, {kt}, {vt}, {mt} = {t}, {kn}, {vn}, {mn}",
            f"if {s} > 1 and bool({mn}.any()):  # prefill: keys after the last attended one weigh exactly 0",
            f"    {keys} = int({mn}.flatten(0, 1).any(0).nonzero().max()) + 1",
            f"    {kt}, {vt}, {mt} = {kn}[:, :, :{keys}], {vn}[:, :, :{keys}], {mn}[:, :, :{keys}]",
        ]
        t, kn, vn, mn = keys, kt, vt, mt
    body, result = _grouped_eager(e, op, kn, vn, mn, t)
    return lines + body, result


def _sdpa(e: Emitter, op: Op, k: str, v: str, mask: str, per_head: bool = False) -> str:
    """`F.scaled_dot_product_attention` over keys `k`, values `v` and the `mask` [B, S, T] (bool, True: attended;
    `per_head`: [B, 1, S, T], bool or additive), the query heads of one KV head reading it in place (`enable_gqa`)."""
    gqa = ", enable_gqa=True" if op.args["q"].dims[1].as_int() != op.args["k"].dims[1].as_int() else ""
    mask = mask if per_head else f"{mask}.unsqueeze(1)"
    return (
        f"F.scaled_dot_product_attention({e.r(op.args['q'])}, {k}, {v}, attn_mask={mask}, "
        f"scale={e.r(op.args['scale'])}{gqa})"
    )


def _grouped_eager(e: Emitter, op: Op, kn: str, vn: str, mn: str, t: str):
    """The grouped eager form over keys `kn`, values `vn` and mask `mn` of `t` keys (their names)."""
    q, k = op.args["q"], op.args["k"]
    b, h, s, d = (dim_text(x) for x in q.dims)
    hkv = dim_text(k.dims[1])
    g = q.dims[1].as_int() // k.dims[1].as_int()
    qn = e.r(q)
    dtype = TORCH_DTYPES[q.dtype.name]
    scale = op.args["scale"]
    scores, probs = e.fresh("scores"), e.fresh("probs")
    lines = []
    queries_scaled = op.attrs.get("variant", {}).get("scale_queries")
    qs = f"({qn} * {e.r(scale)})" if queries_scaled else qn
    tail = "" if queries_scaled else f" * {e.r(scale)}"
    if g == 1:
        lines.append(f"{scores} = ({qs} @ {kn}.transpose(-2, -1)){tail}")
    else:
        lines += [
            f"{scores} = {qs}.reshape({b}, {hkv}, {g} * {s}, {d}) @ {kn}.transpose(-2, -1)  # {g} heads per KV head",
            f"{scores} = {scores}.reshape({b}, {h}, {s}, {t}){tail}",
        ]
    lines.append(f"{scores} = {scores}.masked_fill_(~{mn}.unsqueeze(1), torch.finfo({scores}.dtype).min)")
    if op.args.get("upcast") and q.dtype.name != "f32":
        lines.append(f"{probs} = torch.softmax({scores}, dim=-1, dtype=torch.float32).to({dtype})")
    else:  # f32 already, or softmax in the working dtype
        lines.append(f"{probs} = torch.softmax({scores}, dim=-1)")
    if g == 1:
        return lines, f"{probs} @ {vn}"
    return lines, f"({probs}.reshape({b}, {hkv}, {g} * {s}, {t}) @ {vn}).reshape({b}, {h}, {s}, {d})"


def _gather_matmul(e: Emitter, op: Op):
    """`out[i] = x[i] @ weight[indices[i]]` (x: [..., K], weight: [E, K, N], indices: i64[...]) without
    copying the chosen matrices per row: on CPU the rows are sorted by expert and `F.grouped_mm` multiplies
    each expert's rows by its matrix in place (the matmul per expert hit of transformers' eager experts; the
    gathered form copies k matrices per token, 400 MB a layer at GPT-OSS-20B's width). Under torch.compile
    and on other devices (grouped_mm there wants bf16 on recent CUDA GPUs; its meta function, bf16 always),
    and in f64, which grouped_mm lacks, the gathered form: it needs no host synchronisation (CUDA graphs)."""
    x, weight, indices = op.args["x"], op.args["weight"], op.args["indices"]
    xn, wn, ixn = e.r(x), e.r(weight), e.r(indices)
    experts, k, n = (dim_text(d) for d in weight.dims)
    names = ("flat", "order", "expert_ids", "offsets", "rows", "chosen")
    flat, order, ids, offsets, rows, out = (e.fresh(s) for s in names)
    grouped = f"{xn}.is_cpu and {xn}.dtype != torch.float64 and not torch.compiler.is_compiling()"
    lines = [
        f"if {grouped}:  # each chosen expert's matrix read in place",
        f"    {flat} = {ixn}.flatten()",
        f"    {order} = {flat}.argsort(stable=True)",
        f"    {ids} = torch.arange({experts}, device={flat}.device)",
        f"    {offsets} = torch.searchsorted({flat}[{order}], {ids}, right=True)  # where each expert's rows end",
        f"    {rows} = F.grouped_mm({xn}.reshape(-1, {k})[{order}], {wn}, offs={offsets}.int())",
        f"    {out} = torch.empty_like({rows}).index_copy_(0, {order}, {rows}).reshape(*{ixn}.shape, {n})",
        "else:  # the chosen matrices gathered, without a host synchronisation",
        f"    {out} = ({xn}.unsqueeze(-2) @ {wn}[{ixn}]).squeeze(-2)",
    ]
    return lines, out


def _last_dim(v) -> str:
    return dim_text(v.dims[-1])


def _rms_norm(e: Emitter, op: Op) -> str:
    """`F.rms_norm`: under `equivalent`, with transformers' casts around it (LlamaRMSNorm: normalised in f32, cast
    back, then `weight *` in the working dtype; bit for bit the op-by-op body in f32 and bf16, measured on CPU,
    in 1 kernel instead of 4-6); under `fast`, the weight inside, in the working dtype."""
    x, weight, eps = op.args["x"], e.r(op.args["weight"]), e.r(op.args["eps"])
    shape = f"({_last_dim(x)},)"
    if e.numerics == "fast":
        return f"F.rms_norm({e.r(x)}, {shape}, {weight}, {eps})"
    if x.dtype.name == "f32":
        return f"{weight} * F.rms_norm({e.r(x)}, {shape}, None, {eps})"
    return f"{weight} * F.rms_norm({e.r(x)}.to(torch.float32), {shape}, None, {eps}).to({TORCH_DTYPES[x.dtype.name]})"


NATIVE: dict[str, Callable[[Emitter, Op], "str | tuple[list[str], str]"]] = {
    "softmax": lambda e, op: f"torch.softmax({e.r(op.args['x'])}, dim=-1)",
    "silu": lambda e, op: f"F.silu({e.r(op.args['x'])})",
    "gelu": lambda e, op: f"F.gelu({e.r(op.args['x'])})",
    "layer_norm": lambda e, op: (
        f"F.layer_norm({e.r(op.args['x'])}, ({_last_dim(op.args['x'])},), "
        f"{e.r(op.args['weight'])}, None, {e.r(op.args['eps'])})"
    ),
    "gelu_tanh": lambda e, op: f'F.gelu({e.r(op.args["x"])}, approximate="tanh")',
    "rms_norm": _rms_norm,
    "attention": _grouped_attention,
    "gather_matmul": _gather_matmul,
}


# ----------------------------------------------------------------------------- the module


def module_passes(program: Program, numerics: str, mode: str, device_type: str) -> PassOptions:
    """The passes a `LinnetModule` runs before writing its source: `PASSES`, and for an f32 model under `fast`,
    generated eagerly on the CPU, `concat_linear_weights` (q, k and v; gate and up: one `linears` call each, the
    weights laid out adjacently by `LinnetModule.bind`). On a 2-core AVX2 EPYC, the same memory refilled in either
    arrangement (bench/weight_layouts.py, three runs): one row through SmolLM2's q, k and v as one [960, 576]
    weight held transposed in 0.66-0.83x the time of three, gate and up as one [3072, 576] in 0.81-1.00x; its f32
    decode 1.01-1.38x `equivalent`'s in six rounds of two runs, 1.10-1.15x before (bench/results/
    generate_speed_amd_avx2_r14{,b}_f32_fast.md). Not in bf16: oneDNN's bf16 GEMV gained 3-10 % on the same memory
    and nothing measurable end to end. `equivalent` keeps one `linear` a weight:
    transformers' kernels, bit for bit. An inductor module on the CPU (f32, bf16; either numerics) joins them too:
    its compiled decode step reads each group as one reduction (`linears_joined_under_compile`; SmolLM2's bf16 step ~4 %
    faster on a 2-core AVX-512 Xeon, docs/backends.md), while its eager calls keep one `linear` a weight (the
    generated module's bits). `generate` (`linnet torch`) writes `PASSES`' module, whose weights
    a caller loads apart. Under `fast`, eagerly on the CPU, the wide f32 weights are held transposed
    (`transpose_wide_weights`); inductor compiles its own decode kernels, and the interpreter calls F.linear."""
    if numerics == "fast" and mode == "generated" and device_type == "cpu":
        # the wide f32 weights held transposed for `linear`'s blocks of K (`fusion.hold_wide_weights_transposed`)
        return replace(PASSES, concat_linear_weights=program.dtype.name == "f32", transpose_wide_weights=True)
    if mode == "inductor" and device_type == "cpu" and program.dtype.name in ("f32", "bf16"):
        return replace(PASSES, concat_linear_weights=True)
    return PASSES


class ModuleEmitter(Emitter):
    """The generated module's emitter: linear layers call the prelude's `linear`, those over joined weights
    `linears`; under `fast` in bf16 or f16, attention that reads the cache up to its last attended key calls
    `one_row_attention` (prelude.py)."""


def _joined(fallback: Emit) -> Emit:
    """The module's emitter of `concat`, `linear` or `split`: a group of linear layers over joined weights
    (`fusion.joined_linears`: the concat of the parameters, the linear, the split of its output) is one statement,
    written at the split, `q_proj, k_proj, v_proj = linears(x, (self.q_proj.weight, ...))` (prelude.py); any other
    op is `fallback`'s."""

    def emit(e: Emitter, op: Op):
        if e.graph is None:
            return fallback(e, op)
        if id(e.graph) not in e.joined:
            e.joined[id(e.graph)] = joined_linears(e.graph)
        group = e.joined[id(e.graph)].get(id(op))
        if group is None:
            return fallback(e, op)
        concat, dot, split = group
        if op is not split:
            return [], None
        return f"linears({e.r(dot.args['x'])}, ({', '.join(e.r(w) for w in concat.args['xs'])}))"

    return emit


def _module_attention(e: Emitter, op: Op):
    """`_grouped_attention` as the module writes it: under `fast` in bf16/f16 the call over the trimmed cache is the
    module's `one_row_attention`."""
    return _grouped_attention(e, op, one_row=e.numerics == "fast" and op.args["q"].dtype.name in ("bf16", "f16"))


class TorchModule(ModuleWriter):
    """The PyTorch module: classes of `nn.Module` whose PARAMS/STATE are (shape, dtype), over the prelude's `Module`."""

    emitter = ModuleEmitter
    reserved = RESERVED
    prelude = PRELUDE

    def head(self) -> list[str]:
        p = self.program
        return [
            f'"""{p.model} from {p.source}, generated by linnet.',
            "",
            f"Preset {p.preset or '(defaults)'}, working dtype {p.dtype.name}, numerics {self.numerics}, "
            f"max_batch {p.max_batch}, max_positions {p.max_positions}.",
            f"`{p.root}(device)` is the model: its parameters are named by checkpoint name and have no",
            "storage until a checkpoint is loaded (`model.load_state_dict(tensors, strict=False, assign=True)`);",
            "its KV cache is zeroed buffers on `device`, updated in place by the entries that write it.",
            '"""',
            "",
            "import torch",
            "import torch.nn.functional as F",
            "from torch import nn",
            *self.prelude_imports(),
        ]

    def function(self, g, e: Emitter, name: str, method: bool) -> list[str]:
        """The function, each intermediate tensor freed after its last use (`liveness`)."""
        return release_dead_values(super().function(g, e, name, method), e.tensors)

    def table(self, name: str, items: dict) -> list[str]:
        if not items:
            return []
        rows = [f"    {k!r}: (({_shape(t)}), {TORCH_DTYPES[t.dtype.name]})," for k, t in items.items()]
        return [f"{name} = {{", *rows, "}"]


def generate(program: Program, numerics: str = "equivalent", standalone: bool = False) -> str:
    """The model as a Python module (see the module docstring): `Root(device)` builds it with
    empty parameters named by checkpoint name; entries are its methods. It imports the helpers
    it calls from the prelude; `standalone` (`linnet torch`), it carries their definitions and
    imports only torch. Raises CodegenError."""
    if numerics not in NUMERICS:
        raise CodegenError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    return TorchModule(prepare(program, PASSES, numerics), numerics, standalone).write()


def _shape(t) -> str:
    dims = [str(d.as_int()) for d in t.shape.dims]
    return ", ".join(dims) + ("," if len(dims) == 1 else "")


def graph_function(g, numerics: str = "equivalent") -> str:
    """A flat graph as a standalone PyTorch `def NAME(p, inputs...)` (`render.graph_function`); one that runs
    dropout takes `training=False` last."""
    return render.graph_function(Emitter, g, numerics)


def flat_program(program: Program, numerics: str = "equivalent") -> Program:
    """`program` flattened (every call inlined, every loop unrolled) and prepared as this
    backend runs it: what the interpreter executes."""
    return prepare(program, replace(PASSES, flatten=True), numerics)


Emitter.dtypes = TORCH_DTYPES
Emitter.emitters = EMITTERS
Emitter.native = NATIVE
Emitter.reserved = RESERVED
Emitter.backend = "PyTorch"
Emitter.training_arg = "training"  # nn.Module's flag: `self.training` in a method
Emitter.training_off = "False"
ModuleEmitter.emitters = {
    **EMITTERS,
    "linear": _joined(lambda e, op: f"linear({e.r(op.args['x'])}, {e.r(op.args['weight'])})"),
    "concat": _joined(EMITTERS["concat"]),
    "split": _joined(EMITTERS["split"]),
}
ModuleEmitter.native = {**NATIVE, "attention": _module_attention}
