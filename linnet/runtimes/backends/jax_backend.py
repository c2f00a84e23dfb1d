"""`linnet.jax.load`: a source and its weights as jitted JAX (`mode="generated"`) or as the
exported StableHLO artifact (`mode="stablehlo"`, `--backend xla`); `load_exported`: a
serialized artifact run without its `.linnet` source.

Parameters are a dict by checkpoint name of device arrays (the checkpoint's numpy arrays, cast
to the working dtype and put on the device once), passed as arguments: nothing is baked into
the compiled code. Loading, running and generating import neither torch nor transformers. The weights
of linear layers that share an input are held concatenated under one key instead
(`model.layers.0.self_attn.{q,k,v}_proj.weight`; `linnet.compiler.jax.codegen.fused_key`), so
each group is one dot. The KV
cache is a second dict, threaded through `step` and donated, so XLA updates it in place.

Prefill and padding. `step` returns the logits of each entry's *last* token, so a prompt
padded on the right would give the logits of a padding token. `JaxStepModel` therefore
prefills a prompt of P tokens as: the first P - 1 tokens, padded on the right to a length
bucket (16, 32, 64, ... up to `max_positions`), then the last token as one decode step
(S = 1), whose logits are the answer. This is exact: the padding sits at positions after
the real tokens, which causal attention hides from them; its cache entries (at positions
P - 1 and later; past the cache they are dropped) are overwritten before they are read,
since a step writes position p before it attends to positions <= p (the runner's
contract). So each bucket compiles once, decode compiles once per batch size, and the cost
is one decode step per prompt. A prompt whose length is itself a bucket (512 tokens) needs no
padding: it runs as one step of its own length, whose last token is the prompt's (that shape is
the bucket the padded path compiles for it anyway, so nothing more is compiled).

bf16 on the CPU. XLA's CPU compiler has no bf16 dot: it converts both operands to f32, dots in
f32 and rounds the result, converting every weight again on every call (181 converts a step for
SmolLM2, which made bf16 decode slower than f32). So a bf16 model loaded on the CPU for inference
(fused weights) holds its matrices in f32, rounded to bf16 first and widened once at load, and the
generated code dots over them as XLA's bf16 dot did (`linnet.compiler.jax.codegen`,
`f32_matrices`): the same arithmetic (bit for bit with XLA's excess-precision rewrites off, as
`equivalent` compiles: `JaxProgram.compiler_options`; tests/runtimes/test_jax_f32_matrices.py),
for twice the matrices' memory (what f32 holds).

64-bit types. The generated code's integers are i64, as the IR's; loading, putting inputs on the device and running
steps happen under `jax.enable_x64(True)` for that call and thread only (`linnet.compiler.jax.x64`), so JAX's
process-wide `jax_enable_x64` stays what the caller set (docs/backends.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from linnet.compiler.jax.x64 import x64_scoped
from linnet.errors import BackendError, LoadError
from linnet.runtimes.backends import backend_for
from linnet.runtimes.formats.checkpoints import cast_floating
from linnet.runtimes.formats.gguf_quants import GroupQuantized
from linnet.runtimes.loading import LoadOptions
from linnet.runtimes.model import ModelBase, step_entry

from .jax_loop import greedy_tokens
from .jax_quantized import concat_pairs, held_pair, stored_matrices

if TYPE_CHECKING:
    from linnet.runtimes.loading import Prepared

BACKEND_MODES = {"jax": "generated", "xla": "stablehlo"}
MIN_BUCKET = 16


def jax_module():
    """The `jax` module, imported on first use (loading Linnet never imports JAX). Its config is left as it is: the
    functions that need 64-bit types (the generated code's i64) run under `x64_scoped`."""
    import jax

    return jax


def _device(device: str):
    jax = jax_module()
    platform = {"cuda": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu"}.get(device.split(":")[0])
    if platform is None:
        raise BackendError(f"device must be cpu, cuda (gpu) or tpu, got {device!r}")
    try:
        devices = jax.devices(platform)
    except RuntimeError as err:
        raise BackendError(f"device {device!r}: JAX has no {platform} backend here ({err})") from None
    index = device.split(":")[1] if ":" in device else "0"
    if not index.isdigit() or int(index) >= len(devices):
        raise BackendError(f"device {device!r}: JAX has {len(devices)} {platform} device(s) here, numbered from 0")
    return devices[int(index)]


def setup_process(backend: Any, instances: int | None = None) -> str:
    """Nothing to set for this process (`Backend.setup_process`): XLA sizes its own thread pools."""
    return ""


def device_problem(device: str) -> str | None:
    """Why JAX cannot use `device` here, or None."""
    try:
        _device(device)
    except (BackendError, IndexError, ValueError) as err:
        return str(err) or f"no device {device!r}"
    return None


def buckets(max_positions: int) -> list[int]:
    """Prefill lengths: powers of two from MIN_BUCKET, and max_positions itself."""
    out, n = [], MIN_BUCKET
    while n < max_positions:
        out.append(n)
        n *= 2
    return out + [max_positions]


def bucket_for(length: int, max_positions: int) -> int:
    for b in buckets(max_positions):
        if b >= length:
            return b
    return length


@dataclass
class JaxModel(ModelBase):
    """A loaded model (`LoadedModel`): `run(entry, *arrays)` and the entries as attributes
    (`model.forward(ids)`) take and return numpy; `native` takes numpy or JAX arrays and returns
    JAX arrays (`model.native.forward(ids)`, nothing copied to the host). An entry with a KV
    cache updates `state` (donated). `params` and `state` are dicts of device arrays by
    checkpoint name (fused weights by their fused key; KV caches in the shape the backend holds
    them, [max_batch * H, T, D], `codegen.state_shape`). `step_model()` adapts `step` to the
    generation runner. `load_s`: checking, lowering, exporting and binding weights (compiles
    happen on first call, per shape)."""

    compile_kind = "compile"  # what the first call of an entry does (`caches.watch`)

    mode: str
    params: dict
    state: dict
    functions: dict[str, Callable]  # name -> jitted f(params, state, *inputs)
    stateful: dict[str, bool]
    max_batch: int
    max_positions: int
    vocab_size: int | None
    prepared: Prepared | None = None
    source: str | None = None  # the generated JAX (mode "generated")
    exported: dict = field(default_factory=dict)  # name -> jax.export.Exported (mode "stablehlo")
    device: Any = None
    load_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    backend: str = "jax"
    numerics: str = "equivalent"
    cache_layout: str = "flat"  # how the generated code holds KV caches (`cache_layout_for`)
    # whether a block write to a row past the cache is dropped (the prelude's `_block_fits`, since 2026-12-06): an
    # artifact exported before clamps it onto the last row, so its prefill steps are never padded with such rows
    drops_padded_rows: bool = True
    # the `step` compiled ahead of time per input_ids shape [B, S] (`JaxStepModel`), shared by its step models
    step_executables: dict = field(default_factory=dict, repr=False)
    # where inputs go: None for `device` alone; a `jax.sharding.Sharding` (replicated over a mesh) once the
    # parameters are sharded (`linnet.runtimes.parallel.jax_mesh`)
    input_sharding: Any = None
    compiler_options: dict | None = None  # the XLA options its entries compile with (`JaxProgram.compiler_options`)
    offload: Any = None  # the `jax_offload.OffloadPlan` when layers are held in host memory (`cpu_offload_gb`)

    @x64_scoped  # an i64 input stays i64
    def put_input(self, a):
        """A numpy input on the model's device (or replicated over its mesh)."""
        return jax_module().device_put(np.asarray(a), self.input_sharding or self.device)

    @property
    def entries(self) -> tuple[str, ...]:
        return tuple(self.__dict__.get("functions") or ())

    def _native_entry(self, name: str) -> Callable:
        self.graph(name)
        fn = self.functions[name]

        @x64_scoped
        def call(*inputs):
            inputs = [self.put_input(x) if isinstance(x, np.ndarray) else x for x in inputs]
            if not self.stateful[name]:
                return fn(self.params, {}, *inputs)
            out, self.state = fn(self.params, self.state, *inputs)
            return out

        call.__name__ = name
        return call

    def _run_arrays(self, entry: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = self._native_entry(entry)(*arrays)
        return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]

    @x64_scoped
    def reset_state(self) -> None:
        """Zero the KV cache (not needed between requests: a step only reads what it wrote)."""
        jax = jax_module()
        self.state = {k: jax.device_put(np.zeros(v.shape, v.dtype), v.sharding) for k, v in self.state.items()}

    def step_model(self, decode_loop: bool | None = None, batch_buckets: bool | None = None) -> "JaxStepModel":
        """The runner's `StepModel` (`JaxStepModel`); `decode_loop` and `batch_buckets` as it takes them."""
        return JaxStepModel(self, decode_loop, batch_buckets)


class JaxStepModel:
    """The runner's `StepModel` over a JAX `step`: numpy in, numpy f32 logits out; prefill
    padded to length buckets (see the module docstring), decode (S = 1) compiled once per
    batch size. Each input shape is compiled ahead of time (`jit(...).lower(...).compile()`)
    and kept, so `warm_up` compiles the shapes a generation will use before it starts, and
    the steps themselves never compile.

    `decode_loop`: whether greedy generation runs its decode steps many per dispatch on the device
    (`decode_greedy`, `jax_loop.GreedyLoop`); None (the default) means on an accelerator, not on the CPU, where a
    host round trip costs little and the loop would be one more compile. Never over a mesh (sharded inputs).

    `batch_buckets`: whether a decode step of B rows runs as the next power of two (`decode_batch`), the rows added
    pointing past the cache (their writes dropped, their logits discarded), so that serving compiles log2(max_batch)
    decode steps instead of max_batch (a few seconds each on a TPU). None (the default) means on an accelerator: on
    the CPU a row's logits may depend on the batch's size (XLA picks its dot kernels by shape), and serving there
    promises each request the tokens `linnet generate` gives it alone."""

    compile_kind = "compile"

    def __init__(self, model: JaxModel, decode_loop: bool | None = None, batch_buckets: bool | None = None):
        if "step" not in model.functions:
            raise ValueError("generation needs a decoder with `entry fn step`")
        self.model = model
        self.max_batch = model.max_batch
        self.max_positions = model.max_positions
        self.vocab_size = model.vocab_size
        self._jax = jax_module()
        self._compiled: dict[tuple[int, int], Callable] = model.step_executables
        accelerator = getattr(model.device, "platform", "cpu") != "cpu"
        decode_loop = accelerator if decode_loop is None else decode_loop
        self.batch_buckets = accelerator if batch_buckets is None else batch_buckets
        self._greedy = self._jax.jit(greedy_tokens)
        self._loop = self._steps = None
        self._prefill_batches: dict[int, int] = {}  # chunk length -> the most chunks a step takes (warmed up)
        if decode_loop and model.input_sharding is None and model.offload is None:
            from .jax_loop import BatchSteps, GreedyLoop

            jitted = model.functions[step_entry(model.functions, 1)]
            # the function under the entry's `jax.jit` (its `__wrapped__`): XLA options go on the loop's own jit
            self._loop = GreedyLoop(model, jitted.__wrapped__, model.compiler_options)
            self._steps = BatchSteps(model, jitted.__wrapped__, model.compiler_options)

    @property
    def decode_greedy(self):
        """The `generation.DecodeLoop` entry (a `jax_loop.GreedyLoop`) when this step model runs decode loops on
        the device, else None (the runner then steps token by token)."""
        return self._loop

    @property
    def max_greedy_steps(self) -> int:
        """`generation.GreedySteps`: the most decode steps of a batch `step_greedy_steps` runs in one dispatch (0:
        one step a dispatch, where decode loops are off)."""
        return 0 if self._steps is None else self._steps.chunk

    @property
    def compiled_shapes(self) -> list[tuple[int, int]]:
        """The `input_ids` shapes ([B, S]) compiled so far, in order."""
        return sorted(self._compiled)

    @x64_scoped
    def _executable(self, shape: tuple[int, int]) -> Callable:
        """The step compiled for `input_ids` of `shape` ([B, S]; `positions` and `rows` [B]), compiled on first
        use. The compile goes through JAX's persistent cache when one is set (`caches.enable`)."""
        exe = self._compiled.get(shape)
        if exe is None:
            jax, m = self._jax, self.model
            sharding = m.input_sharding or jax.sharding.SingleDeviceSharding(m.device)
            ids = jax.ShapeDtypeStruct(shape, np.int64, sharding=sharding)
            vec = jax.ShapeDtypeStruct(shape[:1], np.int64, sharding=sharding)
            fn = m.functions[step_entry(m.functions, shape[1])]  # one token a row: a decoder's `decode` if it has one
            exe = self._compiled[shape] = fn.lower(m.params, m.state, ids, vec, vec).compile()
        return exe

    @x64_scoped
    def warm_up(self, prefill_lengths: list[int], batch_sizes: list[int]) -> None:
        """Compile now the shapes that prefilling steps of `prefill_lengths` tokens (one entry each) and decoding
        `batch_sizes` rows at once will run (each prefill's padded bucket, the decode step per batch size), and run
        each once on zeros in rows 0..B-1 from position 0: XLA's first execution of a program pays a one-time setup
        (about 0.4 s for SmolLM2's prefill on CPU) that would otherwise land in the first token's time. The cache
        entries written are overwritten before they are read (the runner's contract)."""
        shapes = {(self.decode_batch(b), 1) for b in batch_sizes} | {(1, 1)}
        shapes |= {(1, bucket_for(n - 1, self.max_positions)) for n in prefill_lengths if n > 1}
        for b, s in sorted(shapes):
            self._executable((b, s))
        if self._loop is not None:
            self._loop.warm_up()
        for b, s in sorted(shapes):
            zeros = np.zeros(b, dtype=np.int64)
            logits = self._call(np.zeros((b, s), dtype=np.int64), zeros, np.arange(b, dtype=np.int64))
            np.asarray(self._greedy(logits)[0] if s == 1 else logits)
        if self._steps is not None:
            for b in sorted({self.decode_batch(b) for b in batch_sizes}):
                self._steps.warm_up(b)

    def warm_up_prefill(self, length: int, counts: list[int]) -> None:
        """`generation.PrefillBatches`: compile (and run once on zeros in rows 0..k-1) the steps that prefill k
        chunks of `length` tokens at once for each k of `counts` (as `decode_batch` rounds them); afterwards
        `prefill_batch(length)` is the largest. Only with batch buckets (an accelerator): on the CPU a row's logits
        may depend on the batch's size, and serving there promises each request the tokens it gets alone."""
        if not self.batch_buckets or length < 2 or not self.model.drops_padded_rows:
            return  # (an artifact exported before padded rows were dropped: `JaxModel.drops_padded_rows`)
        for k in sorted({self.decode_batch(k) for k in counts if k > 1}):
            zeros = np.zeros(k, dtype=np.int64)
            np.asarray(self.step(np.zeros((k, length), dtype=np.int64), zeros, np.arange(k, dtype=np.int64)))
            self._prefill_batches[length] = max(k, self._prefill_batches.get(length, 1))

    def prefill_batch(self, length: int) -> int:
        """`generation.PrefillBatches`: the most prefill chunks of `length` tokens one step takes (1 unless
        `warm_up_prefill` compiled more)."""
        return self._prefill_batches.get(length, 1)

    def decode_batch(self, b: int) -> int:
        """The rows a decode step of `b` rows runs: `b`, or with `batch_buckets` the next power of two (at most
        `max_batch`)."""
        if not self.batch_buckets:
            return b
        bucket = 1
        while bucket < b:
            bucket *= 2
        return min(bucket, self.max_batch)

    def _pad_rows(
        self, ids: np.ndarray, positions: np.ndarray, rows: np.ndarray, runs: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`ids` [B, S], `positions` and `rows` [B] with `runs - B` rows added past the cache (row `max_batch`,
        token 0 at position 0): a step's writes there are dropped, its reads clamped, its logits cut by the caller."""
        b, s = ids.shape
        if runs <= b:
            return ids, positions, rows
        return (
            np.concatenate([ids, np.zeros((runs - b, s), np.int64)]),
            np.concatenate([positions, np.zeros(runs - b, np.int64)]),
            np.concatenate([rows, np.full(runs - b, self.max_batch, np.int64)]),
        )

    @x64_scoped
    def _call(self, ids: np.ndarray, positions: np.ndarray, rows: np.ndarray):
        m = self.model
        b, s = ids.shape
        runs = self.decode_batch(b) if s == 1 or (b > 1 and self.model.drops_padded_rows) else b
        ids, positions, rows = self._pad_rows(ids, positions, rows, runs)
        put = lambda a: m.put_input(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
        logits, m.state = self._executable(ids.shape)(m.params, m.state, put(ids), put(positions), put(rows))
        return logits  # [runs, V], on the device: the caller keeps the first b rows on the host (a slice on the
        # device would compile once per b, which batch buckets are there to avoid)

    @x64_scoped
    def step_greedy(
        self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """`generation.GreedyStep`: a decode step (S = 1) whose argmax and non-finite counts are taken on the
        device, so only i64 `[B]` tokens and `[B, 2]` NaN and Inf counts come back, not f32 `[B, V]` logits (a
        longer step takes `step`'s logits and does the same on the host)."""
        input_ids = np.asarray(input_ids, dtype=np.int64)
        if input_ids.shape[1] != 1:
            logits = self.step(input_ids, positions, rows)
            return np.argmax(logits, axis=-1), np.stack([np.isnan(logits).sum(-1), np.isinf(logits).sum(-1)], -1)
        b = input_ids.shape[0]
        tokens, bad = self._greedy(self._call(input_ids, np.asarray(positions, dtype=np.int64), rows))
        return np.asarray(tokens)[:b], np.asarray(bad)[:b]

    def step_greedy_steps(
        self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray, steps: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`generation.GreedySteps`: `steps` (1..`max_greedy_steps`) greedy decode steps of the `[B, 1]` `input_ids` in
        one dispatch (`jax_loop.BatchSteps`), each row fed its own argmax. Returns i64 `[B, steps]` tokens and
        `[B, steps, 2]` NaN and Inf counts. Raises RuntimeError where decode loops are off (`max_greedy_steps` 0)."""
        if self._steps is None:
            raise RuntimeError("this step model runs one decode step a dispatch (max_greedy_steps is 0)")
        ids = np.asarray(input_ids, dtype=np.int64)
        positions, rows = np.asarray(positions, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        b = ids.shape[0]
        tokens, bad = self._steps(*self._pad_rows(ids, positions, rows, self.decode_batch(b)), steps)
        return tokens[:b], bad[:b]

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        input_ids = np.asarray(input_ids, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        b, s = input_ids.shape
        if s > 1 and bucket_for(s, self.max_positions) == s:  # no padding: the last token is the prompt's own
            return np.asarray(self._call(input_ids, positions, rows), dtype=np.float32)[:b]
        if s > 1:
            head = input_ids[:, :-1]
            width = bucket_for(s - 1, self.max_positions)
            padded = np.zeros((b, width), dtype=np.int64)
            padded[:, : s - 1] = head
            self._call(padded, positions, rows)  # logits discarded: they are the padding's
        logits = self._call(input_ids[:, -1:], positions + (s - 1), rows)
        return np.asarray(logits, dtype=np.float32)[:b]


@x64_scoped
def load(
    source: str | Path,
    weights: str | Path | None = None,
    options: LoadOptions = LoadOptions(),
    mode: str = "generated",
    fuse_linear_weights: bool = True,
    scan_layers: bool | None = None,
    cpu_offload_gb: float | None = None,
) -> JaxModel:
    """Load `source` with `weights` for JAX in `mode` ("generated": the generated JAX under
    jax.jit; "stablehlo": each entry exported through jax.export, symbolic batch and sequence
    dims, and run from the artifact) under `options`. Without weights and with `options.random_weights`,
    parameters are drawn from N(0, 0.02) (norm scales 1, biases 0) with `options.seed`. With
    `fuse_linear_weights=False`, `params` holds every weight under its checkpoint name (no fused
    keys): what sharding (`linnet.runtimes.parallel`) and training by checkpoint name use. `scan_layers`: each list
    of identical layers is held stacked and its loops run as one `lax.scan` (`linnet.compiler.jax.scan`: one layer
    traced and compiled, not every layer); None (auto) as `scans_layers` decides (on the CPU, not in the per-name
    layout, `LINNET_SCAN_LAYERS=0` turns it off; never with `cpu_offload_gb`). `cpu_offload_gb`: hold that many GiB
    of the layers' weights in host memory, streamed to the device each step (`jax_offload`; `--cpu-offload-gb`,
    vLLM's name). Called by
    `Backend.load` (`linnet.jax.load`, `linnet.load`), which checks the options first.

    Raises LoadError (source, config, names or shapes) and BackendError (mode, dtype, device)."""
    from linnet.runtimes.loading import prepare

    t0 = time.perf_counter()
    _device(options.device)
    prepared = prepare(source, weights, options)
    return load_prepared(prepared, options, mode, fuse_linear_weights, t0, scan_layers, cpu_offload_gb)


@x64_scoped
def load_prepared(
    prepared: Prepared,
    options: LoadOptions = LoadOptions(),
    mode: str = "generated",
    fuse_linear_weights: bool = True,
    t0: float | None = None,
    scan_layers: bool | None = None,
    cpu_offload_gb: float | None = None,
) -> JaxModel:
    """A model from an already prepared program and checkpoint (`loading.prepare`): compiled in `mode` under
    `options`' numerics, its weights put on `options.device` (random ones from `options.seed` when there is no
    checkpoint). `load` does the preparing; a source transform (LoRA) prepares its own; `scan_layers` and
    `cpu_offload_gb` as `load` takes them. Raises LoadError, BackendError."""
    numerics, device, seed, progress = options.numerics, options.device, options.seed, options.progress
    from linnet.compiler.jax.module import compile_program, export_entry, exported_fn, param_specs

    t0 = time.perf_counter() if t0 is None else t0
    backend = backend_for("jax_backend", mode)
    jax = jax_module()
    dev = _device(device)
    program = prepared.program
    # bf16 on the CPU: matrices held in f32 (the module docstring); not for the per-name layout that sharding and
    # training compile themselves
    f32_matrices = dev.platform == "cpu" and program.dtype.name == "bf16" and fuse_linear_weights
    # offload cuts the loop over the layers unrolled (`jax_offload`): auto is then unrolled, a scan asked for (the
    # argument, or the variable) refused
    auto = (scan_layers_env() or False) if cpu_offload_gb and scan_layers is None else scan_layers
    quantized = stored_matrices(prepared)  # --dtype stored: the Q8_0 matrices, held as int8 codes and f16 scales
    scan = scans_layers(auto, dev.platform, fuse_linear_weights, stored=bool(quantized))
    layout = cache_layout_for(dev)
    compiled = compile_program(
        program, numerics, fuse_linear_weights, f32_matrices, layout, scan_layers=scan, quantized=quantized
    )
    plan = _offload_plan(compiled, cpu_offload_gb, layout, scan) if cpu_offload_gb else None  # 0: none, as vLLM's
    binder = _Binder(
        dev, compiled.fused, compiled.held_dtype, compiled.stacked, _kernel_layout(dev) if quantized else None
    )
    if plan is not None:
        from .jax_offload import host_sharding

        binder.host, binder.offloads = host_sharding(dev), plan.offloads
    if prepared.checkpoint is not None:
        params = _checkpoint_params(prepared, progress, binder)
    else:
        params = _random_params(program, seed, binder)
    _, held = param_specs(program, compiled.fused, compiled.held_dtype, layout, compiled.stacked)
    state = {path: jax.device_put(np.zeros(s.shape, dtype=s.dtype), dev) for path, s in held.items()}
    stateful = {name: compiled.stateful(name) for name in program.entries}
    exported = {}
    if plan is not None:
        from .jax_offload import SegmentedEntry

        specs = None if mode == "generated" else param_specs(program, compiled.fused, compiled.held_dtype, layout)
        functions = {
            n: SegmentedEntry(compiled, n, plan, dev, compiled.compiler_options, specs) for n in program.entries
        }
    elif mode == "generated":
        functions = {name: compiled.jitted(name) for name in program.entries}
    else:
        platform = dev.platform
        exported = {name: export_entry(compiled, name, platforms=[platform]) for name in program.entries}
        functions = {
            name: exported_fn(exp, stateful[name], compiled.compiler_options) for name, exp in exported.items()
        }
    vocab = program.entries["step"].outputs[0].dims[-1].as_int() if "step" in program.entries else None
    return JaxModel(
        mode=mode,
        params=params,
        state=state,
        functions=functions,
        stateful=stateful,
        max_batch=program.max_batch,
        max_positions=program.max_positions,  # loading may cap it (a learned position table)
        vocab_size=vocab,
        prepared=prepared,
        source=compiled.source,
        exported=exported,
        device=dev,
        load_s=time.perf_counter() - t0,
        notes=list(prepared.notes) + ([F32_MATRICES_NOTE] if f32_matrices else []) + ([plan.note()] if plan else []),
        backend=backend.name,
        numerics=numerics,
        compiler_options=compiled.compiler_options,
        cache_layout=compiled.cache_layout,
        offload=plan,
    )


def _offload_plan(compiled, cpu_offload_gb: float, layout: str, scan: bool):
    """The `jax_offload.OffloadPlan` of `cpu_offload_gb` GiB for `compiled`. Raises BackendError for what offload
    does not combine with (`--dtype stored`, `scan_layers`)."""
    from linnet.compiler.jax.module import param_specs

    from .jax_offload import plan_offload

    refused = {
        "--dtype stored (its quantized pairs): use --dtype bf16 or f32": bool(compiled.quantized),
        f"scan_layers (the layers as one scan; {SCAN_LAYERS_ENV}=1 or scan_layers=True asks for it)": scan,
    }
    for why, applies in refused.items():
        if applies:
            raise BackendError(f"--cpu-offload-gb is not built for {why}")
    specs, _ = param_specs(compiled.program, compiled.fused, compiled.held_dtype, layout)
    return plan_offload(specs, compiled.namespace.get("STACKED_LISTS", {}), cpu_offload_gb)


# Whether an accelerator (a TPU, a GPU) scans the layers by default. The chip (bench/results/tpu_compile_2026-12-06:
# the 1.1B shape) compiled a generation's programs in 5.8 s cold and 0.40 s cached scanned against 46.3 s and 8.5 s
# unrolled, for a decode that costs 12 % more a token at batch 1 and 8 % more a 32-row step: a generation waits far
# less scanned, so scanned is the default; `linnet serve`, whose throughput is what it is for and whose compiles are
# paid once at start, asks for the layers unrolled there (`linnet.cli.common.load_model`). The CPU scans by default
# (21-22 s -> 2.2-4.1 s a program cold, 9.4 -> 0.25 s cached: bench/results/tpu_compile_cpu.json).
SCAN_ON_ACCELERATORS = True
# `--dtype stored` (Q8_0 pairs through the Pallas kernels) on an accelerator is not scanned by default: on the chip
# Qwen3-8B's stored decode ran scanned at 73.6 ms a step, 21 % of streaming the 9.2 GB it holds
# (bench/results/tpu_q8_qwen3_2026-12-06.json), where Llama-3.1-8B's ran unrolled at 14.93 ms, 100 %
# (tpu_q8_pallas_2026-12-06.json). The cause (seen on the CPU): each layer's slice of the stacked pairs was copied
# out of the stack for the kernel's custom call; the kernels now read a layer's tiles from the stacks
# (`q8_kernel.StackedLayerQ8`). On the chip since: TinyLlama-1.1B's shape scanned 88 % against 90 % unrolled (compile
# 8.0 s against 163.5 s cold: tpu_q8_layers_tinyllama_2026-12-06.json), but Qwen3-8B's scanned still 55.9 ms a step,
# 27 %, against 97 % unrolled (tpu_q8_qwen3_scanned_2026-12-06.json, tpu_q8_qwen3_unrolled_2026-12-06.json): what
# else its scanned step pays is not found yet, so the 8B class keeps the unrolled default.
STORED_SCANS_ON_ACCELERATORS = False
# `LINNET_SCAN_LAYERS=0` (or 1): the layers unrolled (or scanned) wherever `scan_layers` is left to its default
SCAN_LAYERS_ENV = "LINNET_SCAN_LAYERS"
_SCAN_VALUES = {"0": False, "off": False, "false": False, "no": False, "1": True, "on": True, "true": True, "yes": True}


def scans_layers(
    scan_layers: bool | None, platform: str, fuse_linear_weights: bool = True, stored: bool = False
) -> bool:
    """Whether a load holds its lists of identical layers stacked and runs their loops as one `lax.scan`
    (`linnet.compiler.jax.scan`). `scan_layers` True or False is that; None (auto) is: never in the per-name layout
    (`fuse_linear_weights=False`: tensor-parallel sharding and the JAX trainer address each layer's weights by
    checkpoint name, so they unroll); else `LINNET_SCAN_LAYERS` when set (0/off or 1/on); else unrolled for
    `--dtype stored` matrices (`stored`) on an accelerator (`STORED_SCANS_ON_ACCELERATORS`); else on the CPU, and on
    an accelerator (jax's `platform`: "tpu", "gpu") as `SCAN_ON_ACCELERATORS` says. Raises BackendError for another
    value of the variable."""
    if scan_layers is not None:
        return bool(scan_layers)
    if not fuse_linear_weights:
        return False
    asked = scan_layers_env()
    if asked is not None:
        return asked
    if stored and platform != "cpu":
        return STORED_SCANS_ON_ACCELERATORS
    return platform == "cpu" or SCAN_ON_ACCELERATORS


def scan_layers_env() -> bool | None:
    """What `LINNET_SCAN_LAYERS` asks (True: scan, False: unroll), or None when it is unset or empty. Raises
    BackendError for another value."""
    value = os.environ.get(SCAN_LAYERS_ENV, "").strip().lower()
    if not value:
        return None
    if value not in _SCAN_VALUES:
        raise BackendError(f"{SCAN_LAYERS_ENV} must be 0 or 1 (off or on), got {value!r}")
    return _SCAN_VALUES[value]


def _kernel_layout(device) -> Callable | None:
    """How a quantized pair is re-laid at load for `device`'s matmul kernel (`q8_kernel.hold`: on a TPU, the Pallas
    kernel), or None (the CPU: XLA's dot over the pair as the file holds it)."""
    from linnet.compiler.jax import q8_kernel

    return q8_kernel.hold if q8_kernel.uses_kernel(device.platform) else None


def cache_layout_for(device) -> str:
    """How the generated code holds KV caches on `device` (a jax Device): "token_major" ([max_batch, T, H * D]) on a
    TPU, "flat" ([max_batch * H, T, D]) elsewhere; `linnet.ir.attention.hold_caches` gives the measurements."""
    return "token_major" if device.platform == "tpu" else "flat"


F32_MATRICES_NOTE = (
    "bf16 on the CPU: the matrices are held in f32 (their bf16 values, widened once at load), since XLA's CPU dots "
    "compute bf16 in f32 and would convert every weight on every step; the same arithmetic as XLA's bf16 dots, twice "
    "the matrices' memory"
)


class _Binder:
    """Puts parameters on the device as they are read, by checkpoint name, except the members of
    a fused group (`fused`: key -> names), held on the host until the group is complete and then
    put concatenated under its key, and the items' members of a stacked list (`stacked`: list path -> items,
    `JaxProgram.stacked`), each copied into its slot of one host array [items, ...] and put once every item's is
    there, under its stacked key (`scan.stacked_key`): stacked once at load, never per call. Each array is held in
    `held_dtype(dtype, rank)` (`JaxProgram.held_dtype`: the bf16 matrices widened to f32 on the CPU; an exact
    cast); a `GroupQuantized` matrix (`--dtype stored`) as its pair of codes and scales (`jax_quantized.held_pair`;
    a fused group's pairs concatenated), re-laid by `relayout` when given (a kernel's layout: `q8_kernel.hold`),
    and in a stacked list each of its arrays stacked (codes [items, N, K]: a scan's item gets its layer's pair)."""

    def __init__(
        self,
        device,
        fused: dict[str, list[str]],
        held_dtype: Callable[[str, int], str] | None = None,
        stacked: dict[str, int] | None = None,
        relayout: Callable | None = None,
    ):
        self.jax, self.device, self.fused = jax_module(), device, fused
        self.held_dtype, self.relayout = held_dtype, relayout
        self.stacked = stacked or {}
        self.group = {n: key for key, names in fused.items() for n in names}
        self.pending: dict[str, dict[str, np.ndarray]] = {}
        self.slots: dict[str, tuple] = {}  # stacked key -> (host array of each leaf, their tree, indices filled)
        self.params: dict = {}
        # offloaded parameters (`jax_offload`): which keys are held in host memory, and where (None: numpy arrays)
        self.offloads: Callable[[str], bool] = lambda key: False
        self.host: Any = None

    def put(self, path: str, a: np.ndarray | GroupQuantized) -> None:
        if isinstance(a, GroupQuantized):
            a = held_pair(a, path)
        elif self.held_dtype is not None and a.dtype.name == "bfloat16" and self.held_dtype("bf16", a.ndim) == "f32":
            a = a.astype(np.float32)  # bf16 values, widened exactly
        key = self.group.get(path)
        if key is None:
            self._place(path, a)
            return
        held = self.pending.setdefault(key, {})
        held[path] = a
        if len(held) == len(self.fused[key]):
            held = self.pending.pop(key)
            parts = [held[n] for n in self.fused[key]]
            self._place(key, concat_pairs(parts) if isinstance(parts[0], tuple) else np.concatenate(parts))

    def _place(self, key: str, a: np.ndarray | tuple) -> None:
        """Put `a` (an array, or a quantized pair, re-laid for the kernel first) under `key`, or into its slot of a
        stacked array (put once full; a pair's codes and scales each stacked: one [items, ...] array per leaf)."""
        from linnet.compiler.jax.scan import STACKED_INDEX, stacked_key

        a = self._relaid(a)
        found = stacked_key(key, self.stacked)
        if found is None and self.offloads(key):
            self.params[key] = np.asarray(a) if self.host is None else self.jax.device_put(a, self.host)
            return
        if found is None:
            self.params[key] = self.jax.device_put(a, self.device)
            return
        stacked, index = found
        count = self.stacked[stacked.split(f".{STACKED_INDEX}.")[0]]
        leaves, tree = self.jax.tree.flatten(a)
        new = ([np.empty((count, *x.shape), x.dtype) for x in leaves], tree, set())
        wholes, tree, filled = self.slots.setdefault(stacked, new)
        for whole, x in zip(wholes, leaves):
            if whole.shape[1:] != x.shape or whole.dtype != x.dtype:  # the loop's lowering makes its items alike
                items = f"{list(whole.shape[1:])} {whole.dtype}"
                raise LoadError(f"`{key}` is {list(x.shape)} {x.dtype}, the other items of its list {items}", "L501")
            whole[index] = x
        filled.add(index)
        if len(filled) == count:
            held = self.jax.tree.unflatten(tree, self.slots.pop(stacked)[0])
            self.params[stacked] = self.jax.device_put(held, self.device)

    def _relaid(self, a):
        return self.relayout(*a) if self.relayout is not None and isinstance(a, tuple) else a

    def done(self) -> dict:
        for key, held in self.pending.items():
            raise _missing_members(key, [n for n in self.fused[key] if n not in held])
        from linnet.compiler.jax.scan import stacked_names

        for key, (wholes, _, filled) in self.slots.items():
            missing = [n for i, n in enumerate(stacked_names(key, len(wholes[0]))) if i not in filled]
            names = ", ".join(f"`{n}`" for n in missing[:4])
            raise LoadError(f"no tensor for {names} (stacked as `{key}`)", code="L502")
        return self.params


def _missing_members(key: str, missing: list[str]) -> Exception:
    return LoadError(f"no tensor for {', '.join(f'`{n}`' for n in missing)} (fused as `{key}`)", code="L502")


def _checkpoint_params(prepared: Prepared, progress: bool, binder: _Binder) -> dict:
    """The checkpoint's arrays in the working dtype, put on the device once by `binder` (fused groups
    concatenated)."""
    from linnet.runtimes.loading import planned_tensors

    specs = {t.path: t for t in prepared.program.params}
    for path, a in planned_tensors(prepared, progress, prepared.program.dtype.name):
        if a.shape != specs[path].shape:
            raise LoadError(
                f"`{path}`: the checkpoint has {list(a.shape)}, the model {list(specs[path].shape)}", code="L501"
            )
        binder.put(path, a)
    return binder.done()


def _random_params(program, seed: int, binder: _Binder) -> dict:
    from linnet.runtimes.loading import random_params

    for path, a in random_params(program, seed).items():
        binder.put(path, a)
    return binder.done()


# ----------------------------------------------------------------------------- serialized artifacts


def save_exported(exported, path: str | Path, metadata: dict[str, Any]) -> list[Path]:
    """Write `exported.serialize()` to `path` and `metadata` (entry, max_batch, max_positions,
    weights...) plus the artifact's `sha256` as JSON to `path` + ".json". Returns the paths
    written."""
    path = Path(path)
    data = exported.serialize()
    path.write_bytes(data)
    meta = path.with_name(path.name + ".json")
    meta.write_text(json.dumps({**metadata, "sha256": _digest(data, metadata)}, indent=2) + "\n", "utf-8")
    return [path, meta]


# The metadata fields that change what the artifact computes or how it is driven; the others (source, model, ...)
# are for people, and may be edited.
_BINDING_FIELDS = ("entry", "max_batch", "max_positions", "fused_weights", "compiler_options", "drops_padded_rows")


def _digest(data: bytes, meta: dict[str, Any]) -> str:
    """sha256 of the artifact's bytes and its binding metadata fields (canonical JSON), as hex."""
    fields = json.dumps({k: meta[k] for k in _BINDING_FIELDS if k in meta}, sort_keys=True).encode()
    return hashlib.sha256(data + b"\0" + fields).hexdigest()


# What `jax.export.deserialize` raises for bytes that are not a well-formed artifact (flatbuffers reads past the end,
# indexes out of range, undecodable names, unknown enum values, its own asserts); it documents none, and only
# artifacts without a recorded sha256 reach it unchecked (tests/runtimes/test_corrupt_files.py sweeps them).
_DESERIALIZE_ERRORS = (
    ValueError,
    IndexError,
    KeyError,
    TypeError,
    AttributeError,
    AssertionError,
    OverflowError,
    RecursionError,
    struct.error,
)


def _read_exported(path: Path) -> tuple[bytes, dict[str, Any], Path]:
    """The artifact's bytes and its metadata (`{}` without a `.json` beside it), checked: the JSON is an
    object; `entry` a string; `max_batch` and `max_positions` positive integers; `fused_weights`
    `{key: {member: [dims]}}`; `compiler_options` `{XLA option: bool, number or string}`; and the bytes and
    those fields match the `sha256` it records (every
    artifact written since it was added, `_digest`), so a truncated, bit-flipped or mismatched
    artifact is refused before it is parsed.
    Raises LoadError naming the file."""
    meta_path = path.with_name(path.name + ".json")
    try:
        data = path.read_bytes()
        text = meta_path.read_text(encoding="utf-8") if meta_path.exists() else None
    except OSError as e:
        raise LoadError(f"{e.filename}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise LoadError(f"{meta_path}: not UTF-8 ({e})") from None
    if text is None:
        return data, {}, meta_path
    try:
        meta = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise LoadError(f"{meta_path}: corrupt JSON ({e})") from None
    if not isinstance(meta, dict):
        raise LoadError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")

    def positive(key: str) -> bool:
        v = meta[key]
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    problems = [f"`{k}` must be a string" for k in ("entry", "sha256") if k in meta and not isinstance(meta[k], str)]
    problems += [
        f"`{k}` must be a positive integer" for k in ("max_batch", "max_positions") if k in meta and not positive(k)
    ]
    fused = meta.get("fused_weights", {})
    if not (
        isinstance(fused, dict)
        and all(isinstance(members, dict) for members in fused.values())
        and all(
            isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in dims)
            for members in fused.values()
            for dims in members.values()
        )
    ):
        problems.append("`fused_weights` must map each fused key to {member: [dims]}")
    options = meta.get("compiler_options", {})
    if not (isinstance(options, dict) and all(isinstance(v, (bool, int, float, str)) for v in options.values())):
        problems.append("`compiler_options` must map XLA option names to booleans, numbers or strings")
    if problems:
        raise LoadError(f"{meta_path}: {'; '.join(problems)}")
    if "sha256" in meta and _digest(data, meta) != meta["sha256"]:
        raise LoadError(
            f"{path}: the artifact and its {', '.join(_BINDING_FIELDS)} do not match the sha256 in {meta_path.name} "
            "(truncated, corrupt, edited, or written by another export): export it again"
        )
    return data, meta, meta_path


@x64_scoped
def load_exported(
    path: str | Path, params: dict | None = None, weights: str | Path | None = None, device: str = "cpu"
) -> JaxModel:
    """Run a serialized StableHLO entry (`linnet stablehlo FILE --entry NAME --serialized PATH`)
    without its `.linnet` source: the argument names and shapes come from the artifact. The
    parameters are `params` (a dict by checkpoint name of arrays) or read from `weights` (a
    checkpoint; its names are matched to the artifact's, allowing one leading segment more or
    less, as loading from source does). Where the artifact takes fused weights (a key such as
    `model.layers.0.mlp.{gate,up}_proj.weight`, `codegen.fused_key`), they are made from their
    members by checkpoint name, and where it takes a list of layers stacked (`model.layers.*.mlp.down_proj.weight`,
    from a model loaded with `scan_layers`; `linnet.compiler.jax.scan`), from its items'. It compiles with the XLA
    options its JSON records (`compiler_options`: what the
    export's numerics need, `JaxProgram.compiler_options`), so it computes what the model loaded from source
    computes; an artifact without them compiles with XLA's defaults. Returns a `JaxModel` with the one entry.

    Raises LoadError for missing or mis-shaped parameters."""
    jax = jax_module()
    from linnet.compiler.jax.module import exported_fn, exported_signature
    from linnet.compiler.jax.scan import unstacked

    t0 = time.perf_counter()
    path = Path(path)
    data, meta, meta_path = _read_exported(path)
    try:
        exported = jax.export.deserialize(bytearray(data))
    except _DESERIALIZE_ERRORS as e:
        raise LoadError(
            f"{path}: not a serialized jax.export artifact, or a corrupt one ({type(e).__name__}: {e})"
        ) from None
    name = meta.get("entry", "entry")
    dev = _device(device)
    param_specs, state_specs, _ = exported_signature(exported)
    if state_specs and "max_batch" not in meta:
        raise LoadError(
            f"{meta_path}: missing or without `max_batch`; an entry with a KV cache needs it (written next to the "
            "artifact by `linnet stablehlo --serialized`: the entry, max_batch and max_positions)"
        )
    _check_cache_sizes(meta, state_specs, meta_path)
    members = meta.get("fused_weights", {})
    try:
        if params is None:
            if weights is None:
                raise LoadError("give params= (a dict by checkpoint name) or weights= (a checkpoint)")
            params = _weights_by_name(weights, _item_specs(param_specs))
        params = unstacked(params, param_specs)  # layers given stacked (a scanned model's) to an unrolled artifact
        params = _stacked_from_items(_fused_from_members(params, _item_specs(param_specs), members), param_specs)
        missing = [k for k in param_specs if k not in params]
        if missing:
            raise LoadError(f"{len(missing)} parameter(s) the artifact takes are missing: {missing[:6]}", code="L502")
        bound = {}
        for k, spec in param_specs.items():
            a = np.asarray(params[k])
            if tuple(a.shape) != tuple(spec.shape):
                raise LoadError(f"`{k}` is {list(a.shape)}, the artifact takes {list(spec.shape)}", code="L501")
            bound[k] = jax.device_put(a.astype(spec.dtype), dev)
    except LoadError as err:  # name the artifact whose signature the weights do not fit
        raise LoadError(f"{path}: {err.message}", code=err.code) from None
    state = {k: jax.device_put(np.zeros(s.shape, s.dtype), dev) for k, s in state_specs.items()}
    stateful = bool(state_specs)
    vocab = None
    if name == "step":
        vocab = int(exported.out_avals[0].shape[-1])
    return JaxModel(
        mode="stablehlo",
        backend="xla",
        params=bound,
        state=state,
        functions={name: exported_fn(exported, stateful, meta.get("compiler_options") or None)},
        stateful={name: stateful},
        max_batch=int(meta.get("max_batch", 1)),
        max_positions=int(meta.get("max_positions", 0)),
        vocab_size=vocab,
        exported={name: exported},
        device=dev,
        load_s=time.perf_counter() - t0,
        compiler_options=meta.get("compiler_options") or None,
        drops_padded_rows=meta.get("drops_padded_rows") is True,
    )


def _check_cache_sizes(meta: dict, state_specs: dict, meta_path: Path) -> None:
    """Refuse metadata whose cache sizes the artifact's KV-cache arguments contradict (each held as
    [max_batch * num_key_value_heads, max_positions, head_dim]): a wrong max_positions would let the
    runner write past the cache, which XLA clamps silently. Raises LoadError naming the JSON."""
    max_batch, max_positions = meta.get("max_batch", 1), meta.get("max_positions")
    for key, spec in _item_specs(state_specs).items():
        shape = tuple(spec.shape)
        if len(shape) != 3 or shape[0] % max_batch or (max_positions is not None and shape[1] != max_positions):
            raise LoadError(
                f"{meta_path}: max_batch {max_batch} and max_positions {max_positions} do not fit the artifact's "
                f"cache `{key}` of {list(shape)} ([max_batch * num_key_value_heads, max_positions, head_dim])"
            )


def _item_specs(specs: dict) -> dict:
    """`specs` with each stacked key (a list of layers the artifact scans, `list.*.member` [items, ...];
    `linnet.compiler.jax.scan`) replaced by its items' keys and specs, in order."""
    from linnet.compiler.jax.scan import STACKED_INDEX, stacked_names

    jax = jax_module()
    out = {}
    for key, spec in specs.items():
        if f".{STACKED_INDEX}." not in key:
            out[key] = spec
            continue
        item = jax.ShapeDtypeStruct(tuple(spec.shape[1:]), spec.dtype)
        out.update((name, item) for name in stacked_names(key, spec.shape[0]))
    return out


def _stacked_from_items(params: dict, specs: dict) -> dict:
    """`params` with each stacked key the artifact takes that `params` lacks made from its items' arrays (by
    checkpoint name or fused key; `_item_specs`), stacked along a new leading axis."""
    from linnet.compiler.jax.scan import STACKED_INDEX, stacked_names

    out = dict(params)
    for key, spec in specs.items():
        if key in params or f".{STACKED_INDEX}." not in key:
            continue
        names = stacked_names(key, spec.shape[0])
        missing = [n for n in names if n not in out]
        if missing:
            raise LoadError(
                f"no tensor for {', '.join(f'`{n}`' for n in missing[:4])} (stacked as `{key}`)", code="L502"
            )
        items = [np.asarray(out.pop(n)) for n in names]
        for n, a in zip(names, items):
            if a.shape != tuple(spec.shape[1:]):
                raise LoadError(
                    f"`{n}` is {list(a.shape)}, the artifact takes {list(spec.shape[1:])} (stacked as `{key}`)",
                    code="L501",
                )
        out[key] = np.stack(items)
    return out


def _fused_from_members(params: dict, specs: dict, members: dict) -> dict:
    """`params` with each fused key the artifact takes (`codegen.fused_key`) that `params` lacks
    made from its members by checkpoint name (`_fuse_members`)."""
    from linnet.compiler.jax.codegen import fused_names

    out = dict(params)
    for key, spec in specs.items():
        names = fused_names(key) if key not in params else None
        if names:
            missing = [n for n in names if n not in params]
            if missing:
                raise _missing_members(key, missing)
            out[key] = _fuse_members(key, {n: np.asarray(params[n]) for n in names}, spec, members.get(key))
    return out


def _fuse_members(key: str, parts: dict, spec, shapes: dict | None) -> np.ndarray:
    """The members of fused weight `key` concatenated along dim 0, each checked first against its
    shape in the artifact's metadata (`shapes`: name -> shape; `fused_weights` in the JSON), or,
    without it, against the fused weight's row length.

    Raises LoadError (L501) naming the member and both shapes."""
    for n, a in parts.items():
        want = shapes.get(n) if shapes else None
        if want is not None and list(a.shape) != list(want):
            raise LoadError(
                f"`{n}` is {list(a.shape)}, the artifact takes {list(want)} (fused as `{key}`)", code="L501"
            )
        if want is None and (a.ndim != 2 or a.shape[1] != spec.shape[1]):
            raise LoadError(
                f"`{n}` is {list(a.shape)}, the artifact takes [rows, {spec.shape[1]}] (fused as `{key}`)", code="L501"
            )
    return np.concatenate(list(parts.values()))


def _weights_by_name(weights, specs: dict) -> dict:
    """The tensors the artifact's parameters need, read from a checkpoint by checkpoint name (a
    fused key's members by theirs; `_fused_from_members` then fuses them), in its dtypes."""
    from linnet.compiler.jax.codegen import fused_names
    from linnet.runtimes.formats.checkpoints import open_checkpoint
    from linnet.runtimes.loading import prefix_map

    with open_checkpoint(weights) as ckpt:
        names = {k: fused_names(k) or [k] for k in specs}
        rename = prefix_map([n for group in names.values() for n in group], set(ckpt.tensor_names))
        out = {}
        for k, spec in specs.items():
            for n in names[k]:
                if rename(n) not in ckpt:
                    raise LoadError(f"{weights} has no tensor for `{n}`", code="L502")
                out[n] = cast_floating(ckpt.load(rename(n)), "f32").astype(spec.dtype)
        return out


__all__ = [
    "load",
    "load_exported",
    "save_exported",
    "JaxModel",
    "JaxStepModel",
    "BACKEND_MODES",
    "buckets",
    "scans_layers",
    "SCAN_ON_ACCELERATORS",
    "STORED_SCANS_ON_ACCELERATORS",
    "SCAN_LAYERS_ENV",
]
