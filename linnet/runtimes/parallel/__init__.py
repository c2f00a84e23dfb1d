"""Running one model across processes or devices on the engines people already run:
`torch.distributed` (torchrun; gloo on CPU, NCCL on GPU) and JAX sharding over a device mesh.

- `plan`: which weights a tensor-parallel run splits and how (transformers' `base_model_tp_plan`).
- `torch_tp`: tensor-parallel inference on PyTorch: parameters as DTensors sharded by that plan over a
  `DeviceMesh`; the generated code runs unchanged under DTensor's sharding propagation.
- `jax_mesh`: the same on JAX: parameters as `NamedSharding`s of a `Mesh` by checkpoint name, the entries
  under `jax.jit`, which partitions them (GSPMD).

Nothing here is imported by `linnet.runtimes` itself: importing `torch_tp` imports torch, `jax_mesh` jax;
`tensor_parallel(model)` picks the one the model's backend record names (`linnet generate --tensor-parallel`).
"""

from __future__ import annotations

import importlib
from typing import Any

from linnet.errors import BackendError

__all__ = ["load_options", "tensor_parallel"]


def load_options(backend: Any) -> dict[str, Any]:
    """The load options a tensor-parallel run of `backend` (a registry `Backend`) needs (JAX:
    `fuse_linear_weights=False`, every weight under the checkpoint name its split is planned by); {} for a backend
    that does not split (`tensor_parallel` then says why)."""
    return {} if backend.tensor_parallel is None else _splitter(backend).LOAD_OPTIONS


def tensor_parallel(model: Any) -> tuple[Any, bool]:
    """`model` (a `LoadedModel` of a backend whose record names a `tensor_parallel` module, loaded with
    `load_options`) split for tensor-parallel inference: over the torchrun processes on PyTorch (`torch_tp`), over
    every device on JAX (`jax_mesh`). Returns (the model, whether this process is the one that reports: rank 0, or
    always on JAX). Raises BackendError for another backend, outside torchrun on PyTorch, or a plan that does not
    fit."""
    from linnet.runtimes.backends import BACKENDS, get_backend

    backend = get_backend(model.backend)
    if backend.tensor_parallel is None:
        which = ", ".join(b.name for b in BACKENDS.values() if b.tensor_parallel is not None)
        raise BackendError(f"tensor parallelism runs on {which}, not {model.backend}")
    return _splitter(backend).tensor_parallel(model)


def _splitter(backend: Any) -> Any:
    return importlib.import_module(f"{__name__}.{backend.tensor_parallel}")
