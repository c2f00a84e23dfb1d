"""`linnet.torch.load`: a source and its weights as a runnable PyTorch model (backends
`torch-interpret`, `torch`, `torch-compile`, `cuda-graphs`).

The backend (`linnet.compiler.torch`) turns the Core IR into an `nn.Module` with empty
parameters; this binds the checkpoint's numpy arrays to it (dequantized GGUF tensors included),
each converted once (`torch.from_numpy`, then cast to the working dtype on the device), with a
progress bar on stderr for loads over a second. With `dtype="stored"` a GGUF file's quantized matrices
(`GroupQuantized`) are bound as `QuantizedWeight`s (`linnet.compiler.torch.quantized`), which `F.linear`
and `F.embedding` read through torch's int4 CPU kernel and exact row lookups; everything else is f32.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from linnet.compiler.torch.module import BackendError, LinnetModule, compile_program
from linnet.compiler.torch.quantized import QuantizedWeight
from linnet.errors import LoadError
from linnet.runtimes.backends import BACKENDS, Backend, backend_for, device_kind
from linnet.runtimes.backends.allocator import keep_freed_heap
from linnet.runtimes.formats.gguf_quants import GroupQuantized
from linnet.runtimes.loading import LoadOptions, Prepared, planned_tensors, prepare, random_params
from linnet.runtimes.model import ModelBase, step_entry

# --backend -> the `mode` of `load` (the registry's records for this runtime)
BACKEND_MODES = {b.name: b.mode for b in BACKENDS.values() if b.runtime == "torch_backend"}


@dataclass
class TorchModel(ModelBase):
    """A loaded model (`LoadedModel`): `run(entry, *arrays)` and the entries as attributes
    (`model.forward(ids)`) take and return numpy; `native` and `module.entry(name)` take and
    return torch tensors on the model's device (`model.native.forward(ids)`). `module` is the
    `nn.Module` (its `state_dict()` keys are the checkpoint names). `step_model()` adapts `step`
    to the generation runner. `load_s` is the load time in seconds (checking, lowering,
    compiling, binding weights)."""

    module: LinnetModule
    prepared: Prepared
    load_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    backend: str = "torch"

    def held_weights(self) -> dict[str, np.ndarray]:
        """The program's parameters by `state_dict()` key (the checkpoint names), on the host; the KV cache stays."""
        held = self.module.state_dict()
        return {s.path: to_numpy(held[s.path]) for s in self.program.params if s.path in held}

    @property
    def compile_kind(self) -> str:
        """What the first call of an entry does beyond running it (`caches.watch`): "compile" under
        torch.compile, "" for eager modes (CUDA graphs capture only decode steps: `TorchStepModel`)."""
        return "compile" if self.module.mode == "inductor" else ""

    @property
    def max_batch(self) -> int:
        return self.module.program.max_batch

    @property
    def max_positions(self) -> int:
        return self.module.program.max_positions

    def _native_entry(self, entry: str) -> Callable:
        return self.module.entry(entry)

    def _run_arrays(self, entry: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
        fn = self.module.entry(entry)
        device = self.module.device_
        with torch.inference_mode():
            out = fn(*[to_torch(a).to(device) for a in arrays])
            outs = out if isinstance(out, tuple) else (out,)
            return [to_numpy(t) for t in outs]

    def reset_state(self) -> None:
        """Zero the KV cache (not needed between requests: a step only reads what it wrote)."""
        self.module.reset_state()

    def step_model(self) -> "TorchStepModel":
        return TorchStepModel(self.module)


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A numpy array as a CPU tensor over the same memory (bf16 through its bit pattern). A read-only
    array, such as a memory-mapped checkpoint tensor, is copied first: torch tensors are writable."""
    if not a.flags.writeable:
        a = a.copy()
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as a numpy array on the host (bf16 as `ml_dtypes.bfloat16`)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def setup_process(backend: Backend, instances: int | None = None) -> str:
    """PyTorch's thread count for this process (`Backend.setup_process`): one thread per idle core of the process's
    CPU affinity (per core of it where the compiled kernels are specialised to the thread count,
    `Backend.thread_specific`; `linnet.runtimes.backends.threads`), or, with `instances` processes serving one model
    (Triton's instances, each a process), an equal share of the cores each: without it each would start one thread
    per core and they would fight. Returns what was chosen, for the timing line."""
    if instances is not None:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // instances))
        return ""
    from linnet.runtimes.backends.threads import set_torch_threads

    return set_torch_threads(follow_load=not backend.thread_specific)


def device_problem(device: str) -> str | None:
    """Why PyTorch cannot use `device` here, or None."""
    try:
        torch.device(device)
    except RuntimeError:  # the kind check reads "CPU" and "cpu:x" as cpu; torch refuses both
        return f"device {device!r} is not a device torch reads (cpu, cuda or cuda:N)"
    if device_kind(device) == "cuda" and not torch.cuda.is_available():
        return f"device {device!r} needs CUDA, and torch.cuda.is_available() is False here"
    return None


class TorchStepModel:
    """The runner's `StepModel` over a torch `step`: numpy in, numpy f32 logits out."""

    def __init__(self, module: LinnetModule):
        self.module = module
        program = module.program
        self.max_batch = program.max_batch
        self.max_positions = program.max_positions
        self.vocab_size = program.entries["step"].outputs[0].dims[-1].as_int()
        self._device = module.device_
        # what `warm_up` does: torch.compile compiles, and CUDA graphs capture, the decode step per batch size
        self.compile_kind = {"inductor": "compile", "cuda-graphs": "graph capture"}.get(module.mode, "")

    def warm_up(self, prefill_lengths: list[int], batch_sizes: list[int]) -> None:
        """Compile (torch-compile) or capture (cuda-graphs) now the decode step of each of `batch_sizes`, by running
        it once on zeros in rows 0..B-1 at position 0 (entries the runner overwrites before it reads them), so
        that neither the first token's time nor the decode rate pays for it. Prefill runs eagerly in these modes,
        and every step of the eager modes does: nothing to do for `prefill_lengths` or for them."""
        if not self.compile_kind:
            return
        for b in sorted(set(batch_sizes) | {1}):
            zeros = np.zeros(b, dtype=np.int64)
            self.step(np.zeros((b, 1), dtype=np.int64), zeros, np.arange(b, dtype=np.int64))

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        d = self._device
        entry = self.module.entry(step_entry(self.module.program.entries, input_ids.shape[1]))
        with torch.inference_mode():
            logits = entry(
                torch.from_numpy(np.ascontiguousarray(input_ids, dtype=np.int64)).to(d),
                torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)).to(d),
                torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(d),
            )
        return logits.float().cpu().numpy()


