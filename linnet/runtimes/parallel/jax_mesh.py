"""Tensor-parallel inference on JAX: the parameters as `NamedSharding`s of a device `Mesh`, split by
checkpoint name as the plan says (`plan.LLAMA_TP_PLAN`), and the entries under `jax.jit`, which
partitions the program over the mesh (GSPMD) and inserts the collectives itself.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python script.py   # two CPU devices
    model = load_tensor_parallel("examples/llama.linnet", weights="folder")
    result = Generator(model.step_model(), model.tokenizer()).generate(prompt_ids, params)

The same code runs on one host's devices and across hosts: `initialize_distributed()` calls
`jax.distributed.initialize()` when a multi-host environment is set (JAX_COORDINATOR_ADDRESS, or a
cluster JAX detects such as SLURM), after which `jax.devices()` lists every host's devices and the mesh
spans them.

The model is loaded with `fuse_linear_weights=False`, so every weight keeps its checkpoint name (a fused
q/k/v weight split in two would cut across its members). KV caches, held as [max_batch * H, T, D] on this
backend, are split on dim 0: with max_batch 1 that is on heads, like the k_proj/v_proj outputs that fill
them. Inputs and outputs are replicated. GSPMD keeps the result exact whatever the split; the split
decides only what moves between devices.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from linnet.compiler.jax.x64 import ScopedJit, x64_scoped
from linnet.errors import BackendError
from linnet.runtimes.backends import backend_for
from linnet.runtimes.backends.jax_backend import JaxModel, jax_module

from .plan import LLAMA_TP_PLAN, check_plan, split_dim

__all__ = [
    "LOAD_OPTIONS",
    "tensor_parallel",
    "initialize_distributed",
    "make_mesh",
    "param_sharding",
    "shard_model",
    "load_tensor_parallel",
]

AXIS = "tp"
# what `jax.distributed.initialize()` reads when it is given no arguments (an explicit coordinator)
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"


def initialize_distributed() -> bool:
    """Join a multi-host JAX run when its environment says there is one (JAX_COORDINATOR_ADDRESS with
    JAX_NUM_PROCESSES and JAX_PROCESS_ID, read by `jax.distributed.initialize()`); on one host, do nothing.
    Returns whether it initialised. Idempotent."""
    jax = jax_module()
    if COORDINATOR_ENV not in os.environ or jax.distributed.is_initialized():
        return False
    jax.distributed.initialize()
    return True


def make_mesh(devices: list | None = None, axis: str = AXIS):
    """A 1-D `jax.sharding.Mesh` named `axis` over `devices` (default: every device of the run, across
    hosts when `initialize_distributed` joined one). Tensor parallelism names it "tp", the JAX trainer's data
    parallelism "batch"."""
    jax = jax_module()
    initialize_distributed()
    devices = list(devices) if devices is not None else jax.devices()
    return jax.sharding.Mesh(np.array(devices), (axis,))


def param_sharding(
    mesh, path: str, rank: int, plan: dict[str, str] = LLAMA_TP_PLAN, state: bool = False, cache_layout: str = "flat"
):
    """The `NamedSharding` of tensor `path` of rank `rank`: split on `plan`'s dim for a parameter; for a KV cache,
    on its heads: dim 0 held flat ([max_batch * H, T, D]), dim 2 held token-major ([max_batch, T, H * D]);
    replicated otherwise."""
    jax = jax_module()
    P = jax.sharding.PartitionSpec
    dim = split_dim(path, plan)
    if dim is not None and state:
        dim = 0 if cache_layout == "flat" else 2
    spec = [None] * rank
    if dim is not None:
        spec[dim] = mesh.axis_names[0]
    return jax.sharding.NamedSharding(mesh, P(*spec))


@x64_scoped
def shard_model(model: JaxModel, mesh, plan: dict[str, str] = LLAMA_TP_PLAN) -> JaxModel:
    """`model` (loaded with `fuse_linear_weights=False`) with its parameters and KV cache placed on `mesh`
    by `plan`, and its entries jitted with those shardings (the state keeps its sharding from step to step,
    outputs replicated). In place; returns `model`. Raises BackendError for fused weights, stacked layers
    (`scan_layers=True`), a StableHLO artifact (`--backend xla`), weights held quantized (`--dtype stored`), layers
    held in host memory (`--cpu-offload-gb`) or a plan that does not fit."""
    jax = jax_module()
    from linnet.compiler.jax.module import compile_program

    if model.offload is not None:
        raise BackendError("--cpu-offload-gb and tensor parallelism do not combine (not built): give one")
    fused = [k for k in model.params if "{" in k]
    if fused:
        raise BackendError(
            f"shard a JAX model loaded with fuse_linear_weights=False (it has fused weights: {fused[0]})"
        )
    stacked = [k for k in model.params if ".*." in k]  # the plan names each layer's weights: auto unrolls them
    if stacked:
        raise BackendError(f"shard a JAX model loaded with scan_layers=False (it holds `{stacked[0]}` stacked)")
    if model.mode != "generated" or model.prepared is None:
        raise BackendError("tensor parallelism on JAX runs the generated code (backend jax), not an exported artifact")
    if any(isinstance(v, tuple) for v in model.params.values()):
        raise BackendError("tensor parallelism on JAX shards dense weights, not --dtype stored's quantized ones")
    check_plan(list(model.params), model.config, mesh.size, plan)
    model.params = {k: jax.device_put(v, param_sharding(mesh, k, v.ndim, plan)) for k, v in model.params.items()}
    model.state = {
        k: jax.device_put(v, param_sharding(mesh, k, v.ndim, plan, state=True, cache_layout=model.cache_layout))
        for k, v in model.state.items()
    }
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state_shardings = {k: v.sharding for k, v in model.state.items()}
    compiled = compile_program(
        model.prepared.program, model.numerics, fuse_linear_weights=False, cache_layout=model.cache_layout
    )
    functions = {}
    for name in model.functions:
        stateful = model.stateful[name]
        out = (replicated, state_shardings) if stateful else replicated
        jitted = jax.jit(compiled.entry_fn(name), out_shardings=out, donate_argnums=(1,) if stateful else ())
        functions[name] = ScopedJit(jitted)
    model.functions = functions
    model.step_executables.clear()
    model.input_sharding = replicated
    model.device = mesh.devices.flat[0]
    return model


# what `linnet.runtimes.parallel.load_options` adds to a load to be split here: every weight under its checkpoint
# name, which the plan splits by
LOAD_OPTIONS: dict[str, Any] = {"fuse_linear_weights": False}


def tensor_parallel(model: JaxModel) -> tuple[JaxModel, bool]:
    """`model` sharded over every device (`make_mesh()`); this one process always reports. Raises BackendError for
    a plan that does not fit."""
    return shard_model(model, make_mesh()), True


def load_tensor_parallel(
    source: str | Path,
    weights: str | Path | None = None,
    mesh=None,
    plan: dict[str, str] = LLAMA_TP_PLAN,
    **options: Any,
) -> JaxModel:
    """`linnet.jax.load(source, weights, fuse_linear_weights=False, **options)` sharded over `mesh`
    (default `make_mesh()`: every device). Raises what `load` raises, and BackendError."""
    mesh = mesh if mesh is not None else make_mesh()
    backend = backend_for("jax_backend", options.pop("mode", "generated"))
    return shard_model(backend.load(source, weights, **LOAD_OPTIONS, **options), mesh, plan)
