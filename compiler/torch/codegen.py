"""Core IR to PyTorch source: one statement per op, readable, importing only torch.

Used two ways: `generate(program)` writes a module with one function per entry
(`linnet torch FILE -o model.py`), and the interpreter (`interpret.py`) runs the same
statements one op at a time. This file does not import torch: the language server shows
generated code in its own process.

Numerics (ARCHITECTURE.md): a `composite` runs as a native kernel when that kernel is what
the reference implementation calls (softmax, SiLU, erf GELU and layer norm: transformers calls
them natively) and, under `fast`, also where it is only close (SDPA for attention, fused RMS
norm, tanh GELU); otherwise its body, op by op, in transformers' op order.
"""

from __future__ import annotations

import math
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
from linnet.types.dims import Dim

TORCH_DTYPES = {
    "f64": "torch.float64",
    "f32": "torch.float32",
    "f16": "torch.float16",
    "bf16": "torch.bfloat16",
    "i64": "torch.int64",
    "i32": "torch.int32",
    "bool": "torch.bool",
}
NUMERICS = ("equivalent", "fast")
RESERVED = python_reserved("torch", "F", "p", "device", "math")

# Registry ops the PyTorch backend cannot express, with the reason (none at present: the op
# coverage test accepts an op that is either emitted or listed here).
UNSUPPORTED: dict[str, str] = {}


class CodegenError(RenderError):
    """An op or argument the PyTorch backend cannot express (names the op)."""


# ----------------------------------------------------------------------------- rendering


class Emitter(GraphEmitter):
    """Emits the PyTorch statements of one graph (tables below; machinery in linnet.ir.render)."""

    def prepare_graph(self, g: Graph) -> None:
        self._mark_linear(g)

    def _mark_linear(self, g: Graph) -> None:
        """`x @ transpose(w)` with a 2-d `w` used once is `F.linear(x, w)`, as nn.Linear runs it."""
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


_index = index_text
_dims = dims_text
_all_ops = all_ops
_np_name = np_dtype_name


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


def _matmul(e: Emitter, op: Op) -> str:
    w = op.attrs.get("linear_weight")
    if w is not None:
        return f"F.linear({e.r(op.args['x'])}, {e.r(w)})"
    return f"{e.r(op.args['x'])} @ {e.r(op.args['y'])}"


