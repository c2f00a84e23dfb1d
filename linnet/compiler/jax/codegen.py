"""Core IR to JAX source: a model file a person can read, pure and functional.

`generate(program)` writes one class per module class with methods, one function per Linnet
function, the root model's class with the entries as methods (`linnet jax FILE -o model.py`),
and one module-level function per entry, `step(p, input_ids, positions, rows)`, which builds
the model over `p` (a dict of arrays by checkpoint name: parameters, the weights fused at load
by `fuse_weights`, and the state) and runs the entry. An entry that writes state (the KV
cache) returns `(outputs..., {checkpoint name: new value})`: a method writing a cache assigns
the new array where it read the old one (`self.k_cache = write_cache(...)`), and the entry
collects what was assigned (`Module.state`), so the cache is threaded through the call (and
donated by the runtime, so XLA updates it in place). Dropout draws only when the entry's `p` holds a
random key under `DROPOUT_KEY` (the JAX trainer's; the prelude's `dropout`). The helpers the code
calls (the `Module` base class, `write_cache`, dropout) are the real module `prelude.py`: generated
code imports them from it, and a standalone file (`linnet jax`, `standalone=True`) carries their
definitions instead and imports only jax. This file does not import jax: the language server shows
generated code in its own process.

What runs natively is decided by the passes (`PASSES`, `linnet.ir.pipeline`): a composite
runs as a native function when that function is what the reference implementation computes
(`jax.nn.softmax`, `jax.nn.silu`, erf `jax.nn.gelu`), otherwise as its body, in
transformers' op order; linear layers that share an input are one dot over their weights
fused at load, and KV caches are held [max_batch * H, T, D] (`linnet.ir.attention`). Under
`equivalent`, f32 matmuls ask for full f32 precision (`PRECISION = "highest"`: no TF32 or bf16
passes on GPUs/TPUs; on CPU f32 dots are f32 either way, and it measured no slower). A dot of bf16 or
f16 operands asks for nothing (`Emitter.precision`): its products are exact in f32 and every backend
accumulates them in f32 at default precision, as PyTorch's reference does, so `"highest"` adds nothing
there, and a TPU refuses it (Mosaic: "Bad lhs type" for a bf16 dot asked for f32 contraction).

Matrices held in f32 (`f32_matrices`, what `linnet.runtimes.backends.jax_backend` asks for bf16 on the CPU). XLA's CPU
compiler has no bf16 dot: it converts both operands to f32, runs an f32 dot and rounds the result to bf16, and for
a weight it does that conversion on every call (a whole pass over the weights per decode step). With
`f32_matrices`, every bf16 parameter of rank 2 (`held_in_f32`) is given to the code in f32, holding the same bf16
values (rounded to bf16 first, widened exactly once at load), and the code computes what XLA computed before:
a `linear` or `matmul` over such a weight upcasts its bf16 input, dots in f32 and rounds to bf16, a `take` from it
rounds the rows it read (exact), and any other use reads it through `.astype(bf16)` (exact). With XLA's
excess-precision rewrites off (what `equivalent` compiles with: `module.JaxProgram.compiler_options`) the
logits are bit for bit those of bf16 parameters (tests/runtimes/test_jax_f32_matrices.py); with them on (XLA's
default, `fast`) XLA skips some f32 -> bf16 -> f32 round trips, and which ones depends on how the converts were
written, so the two differ in the last bits of some activations. Off, the code is as without it.

Matrices held quantized (`quantized`, what the runtime asks for under `--dtype stored`: a GGUF file's Q8_0 matrices
kept as int8 codes and f16 scales on the device). Every matrix parameter may then be a pair (codes, scales) in place
of an array, which the code sees only when it is traced (one class serves layers held either way): a `linear` over
it is the prelude's `quantized_linear` (the matrix dequantized in x's dtype as the dot's operand, which XLA fuses
into the dot where it can), a `take` of its rows `quantized_take` (the rows' codes and scales, then the rows
dequantized: exact), any other use `dequantize(...)` (the whole matrix). Off, the code is as without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from linnet.errors import CodegenError
from linnet.ir import render
from linnet.ir.attention import held_shape
from linnet.ir.core import Op, Program, Value
from linnet.ir.fusion import fused_key, fused_names, split_fused_key
from linnet.ir.passes import runs_random
from linnet.ir.pipeline import NUMERICS, PassOptions, prepare
from linnet.ir.render import (
    GraphEmitter,
    ModuleWriter,
    Prelude,
    constant_values,
    index_text,
    infix_emitter,
    np_dtype_name,
    python_infix,
    python_reserved,
)
from linnet.ops.rearrange import rearrange_plan
from linnet.types.dims import Dim

from .dims import MIN_CALL, dim_text, dims_text
from .scan import scanned_loops, stacked_lists
from .spatial import EMITTERS as SPATIAL_EMITTERS

JAX_DTYPES = {
    "f64": "jnp.float64",
    "f32": "jnp.float32",
    "f16": "jnp.float16",
    "bf16": "jnp.bfloat16",
    "i64": "jnp.int64",
    "i32": "jnp.int32",
    "bool": "jnp.bool_",
}
RESERVED = python_reserved(
    "jax",
    "jnp",
    "lax",
    "p",
    "self",
    "math",
    "PRECISION",
    "Module",
    "write_cache",
    "write_cache_tokens",
    "fuse_weights",
    "FUSED_WEIGHTS",
    "resize_axis",
    "dropout",
    "DropoutKeys",
    "share_dropout_keys",
    "dropout_keys",
    "DROPOUT_KEY",
    "scan_layers",
    "Stacked",
    "StateSlot",
    "STACKED_LISTS",
    "stack_layers",
    "dequantize",
    "quantized_linear",
    "quantized_take",
)

# The helpers generated code calls (`Module`, `write_cache`, dropout): a real module, which imports jax, so read as
# text here.
PRELUDE = Prelude("linnet.compiler.jax.prelude", Path(__file__).with_name("prelude.py"))

# The name under which an entry's `p` holds the random key of its dropouts (not a checkpoint name): absent, dropout
# is the identity (inference); the JAX trainer passes one per micro-batch.
DROPOUT_KEY = "<dropout key>"

# Registry ops the JAX backend cannot express, with the reason (none at present: the test
# accepts an op that is either lowered or listed here).
UNSUPPORTED: dict[str, str] = {}

# What the passes do for this backend: composites native under these numerics, one dot per
# group of linear layers sharing an input, KV caches held flat, and attention reading them so.
PASSES = PassOptions(
    fuse_linear_weights=True,
    cache_layout="flat",
    native={
        "softmax": NUMERICS,
        "silu": NUMERICS,
        "gelu": NUMERICS,
        "gelu_tanh": ("fast",),
        "attention": NUMERICS,
    },
    attention=("kv_flat",),
)

__all__ = [
    "generate",
    "held_in_f32",
    "state_shape",
    "fused_key",
    "fused_names",
    "split_fused_key",
    "CodegenError",
    "PASSES",
]


def state_shape(shape: tuple[int, ...], cache_layout: str = "flat") -> tuple[int, ...]:
    """The shape the JAX backend holds a state tensor in: a KV cache [max_batch, H, T, D] (rank
    4) as `cache_layout` says ("flat": [max_batch * H, T, D], "token_major": [max_batch, T, H * D];
    `linnet.ir.attention.hold_caches` says why each), other state as declared."""
    return held_shape(tuple(shape), cache_layout) if len(shape) == 4 else tuple(shape)


class Emitter(GraphEmitter):
    """Emits the JAX statements of one graph (tables below; machinery in linnet.ir.render).

    A value held as a flat KV cache ([rows * H, T, D]: the ops the passes marked `layout`
    flat) renders as its declared [rows, H, T, D] (a reshape) for any op; `flat_name` gives the
    array as held, for the ops that work on it directly (cache_write, take, attention)."""

    MIN_CALL = MIN_CALL

    # `f32_matrices` (the module docstring): value id -> the member holding it in f32, for the params held so; None
    # when off. Their generic rendering (`names`) reads them through `.astype(...)`, so any use is correct.
    held: dict[int, str] | None = None
    # the ids of the `loop` ops written as `scan_layers` (`scan.scanned_loops`: their lists may be held stacked)
    scanned: frozenset[int] = frozenset()
    # whether `scan_layers` hands each item its slice of the stacked state (`Stacked.scan`'s `state_per_item`): for
    # KV caches held token-major, the TPU's layout, whose carried stack the chip's compiler re-laid at every layer
    state_per_item: bool = False
    # `quantized` (the module docstring): value id -> the member of each matrix parameter, which may be held as a
    # quantized pair; None when off. Their generic rendering reads them through `dequantize(...)`.
    quantized: dict[int, str] | None = None

    def op_lines(self, op: Op) -> list[str]:
        v = op.result if op.name == "param" else None
        if self.quantized is not None and v is not None and v.rank == 2:
            self.quantized[id(v)] = member = self.member(op.attrs["path"])
            self.names[id(v)] = f"dequantize({member})"
            return []
        if self.held is not None and v is not None and held_in_f32(v.dtype.name, v.rank):
            self.held[id(v)] = member = self.member(op.attrs["path"])
            self.names[id(v)] = f"{member}.astype({self.dtypes[v.dtype.name]})"
            return []
        return super().op_lines(op)

    def f32_operand(self, v: Value) -> str | None:
        """The f32 array holding `v` when it is a matrix held in f32 (`f32_matrices`), else None."""
        return None if self.held is None else self.held.get(id(v))

    def quantized_operand(self, v: Value) -> str | None:
        """The member holding `v` when it is a matrix parameter that may be quantized (`quantized`), else None."""
        return None if self.quantized is None else self.quantized.get(id(v))

    def flat_name(self, v: Value) -> str:
        return super().r(v)

    @staticmethod
    def precision(x: Value, f32: bool = False) -> str:
        """The `precision=` argument of a dot or convolution over `x` (and operands of its dtype): `PRECISION` for
        f32 operands (or `f32`: operands upcast to f32 in the code), nothing for bf16 and f16 ones (the module
        docstring says why)."""
        return ", precision=PRECISION" if f32 or x.dtype.name == "f32" else ""

    def store_state(self, path: str, value: Value) -> str:
        return f"{self.member(path)} = {self.r(value)}"  # what the entry returns as the new state

    def r(self, v) -> str:
        layout = _held_layout(v) if isinstance(v, Value) else None
        if layout == "flat":
            return f"{super().r(v)}.reshape({dims_text(v.dims)})"
        if layout == "token_major":  # [rows, T, H * D] seen as declared, [rows, H, T, D]
            b, h, t, d = v.dims
            return f"jnp.swapaxes({super().r(v)}.reshape({dims_text([b, t, h, d])}), 1, 2)"
        return super().r(v)

    def loop_lines(self, op: Op) -> list[str]:
        """A loop over a list that may be held stacked (`scanned`) as the prelude's `scan_layers` over a function of
        one item and the carried values, `h = scan_layers(self.layers, layer_body, h)` (`linnet.compiler.jax.scan`
        says why); other loops as `for layer in self.layers:`."""
        if id(op) not in self.scanned:
            return super().loop_lines(op)
        body, carried, captured = op.body, op.args["carried"], op.args["captured"]
        items = self.receiver(op.attrs["list"] + ".")
        var = self.fresh(op.attrs["var"])
        fn = self.fresh(f"{op.attrs['var']}_body")
        self.receivers[f"{op.attrs['list']}.{op.attrs['index']}."] = var
        later, also_captured = self._read_after(op), {id(v) for v in captured}
        ins, outs = [], []  # the carried values' names inside the function, and after the scan
        for outer, inner, result in zip(carried, body.inputs, op.results):
            name = self.r(outer)
            reuse = name.isidentifier() and id(outer) not in also_captured
            ins.append(name if reuse else self.fresh(inner.hint or inner.name))
            outs.append(name if reuse and id(outer) not in later else self.fresh(result.hint or result.name))
            self.names[id(inner)] = ins[-1]
        for outer, inner in zip(captured, body.inputs[len(carried) :]):
            self.names[id(inner)] = self.r(outer)  # read from the enclosing method (a closure)
        for i, out_value in enumerate(body.outputs):
            producer = out_value.producer
            n = len(producer.callee.outputs) if producer is not None and producer.callee is not None else 1
            if producer is not None and out_value in producer.results[:n] and n == 1:
                if not self._read_after(producer, body, body.inputs[i]):
                    self.prebound[id(out_value)] = ins[i]  # computed into the carried variable
        inner = self.graph_lines(body)
        returned = ", ".join(self.r(v) for v in body.outputs)
        for result, name in zip(op.results, outs):
            self.names[id(result)] = name
        one = len(carried) == 1
        head = [f"def {fn}({var}, {ins[0] if one else 'carry'}):"] + ([] if one else [f"    {', '.join(ins)} = carry"])
        start = self.r(carried[0]) if one else f"({', '.join(map(self.r, carried))})"
        per_item = ", state_per_item=True" if self.state_per_item else ""
        call = f"{', '.join(outs)} = scan_layers({items}, {fn}, {start}{per_item})" + (
            f"  # {op.origin}" if op.origin else ""
        )
        return [*head, *("    " + line for line in inner), f"    return {returned}", call]

    def is_member(self, text: str) -> bool:
        """Whether `text` is a member of a module (`self.k_cache`), which an assignment updates."""
        return text.startswith(tuple(f"{r}." for r in self.receivers.values())) or text.startswith("getattr(")

    def float_text(self, v: float) -> str:
        if v != v:
            return "jnp.nan"
        if v in (float("inf"), float("-inf")):
            return "jnp.inf" if v > 0 else "-jnp.inf"
        return repr(v)


def held_in_f32(dtype_name: str, rank: int) -> bool:
    """Whether a parameter of this dtype and rank is held in f32 under `f32_matrices` (the module docstring): the
    bf16 matrices. The runtime widens exactly these (`linnet.runtimes.backends.jax_backend`), so both sides use this
    rule."""
    return dtype_name == "bf16" and rank == 2


def _cache_layout(p: Program) -> str:
    """The layout (`linnet.ir.attention.CACHE_LAYOUTS`) `p`'s KV caches are held in: that of their reads."""

    def layouts(ops):
        for op in ops:
            if op.name == "state" and "layout" in op.attrs:
                yield op.attrs["layout"]
            if op.name == "loop":
                yield from layouts(op.body.ops)

    return next((layout for g in p.graphs() for layout in layouts(g.ops)), "flat")


