"""`linnet.onnx.load`: a source and its weights as ONNX graphs on ONNX Runtime
(`--backend onnxruntime`), and `export`: the same graph written as an `.onnx` file.

Each entry is lowered by `linnet.compiler.onnx` with the checkpoint's tensors (cast to the
working dtype) as initializers named by checkpoint name, and run in its own
`InferenceSession` (made on first use). The proto names the weights as external data, so the model
is neither serialized to bytes nor parsed back; on the CPU ORT memory-maps them from a temporary file
rather than copying them (see `make_session`), and the lowered graph is dropped once its session
exists. Providers: `CPUExecutionProvider` here; with
`device="cuda"` (onnxruntime-gpu) CUDA, or TensorRT with `providers=["tensorrt", ...]`.

The KV cache. Layer i's cache is the graph input `past_key_values.i.key/value` and output
`present.i.key/value`; `present` is `past` with the step's block written (a ScatterND). The
cache lives in `OrtValue`s on the session's device and each step binds them with I/O binding,
`present` to the *same* OrtValue as `past` (`share_buffer=True`, the default: the scatter
then writes in place) or to a second set that is swapped after the step
(`share_buffer=False`). Either way no step copies the cache to or from the host: only the
token ids, positions and rows go in, and only the logits come out.

Prefill runs unpadded: the graph's batch and sequence dims are symbolic, so a new prompt
length costs no compile, and the step's last-token logits are the prompt's last token's.

Numerics: `equivalent` runs with ORT's basic graph optimisations (constant folding and
redundant-node removal, which change no arithmetic); `fast` enables all of them (ORT's
fusions of normalisation, GELU and attention patterns; the lowering writes each provable rotary embedding as one
`com.microsoft.RotaryEmbedding`, `linnet.compiler.onnx.rotary`) and says so in `notes`.

Dtypes: f32, f16 and bf16. ORT's CPU provider computes nothing in bf16 (it moves, gathers and
converts it; `linnet.compiler.onnx.kernels` has the measured table), so on CPU a bf16 model under
`equivalent` is refused at `load`, before the weights are read: the BackendError names the ops
without kernels. Under `fast` those ops run in f32 (`linnet.compiler.onnx.upcast`, applied in
`model_ir`; the entries are lowered at `load` so that `notes` says how many ops of each run
upcast). The weights stay bf16 initializers whose Casts ORT folds into f32 copies when the session
is made. The KV cache stays bf16 and the outputs are `ml_dtypes.bfloat16` arrays. numpy has no
bf16, so bf16 goes in and out of ORT as uint16 bits (`_ortvalue`, `_numpy`), and bf16 outputs are
bound to host memory. Providers other than CPU get no upcast (not measured).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from linnet.errors import BackendError, LoadError
from linnet.runtimes.backends import caches
from linnet.runtimes.backends.allocator import release_freed_heap
from linnet.runtimes.loading import LoadOptions
from linnet.runtimes.model import ModelBase, step_entry

if TYPE_CHECKING:
    from linnet.runtimes.loading import Prepared

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16: numpy has no bf16, so ORT is told the type of a uint16 view
TWO_GB = 2**31 - 1


def _ort():
    import onnxruntime

    return onnxruntime


def resolve_providers(device: str, providers) -> list[str]:
    """ORT provider names from `providers` (short names `cpu`, `cuda`, `tensorrt` or full
    names) or, when None, from `device`. Raises BackendError for a provider this build lacks."""
    ort = _ort()
    if providers is None:
        kind = device.split(":")[0]
        if kind not in ("cpu", "cuda", "gpu"):
            raise BackendError(f"device must be cpu or cuda, got {device!r}")
        providers = ["cpu"] if kind == "cpu" else ["cuda", "cpu"]
    names = [PROVIDERS.get(p, p) for p in providers]
    available = set(ort.get_available_providers())
    missing = [n for n in names if n not in available]
    if missing:
        raise BackendError(
            f"ONNX Runtime here has no {', '.join(missing)} (available: {', '.join(sorted(available))}); "
            "GPU providers come with the onnxruntime-gpu package"
        )
    return names


def setup_process(backend: Any, instances: int | None = None) -> str:
    """Nothing to set for this process (`Backend.setup_process`): ONNX Runtime's sessions take their thread count
    at load (the `threads` option)."""
    return ""


def device_problem(device: str) -> str | None:
    """Why ONNX Runtime cannot use `device` here (no such provider in this build), or None."""
    try:
        resolve_providers(device, None)
    except BackendError as err:
        return str(err)
    return None


@dataclass
class OnnxModel(ModelBase):
    """A loaded model (`LoadedModel`): `run(entry, *arrays)` and the entries as attributes
    (`model.forward(ids)`) take and return numpy arrays, which are also ONNX Runtime's own
    (`native` is the same); `step` reads and writes the KV cache in `state` (OrtValues by
    checkpoint path, on the session's device). `step_model()` adapts `step` to the generation
    runner. `load_s`: checking, lowering and binding weights (sessions are made on first use of
    an entry; `session_s` records how long each took)."""

    prepared: Prepared
    params: dict[str, np.ndarray] = field(repr=False)
    numerics: str = "equivalent"
    providers: list[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    threads: int | None = None
    share_buffer: bool = True
    max_batch: int = 1
    max_positions: int = 768
    vocab_size: int | None = None
    load_s: float = 0.0
    session_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sessions: dict[str, Any] = field(default_factory=dict, repr=False)
    state: dict[str, Any] = field(default_factory=dict, repr=False)
    _spare: dict[str, Any] = field(default_factory=dict, repr=False)
    _layouts: dict[str, "_BindingLayout"] = field(default_factory=dict, repr=False)
    _bindings: dict[str, Any] = field(default_factory=dict, repr=False)  # entry -> IOBinding, cache bound
    lowered: dict[str, Any] = field(default_factory=dict, repr=False)  # entry -> onnx_ir.Model (see model_ir)
    _handed_out: set[str] = field(default_factory=set, repr=False)  # entries whose lowered model a caller may hold
    _lock: Any = field(default_factory=threading.RLock, repr=False)  # lowering and sessions, made once
    backend: str = "onnxruntime"
    compile_kind = "session build"  # what the first call of an entry does (`caches.watch`)

    @property
    def device_type(self) -> str:
        return "cuda" if self.providers[0] in (PROVIDERS["cuda"], PROVIDERS["tensorrt"]) else "cpu"

    def model_ir(self, name: str):
        """Entry `name` as an `onnx_ir.Model` whose initializers wrap `params` (no copy), with the
        ops the provider lacks a kernel for in the model's dtype computed in f32 under `fast`
        (`linnet.compiler.onnx.upcast`; bf16 on CPU). Raises BackendError under `equivalent` when
        some op has no kernel in the model's dtype. The model is the caller's to keep: making the
        entry's session later leaves its initializers alone."""
        with self._lock:
            self._handed_out.add(name)
            return self._lowered(name)

    def _lowered(self, name: str):
        """`model_ir` for the backend's own use: kept until the entry's session is made, then made anew when asked
        for (an export after generating) and not kept."""
        if name in self.lowered:
            return self.lowered[name]
        model, notes = _lower_for(self.program, name, self.params, self.numerics, self.providers[0])
        self.notes += [n for n in notes if n not in self.notes]
        if name not in self.sessions:
            self.lowered[name] = model
        return model

    def model_proto(self, name: str):
        from linnet.compiler.onnx.lower import to_proto

        with self._lock:
            return to_proto(self._lowered(name))

    def session(self, name: str):
        """The InferenceSession of entry `name` (made on first use, once when threads ask together)."""
        if name not in self.program.entries:
            raise KeyError(f"no entry `{name}` (entries: {', '.join(self.program.entries)})")
        with self._lock:
            if name not in self.sessions:
                self._make_session(name)
        return self.sessions[name]

    def _make_session(self, name: str) -> None:
        t0 = time.perf_counter()
        # A decoder's shapes change from step to step (the prompt, the cache's filled length), and ORT's memory
        # pattern, a plan per input shape, only grew its arena: SmolLM2 stored `fast`, 512 + 128 tokens, peak
        # RSS 680 -> 633 MB with the pattern off, decode and prefill as fast (three alternating A/B pairs).
        mem_pattern = not self.program.state
        model = self._lowered(name)
        self.sessions[name] = make_session(model, self.providers, self.numerics, self.threads, mem_pattern=mem_pattern)
        # The session holds the weights now, so the lowered graph goes (`model_ir` lowers again if asked), and with
        # it the arrays of its own (a stored model's fused q/k/v and gate/up weights, concatenated: 54 MB of
        # SmolLM2), here rather than at the next cyclic GC (onnx_ir graphs hold cycles; a gc.collect() took
        # 0.12-0.15 s). Then the heap pages freed since the session began, ORT's own scratch among them, go back
        # to the kernel (`release_freed_heap`: 300 MB of SmolLM2 in f32).
        del self.lowered[name]
        if name not in self._handed_out:
            for value in model.graph.initializers.values():
                value.const_value = None
        del model
        release_freed_heap()
        self.session_s[name] = time.perf_counter() - t0

    def cache_names(self) -> dict[str, tuple[str, str]]:
        from linnet.compiler.onnx.lower import cache_names

        return cache_names(self.program)

    def reset_state(self) -> None:
        """Zero the KV cache (not needed between requests: a step only reads what it wrote)."""
        self.state = {
            t.path: _ortvalue(np.zeros(t.shape, _np(t.type.dtype.name)), self.device_type) for t in self.program.state
        }
        self._spare = {}
        self._bindings = {}

    def _layout(self, name: str, sess) -> "_BindingLayout":
        """How entry `name`'s session binds (made once: reading it from the IR and the session took ~2 ms of
        a 25 ms SmolLM2 decode step)."""
        if name not in self._layouts:
            g = self.program.entries[name]
            written = set(self.program.state_written(name))
            # an entry's graph takes only the state it reads or writes (Whisper's `prefill_encoder` writes the
            # cross-attention caches and never sees the self-attention ones)
            taken = {i.name for i in sess.get_inputs()}
            cache = [
                (path, iname, oname if path in written else None)
                for path, (iname, oname) in self.cache_names().items()
                if iname in taken
            ]
            plain = [o.name for o in sess.get_outputs()][: len(g.outputs)]
            self._layouts[name] = _BindingLayout(plain, cache)
        return self._layouts[name]

    def _run_arrays(self, name: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Entry `name` on checked numpy inputs (`model.check_inputs`); returns its outputs (the new
        cache stays in `state`)."""
        g = self.program.entries[name]
        sess = self.session(name)
        arrays = {v.name: x for v, x in zip(g.inputs, inputs)}
        bf16 = self.program.dtype.name == "bf16"
        if not g.uses_state:
            if not bf16:
                return sess.run(None, arrays)
            return [_numpy(v) for v in sess.run_with_ort_values(None, {k: _ortvalue(a) for k, a in arrays.items()})]
        if not self.state:
            self.reset_state()
        layout = self._layout(name, sess)
        # With `share_buffer` the cache's OrtValues stay put, so the binding of the cache is made once and each
        # step rebinds only the entry's own inputs and outputs; otherwise the cache swaps buffers every step.
        binding = self._bindings.get(name) if self.share_buffer else None
        new = {}
        if binding is None:
            binding = sess.io_binding()
            for o in layout.plain_outputs:  # first: `get_outputs` lists outputs in the order they were first bound
                binding.bind_output(o, "cpu" if bf16 else self.device_type)
            for path, iname, oname in layout.cache:
                binding.bind_ortvalue_input(iname, self.state[path])
                if oname is None:
                    continue
                if self.share_buffer:
                    target = self.state[path]
                else:
                    target = self._spare.get(path)
                    if target is None:
                        t = self.state[path]
                        target = _ort().OrtValue.ortvalue_from_shape_and_type(
                            t.shape(), _onnx_type_of(t), self.device_type, 0
                        )
                binding.bind_ortvalue_output(oname, target)
                new[path] = target
            if self.share_buffer:
                self._bindings[name] = binding
        for k, a in arrays.items():
            if a.dtype == _np("bf16"):
                binding.bind_ortvalue_input(k, _ortvalue(a))
            else:
                binding.bind_cpu_input(k, a)
        for o in layout.plain_outputs:  # bound again in place: a fresh buffer for each step's outputs
            binding.bind_output(o, "cpu" if bf16 else self.device_type)  # bf16 is read from host memory
        sess.run_with_iobinding(binding)
        if not self.share_buffer:
            for path, target in new.items():
                self._spare[path], self.state[path] = self.state[path], target
        return [_numpy(v) for v in binding.get_outputs()[: len(layout.plain_outputs)]]

    def _native_entry(self, name: str):
        return self.entry(name)  # ONNX Runtime's arrays are numpy

    def step_model(self) -> "OnnxStepModel":
        return OnnxStepModel(self)

    def save(self, path: str | Path, entry: str) -> list[Path]:
        """Write entry `entry` as an .onnx file (external data beside it when over 2 GB)."""
        return save_model(self.model_proto(entry), path)


@dataclass
class _BindingLayout:
    """An entry's I/O binding: its plain outputs by name, and its cache as (state path, input name, output name or
    None for state it only reads)."""

    plain_outputs: list[str]
    cache: list[tuple[str, str, str | None]]


class OnnxStepModel:
    """The runner's `StepModel` over the ONNX `step`: numpy in, numpy f32 logits out, the cache
    bound on the device (see the module docstring); prefill unpadded."""

    def __init__(self, model: OnnxModel):
        if "step" not in model.program.entries:
            raise ValueError("generation needs a decoder with `entry fn step`")
        self.model = model
        self.max_batch = model.max_batch
        self.max_positions = model.max_positions
        self.vocab_size = model.vocab_size

    compile_kind = "session build"

    def warm_up(self, prefill_lengths: list[int], batch_sizes: list[int]) -> None:
        """Make the `step` session now (ONNX Runtime optimizes the graph then; with the cache on it reads the
        optimized model instead), so that the first token's time does not pay for it. The graph's dims are
        symbolic: no shape needs a compile of its own."""
        for name in {"step", step_entry(self.model.program.entries, 1)}:
            self.model.session(name)

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        entry = step_entry(self.model.program.entries, np.shape(input_ids)[1])
        (logits,) = self.model.run(entry, input_ids, positions, rows)
        return np.asarray(logits, dtype=np.float32)


IN_MEMORY = "linnet-in-memory"  # the external-data location of initializers handed to ORT from memory
IN_MEMORY_MIN_BYTES = 1024  # smaller initializers stay in the proto (ORT reads small shape constants there)
MAPPED_MODEL, MAPPED_DATA = "model.onnx", "weights.bin"  # `_mapped_session`'s temporary files
MAPPED_ALIGN = 4096  # each weight starts on a page of `MAPPED_DATA`, so that ORT maps it where it lies


@dataclass
class _Weightless:
    """A model's proto with its large initializers left out (external data at `IN_MEMORY`), and those initializers
    as numpy arrays (C-contiguous) by `names`."""

    proto: Any  # onnx.ModelProto
    graph: bytes  # `proto` serialized (the cache key's graph)
    names: list[str]
    arrays: list[np.ndarray]


def session_options(numerics: str = "equivalent", threads: int | None = None, mem_pattern: bool = True):
    """ONNX Runtime's SessionOptions: all graph optimisations under `fast`, the basic ones under `equivalent`;
    `threads` intra-op threads (one inter-op); `mem_pattern` False turns ORT's per-shape memory plans off."""
    ort = _ort()
    opts = ort.SessionOptions()
    opts.enable_mem_pattern = mem_pattern
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if numerics == "fast" else ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    )
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return opts


