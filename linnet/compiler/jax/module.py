"""A Core IR program as jitted JAX functions, or as StableHLO through `jax.export`.

`compile_program(program, numerics=...)` executes the generated source (`codegen.generate`)
and returns a `JaxProgram`: per entry, a pure function `(params, state, *inputs)` returning
the outputs and, for an entry that writes state, the new state (`entry_fn`), and its
`jax.jit` with the state donated (`jitted`), so XLA writes the KV cache in place. The
parameters an entry takes are the checkpoint's by name, except the weights of linear layers
that share an input, which it reads concatenated under one key (`codegen.fused_key`, e.g.
`model.layers.0.self_attn.{q,k,v}_proj.weight`), made once at load (`runtimes.jax_backend`).
`export_entry(...)` exports one entry with symbolic batch and sequence dims; `exported_fn`
runs an `Exported` (fresh or deserialized) with the same calling convention.

Parameters and state are arguments, never constants: the folded constants of the IR (a few
small arrays, such as the rotary exponents) are the only values baked into a trace.

Integer inputs and indices are i64, as in the IR: tracing, exporting and calling these functions needs 64-bit types
on, which this module turns on for its own calls only (`x64.scope`, thread-local; never `jax_enable_x64` for the
process): the jitted functions run under `x64.scope()` whoever calls them (`x64.ScopedJit`).
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field, replace
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from linnet.errors import BackendError
from linnet.ir.core import Graph, Program
from linnet.ir.pipeline import prepare

from . import q8_kernel
from .codegen import JAX_DTYPES, NUMERICS, PASSES, held_in_f32, module_source, state_shape
from .dims import dim_text
from .scan import STACKED_INDEX, stacked_key, stacked_lists
from .x64 import ScopedJit, x64_scoped

MODES = ("generated", "stablehlo")


def jax_dtype(name: str):
    return getattr(jnp, JAX_DTYPES[name].split(".")[1])


@dataclass
class JaxProgram:
    """The generated functions of a program (see the module docstring)."""

    program: Program
    numerics: str
    source: str
    namespace: dict = field(repr=False)
    fused: dict[str, list[str]] = field(default_factory=dict)  # fused weight key -> checkpoint names
    f32_matrices: bool = False  # the bf16 matrices are taken in f32 (`codegen`'s docstring; `held_dtype`)
    cache_layout: str = "flat"  # how KV caches are held (`codegen.state_shape`)
    # the lists of layers held stacked (`scan.stacked_lists`: list path -> items), whose loops run as one scan; empty
    # when `quantized` holds any parameter (`compile_program` says why)
    stacked: dict[str, int] = field(default_factory=dict)
    # the parameters held quantized (`--dtype stored`), by the key the entries take them under (a fused key for a
    # fused group) -> values per scale: each a pair (codes i8[N, K], scales f16[N, K / group]) (`codegen`'s docstring)
    quantized: dict[str, int] = field(default_factory=dict)

    def held_dtype(self, dtype_name: str, rank: int) -> str:
        """The dtype (a Linnet name) the code takes a parameter of `dtype_name` and `rank` in: f32 for the matrices
        held in f32 (`f32_matrices`, `codegen.held_in_f32`), its own otherwise."""
        return "f32" if self.f32_matrices and held_in_f32(dtype_name, rank) else dtype_name

    def stateful(self, name: str) -> bool:
        return bool(self.program.entries[name].written_state())

    def entry_fn(self, name: str) -> Callable:
        """`f(params, state, *inputs)`: outputs (a value or a tuple), and for an entry that writes
        state `(outputs, new_state)`. The new state has every state tensor (unwritten ones passed
        through), so it can replace the old dict."""
        if name not in self.program.entries:
            raise KeyError(f"no entry `{name}` (entries: {', '.join(self.program.entries)})")
        fn = self.namespace[name]
        stateful = self.stateful(name)

        def run(params, state, *inputs):
            out = fn({**params, **state}, *inputs)
            if not stateful:
                return out
            *outs, new = out
            outs = outs[0] if len(outs) == 1 else tuple(outs)
            return outs, {k: new.get(k, v) for k, v in state.items()}

        run.__name__ = name
        return run

    @property
    def compiler_options(self) -> dict[str, bool] | None:
        """The XLA options every entry compiles with. Under `equivalent` a bf16 or f16 program rounds where the
        reference rounds: XLA's `xla_allow_excess_precision` (on by default) drops f32 -> bf16 -> f32 round trips
        it finds, keeping precision the reference does not have, and which ones it finds depends on how the
        converts are written (SmolLM2 bf16 against transformers bf16 on 64 tokens: max |d| 2.78 with it on, 1.0
        with it off, with the matrices held in f32). f32 programs and `fast` keep XLA's default."""
        if self.numerics == "equivalent" and self.program.dtype.name != "f32":
            return {"xla_allow_excess_precision": False}
        return None

    def jitted(self, name: str) -> Callable:
        """The entry under `jax.jit` with `compiler_options`, the state (argument 1) donated when the entry writes
        it, called and lowered under `x64.scope()` (`ScopedJit`)."""
        jitted = jax.jit(
            self.entry_fn(name),
            donate_argnums=(1,) if self.stateful(name) else (),
            compiler_options=self.compiler_options,
        )
        return ScopedJit(jitted)