def _held_layout(v: Value) -> str | None:
    return v.producer.attrs.get("layout") if v.producer is not None else None


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


def _dot(e: Emitter, op: Op, form: str, x: Value, w: Value) -> str:
    """`form` (with {x}, {w} and {precision}) over `x` and `w`; over a matrix held in f32 (`f32_matrices`), what
    XLA's CPU compiler does for a bf16 dot: `x` upcast, an f32 dot, the result rounded to the op's dtype."""
    held = e.f32_operand(w)
    if held is None:
        return form.format(x=e.r(x), w=e.r(w), precision=e.precision(x))
    upcast = form.format(x=f"{e.r(x)}.astype(jnp.float32)", w=held, precision=e.precision(x, f32=True))
    return f"{upcast}.astype({e.dtypes[op.result.dtype.name]})"


EMITTERS["matmul"] = lambda e, op: _dot(e, op, "jnp.matmul({x}, {w}{precision})", op.args["x"], op.args["y"])


def _linear(e: Emitter, op: Op) -> str:
    x, w = op.args["x"], op.args["weight"]
    member = e.quantized_operand(w)
    if member is not None:  # the prelude's: dequantized inside the dot when held quantized
        return f"quantized_linear({e.r(x)}, {member}, {'PRECISION' if x.dtype.name == 'f32' else 'None'})"
    return _dot(e, op, 'jnp.einsum("...i,oi->...o", {x}, {w}{precision})', x, w)