EMITTERS["matmul"] = _matmul
EMITTERS["reshape"] = lambda e, op: f"{e.r(op.args['x'])}.reshape({_dims(op.args['shape'])})"
EMITTERS["transpose"] = lambda e, op: f"{e.r(op.args['x'])}.transpose({op.args['dim0']}, {op.args['dim1']})"
EMITTERS["permute"] = lambda e, op: f"{e.r(op.args['x'])}.permute({', '.join(map(str, op.args['dims']))})"
EMITTERS["unsqueeze"] = lambda e, op: f"{e.r(op.args['x'])}.unsqueeze({op.args['dim']})"
EMITTERS["squeeze"] = lambda e, op: f"{e.r(op.args['x'])}.squeeze({op.args['dim']})"
EMITTERS["expand"] = lambda e, op: f"{e.r(op.args['x'])}.expand({_dims(op.args['shape'])})"
EMITTERS["concat"] = lambda e, op: f"torch.cat({e.r(op.args['xs'])}, dim={op.args['dim']})"
EMITTERS["split"] = lambda e, op: (
    f"torch.split({e.r(op.args['x'])}, {_dims(op.args['sizes'], True)}, dim={op.args['dim']})"
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
        text += f".reshape({_dims(expanded)})"
    if perm != list(range(len(perm))):
        moved = [i for i, p in enumerate(perm) if p != i]
        if len(moved) == 2:
            text += f".transpose({moved[0]}, {moved[1]})"
        else:
            text += f".permute({', '.join(map(str, perm))})"
    if [d.key() for d in out] != [d.key() for d in expanded] or len(out) != len(expanded):
        permuted = [expanded[i] for i in perm]
        if [d.key() for d in out] != [d.key() for d in permuted]:
            text += f".reshape({_dims(out)})"
    return text


EMITTERS["rearrange"] = _rearrange


def _take(e: Emitter, op: Op) -> str:
    x, idx, dim = op.args["x"], op.args["indices"], op.args["dim"]
    if (dim == 0 or dim == -x.rank) and x.dims[0].as_int() == 1 and x.producer is not None:
        if x.producer.name in ("state", "cache_write"):
            # One cache row: every valid index is 0, so reading rows is reading the cache (no copy).
            return f"{e.r(x)}.expand({_dims(op.result.dims)})"
    if (dim == 0 or dim == -x.rank) and x.rank == 2:
        return f"F.embedding({e.r(idx)}, {e.r(x)})"
    return f"{e.r(x)}[{_index(x.rank, dim, e.r(idx))}]"


def _slice(e: Emitter, op: Op) -> str:
    x = op.args["x"]
    start, stop = op.args["start"], op.args["stop"]
    a = "" if start is None or (isinstance(start, Dim) and start.as_int() == 0) else e.r(start)
    b = "" if stop is None else e.r(stop)
    return f"{e.r(x)}[{_index(x.rank, op.args['dim'], f'{a}:{b}')}]"


EMITTERS["take"] = _take
EMITTERS["slice"] = _slice
EMITTERS["select"] = lambda e, op: (
    f"{e.r(op.args['x'])}[{_index(op.args['x'].rank, op.args['dim'], e.r(op.args['index']))}]"
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
    f"torch.full(({_dims(op.args['shape'])},), {e.r(op.args['value'])}, dtype={e.r(op.args['dtype'])}, device=device)"
)
EMITTERS["zeros"] = lambda e, op: (
    f"torch.zeros(({_dims(op.args['shape'])},), dtype={e.r(op.args['dtype'])}, device=device)"
)
EMITTERS["ones"] = lambda e, op: (
    f"torch.ones(({_dims(op.args['shape'])},), dtype={e.r(op.args['dtype'])}, device=device)"
)
EMITTERS["min_value"] = lambda e, op: (
    f"torch.full((), torch.finfo({e.r(op.args['dtype'])}).min, dtype={e.r(op.args['dtype'])}, device=device)"
)


def _cache_write(e: Emitter, op: Op):
    """In place: row `rows[b]`, positions `positions[b] + 0..S-1` (the verifier guarantees the
    old cache value is not read again). The index tensors are made once per step."""
    cache, rows, positions, new = (e.r(op.args[k]) for k in ("cache", "rows", "positions", "new"))
    s = dim_text(op.args["new"].dims[2])
    stmts = []
    key = ("cache_index", rows, positions, s)
    if key not in e.names:
        r, t = e.fresh("row_index"), e.fresh("position_index")
        stmts += [f"{r} = {rows}[:, None]", f"{t} = {positions}[:, None] + torch.arange({s}, device=device)"]
        e.names[key] = (r, t)
    r, t = e.names[key]
    stmts.append(f"{cache}[{r}, :, {t}] = {new}.transpose(1, 2)")
    return stmts, cache


EMITTERS["cache_write"] = _cache_write
EMITTERS["param"] = lambda e, op: f"p[{op.attrs['path']!r}]"
EMITTERS["state"] = lambda e, op: f"p[{op.attrs['path']!r}]"
EMITTERS["const"] = lambda e, op: f"p[{('const:' + e.names[('const', id(op))])!r}]"


# ----------------------------------------------------------------------------- native composites


def _grouped_attention(e: Emitter, op: Op):
    """transformers' eager attention (matmul, scale, mask with the dtype's minimum, softmax,
    matmul) with the query heads of one KV head batched together instead of repeating the
    keys and values (`repeat_kv`): the same dot products, without copying the cache G times.

    Two rewrites that change no value: a power-of-two scale multiplies the queries instead of
    the scores (exact either way); and over a cache of fixed length, prefill (S > 1) drops
    the keys after the last one any query attends, whose weights are exact zeros (a host
    synchronisation, in prefill only: decode steps stay free of them)."""
    q, k, v, mask = (op.args[n] for n in ("q", "k", "v", "mask"))
    b, h, s, d = (dim_text(x) for x in q.dims)
    hkv, t = dim_text(k.dims[1]), dim_text(k.dims[2])
    g = q.dims[1].as_int() // k.dims[1].as_int()
    qn, kn, vn, mn = e.r(q), e.r(k), e.r(v), e.r(mask)
    dtype = TORCH_DTYPES[q.dtype.name]
    scale = op.args["scale"]
    exact_scale = isinstance(scale, float) and scale > 0 and math.frexp(scale)[0] == 0.5
    scores, probs = e.fresh("scores"), e.fresh("probs")
    lines = []
    if k.dims[2].as_int() is not None and q.dims[2].as_int() != 1:
        keys, kt, vt, mt = e.fresh("keys"), e.fresh("k_used"), e.fresh("v_used"), e.fresh("mask_used")
        lines += [
            f"{keys}, {kt}, {vt}, {mt} = {dim_text(k.dims[2])}, {kn}, {vn}, {mn}",
            f"if {s} > 1 and bool({mn}.any()):  # prefill: keys after the last attended one weigh exactly 0",
            f"    {keys} = int({mn}.flatten(0, 1).any(0).nonzero().max()) + 1",
            f"    {kt}, {vt}, {mt} = {kn}[:, :, :{keys}], {vn}[:, :, :{keys}], {mn}[:, :, :{keys}]",
        ]
        t, kn, vn, mn = keys, kt, vt, mt
    qs = f"({qn} * {e.r(scale)})" if exact_scale else qn
    tail = "" if exact_scale else f" * {e.r(scale)}"
    if g == 1:
        lines.append(f"{scores} = ({qs} @ {kn}.transpose(-2, -1)){tail}")
    else:
        lines += [
            f"{scores} = {qs}.reshape({b}, {hkv}, {g} * {s}, {d}) @ {kn}.transpose(-2, -1)  # {g} heads per KV head",
            f"{scores} = {scores}.reshape({b}, {h}, {s}, {t}){tail}",
        ]
    lines.append(f"{scores} = {scores}.masked_fill_(~{mn}.unsqueeze(1), torch.finfo({dtype}).min)")
    if op.args.get("upcast"):
        lines.append(f"{probs} = torch.softmax({scores}, dim=-1, dtype=torch.float32).to({dtype})")
    else:
        lines.append(f"{probs} = torch.softmax({scores}, dim=-1)")
    if g == 1:
        return lines, f"{probs} @ {vn}"
    return lines, f"({probs}.reshape({b}, {hkv}, {g} * {s}, {t}) @ {vn}).reshape({b}, {h}, {s}, {d})"


def _last_dim(v: Value) -> str:
    return dim_text(v.dims[-1])


NATIVE: dict[str, tuple[tuple[str, ...], Callable[[Emitter, Op], str]]] = {
    "softmax": (NUMERICS, lambda e, op: f"torch.softmax({e.r(op.args['x'])}, dim=-1)"),
    "silu": (NUMERICS, lambda e, op: f"F.silu({e.r(op.args['x'])})"),
    "gelu": (NUMERICS, lambda e, op: f"F.gelu({e.r(op.args['x'])})"),
    "layer_norm": (
        NUMERICS,
        lambda e, op: (
            f"F.layer_norm({e.r(op.args['x'])}, ({_last_dim(op.args['x'])},), "
            f"{e.r(op.args['weight'])}, None, {e.r(op.args['eps'])})"
        ),
    ),
    "gelu_tanh": (("fast",), lambda e, op: f'F.gelu({e.r(op.args["x"])}, approximate="tanh")'),
    "rms_norm": (
        ("fast",),
        lambda e, op: (
            f"F.rms_norm({e.r(op.args['x'])}, ({_last_dim(op.args['x'])},), "
            f"{e.r(op.args['weight'])}, {e.r(op.args['eps'])})"
        ),
    ),
    "attention": (NUMERICS[:1], lambda e, op: _grouped_attention(e, op)),
    "attention@fast": (
        ("fast",),
        lambda e, op: (
            f"F.scaled_dot_product_attention({e.r(op.args['q'])}, {e.r(op.args['k'])}, "
            f"{e.r(op.args['v'])}, attn_mask={e.r(op.args['mask'])}.unsqueeze(1), "
            f"scale={e.r(op.args['scale'])}, enable_gqa=True)"
        ),
    ),
}


# ----------------------------------------------------------------------------- whole functions


def function_source(g: Graph, numerics: str = "equivalent", constants: dict | None = None) -> str:
    """The source of one entry as `def NAME(p, inputs...)`. Its folded constants are added to
    `constants` (key -> numpy array; an equal array already there is reused)."""
    e = Emitter(numerics)
    e.dim_names = set(g.dim_vars)
    e.taken |= e.dim_names
    args = [e.bind(v) for v in g.inputs]
    sig = ", ".join(format_tensor_type(v.type) for v in g.inputs)
    outs = ", ".join(format_tensor_type(v.type) for v in g.outputs)
    lines = [f"def {g.name}(p, {', '.join(args)}):", f'    """{sig} -> {outs}"""']
    constants = {} if constants is None else constants
    for op in _all_ops(g):
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
    if "device" in used:
        lines.append(f"    device = {args[0]}.device")
    rets = ", ".join(e.r(v) for v in g.outputs)
    lines += release_dead(body, keep=set(args) | set(re.findall(r"[A-Za-z_]\w*", rets)) | {"p", "device"})
    for path, v in g.state_updates.items():
        if v.producer is None or v.producer.name != "cache_write":
            raise CodegenError(f"state `{path}` is updated by `{v.producer.name}`; only cache_write updates in place")
    lines.append(f"    return {rets}")
    return "\n".join(lines)


_ASSIGNED = re.compile(r"^    ([A-Za-z_]\w*(?:, [A-Za-z_]\w*)*) = ")
_NAME = re.compile(r"(?<![.\w])[A-Za-z_]\w*")
_STRING = re.compile(r"'[^']*'|\"[^\"]*\"")


def release_dead(body: list[str], keep: set[str]) -> list[str]:
    """`del` each local after its last use, so a step holds one layer's intermediates rather
    than every layer's (a straight-line function keeps its locals alive until it returns:
    over 30 layers of a 512-token prefill that is gigabytes). `body` lines are indented four
    spaces; deeper lines belong to the `if` above them."""
    defined: set[str] = set()
    last: dict[str, int] = {}
    block_end: list[int] = []
    end = len(body)
    for i in range(len(body) - 1, -1, -1):
        if not body[i].startswith("        "):
            end = i
        block_end.append(end)
    block_end.reverse()
    for i, line in enumerate(body):
        m = _ASSIGNED.match(line)
        if m and not line.split(" = ", 1)[1].startswith("p["):  # parameters stay alive in `p` anyway
            defined |= set(m.group(1).split(", "))
        code = _STRING.sub("", line.split("  #", 1)[0])
        for name in _NAME.findall(code):
            last[name] = block_end[i]
    out: list[str] = []
    dying: dict[int, list[str]] = {}
    for name in defined - keep:
        dying.setdefault(last[name], []).append(name)
    for i, line in enumerate(body):
        out.append(line)
        if i in dying:
            out.append("    del " + ", ".join(sorted(dying[i], key=lambda n: (len(n), n))))
    return out


def generate(program: Program, numerics: str = "equivalent") -> str:
    """A Python module with one function per entry, each `f(p, *inputs)` where `p` maps
    checkpoint names (and `const:` keys) to tensors. Imports only torch."""
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
        "from `constants(device)`; the KV cache tensors in `p` are updated in place.",
        '"""',
        "",
        "import torch",
        "import torch.nn.functional as F",
        "",
        "",
        "def constants(device):",
        '    """Small folded constants (no weights), made once per load."""',
        "    return {",
    ]
    for k, v in constants.items():
        head.append(f"        {k!r}: torch.tensor({v.tolist()!r}, dtype={TORCH_DTYPES[_np_name(v)]}, device=device),")
    head.append("    }")
    return "\n".join(head + [""] + ["\n" + f + "\n" for f in funcs]).rstrip() + "\n"


Emitter.dtypes = TORCH_DTYPES
Emitter.emitters = EMITTERS
Emitter.native = NATIVE
Emitter.reserved = RESERVED
Emitter.backend = "PyTorch"
Emitter.error = CodegenError