@x64_scoped  # anything the generated module makes as it is executed is made in the IR's dtypes
def compile_program(
    program: Program,
    numerics: str = "equivalent",
    fuse_linear_weights: bool = True,
    f32_matrices: bool = False,
    cache_layout: str = "flat",
    scan_layers: bool = False,
    quantized: dict[str, int] | None = None,
) -> JaxProgram:
    """The program's generated JAX, executed (nothing is traced or compiled yet). With
    `fuse_linear_weights=False` every parameter keeps its checkpoint name (no fused keys, one dot
    per linear layer): what sharding by checkpoint name and gradients by checkpoint name want. With
    `f32_matrices`, the code takes the bf16 matrices in f32 (`JaxProgram.held_dtype`; the codegen docstring says
    why: XLA's CPU dots). `cache_layout`: how KV caches are held, "flat" or "token_major"
    (`linnet.ir.attention.hold_caches` says which suits which device). With `scan_layers`, the parameters and state
    of each list of identical layers its loops can scan (`scan.stacked_lists`) are taken stacked, `list.*.member`
    [items, ...] (`stacked`, `param_specs`; the runtime stacks them once at load), so that each such loop is one
    `lax.scan`: one layer traced and compiled instead of every layer. `quantized`: the parameters (by checkpoint
    name) held quantized, each -> its values per scale (`--dtype stored`; `JaxProgram.quantized`). In a stacked list a
    quantized pair's codes and scales are each stacked (a pytree: `lax.scan` gives each layer its own pair). Raises
    BackendError for unknown numerics and for a fused group whose members are not all quantized alike."""
    if numerics not in NUMERICS:
        raise BackendError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    passes = replace(PASSES, fuse_linear_weights=fuse_linear_weights, cache_layout=cache_layout)
    prepared = prepare(program, passes, numerics)
    fused = {t.key: list(t.sources) for t in prepared.param_transforms}
    held_quantized = _quantized_keys(quantized, fused) if quantized else {}
    source = module_source(prepared, numerics, f32_matrices, quantized=bool(quantized))
    filename = f"<linnet generated jax: {program.source}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show it
    namespace: dict = {"__name__": "linnet_generated_jax"}
    exec(compile(source, filename, "exec"), namespace)
    return JaxProgram(
        program,
        numerics,
        source,
        namespace,
        fused=fused,
        f32_matrices=f32_matrices,
        cache_layout=cache_layout,
        stacked=stacked_lists(prepared) if scan_layers else {},
        quantized=held_quantized,
    )


def _quantized_keys(quantized: dict[str, int], fused: dict[str, list[str]]) -> dict[str, int]:
    """`quantized` (checkpoint name -> values per scale) by the keys the entries take: a fused group's key when all
    its members are quantized with one group size (their codes and scales are concatenated at load). Raises
    BackendError naming the members of a group held some quantized and some not (or in different groups)."""
    out = dict(quantized)
    for key, names in fused.items():
        groups = {quantized.get(n) for n in names}
        if groups == {None}:
            continue
        if len(groups) > 1:
            held = {n: f"groups of {quantized[n]}" if n in quantized else "not quantized" for n in names}
            kinds = ", ".join(f"`{n}` ({how})" for n, how in held.items())
            raise BackendError(
                f"--dtype stored on JAX fuses {kinds} into one matrix, so they must be quantized alike; "
                "use --dtype f32 (dequantized)"
            )
        for n in names:
            del out[n]
        out[key] = groups.pop()
    return out


# ----------------------------------------------------------------------------- StableHLO


def fused_member_shapes(program: Program, fused: dict[str, list[str]]) -> dict[str, dict[str, list[int]]]:
    """Each fused weight's members and their shapes, by checkpoint name (what an artifact's JSON
    records, so that `load_exported` can check each member, not only their concatenation)."""
    shapes = {t.path: list(t.shape) for t in program.params}
    return {key: {n: shapes[n] for n in names} for key, names in fused.items()}