EMITTERS["linear"] = _linear
EMITTERS["reshape"] = lambda e, op: f"{e.r(op.args['x'])}.reshape({_shape(op.args['shape'])})"
EMITTERS["transpose"] = lambda e, op: f"jnp.swapaxes({e.r(op.args['x'])}, {op.args['dim0']}, {op.args['dim1']})"
EMITTERS["permute"] = lambda e, op: f"jnp.transpose({e.r(op.args['x'])}, ({_tuple(op.args['dims'])}))"
EMITTERS["unsqueeze"] = lambda e, op: f"jnp.expand_dims({e.r(op.args['x'])}, {op.args['dim']})"
EMITTERS["squeeze"] = lambda e, op: f"jnp.squeeze({e.r(op.args['x'])}, {op.args['dim']})"
EMITTERS["expand"] = lambda e, op: f"jnp.broadcast_to({e.r(op.args['x'])}, ({_tuple(op.args['shape'])}))"
EMITTERS["concat"] = lambda e, op: f"jnp.concatenate({e.r(op.args['xs'])}, axis={op.args['dim']})"
EMITTERS["cast"] = lambda e, op: f"{e.r(op.args['x'])}.astype({e.r(op.args['dtype'])})"


def _dropout(e: Emitter, op: Op) -> str:
    """`dropout(x, p, self.dropout_keys)`, the prelude's helper: the identity unless the entry was
    given a random key (`p[DROPOUT_KEY]`: the JAX trainer's, per micro-batch); p = 0 is the identity."""
    x, p = op.args["x"], op.args["p"]
    if p == 0:
        return e.r(x)
    return f"dropout({e.r(x)}, {e.r(float(p))}, {e.training_flag()})"