def make_session(
    model, providers: list[str], numerics: str = "equivalent", threads: int | None = None, mem_pattern: bool = True
):
    """An InferenceSession of `model` (an `onnx_ir.Model`, or an `onnx.ModelProto`).

    An `onnx_ir.Model`'s large initializers are not serialized into the proto: the proto names them as external
    data, so a 540 MB model is not parsed back from bytes and the 2 GB protobuf limit does not apply. How ORT gets
    them (`_new_session`): on the CPU provider it memory-maps them from a temporary file, elsewhere they are handed
    over from memory (`add_external_initializers`, which ORT 1.32 copies).

    With ONNX Runtime's cache on (`caches.enable("onnx")`) and the CPU provider alone, the
    session of an `onnx_ir.Model` is made from its cached optimized model (`_cached_session`)."""
    ort = _ort()
    opts = session_options(numerics, threads, mem_pattern)
    if not hasattr(model, "SerializeToString"):
        weights = _weightless(model)
        folder = caches.enabled("onnxruntime")
        if folder is not None and providers == [PROVIDERS["cpu"]]:
            return _cached_session(folder, weights, providers, numerics, threads, mem_pattern)
        caches.record("onnxruntime", hit=None)
        return _new_session(weights, opts, providers)
    proto = model
    if proto.ByteSize() < TWO_GB:
        return ort.InferenceSession(proto.SerializeToString(), opts, providers=providers)
    with tempfile.TemporaryDirectory(prefix="linnet-onnx-") as tmp:
        path = Path(tmp) / "model.onnx"
        save_model(proto, path)
        return ort.InferenceSession(str(path), opts, providers=providers)


