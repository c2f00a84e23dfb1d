"""Running one model across processes or devices on the engines people already run:
`torch.distributed` (torchrun; gloo on CPU, NCCL on GPU) and JAX sharding over a device mesh.

- `plan`: which weights a tensor-parallel run splits and how (transformers' `base_model_tp_plan`).
- `torch_tp`: tensor-parallel inference on PyTorch: parameters as DTensors sharded by that plan over a
  `DeviceMesh`; the generated code runs unchanged under DTensor's sharding propagation.
- `jax_mesh`: the same on JAX: parameters as `NamedSharding`s of a `Mesh` by checkpoint name, the entries
  under `jax.jit`, which partitions them (GSPMD).

Nothing here is imported by `linnet.runtimes` itself: importing `torch_tp` imports torch, `jax_mesh` jax.
"""