EMITTERS["dropout"] = _dropout


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
# lax.top_k's indices are int32 (and equal entries go to the lower index, as torch.topk's)
EMITTERS["top_k"] = lambda e, op: (
    f"(lambda v, i: (v, i.astype(jnp.int64)))(*lax.top_k({e.r(op.args['x'])}, {e.r(op.args['k'])}))"
)
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
    layout = op.attrs.get("layout")
    if layout == "flat":
        # Rows of a cache held as [rows * H, T, D], held the same way: [B * H, T, D].
        b, h, t, d = op.result.dims
        rows = (
            f"jnp.broadcast_to({e.r(x)}, ({_tuple(op.result.dims)}))"  # one cache row: every valid index is 0
            if x.dims[0].as_int() == 1
            else f"jnp.take({e.r(x)}, {e.r(idx)}, axis=0, mode='clip')"
        )
        return f"{rows}.reshape({dims_text([b * h, t, d])})"
    if layout == "token_major":
        # Rows of a cache held as [rows, T, H * D], held the same way: [B, T, H * D].
        b, h, t, d = op.result.dims
        if x.dims[0].as_int() == 1:  # one cache row: every valid index is 0
            return f"jnp.broadcast_to({e.flat_name(x)}, ({_tuple([b, t, h * d])}))"
        return f"jnp.take({e.flat_name(x)}, {e.r(idx)}, axis=0, mode='clip')"
    if (dim == 0 or dim == -x.rank) and x.dims[0].as_int() == 1 and x.producer is not None:
        if x.producer.name in ("state", "cache_write"):
            # One cache row: every valid index is 0, so reading rows is reading the cache (no gather).
            return f"jnp.broadcast_to({e.r(x)}, ({_tuple(op.result.dims)}))"
    # An index out of range reads the nearest row (a gather cannot raise under jit).
    member = e.quantized_operand(x)
    if member is not None and (dim == 0 or dim == -x.rank):  # rows of a table that may be held quantized
        return f"quantized_take({member}, {e.r(idx)}, 0)"
    held = e.f32_operand(x)
    if held is not None:  # rows of a matrix held in f32, rounded back to bf16 (exact: they hold bf16 values)
        return f"jnp.take({held}, {e.r(idx)}, axis={dim}, mode='clip').astype({e.dtypes[x.dtype.name]})"
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
EMITTERS["tensor"] = lambda e, op: f"jnp.array({e.r(op.args['values'])}, dtype={e.r(op.args['dtype'])})"
EMITTERS["zeros"] = lambda e, op: f"jnp.zeros(({_tuple(op.args['shape'])}), dtype={e.r(op.args['dtype'])})"
EMITTERS["ones"] = lambda e, op: f"jnp.ones(({_tuple(op.args['shape'])}), dtype={e.r(op.args['dtype'])})"
EMITTERS["min_value"] = lambda e, op: (
    f"jnp.array(jnp.finfo({e.r(op.args['dtype'])}).min, dtype={e.r(op.args['dtype'])})"
)


