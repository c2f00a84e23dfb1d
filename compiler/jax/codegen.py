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

import re
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
from linnet.semantics.dims import Dim

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
RESERVED = python_reserved("jax", "jnp", "lax", "p", "math", "PRECISION", "constants")

# Registry ops the JAX backend cannot express, with the reason (none at present: the test
# accepts an op that is either lowered or listed here).
UNSUPPORTED: dict[str, str] = {}


class CodegenError(RenderError):
    """An op or argument the JAX backend cannot express (names the op)."""


class Emitter(GraphEmitter):
    """Emits the JAX statements of one graph (tables below; machinery in linnet.ir.render)."""

    def prepare_graph(self, g: Graph) -> None:
        """`x @ transpose(w)` with a 2-d `w` used once contracts `w` where it lies, as a
        linear layer: `jnp.einsum("...i,oi->...o", x, w)` (XLA then reads the weight in its
        stored layout instead of materialising its transpose)."""
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


def _matmul(e: Emitter, op: Op) -> str:
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
    Positions past the cache are dropped (a padded prefill's tail)."""
    cache, rows, positions, new = (e.r(op.args[k]) for k in ("cache", "rows", "positions", "new"))
    s = dim_text(op.args["new"].dims[2])
    return (
        f"{cache}.at[{rows}[:, None], :, {positions}[:, None] + lax.iota(jnp.int64, {s})]"
        f".set(jnp.swapaxes({new}, 1, 2), mode='drop')"
    )


EMITTERS["cache_write"] = _cache_write
EMITTERS["param"] = lambda e, op: f"p[{op.attrs['path']!r}]"
EMITTERS["state"] = lambda e, op: f"p[{op.attrs['path']!r}]"
EMITTERS["const"] = lambda e, op: f"p[{('const:' + e.names[('const', id(op))])!r}]"


# ----------------------------------------------------------------------------- native composites


def _reads_cache(v: Value) -> bool:
    """`v` is rows of a KV cache (`take` of a `state` or `cache_write` value)."""
    t = v.producer
    if t is None or t.name != "take":
        return False
    x = t.args["x"]
    return x.producer is not None and x.producer.name in ("state", "cache_write")


def _grouped_attention(e: Emitter, op: Op):
    """transformers' eager attention (matmul, scale, mask with the dtype's minimum, softmax,
    matmul) with the query heads of one KV head batched together instead of repeating the
    keys and values (`repeat_kv`): the same dot products, without copying the cache G times.

    Keys and values read from the KV cache are contracted one KV head at a time (`k[:, i]`):
    XLA on CPU fuses the cache write into a dot's operand when the dot reads the whole cache
    through a reshape, once per reader, and each fused copy of the write gets its own copy of
    the cache (four per cache per step); a dot over a slice reads the written cache in place."""
    q, k, v, mask = (op.args[n] for n in ("q", "k", "v", "mask"))
    b, h, s, d = (dim_text(x) for x in q.dims)
    hkv, t = dim_text(k.dims[1]), dim_text(k.dims[2])
    nkv = k.dims[1].as_int()
    g = q.dims[1].as_int() // nkv
    qn, kn, vn, mn = e.r(q), e.r(k), e.r(v), e.r(mask)
    dtype = JAX_DTYPES[q.dtype.name]
    scores, probs = e.fresh("scores"), e.fresh("probs")
    scale = e.r(op.args["scale"])
    per_head = _reads_cache(k) and _reads_cache(v) and nkv is not None
    note = f"  # {g} heads per KV head" if g > 1 else ""
    qg = qn if g == 1 else f"{qn}.reshape({b}, {hkv}, {g} * {s}, {d})"
    if per_head:
        qi = e.fresh("q_grouped") if g > 1 else qn
        lines = [f"{qi} = {qg}{note}"] if g > 1 else []
        lines.append(
            f'{scores} = jnp.stack([jnp.einsum("bsd,btd->bst", {qi}[:, i], {kn}[:, i], precision=PRECISION) '
            f"for i in range({nkv})], axis=1)  # one KV head at a time"
        )
        if g > 1:
            lines.append(f"{scores} = {scores}.reshape({b}, {h}, {s}, {t}) * {scale}")
        else:
            lines[-1] = lines[-1].replace("], axis=1)", f"], axis=1) * {scale}", 1)
    elif g == 1:
        lines = [f'{scores} = jnp.einsum("bhsd,bhtd->bhst", {qn}, {kn}, precision=PRECISION) * {scale}']
    else:
        lines = [
            f'{scores} = jnp.einsum("bhsd,bhtd->bhst", {qg}, {kn}, precision=PRECISION){note}',
            f"{scores} = {scores}.reshape({b}, {h}, {s}, {t}) * {scale}",
        ]
    lines.append(f"{scores} = jnp.where(jnp.expand_dims({mn}, 1), {scores}, jnp.finfo({dtype}).min)")
    if op.args.get("upcast"):
        lines.append(f"{probs} = jax.nn.softmax({scores}.astype(jnp.float32), axis=-1).astype({dtype})")
    else:
        lines.append(f"{probs} = jax.nn.softmax({scores}, axis=-1)")
    pg = probs if g == 1 else f"{probs}.reshape({b}, {hkv}, {g} * {s}, {t})"
    if per_head:
        if g > 1:
            pi = e.fresh("probs_grouped")
            lines.append(f"{pi} = {pg}")
            pg = pi
        out = f"jnp.stack([jnp.matmul({pg}[:, i], {vn}[:, i], precision=PRECISION) for i in range({nkv})], axis=1)"
        return lines, out if g == 1 else f"{out}.reshape({b}, {h}, {s}, {d})"
    if g == 1:
        return lines, f"jnp.matmul({probs}, {vn}, precision=PRECISION)"
    return lines, f"jnp.matmul({pg}, {vn}, precision=PRECISION).reshape({b}, {h}, {s}, {d})"


NATIVE: dict[str, tuple[tuple[str, ...], Callable[[Emitter, Op], "str | tuple[list[str], str]"]]] = {
    "softmax": (NUMERICS, lambda e, op: f"jax.nn.softmax({e.r(op.args['x'])}, axis=-1)"),
    "silu": (NUMERICS, lambda e, op: f"jax.nn.silu({e.r(op.args['x'])})"),
    "gelu": (NUMERICS, lambda e, op: f"jax.nn.gelu({e.r(op.args['x'])}, approximate=False)"),
    "gelu_tanh": (("fast",), lambda e, op: f"jax.nn.gelu({e.r(op.args['x'])}, approximate=True)"),
    "attention": (NUMERICS, _grouped_attention),
}


# ----------------------------------------------------------------------------- whole functions


def function_source(g: Graph, numerics: str = "equivalent", constants: dict | None = None) -> str:
    """The source of one entry as `def NAME(p, inputs...)`; an entry that writes state returns
    `(outputs..., {path: new value})`. Its folded constants are added to `constants`."""
    e = Emitter(numerics)
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
        lines += [f"        {path!r}: {e.r(v)}," for path, v in g.state_updates.items()]
        lines.append("    }")
        rets.append("state")
    lines.append(f"    return {', '.join(rets)}")
    return "\n".join(lines)


def generate(program: Program, numerics: str = "equivalent") -> str:
    """A Python module with one function per entry, each `f(p, *inputs)` where `p` maps
    checkpoint names (parameters and state) and the `const:` keys of `constants()` to arrays.
    Imports only jax."""
    if numerics not in NUMERICS:
        raise CodegenError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    funcs = []
    constants: dict[str, object] = {}
    for g in program.entries.values():
        funcs.append(function_source(g, numerics, constants))
    head = [
        f'"""{program.model} from {program.source}, generated by linnet.',
        "",
        f"Preset {program.preset or '(defaults)'}, working dtype {program.dtype.name}, numerics {numerics}, "
        f"max_batch {program.max_batch}, max_positions {program.max_positions}.",
        "Each entry takes `p`, the parameters and state by checkpoint name plus the constants",
        "from `constants()`, and is pure: an entry that writes state (the KV cache) returns its",
        "outputs and a dict of the new state by checkpoint name. Integer inputs are i64",
        '(run with `jax.config.update("jax_enable_x64", True)`).',
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
    return "\n".join(head + [""] + ["\n" + f + "\n" for f in funcs]).rstrip() + "\n"


Emitter.dtypes = JAX_DTYPES
Emitter.emitters = EMITTERS
Emitter.native = NATIVE
Emitter.reserved = RESERVED
Emitter.backend = "JAX"
Emitter.error = CodegenError