def load(
    source: str | Path, weights: str | Path | None = None, options: LoadOptions = LoadOptions(), mode: str = "generated"
) -> TorchModel:
    """Load `source` with `weights` for PyTorch in `mode` ("interpret", "generated", "inductor", "cuda-graphs"; the
    backends `torch-interpret`, `torch`, `torch-compile`, `cuda-graphs`) under `options`. Without weights and with
    `options.random_weights`, the parameters are `loading.random_params(program, options.seed)` (the same on every
    backend). Called by `Backend.load` (`linnet.torch.load`, `linnet.load`), which checks the options first.

    Raises LoadError (source, config, names or shapes) and BackendError (mode, dtype, device)."""
    t0 = time.perf_counter()
    prepared = prepare(source, weights, options)
    return load_prepared(prepared, options, mode, t0=t0)


def load_prepared(
    prepared: Prepared, options: LoadOptions = LoadOptions(), mode: str = "generated", t0: float | None = None
) -> TorchModel:
    """A model from an already prepared program and checkpoint (`loading.prepare`): compiled in `mode` under
    `options`' numerics on its device, its weights bound (random ones from `options.seed` when there is no
    checkpoint). `load` does the preparing; a source transform (LoRA) prepares its own. Raises LoadError for a
    tensor whose shape differs."""
    numerics, device, seed, progress = options.numerics, options.device, options.seed, options.progress
    t0 = time.perf_counter() if t0 is None else t0
    backend = backend_for("torch_backend", mode)
    if device_kind(device) == "cpu":
        keep_freed_heap()  # eager ops on the CPU malloc and free each activation: keep those pages (allocator.py)
    module = compile_program(prepared.program, mode, numerics, device)
    if prepared.checkpoint is not None:
        tensors = planned_tensors(prepared, progress)
    else:
        tensors = random_params(prepared.program, seed).items()
    for path, array in tensors:
        try:
            if isinstance(array, GroupQuantized):  # --dtype stored: kept quantized, read by quantized kernels
                module.bind(path, QuantizedWeight.from_groups(array, device))
            else:
                module.bind(path, to_torch(array))  # cast to the working dtype on the device
        except ValueError as err:
            raise LoadError(str(err), code="L501") from err
    notes = list(prepared.notes)
    if module.wide_linears_in_f32:
        notes.append(
            "numerics fast: this CPU has no bf16 dot instructions, so linears over more than 16 rows (prefill) run "
            "in f32 and are rounded to bf16 once (within the last bf16 bit of the bf16 kernel's, several times faster)"
        )
    return TorchModel(module, prepared, time.perf_counter() - t0, notes, backend.name)


__all__ = [
    "load",
    "load_prepared",
    "TorchModel",
    "TorchStepModel",
    "LoadError",
    "BackendError",
    "BACKEND_MODES",
    "to_torch",
    "to_numpy",
    "device_problem",
    "setup_process",
]