def _cache_write(e: Emitter, op: Op):
    """A new cache: row `rows[b]`, positions `positions[b] + 0..S-1` set to `new[b]`. The two
    index arrays broadcast to [B, S] and are split by the head slice, so the indexed block is
    [B, S, H, D] (numpy's rule for separated advanced indices): `new` goes in as [B, S, H, D].
    Positions past the cache are dropped (a padded prefill's tail). A cache held as [rows * H, T,
    D] (`layout` flat) is written by the prelude's `write_cache`, one held as [rows, T, H * D]
    (`layout` token_major) by its `write_cache_tokens`. The new
    cache is assigned where the old one was read (`self.k_cache = ...`), which is how the entry
    returns it."""
    rows, positions, new = (e.r(op.args[k]) for k in ("rows", "positions", "new"))
    layout = op.attrs.get("layout")
    if layout is not None:
        cache = e.flat_name(op.args["cache"])
        helper = "write_cache" if layout == "flat" else "write_cache_tokens"
        expr = f"{helper}({cache}, {rows}, {positions}, {new})"
    else:
        cache = e.r(op.args["cache"])
        s = dim_text(op.args["new"].dims[2])
        expr = (
            f"{cache}.at[{rows}[:, None], :, {positions}[:, None] + lax.iota(jnp.int64, {s})]"
            f".set(jnp.swapaxes({new}, 1, 2), mode='drop')"
        )
    if e.is_member(cache):
        e.names[id(op.result)] = cache
        return [f"{cache} = {expr}"], None
    return expr


EMITTERS["cache_write"] = _cache_write