OPTIMIZED_MODEL, OPTIMIZED_DATA = "model.onnx", "model.data"


def _cached_session(folder: Path, weights: _Weightless, providers, numerics, threads, mem_pattern=True):
    """An InferenceSession from ONNX Runtime's optimized model cached under `folder`/<key> (`caches.ort_key`: the
    graph, the weights' bytes, the ORT version, provider and optimization level), made with the graph
    optimizations off, since the file holds the optimized graph (with its folded weights, e.g. transposed
    matmul weights, in `model.data`, which ORT memory-maps). On a miss, or an entry ORT cannot read, the session is
    made from `weights` as without a cache, with ORT writing its optimized model into a fresh folder that is renamed
    to <key> once complete, so a reader never sees half an entry and concurrent writers do not collide. A
    folder that cannot be written (read-only, full) costs the cache, never the session. Each lookup is counted
    by `caches.record`."""
    ort = _ort()
    opts = session_options(numerics, threads, mem_pattern)
    key = caches.ort_key(
        weights.graph, list(zip(weights.names, weights.arrays)), providers[0], str(opts.graph_optimization_level)
    )
    entry = folder / key
    if (entry / OPTIMIZED_MODEL).is_file():
        cached = session_options(numerics, threads, mem_pattern)
        cached.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            session = ort.InferenceSession(str(entry / OPTIMIZED_MODEL), cached, providers=providers)
        except Exception:  # noqa: BLE001
            # ORT raises its own Fail, InvalidGraph...: a damaged entry is rebuilt
            shutil.rmtree(entry, ignore_errors=True)
        else:
            caches.record("onnxruntime", hit=True)
            return session
    caches.record("onnxruntime", hit=False)
    uncached = session_options(numerics, threads, mem_pattern)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".partial", dir=folder))
    except OSError:
        return _new_session(weights, uncached, providers)
    opts.optimized_model_filepath = str(fresh / OPTIMIZED_MODEL)
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", OPTIMIZED_DATA)
    opts.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", str(IN_MEMORY_MIN_BYTES)
    )
    try:
        try:
            session = _new_session(weights, opts, providers)
        except Exception:  # noqa: BLE001
            # the optimized model cannot be written (a full disk...): the session is made without it
            return _new_session(weights, uncached, providers)
        try:
            os.rename(fresh, entry)  # atomic; fails when another process wrote the entry first
        except OSError:
            pass
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return session


