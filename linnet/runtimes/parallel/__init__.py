"""Running one model across processes or devices on the engines people already run:
`torch.distributed` (torchrun; gloo on CPU, NCCL on GPU) and JAX sharding over a device mesh.

- `plan`: which weights a tensor-parallel run splits and how (transformers' `base_model_tp_plan`).
- `torch_tp`: tensor-parallel inference on PyTorch: parameters as DTensors sharded by that plan over a
  `DeviceMesh`; the generated code runs unchanged under DTensor's sharding propagation.
- `jax_mesh`: the same on JAX: parameters as `NamedSharding`s of a `Mesh` by checkpoint name, the entries
  under `jax.jit`, which partitions them (GSPMD).

Nothing here is imported by `linnet.runtimes` itself: importing `torch_tp` imports torch, `jax_mesh` jax;
`tensor_parallel(model)` picks one by the model's backend (`linnet generate --tensor-parallel`).
"""

from __future__ import annotations

from typing import Any

from linnet.errors import BackendError

__all__ = ["tensor_parallel"]


def tensor_parallel(model: Any) -> tuple[Any, bool]:
    """`model` (a `LoadedModel` of the torch or jax family; on JAX loaded with `fuse_linear_weights=False`) split
    for tensor-parallel inference: over the torchrun processes on PyTorch (`torch_tp`), over every device on JAX
    (`jax_mesh`). Returns (the model, whether this process is the one that reports: rank 0, or always on JAX).
    Raises BackendError for another backend, outside torchrun on PyTorch, or a plan that does not fit."""
    family = "jax" if model.backend in ("jax", "xla") else "torch" if model.backend.startswith("torch") else None
    if family == "torch":
        import torch.distributed as dist

        from .torch_tp import init_mesh, shard_model

        mesh = init_mesh(str(model.module.device_))
        return shard_model(model, mesh), dist.get_rank() == 0
    if family == "jax":
        from .jax_mesh import make_mesh, shard_model

        return shard_model(model, make_mesh()), True
    raise BackendError(f"tensor parallelism runs on the PyTorch and JAX backends, not {model.backend}")
