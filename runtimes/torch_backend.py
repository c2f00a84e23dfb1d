"""`linnet.torch.load`: a source and its weights as a runnable PyTorch model.

The backend (`linnet.compiler.torch`) turns the Core IR into an `nn.Module` with empty
parameters; this binds the checkpoint's tensors to it (dequantized GGUF tensors included),
cast to the working dtype, with a progress bar on stderr for loads over a second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from linnet.compiler.torch.module import BackendError, LinnetModule, compile_program, torch_dtype

from .loading import LoadedModel, LoadError, Prepared, planned_tensors, prepare

BACKEND_MODES = {
    "torch-interpret": "interpret",
    "torch": "generated",
    "torch-compile": "inductor",
    "cuda-graphs": "cuda-graphs",
}


@dataclass
class TorchModel(LoadedModel):
    """A loaded model. Entries are methods taking and returning torch tensors on `device`
    (`forward`, `step`, ...); `step_model()` adapts `step` to the generation runner (numpy).
    `load_s` is the load time in seconds (checking, lowering, compiling, binding weights)."""

    module: LinnetModule
    prepared: Prepared
    load_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def __getattr__(self, name: str):
        module = self.__dict__.get("module")
        if module is not None and name in module.program.entries:
            return module.entry(name)
        raise AttributeError(name)

    def step_model(self) -> "TorchStepModel":
        return TorchStepModel(self.module)


class TorchStepModel:
    """The runner's `StepModel` over a torch `step`: numpy in, numpy f32 logits out."""

    def __init__(self, module: LinnetModule):
        self.module = module
        program = module.program
        self.max_batch = program.max_batch
        self.max_positions = program.max_positions
        self.vocab_size = program.entries["step"].outputs[0].dims[-1].as_int()
        self._device = module.device_

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        d = self._device
        with torch.inference_mode():
            logits = self.module.step(
                torch.from_numpy(np.ascontiguousarray(input_ids, dtype=np.int64)).to(d),
                torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)).to(d),
                torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(d),
            )
        return logits.float().cpu().numpy()


def load(
    source: str | Path,
    weights: str | Path | None = None,
    preset: str | None = None,
    config: dict[str, Any] | None = None,
    dtype: str = "f32",
    numerics: str = "equivalent",
    device: str = "cpu",
    max_batch: int = 1,
    max_positions: int = 768,
    mode: str = "generated",
    random_weights: bool = False,
    seed: int = 0,
    progress: bool = True,
) -> TorchModel:
    """Load `source` with `weights` for PyTorch in `mode` ("interpret", "generated",
    "inductor", "cuda-graphs"). Without weights and with `random_weights`, parameters are
    drawn from N(0, 0.02) (norm scales 1, biases 0) with `seed`.

    Raises LoadError (source, config, names or shapes) and BackendError (mode, device)."""
    t0 = time.perf_counter()
    prepared = prepare(source, weights, preset, config, dtype, max_batch, max_positions, random_weights=random_weights)
    module = compile_program(prepared.program, mode, numerics, device)
    if prepared.checkpoint is not None:
        _bind_checkpoint(module, prepared, progress)
    else:
        _bind_random(module, prepared, seed)
    return TorchModel(module, prepared, time.perf_counter() - t0, list(prepared.notes))


def _bind_checkpoint(module: LinnetModule, prepared: Prepared, progress: bool) -> None:
    for path, tensor in planned_tensors(prepared, progress, torch_dtype(prepared.program.dtype.name)):
        try:
            module.bind(path, tensor)
        except ValueError as err:
            raise LoadError(f"error[L501]: {err}") from err


def _bind_random(module: LinnetModule, prepared: Prepared, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for spec in prepared.program.params:
        shape = spec.shape
        if spec.path.endswith("bias"):
            t = torch.zeros(shape)
        elif len(shape) == 1:
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=g) * 0.02
        module.bind(spec.path, t)


__all__ = ["load", "TorchModel", "TorchStepModel", "LoadError", "BackendError", "BACKEND_MODES"]