def _new_session(weights: _Weightless, opts, providers):
    """An InferenceSession of `weights` under `opts`.

    On the CPU provider alone, on a POSIX system, ORT memory-maps the weights from a temporary file
    (`_mapped_session`): handed over from memory (`add_external_initializers`), ORT 1.32 copies each one into the
    session, and while the session is made the process holds them twice (SmolLM2 f32: peak RSS 2,190 against
    1,680-1,740 MB). Where the temporary folder lacks the space, or the file cannot be written, the weights go from
    memory."""
    if weights.names and providers == [PROVIDERS["cpu"]] and os.name == "posix":
        try:
            return _mapped_session(weights, opts, providers)
        except OSError:
            pass
    if weights.names:
        opts.add_external_initializers(weights.names, [_ortvalue_over(a) for a in weights.arrays])
    return _ort().InferenceSession(weights.graph, opts, providers=providers)


def _ortvalue_over(array: np.ndarray):
    """An OrtValue over `array`'s memory, no copy (bf16 as its uint16 bits with ONNX's bf16 type); the OrtValue keeps
    `array` alive."""
    ort = _ort()
    if array.dtype == _np("bf16"):
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(array)


MAPPED_PREFIX = "linnet-ort-"  # + "<pid>-": `_mapped_session`'s folders, each removed once its session exists
STALE_AFTER_S = 3600  # a folder of a process that is gone, this old, was left by a kill during a session build