def _const(e: Emitter, op: Op) -> str:
    value = op.attrs["value"]
    return f"jnp.array({constant_values(e, op)}, dtype={JAX_DTYPES[np_dtype_name(value)]})"


EMITTERS["const"] = _const
EMITTERS.update(SPATIAL_EMITTERS)  # convolutions, pooling, padding, resampling (spatial.py)


# ----------------------------------------------------------------------------- native composites


def _grouped_attention(e: Emitter, op: Op):
    """transformers' eager attention (matmul, scale, mask with the dtype's minimum, softmax,
    matmul) with the query heads of one KV head batched together instead of repeating the
    keys and values (`repeat_kv`): the same dot products, without copying the cache G times.

    With the `kv_flat` variant the keys and values come held as [B * H_kv, T, D] ("flat"): the
    queries are grouped as [B * H_kv, G * S, D] and each product is one dot batched over B * H_kv,
    reading the cache where XLA wrote it; or held as [B, T, H_kv * D] ("token_major"): the queries
    grouped as [B, H_kv, G * S, D], each product one dot batched over B and H_kv."""
    q, k, v, mask = (op.args[n] for n in ("q", "k", "v", "mask"))
    b, h, s, d = (dim_text(x) for x in q.dims)
    hkv, t = dim_text(k.dims[1]), dim_text(k.dims[2])
    g = q.dims[1].as_int() // k.dims[1].as_int()
    dtype = JAX_DTYPES[q.dtype.name]
    scores, probs = e.fresh("scores"), e.fresh("probs")
    scale = e.r(op.args["scale"])
    note = f"  # {g} heads per KV head" if g > 1 else ""
    flat = op.attrs.get("variant", {}).get("kv_flat")
    exact = e.precision(q)
    if flat:  # one dot batched over B * H_kv (held flat) or over B and H_kv (held token-major)
        if flat == "token_major":
            lead, qk, pv = f"{b}, {hkv}", "bksd,btkd->bkst", "bkst,btkd->bksd"
            kn, vn = (f"{e.flat_name(x)}.reshape({b}, {t}, {hkv}, {d})" for x in (k, v))
        else:
            lead, qk, pv = dims_text([q.dims[0] * k.dims[1]]), "ksd,ktd->kst", "kst,ktd->ksd"
            kn, vn = e.flat_name(k), e.flat_name(v)
        qg = e.fresh("q_grouped")
        lines = [
            f"{qg} = {e.r(q)}.reshape({lead}, {g} * {s}, {d}){note}",
            f'{scores} = jnp.einsum("{qk}", {qg}, {kn}{exact}).reshape({b}, {h}, {s}, {t}) * {scale}',
        ]
        grouped = lambda x, n: f"{x}.reshape({lead}, {g} * {s}, {n})"  # noqa: E731
        product = lambda p: f'jnp.einsum("{pv}", {p}, {vn}{exact})'  # noqa: E731
    else:
        kn, vn = e.r(k), e.r(v)
        qg = e.r(q) if g == 1 else f"{e.r(q)}.reshape({b}, {hkv}, {g} * {s}, {d})"
        einsum = f'jnp.einsum("bhsd,bhtd->bhst", {qg}, {kn}{exact})'
        lines = (
            [f"{scores} = {einsum} * {scale}"]
            if g == 1
            else [f"{scores} = {einsum}{note}", f"{scores} = {scores}.reshape({b}, {h}, {s}, {t}) * {scale}"]
        )
        grouped = lambda x, n: x if g == 1 else f"{x}.reshape({b}, {hkv}, {g} * {s}, {n})"  # noqa: E731
        product = lambda p: f"jnp.matmul({p}, {vn}{exact})"  # noqa: E731
    lines.append(f"{scores} = jnp.where(jnp.expand_dims({e.r(mask)}, 1), {scores}, jnp.finfo({dtype}).min)")
    if op.args.get("upcast"):
        lines.append(f"{probs} = jax.nn.softmax({scores}.astype(jnp.float32), axis=-1).astype({dtype})")
    else:
        lines.append(f"{probs} = jax.nn.softmax({scores}, axis=-1)")
    out = product(grouped(probs, t))
    return lines, out if not flat and g == 1 else f"{out}.reshape({b}, {h}, {s}, {d})"