def param_specs(
    program: Program,
    fused: dict[str, list[str]] | None = None,
    held_dtype: Callable[[str, int], str] | None = None,
    cache_layout: str = "flat",
    stacked: dict[str, int] | None = None,
    quantized: dict[str, int] | None = None,
    kernel_layout: bool = False,
) -> tuple[dict, dict]:
    """ShapeDtypeStructs of the parameters (by checkpoint name, and the `fused` groups by their
    key in place of their members) and of the state, in the shape the backend holds it
    (`codegen.state_shape` under `cache_layout`); each parameter in `held_dtype(dtype, rank)` when given
    (`JaxProgram.held_dtype`); a `quantized` one (key -> values per scale) as its pair (i8[N, K],
    f16[N, K / group]), or with `kernel_layout` as a TPU holds it for its kernel (`q8_kernel.held_spec`). The
    members of the `stacked` lists (`JaxProgram.stacked`) are one spec each, `list.*.member` [items, ...]
    (`scan.stacked_key`), in place of the items' (a quantized pair's: each of its specs)."""
    held = held_dtype or (lambda name, rank: name)
    params = {
        t.path: jax.ShapeDtypeStruct(t.shape, jax_dtype(held(t.type.dtype.name, len(t.shape)))) for t in program.params
    }
    for key, names in (fused or {}).items():
        parts = [params.pop(n) for n in names]
        params[key] = jax.ShapeDtypeStruct((sum(a.shape[0] for a in parts), *parts[0].shape[1:]), parts[0].dtype)
    for key, group in (quantized or {}).items():
        n, k = params[key].shape
        pair = (jax.ShapeDtypeStruct((n, k), jnp.int8), jax.ShapeDtypeStruct((n, k // group), jnp.float16))
        params[key] = q8_kernel.held_spec(n, k, group) if kernel_layout else pair
    state = {
        t.path: jax.ShapeDtypeStruct(state_shape(t.shape, cache_layout), jax_dtype(t.type.dtype.name))
        for t in program.state
    }
    return _stacked_specs(params, stacked or {}), _stacked_specs(state, stacked or {})


def _stacked_specs(specs: dict, stacked: dict[str, int]) -> dict:
    """`specs` with the items' specs of each stacked list replaced by one [items, ...] spec per member, in order."""
    out: dict = {}
    for path, spec in specs.items():
        found = stacked_key(path, stacked)
        if found is None:
            out[path] = spec
        elif found[0] not in out:
            count = stacked[found[0].split(f".{STACKED_INDEX}.")[0]]
            out[found[0]] = jax.tree.map(lambda s, n=count: jax.ShapeDtypeStruct((n, *s.shape), s.dtype), spec)
    return out


def input_specs(graph: Graph, max_positions: int | None = None) -> list:
    """ShapeDtypeStructs of an entry's inputs, with its dims (`B`, `S`) symbolic. With `max_positions` (an entry
    that writes a KV cache), each dim that leads no input (`S`, not `B`) is constrained to at most that many: a step
    never writes more positions than the cache holds, and the prelude's `write_cache` updates a row's block of S
    positions in place, which JAX allows only once S is known to fit."""
    leading = {dim_text(v.dims[0]) for v in graph.inputs if v.dims}
    bounded = [d for d in graph.dim_vars if d not in leading] if max_positions else []
    scope = jax.export.SymbolicScope([f"{d} <= {max_positions}" for d in bounded])
    specs = []
    for v in graph.inputs:
        text = ", ".join(dim_text(d) for d in v.dims)
        shape = jax.export.symbolic_shape(text, scope=scope) if graph.dim_vars else tuple(d.as_int() for d in v.dims)
        specs.append(jax.ShapeDtypeStruct(shape, jax_dtype(v.dtype.name)))
    return specs


@x64_scoped
def export_entry(compiled: JaxProgram, name: str, platforms: list[str] | None = None):
    """Entry `name` as a `jax.export.Exported`: arguments `(params, state, *inputs)` (params
    and state as dicts by checkpoint name), batch and sequence dims symbolic. The weights are
    arguments; nothing but the small folded constants is in the artifact."""
    graph = compiled.program.entries[name]
    params, state = param_specs(
        compiled.program,
        compiled.fused,
        compiled.held_dtype,
        compiled.cache_layout,
        stacked=compiled.stacked,
        quantized=compiled.quantized,
        kernel_layout=bool(platforms) and all(q8_kernel.uses_kernel(p) for p in platforms),
    )
    state = state if compiled.stateful(name) else {}  # an entry that writes no state takes none
    fn = compiled.jitted(name).jitted  # the jax.jit itself, which jax.export takes (this function is scoped)
    inputs = input_specs(graph, compiled.program.max_positions if state else None)
    return jax.export.export(fn, platforms=platforms)(params, state, *inputs)


def exported_fn(exported, stateful: bool, compiler_options: dict | None = None) -> Callable:
    """A jitted `f(params, state, *inputs)` running `exported` (the state donated when the entry
    writes it), compiled with `compiler_options` (`JaxProgram.compiler_options`; XLA's defaults when None). Each
    new input shape is a new specialisation of the artifact (one compile). Called and lowered under `x64.scope()`
    (`ScopedJit`)."""
    return ScopedJit(jax.jit(exported.call, donate_argnums=(1,) if stateful else (), compiler_options=compiler_options))


def exported_signature(exported) -> tuple[dict, dict, list]:
    """(params, state, inputs) of an exported entry, as ShapeDtypeStructs (params by checkpoint
    name or fused key, state by checkpoint name), read from the artifact alone."""
    args, _ = jax.tree_util.tree_unflatten(exported.in_tree, list(exported.in_avals))
    params, state, *inputs = args
    return params, state, inputs


def zeros_like_specs(specs: dict, device=None) -> dict:
    out = {}
    for k, s in specs.items():
        out[k] = jax.device_put(np.zeros(s.shape, dtype=s.dtype), device)
    return out