def _mapped_session(weights: _Weightless, opts, providers):
    """An InferenceSession whose large weights ORT memory-maps from a temporary file instead of copying them.

    The weights are written to `MAPPED_DATA` (each at a page boundary) beside the proto, which names them there
    as external data; ORT maps each one, prepacks those its kernels take prepacked (MatMul, MatMulNBits: their
    mapping is then dropped) and reads the rest in place. The folder is removed once the session exists (a mapping
    outlives the file's name on POSIX systems), so the session cannot be made again from its path
    (`InferenceSession.set_providers`). Folders left by a process killed while making a session are removed by the
    next one (`_remove_stale_folders`). Raises OSError when the temporary folder has not the space (checked first)
    or the file cannot be written."""
    root = Path(tempfile.gettempdir())
    _remove_stale_folders(root)
    size = sum(-(-a.nbytes // MAPPED_ALIGN) * MAPPED_ALIGN for a in weights.arrays)
    if shutil.disk_usage(root).free < size + (64 << 20):
        raise OSError(f"{root}: under {size + (64 << 20)} bytes free for the weights")
    proto = type(weights.proto)()
    proto.CopyFrom(weights.proto)
    with tempfile.TemporaryDirectory(prefix=f"{MAPPED_PREFIX}{os.getpid()}-", ignore_cleanup_errors=True) as tmp:
        folder = Path(tmp)
        placed: dict[str, tuple[int, int]] = {}
        with open(folder / MAPPED_DATA, "wb") as f:
            for name, array in zip(weights.names, weights.arrays):
                f.write(bytes(-f.tell() % MAPPED_ALIGN))
                placed[name] = (f.tell(), array.nbytes)
                f.write(array.reshape(-1).view(np.uint8).data)  # bf16 included (no buffer format of its own)
        for tensor in proto.graph.initializer:
            if tensor.name in placed:
                offset, length = placed[tensor.name]
                del tensor.external_data[:]
                for key, value in (("location", MAPPED_DATA), ("offset", str(offset)), ("length", str(length))):
                    item = tensor.external_data.add()
                    item.key, item.value = key, value
        (folder / MAPPED_MODEL).write_bytes(proto.SerializeToString())
        return _ort().InferenceSession(str(folder / MAPPED_MODEL), opts, providers=providers)


def _remove_stale_folders(root: Path) -> None:
    """Removes `_mapped_session` folders under `root` whose process is gone and that are older than
    `STALE_AFTER_S` (a SIGKILL, the OOM killer, during a session build leaves one, as large as the weights).
    A folder this process cannot judge or remove is left alone."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        if not entry.name.startswith(MAPPED_PREFIX):
            continue
        pid = entry.name[len(MAPPED_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
            if not entry.is_dir(follow_symlinks=False) or age < STALE_AFTER_S:
                continue
            os.kill(int(pid), 0)  # raises ProcessLookupError when no such process exists
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:  # PermissionError: another user's live process; anything else: leave it
            continue


def _weightless(model) -> _Weightless:
    """`model` (an `onnx_ir.Model`) as a `_Weightless`: serialized with its initializers of at least
    `IN_MEMORY_MIN_BYTES` as external data at `IN_MEMORY`, their values as arrays (no copy where the tensor is
    contiguous). Restores `model`."""
    import onnx_ir as ir

    from linnet.compiler.onnx.lower import to_proto

    names, arrays, saved = [], [], []
    for name, v in model.graph.initializers.items():
        t = v.const_value
        if t is None or t.nbytes < IN_MEMORY_MIN_BYTES:
            continue
        array = np.ascontiguousarray(t.numpy())
        saved.append((v, t))
        v.const_value = ir.ExternalTensor(IN_MEMORY, 0, t.nbytes, t.dtype, shape=t.shape, name=name)
        names.append(name)
        arrays.append(array)
    try:
        proto = to_proto(model)
    finally:
        for v, t in saved:
            v.const_value = t
    return _Weightless(proto, proto.SerializeToString(), names, arrays)


def save_model(proto, path: str | Path) -> list[Path]:
    """Write `proto` to `path`, its tensors as external data (`path` + ".data") when the model
    is over 2 GB. Returns the paths written."""
    import onnx

    path = Path(path)
    if proto.ByteSize() < TWO_GB:
        onnx.save(proto, str(path))
        return [path]
    data = path.name + ".data"
    onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data)
    return [path, path.with_name(data)]


def _np(name: str):
    """The numpy dtype of a Linnet dtype name (bf16: `ml_dtypes.bfloat16`)."""
    if name == "bf16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return {"f32": np.float32, "f16": np.float16, "i64": np.int64, "i32": np.int32, "bool": np.bool_}[name]


def _onnx_type_of(ortvalue):
    """An OrtValue's element type as `ortvalue_from_shape_and_type` takes it (bf16: the ONNX enum)."""
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": BFLOAT16}
    return types[ortvalue.data_type()]


def _ortvalue(a: np.ndarray, device_type: str = "cpu"):
    """A numpy array as an OrtValue on `device_type` (bf16 arrays are copied in as uint16 bits)."""
    ort = _ort()
    if a.dtype != _np("bf16"):
        return ort.OrtValue.ortvalue_from_numpy(a, device_type, 0)
    v = ort.OrtValue.ortvalue_from_shape_and_type(list(a.shape), BFLOAT16, device_type, 0)
    v.update_inplace(np.ascontiguousarray(a).view(np.uint16))
    return v


def _numpy(v) -> np.ndarray:
    """An OrtValue (in host memory) as a numpy array; bf16 is copied out of its buffer, since ORT's
    `numpy()` knows no numpy bf16 type."""
    if v.data_type() != "tensor(bfloat16)":
        return v.numpy()
    n = v.tensor_size_in_bytes()
    if n == 0:
        return np.zeros(v.shape(), _np("bf16"))
    buf = (ctypes.c_uint8 * n).from_address(v.data_ptr())
    return np.frombuffer(buf, _np("bf16")).reshape(v.shape()).copy()


def _lower_for(program, name: str, params, numerics: str, provider: str):
    """(entry `name` lowered for `provider`, notes): the ops `provider` lacks a kernel for in the
    model's dtype are refused under `equivalent` (BackendError) and upcast under `fast`."""
    from linnet.compiler.onnx.lower import lower_entry
    from linnet.compiler.onnx.upcast import MissingKernels, upcast

    model = lower_entry(program, name, params, numerics)
    try:
        notes = upcast(model, program.dtype.name, provider, numerics, entry=name)
    except MissingKernels as err:
        raise BackendError(str(err)) from None
    return model, notes


def load(
    source: str | Path,
    weights: str | Path | None = None,
    options: LoadOptions = LoadOptions(),
    mode: None = None,
    providers: list[str] | None = None,
    params: dict[str, Any] | None = None,
    threads: int | None = None,
    share_buffer: bool = True,
) -> OnnxModel:
    """Load `source` with `weights` for ONNX Runtime under `options` (ONNX Runtime has one mode: None).
    `params` (a dict by checkpoint name of arrays) gives the parameters directly; without weights and with
    `options.random_weights`, they are drawn from N(0, 0.02) (norm scales 1, biases 0) with `options.seed`.
    `threads`: ORT intra-op threads (default: ORT's choice). Called by `Backend.load` (`linnet.onnx.load`,
    `linnet.load`), which checks the options first.

    Raises LoadError (source, config, names or shapes) and BackendError (dtype, provider)."""
    from linnet.compiler.onnx.kernels import has_table
    from linnet.runtimes.loading import prepare, random_params

    t0 = time.perf_counter()
    numerics, seed, progress = options.numerics, options.seed, options.progress
    names = resolve_providers(options.device, providers)
    prepared = prepare(source, weights, replace(options, random_weights=options.random_weights or params is not None))
    program = prepared.program
    dtype = program.dtype.name  # "stored" runs in f32 (gguf_quants)
    if numerics == "equivalent" and has_table(names[0], dtype):
        for entry in program.entries:  # refuse ops without kernels before reading the weights
            _lower_for(program, entry, "inputs", numerics, names[0])
    if params is not None:
        values = {}
        for spec in program.params:
            if spec.path not in params:
                raise LoadError(f"no value for parameter `{spec.path}`", code="L502")
            a = np.asarray(params[spec.path])
            if tuple(a.shape) != spec.shape:
                raise LoadError(f"`{spec.path}` is {list(a.shape)}, the model {list(spec.shape)}", code="L501")
            values[spec.path] = a.astype(_np(dtype)) if a.dtype.kind == "f" else a
    elif prepared.checkpoint is not None:
        values = _checkpoint_params(prepared, progress, numerics)
    else:
        values = random_params(program, seed)
    notes = list(prepared.notes)
    if numerics == "fast":
        notes.append(
            "numerics fast: ONNX Runtime's graph fusions are on (normalisation, GELU, attention patterns), and rotary "
            "embeddings are com.microsoft.RotaryEmbedding nodes (a file written so runs on ONNX Runtime only)"
        )
    vocab = program.entries["step"].outputs[0].dims[-1].as_int() if "step" in program.entries else None
    model = OnnxModel(
        prepared=prepared,
        params=values,
        numerics=numerics,
        providers=names,
        threads=threads,
        share_buffer=share_buffer,
        max_batch=program.max_batch,
        max_positions=program.max_positions,  # loading may cap it (a learned position table)
        vocab_size=vocab,
        notes=notes,
    )
    if has_table(names[0], dtype):
        for entry in program.entries:  # lowered now, so that `notes` says what runs upcast
            model._lowered(entry)
    model.load_s = time.perf_counter() - t0
    return model


def export(
    source: str | Path,
    entry: str | None,
    output: str | Path,
    weights: str | Path | None = None,
    preset: str | None = None,
    config: dict[str, Any] | None = None,
    dtype: str = "f32",
    numerics: str = "equivalent",
    max_batch: int = 1,
    max_positions: int = 768,
    progress: bool = True,
    with_weights: bool = True,
) -> tuple[list[Path], list[str]]:
    """`linnet onnx`: write entry `entry` (default: the first) as an .onnx file, checked by
    `onnx.checker` and shape-inferred. With weights (given, or the preset's default) the
    parameters are initializers; with none (or `with_weights=False`), they are graph inputs
    named by checkpoint name.
    Returns (paths written, notes). Imports no onnxruntime."""
    import onnx

    from linnet.compiler.onnx.lower import lower_entry, to_proto
    from linnet.ir.build import check_source, preset_weights, read_source
    from linnet.runtimes.loading import default_preset, prepare

    path, text = read_source(source)
    info = check_source(path, text, preset)
    preset = preset if preset is not None else default_preset(info)
    has_weights = weights is not None or (preset is not None and preset_weights(info, preset) is not None)
    has_weights = has_weights and with_weights
    weights = weights if has_weights else None
    options = LoadOptions(
        preset, config, dtype, max_batch=max_batch, max_positions=max_positions, random_weights=not has_weights
    )
    prepared = prepare(source, weights, options)
    program = prepared.program
    entry = entry or next(iter(program.entries))
    if entry not in program.entries:
        raise LoadError(f"no entry `{entry}` (entries: {', '.join(program.entries)})")
    notes = list(prepared.notes)
    if prepared.checkpoint is not None:
        params: Any = _checkpoint_params(prepared, progress)
    else:
        params = "inputs"
        notes.append("no weights: the parameters are graph inputs named by checkpoint name")
    if dtype == "bf16" and numerics == "fast":
        notes.append(
            "bf16 is written as lowered, for any runtime: the f32 upcast of ops ONNX Runtime's CPU provider "
            "has no bf16 kernel for is made when `--backend onnxruntime` loads the model, not in the file"
        )
    proto = to_proto(lower_entry(program, entry, params, numerics))
    written = save_model(proto, output)
    try:
        onnx.checker.check_model(str(written[0]), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:  # a lowering defect: say
        # which file, and keep it to look at
        raise BackendError(f"{written[0]}: the written graph fails onnx.checker: {err}") from None
    return written, notes


def _checkpoint_params(prepared: Prepared, progress: bool, numerics: str = "equivalent") -> dict[str, Any]:
    """The checkpoint's arrays in the working dtype, by parameter path: the initializers (an array
    read as stored stays a view of the memory-mapped file; ORT copies it once into the session).
    Under `--dtype stored` a quantized matrix is packed for MatMulNBits under `numerics` as it is read
    (`linnet.compiler.onnx.quantized.pack_weight`): every entry's graph shares the packed arrays, and the
    unpacked codes of one matrix at a time are ever in memory."""
    from linnet.compiler.onnx.quantized import pack_weight
    from linnet.runtimes.formats.gguf_quants import GroupQuantized
    from linnet.runtimes.loading import planned_tensors

    return {
        path: pack_weight(a, numerics) if isinstance(a, GroupQuantized) else np.ascontiguousarray(a)
        for path, a in planned_tensors(prepared, progress, prepared.program.dtype.name)
    }


__all__ = ["load", "export", "OnnxModel", "OnnxStepModel", "BackendError", "resolve_providers", "device_problem"]