NATIVE: dict[str, Callable[[Emitter, Op], "str | tuple[list[str], str]"]] = {
    "softmax": lambda e, op: f"jax.nn.softmax({e.r(op.args['x'])}, axis=-1)",
    "silu": lambda e, op: f"jax.nn.silu({e.r(op.args['x'])})",
    "gelu": lambda e, op: f"jax.nn.gelu({e.r(op.args['x'])}, approximate=False)",
    "gelu_tanh": lambda e, op: f"jax.nn.gelu({e.r(op.args['x'])}, approximate=True)",
    "attention": _grouped_attention,
}


# ----------------------------------------------------------------------------- the module

# The generated module's fused weights (`Program.param_transforms`), made from the checkpoint's.
FUSE_WEIGHTS = """
# Weights of linear layers that share an input, concatenated along the output dim: the key
# `prefix{a,b}suffix` stands for the checkpoint names prefix + a + suffix, prefix + b + suffix.
FUSED_WEIGHTS = [
    KEYS
]


def fuse_weights(params):
    \"\"\"The parameters the entries take, from `params` by checkpoint name: each group of
    FUSED_WEIGHTS concatenated under its key, in place of its members. Run once, at load.\"\"\"
    out = dict(params)
    for key in FUSED_WEIGHTS:
        prefix, rest = key.split("{")
        middles, suffix = rest.split("}")
        out[key] = jnp.concatenate([out.pop(prefix + m + suffix) for m in middles.split(",")], axis=0)
    return out
""".strip()


# The generated module's stacked lists (`linnet.compiler.jax.scan`), made from the arrays by checkpoint name.
STACK_LAYERS = """
# Lists of identical layers that `scan_layers` runs as one `lax.scan` when held stacked: list path -> items.
STACKED_LISTS = {
    LISTS
}


def stack_layers(arrays):
    \"\"\"`arrays` (by checkpoint name, fused weights by their key) with the members of each list of
    STACKED_LISTS stacked along a new leading axis under `list.*.member`, in place of the items'.
    Run once, at load: a copy of every layer's weights.\"\"\"
    out = dict(arrays)
    for head, count in STACKED_LISTS.items():
        for rest in sorted(k[len(head) + 3 :] for k in arrays if k.startswith(head + ".0.")):
            out[f"{head}.*.{rest}"] = jnp.stack([out.pop(f"{head}.{i}.{rest}") for i in range(count)])
    return out
""".strip()


