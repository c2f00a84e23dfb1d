"""The backend registry: one record per `--backend`, read by the CLI, the language server (and
through it the editor), the benchmarks and the conformance tests.

    from linnet.runtimes.backends import BACKENDS, get_backend

    backend = get_backend("onnxruntime")
    if (why := backend.unavailable("cpu")) is None:
        model = backend.load("examples/llama.linnet", dtype="f32")   # a LoadedModel
        (logits,) = model.run("forward", ids)                      # numpy in, numpy out

A record says what a backend is (name, label, family, the code view an editor shows for it),
what it supports (dtypes, devices, numerics, training), how to load it (the runtime module and
its `mode`), and whether it can run here. Importing this module imports no framework: a
backend's runtime module (and with it torch, jax or onnxruntime) is imported by `load`, and
`unavailable` asks `importlib.util.find_spec` before it imports anything.

Adding a backend is one runtime file (`linnet/runtimes/backends/<name>_backend.py` with a
`load(source, weights, options, mode, **own)` taking the common options as one `LoadOptions` and
returning a `LoadedModel`, a `load_prepared(prepared, options, mode, **own)` for a program already
prepared (LoRA's), a `device_problem(device)` saying why a device cannot be used, and
`setup_process(backend, instances)`) plus its line in `BACKENDS`. Nothing outside this package
asks which framework a backend runs on: what differs is a hook of the record (`setup_process`,
`tensor_parallel`, `trainer`) or of the loaded model (`held_weights`).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linnet.errors import BackendError, TrainError
from linnet.runtimes.formats.gguf_quants import STORED, working_dtype

if TYPE_CHECKING:
    from linnet.runtimes.loading import LoadOptions
    from linnet.runtimes.model import LoadedModel

__all__ = ["Backend", "BACKENDS", "CODE_VIEWS", "get_backend", "backend_for", "check_options", "device_kind"]

NUMERICS = ("equivalent", "fast")
CODE_VIEWS = ("torch", "jax", "stablehlo", "onnx")  # what `linnet/showGenerated` can show, in menu order
# the pip extra that installs a family's framework (README, "Install")
EXTRAS = {"torch": "linnet[torch]", "jax": "linnet[jax]", "onnx": "linnet[onnx]"}


@dataclass(frozen=True)
class Backend:
    """One backend.

    Fields:
        name: the `--backend` value (`torch-compile`), the same in the CLI, the editor and benchmarks.
        label: what a person reads ("PyTorch (torch.compile)").
        family: "torch", "jax" or "onnx": the framework it runs on, whose pip extra installs it.
        runtime: the module under `linnet.runtimes` whose `load(...)` makes its models.
        mode: the `mode=` that module's `load` takes for this backend (None: it has one mode).
        summary: what runs, in one line (ARCHITECTURE.md's backend table).
        code_view: the generated code an editor shows for it (`CODE_VIEWS`), or None.
        dtypes: the working dtypes it runs ("f32", "bf16", "f16").
        devices: the device kinds it runs on ("cpu", "cuda", "tpu").
        numerics: the numerics it supports ("equivalent", "fast").
        requires: the modules it imports (found with `find_spec`, never imported here).
        options: the keyword options its `load` takes beyond the common ones (`providers`).
        trainer: the module under `linnet.runtimes.train` that trains its models (`linnet train`; its entries run
            under autograd: PyTorch's modes, `trainer`; JAX under `jax.grad`, `jax_trainer`), or None: ONNX Runtime
            and the exported StableHLO artifact run inference only. `can_train` says which.
        tensor_parallel: the module under `linnet.runtimes.parallel` that splits its models for tensor-parallel
            inference (`torch_tp`, `jax_mesh`), or None.
        thread_specific: whether the code it compiles is specialised to PyTorch's thread count (inductor's CPU
            kernels are), so a thread count that changes between runs misses the persistent compile cache.
        stored: whether it runs `--dtype stored` (a GGUF file's quantized matrices kept quantized, weight-only
            quantized matmuls, f32 otherwise; contract in `linnet.runtimes.formats.gguf_quants`).
    """

    name: str
    label: str
    family: str
    runtime: str
    mode: str | None
    summary: str
    code_view: str | None
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    requires: tuple[str, ...]
    numerics: tuple[str, ...] = NUMERICS
    options: tuple[str, ...] = ()
    trainer: str | None = None
    tensor_parallel: str | None = None
    thread_specific: bool = False
    stored: bool = False

    def load(
        self, source: str | Path, weights: str | Path | None = None, options: LoadOptions | None = None, **kwargs: Any
    ) -> LoadedModel:
        """Load `source` with `weights` on this backend. The common options (ARCHITECTURE.md: `preset`, `config`,
        `dtype`, `numerics`, `device`, `max_batch`, `max_positions`; `random_weights`, `seed`, `progress`) come as a
        `LoadOptions`, as keywords, or both (keywords win); the remaining keywords are this backend's own, listed
        in `options`. Returns a `LoadedModel`.

        Raises BackendError (dtype, device, numerics, option, or its framework is missing), LoadError
        (source, config, weights), OSError (an unreadable source)."""
        from linnet.runtimes.loading import LOAD_OPTION_NAMES, LoadOptions

        common = {k: v for k, v in kwargs.items() if k in LOAD_OPTION_NAMES}
        own = {k: v for k, v in kwargs.items() if k not in LOAD_OPTION_NAMES}
        options = replace(options or LoadOptions(), **common)
        unknown = sorted(set(own) - set(self.options))
        if unknown:
            takes = f"takes {', '.join(self.options)}" if self.options else "takes none"
            raise BackendError(f"backend {self.name} has no option {', '.join(unknown)} ({takes})")
        check_options(self, options.dtype, options.numerics, options.device)
        missing = self._missing()
        if missing:
            raise BackendError(missing)
        runtime = self.runtime_module()
        problem = runtime.device_problem(options.device)  # before anything is loaded: a reason, not a traceback
        if problem is not None:
            raise BackendError(f"backend {self.name}: {problem}")
        return runtime.load(source, weights, options, self.mode, **own)

    @property
    def can_train(self) -> bool:
        return self.trainer is not None

    def trainer_module(self) -> Any:
        """The training module of this backend (`trainer`; imports its framework). Raises BackendError for a backend
        that does not train, TrainError (`linnet train` exits 2) naming what to install when its framework is
        missing (`--backend torch` on a machine without torch was an ImportError's traceback)."""
        if self.trainer is None:
            raise BackendError(f"backend {self.name} does not train ({self.label} runs inference only)")
        missing = self._missing()
        if missing is not None:
            raise TrainError(f"training on {missing}")
        return importlib.import_module(f"linnet.runtimes.train.{self.trainer}")

    def setup_process(self, device: str = "cpu", instances: int | None = None) -> str:
        """Set this process up to run the backend, before loading: its framework's persistent compile cache
        (`caches.enable`) and, on PyTorch, its thread count (one thread per idle core of the process's CPU affinity;
        with `instances`, an equal share of the cores for each of that many processes serving one model, Triton's
        instances). Returns a note of what was chosen ("" when nothing is worth saying), and does nothing when the
        backend cannot run on `device` here (loading then says why)."""
        from linnet.runtimes.backends import caches

        if self.unavailable(device, probe=False) is not None:
            return ""
        caches.enable(self.family)  # before the runtime module imports its framework
        return self.runtime_module().setup_process(self, instances)

    def runtime_module(self) -> Any:
        """The runtime module under `linnet.runtimes.backends` that loads this backend's models (imports its
        framework)."""
        return importlib.import_module(f"linnet.runtimes.backends.{self.runtime}")

    def unavailable(self, device: str = "cpu", probe: bool = True) -> str | None:
        """Why this backend cannot run on `device` here, or None when it can. Checks the device
        kind against `devices` and that the modules it needs are installed; with `probe`, also asks
        the framework whether the device exists (which imports it: torch for `cuda-graphs`), else
        answers from what is installed alone (the language server, which imports no framework)."""
        kind = device_kind(device)
        if kind not in self.devices:
            return f"{self.name} runs on {' or '.join(self.devices)}, not {device}"
        missing = self._missing()
        if missing or not probe:
            return missing
        return self.runtime_module().device_problem(device)

    def describe(self, device: str = "cpu", probe: bool = False) -> dict[str, Any]:
        """The record as JSON for the language server's `linnet/backends` (camelCase keys), with
        `available` and `reason` for `device`."""
        reason = self.unavailable(device, probe)
        return {
            "name": self.name,
            "label": self.label,
            "family": self.family,
            "summary": self.summary,
            "codeView": self.code_view,
            "dtypes": list(self.dtypes),
            "devices": list(self.devices),
            "numerics": list(self.numerics),
            "canTrain": self.can_train,
            "available": reason is None,
            "reason": reason,
        }

    def _missing(self) -> str | None:
        for module in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"{self.name} needs {module}, which is not installed (pip install '{EXTRAS[self.family]}')"
        return None


TORCH_DTYPES = ("f32", "bf16", "f16")

# One line per backend, in the order menus list them.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "torch-interpret", "PyTorch (interpreter)", "torch", "torch_backend", "interpret",
            "the Core IR op by op (the `equivalent` reference)", None, TORCH_DTYPES, ("cpu", "cuda"), ("torch",),
            trainer="trainer", tensor_parallel="torch_tp",
        ),
        Backend(
            "torch", "PyTorch", "torch", "torch_backend", "generated",
            "the generated PyTorch, eager", "torch", TORCH_DTYPES, ("cpu", "cuda"), ("torch",), trainer="trainer",
            tensor_parallel="torch_tp", stored=True,
        ),
        Backend(
            "torch-compile", "PyTorch (torch.compile)", "torch", "torch_backend", "inductor",
            "the generated PyTorch, decode step under torch.compile", "torch", TORCH_DTYPES, ("cpu", "cuda"),
            ("torch",), thread_specific=True, trainer="trainer", tensor_parallel="torch_tp", stored=True,
        ),
        Backend(
            "cuda-graphs", "PyTorch (CUDA graphs)", "torch", "torch_backend", "cuda-graphs",
            "the decode step replayed as a CUDA graph", "torch", TORCH_DTYPES, ("cuda",), ("torch",),
            thread_specific=True,
        ),
        Backend(
            "jax", "JAX", "jax", "jax_backend", "generated",
            "the generated JAX under jax.jit", "jax", ("f32", "bf16"), ("cpu", "cuda", "tpu"), ("jax", "jaxlib"),
            options=("fuse_linear_weights", "scan_layers", "cpu_offload_gb"), trainer="jax_trainer",
            tensor_parallel="jax_mesh",
            stored=True,
        ),
        Backend(
            "xla", "XLA", "jax", "jax_backend", "stablehlo",
            "the exported StableHLO artifact on XLA", "stablehlo", ("f32", "bf16"), ("cpu", "cuda", "tpu"),
            ("jax", "jaxlib"), options=("scan_layers", "cpu_offload_gb"), tensor_parallel="jax_mesh", stored=True,
        ),
        Backend(
            "onnxruntime", "ONNX Runtime", "onnx", "onnx_backend", None,
            "the .onnx graph on ONNX Runtime", "onnx", ("f32", "f16", "bf16"), ("cpu", "cuda"),
            ("onnx", "onnx_ir", "onnxruntime"), options=("providers", "threads", "share_buffer", "params"), stored=True,
        ),
    )
}  # fmt: skip