class JaxModule(ModuleWriter):
    """The JAX module: plain classes over a dict of arrays (the prelude's `Module`), entries as module-level
    functions."""

    emitter = Emitter
    reserved = RESERVED
    prelude = PRELUDE

    def __init__(
        self,
        program: Program,
        numerics: str,
        f32_matrices: bool = False,
        standalone: bool = False,
        quantized: bool = False,
    ):
        self.scanned = frozenset(scanned_loops(program))  # before the writer renders any method
        self.state_per_item = _cache_layout(program) == "token_major"
        super().__init__(program, numerics, standalone)
        self.f32_matrices, self.quantized = f32_matrices, quantized

    def new_emitter(self) -> Emitter:
        e = super().new_emitter()
        e.held = {} if self.f32_matrices else None
        e.scanned, e.state_per_item = self.scanned, self.state_per_item
        e.quantized = {} if self.quantized else None
        return e

    def head(self) -> list[str]:
        p = self.program
        lines = [
            f'"""{p.model} from {p.source}, generated by linnet.',
            "",
            f"Preset {p.preset or '(defaults)'}, working dtype {p.dtype.name}, numerics {self.numerics}, "
            f"max_batch {p.max_batch}, max_positions {p.max_positions}.",
            "Each entry function takes `p`, the parameters and state by checkpoint name, and is pure:",
            "an entry that writes state (the KV cache) returns its outputs and a dict of the new state.",
            "Pass `p = {**fuse_weights(params), **state}`: linear layers that share an input are one dot",
            "over their weights fused (FUSED_WEIGHTS), made once by `fuse_weights`.",
        ]
        if self.f32_matrices:
            lines += [
                "The bf16 matrices are passed in f32 (their bf16 values, widened once): XLA's CPU dots compute",
                "bf16 in f32 and would otherwise convert every weight on every call; dots over them upcast",
                "their input and round the result to bf16, as XLA's bf16 dot does.",
            ]
        if self.scanned:
            lines += [
                "A loop over a list of identical layers runs as `scan_layers`: one `lax.scan` (one layer traced and",
                "compiled) when `p` holds the list stacked (`p = stack_layers({**fuse_weights(params), **state})`,",
                "STACKED_LISTS), else a plain loop.",
            ]
        if self.quantized:
            lines += [
                "A matrix parameter may be held quantized, as a pair (codes i8[N, K], scales f16[N, K / G]): linear",
                "layers and row lookups read it through `quantized_linear` and `quantized_take`, any other use",
                "through `dequantize` (`--dtype stored`).",
            ]
        if p.state_layouts:
            held = "[max_batch * H, T, D]" if _cache_layout(p) == "flat" else "[max_batch, T, H * D]"
            lines += [
                f"KV caches declared [max_batch, H, T, D] are held as {held}, so that XLA",
                "writes them in place (when the caller donates them: `jax.jit(..., donate_argnums=...)`)",
                "and the attention dots read them where they lie.",
            ]
        lines += [
            "Integer inputs are i64: trace and call the entries under `with jax.enable_x64(True):`",
            "(thread-local; Linnet's own runtime does so rather than set `jax_enable_x64` for the process).",
            '"""',
            "",
            "import jax",
            "import jax.numpy as jnp",
            "import jax.scipy.special",
            "from jax import lax",
            *self.prelude_imports(),
            "",
            f"PRECISION = {'highest' if self.numerics == 'equivalent' else None!r}",
        ]
        return lines

    def table(self, name: str, items: dict) -> list[str]:
        if not items:
            return []
        return [f"{name} = (", *[f"    {k!r}," for k in items], ")"]

    def tail(self) -> list[str]:
        p = self.program
        keys = "".join(f"\n    {t.key!r}," for t in p.param_transforms)
        out = ["", "", FUSE_WEIGHTS.replace("[\n    KEYS\n]", f"[{keys}\n]" if keys else "[]")]
        lists = stacked_lists(p)
        if lists:
            rows = "".join(f"\n    {k!r}: {n}," for k, n in lists.items())
            out += ["", "", STACK_LAYERS.replace("{\n    LISTS\n}", f"{{{rows}\n}}")]
        if any(runs_random(g) for g in p.entries.values()):
            out += ["", "", f"DROPOUT_KEY = {DROPOUT_KEY!r}"]
        for name, g in p.entries.items():
            args = [v.name for v in g.inputs]
            writes = bool(g.written_state())
            out += [
                "",
                "",
                f"def {name}(p, {', '.join(args)}):",
                f'    """The entry `{name}` of {p.root} on `p`, the arrays by checkpoint name'
                + (', with the new state."""' if writes else '."""'),
                f"    model = {p.root}(p)",
                *(["    share_dropout_keys(model, DropoutKeys(p.get(DROPOUT_KEY)))"] if runs_random(g) else []),
                f"    out = model.{self.layout.names[name]}({', '.join(args)})",
                "    return (*out, model.state()) if isinstance(out, tuple) else (out, model.state())"
                if writes
                else "    return out",
            ]
        return out


def generate(program: Program, numerics: str = "equivalent", standalone: bool = False) -> str:
    """The model as a JAX module (see the module docstring). It imports the helpers it calls from
    the prelude; `standalone` (`linnet jax`), it carries their definitions and imports only jax.
    Raises CodegenError."""
    if numerics not in NUMERICS:
        raise CodegenError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    return module_source(prepare(program, PASSES, numerics), numerics, standalone=standalone)


def graph_function(g, numerics: str = "equivalent") -> str:
    """A flat graph as a standalone JAX `def NAME(p, inputs...)` (`render.graph_function`); one that runs dropout
    takes `dropout_keys=None` last and comes after the prelude's dropout helpers (their definitions)."""
    text = render.graph_function(Emitter, g, numerics)
    if not runs_random(g):
        return text
    helpers = PRELUDE.definitions(PRELUDE.needed(PRELUDE.used(text)))
    return "\n\n\n".join([*helpers, text])


def module_source(
    program: Program, numerics: str, f32_matrices: bool = False, standalone: bool = False, quantized: bool = False
) -> str:
    """The module text of a program already prepared with `PASSES`; with `f32_matrices`, the bf16 matrices are
    taken in f32 (the module docstring); `standalone`, with the prelude's definitions (`generate`); `quantized`,
    its matrix parameters may be quantized pairs (the module docstring)."""
    return JaxModule(program, numerics, f32_matrices, standalone, quantized).write()


Emitter.dtypes = JAX_DTYPES
Emitter.emitters = EMITTERS
Emitter.native = NATIVE
Emitter.reserved = RESERVED
Emitter.backend = "JAX"
Emitter.uses_device = False
Emitter.training_arg = "dropout_keys"  # the call's random keys (`DropoutKeys`), None in inference