def get_backend(name: str) -> Backend:
    """The record of backend `name`. Raises BackendError naming the backends."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise BackendError(f"unknown backend `{name}` (backends: {', '.join(BACKENDS)})") from None


def backend_for(runtime: str, mode: str | None) -> Backend:
    """The record a runtime module's `load(..., mode=mode)` serves (`backend_for("jax_backend",
    "stablehlo")` is `xla`). Raises BackendError naming the modes."""
    for b in BACKENDS.values():
        if b.runtime == runtime and b.mode == mode:
            return b
    modes = [b.mode for b in BACKENDS.values() if b.runtime == runtime]
    raise BackendError(f"mode must be one of {', '.join(str(m) for m in modes)}, got {mode!r}")


def device_kind(device: str) -> str:
    """The kind of a device string: "cuda:1" and "gpu" are "cuda", "cpu" is "cpu"."""
    kind = str(device).split(":")[0].strip().lower()
    return "cuda" if kind == "gpu" else kind


def check_options(backend: Backend, dtype: str, numerics: str, device: str) -> None:
    """Refuse a dtype, numerics or device kind `backend` does not support. Raises BackendError
    saying what it supports."""
    if dtype == STORED:
        if not backend.stored:
            which = ", ".join(b.name for b in BACKENDS.values() if b.stored)
            raise BackendError(
                f"--dtype stored (GGUF weights kept quantized) is not built for {backend.name}: it runs on {which}; "
                f"{backend.name} runs the dequantized weights ({', '.join(backend.dtypes)})"
            )
        dtype = working_dtype(dtype)
    if dtype not in backend.dtypes:
        raise BackendError(f"{backend.name} runs {', '.join(backend.dtypes)}, got dtype {dtype!r}")
    if numerics not in backend.numerics:
        raise BackendError(f"numerics must be one of {', '.join(backend.numerics)}, got {numerics!r}")
    if device_kind(device) not in backend.devices:
        raise BackendError(f"{backend.name} runs on {' or '.join(backend.devices)}, got device {device!r}")
