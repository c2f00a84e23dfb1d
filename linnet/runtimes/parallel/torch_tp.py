"""Tensor-parallel inference on PyTorch: the generated module's parameters as DTensors
(`torch.distributed.tensor`) split by the plan (`plan.LLAMA_TP_PLAN`) over a 1-D `DeviceMesh` of the
torchrun processes, and the generated code run unchanged.

    torchrun --nproc-per-node 2 script.py       # gloo on CPU, NCCL on CUDA, by the same code
    model = load_tensor_parallel("examples/llama.linnet", weights="folder")
    result = Generator(model.step_model(), model.tokenizer()).generate(prompt_ids, params)

Why DTensor and not `parallelize_module(..., ColwiseParallel/RowwiseParallel)`: those styles act
through forward hooks on each `nn.Linear`, and the generated code calls `F.linear(x, self.q_proj.weight)`
on the module tree's parameters (no submodule call). DTensor's sharding propagation gives the same
program: `F.linear` of a replicated input with a weight split on dim 0 gives an output split on its
features, which the generated `reshape`/`transpose` turn into a split on heads, so attention (and
the KV cache, split on heads) runs on each rank's own heads with no communication; `F.linear` with a
weight split on dim 1 gives partial sums, which `RowwiseOutputs` all-reduces at once, as
`RowwiseParallel(output_layouts=Replicate())` does. Two all-reduces a decoder layer, the logits
replicated on every rank (checked with `CommDebugMode` in tests/runtimes/parallel).

Each rank reads the whole checkpoint and keeps its shards (`distribute_tensor`): loading the shards
alone is left for later.
"""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication
from torch.overrides import TorchFunctionMode

from linnet.errors import BackendError
from linnet.runtimes.backends import backend_for
from linnet.runtimes.backends.torch_backend import TorchModel, TorchStepModel, to_numpy, to_torch

from ..model import step_entry
from .plan import LLAMA_TP_PLAN, check_plan, split_dim

__all__ = [
    "LOAD_OPTIONS",
    "tensor_parallel",
    "init_mesh",
    "finish",
    "shard_model",
    "load_tensor_parallel",
    "TensorParallelModel",
    "RowwiseOutputs",
]

# the process group's backend for a device kind: what torchrun users pick
DIST_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def init_mesh(device: str = "cpu") -> DeviceMesh:
    """A 1-D mesh ("tp") over every process of this run, initialising the default process group from
    torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with gloo on CPU and NCCL on CUDA
    when it is not initialised yet. Raises BackendError outside torchrun."""
    kind = torch.device(device).type
    if kind not in DIST_BACKENDS:
        raise BackendError(f"tensor parallelism runs on cpu (gloo) or cuda (nccl), not {device!r}")
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise BackendError(
                f"tensor parallelism on PyTorch runs under torchrun (no {', '.join(missing)} in the environment): "
                "torchrun --nproc-per-node N ..."
            )
        if kind == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(DIST_BACKENDS[kind])
        atexit.register(finish)
    return init_device_mesh(kind, (dist.get_world_size(),), mesh_dim_names=("tp",))


FINISH_TIMEOUT_S = 300  # how long a rank waits at exit for the others to be done with their work


def finish() -> None:
    """Meet every other rank at a barrier, then destroy the default process group (where it still exists).
    `init_mesh` registers this at exit. Each rank used to destroy the group as soon as it was done: a rank that
    finished first closed gloo's connections while another still communicated or ran, and that one sometimes
    aborted after its work ("terminate called without an active exception", exit -6; 1 run in ~10 to 1 in 46 of the
    two-rank test). Torch asks for the group to be destroyed before exit, and for no rank to leave a collective
    behind. A rank that fails leaves the others at the barrier until torchrun stops them, or FINISH_TIMEOUT_S
    (gloo's monitored barrier, which names the missing ranks), after which the group is destroyed anyway."""
    if not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=FINISH_TIMEOUT_S))
        else:
            dist.barrier()
    except RuntimeError as err:  # a rank that never came: still leave with the group destroyed
        print(f"linnet: tensor-parallel teardown: {err}", file=sys.stderr)
    finally:
        dist.destroy_process_group()


class RowwiseOutputs(TorchFunctionMode):
    """All-reduces the partial sums of a row-parallel linear layer as soon as `F.linear` (or a matmul)
    makes them (`Partial` -> `Replicate`), so the residual stream stays replicated between layers, as
    `RowwiseParallel(output_layouts=Replicate())` leaves it. (Left partial, DTensor would still be exact,
    but the generated code's in-place ops, such as `masked_fill_` on attention scores, cannot change a
    placement.)"""

    OPS = (F.linear, torch.matmul, torch.Tensor.__matmul__)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention and any(isinstance(a, DTensor) for a in args):
            return _attention_on_own_heads(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if func in self.OPS and isinstance(out, DTensor) and any(isinstance(p, Partial) for p in out.placements):
            out = out.redistribute(out.device_mesh, [Replicate()])
        return out


def _attention_on_own_heads(q, k, v, attn_mask=None, **kwargs):
    """`F.scaled_dot_product_attention` of DTensors: q [B, H, S, D], k, v [B, KV, T, D] split on their heads
    (dim 1), each rank attending with its own heads, as the module docstring describes. DTensor cannot propagate
    the call itself (torch 2.13 registers no sharding strategy for the CPU flash kernel the call dispatches to),
    and heads are independent, so each rank calls it on its local shards: the same kernel on the same values as
    one process runs for those heads. A mask [B, 1, S, T] or [B, S, T] is the same for every head and replicated.
    Anything else (another split, a mask per head) runs on the full tensors, replicated: exact, but each rank
    computes every head."""
    heads = (Shard(1),)
    if all(isinstance(t, DTensor) and t.placements == heads for t in (q, k, v)) and (
        attn_mask is None or attn_mask.dim() < 4 or attn_mask.shape[1] == 1
    ):
        mask = attn_mask.full_tensor() if isinstance(attn_mask, DTensor) else attn_mask
        out = F.scaled_dot_product_attention(q.to_local(), k.to_local(), v.to_local(), attn_mask=mask, **kwargs)
        return DTensor.from_local(out, q.device_mesh, heads, run_check=False)
    full = [t.full_tensor() if isinstance(t, DTensor) else t for t in (q, k, v, attn_mask)]
    return F.scaled_dot_product_attention(*full[:3], attn_mask=full[3], **kwargs)


def _local(out):
    """Entry outputs as plain tensors (the full value on every rank)."""
    if isinstance(out, tuple):
        return tuple(_local(o) for o in out)
    return out.full_tensor() if isinstance(out, DTensor) else out


def shard_model(model: TorchModel, mesh: DeviceMesh, plan: dict[str, str] = LLAMA_TP_PLAN) -> "TensorParallelModel":
    """`model` with its parameters and KV caches split over `mesh` by `plan` (`plan.split_dim`), the others
    replicated, as DTensors in place. Raises BackendError when the plan does not fit the model (no matching
    parameter, heads that do not divide by the mesh size)."""
    module = model.module
    if module.mode not in ("generated", "interpret"):
        raise BackendError(
            f"tensor parallelism runs the eager modes (backend torch or torch-interpret), not {module.mode}"
        )
    params = [t.path for t in model.program.params]
    check_plan(params, model.config, mesh.size(), plan)
    for path, (owner, leaf) in module._leaves.items():
        current = getattr(owner, leaf)
        dim = split_dim(path, plan)
        placement = Shard(dim) if dim is not None else Replicate()
        sharded = distribute_tensor(current.detach(), mesh, [placement])
        if isinstance(current, nn.Parameter):
            owner.register_parameter(leaf, nn.Parameter(sharded, requires_grad=False))
        else:
            owner.register_buffer(leaf, sharded, persistent=False)
        module.tensors[path] = getattr(owner, leaf)
    fields = {k: v for k, v in model.__dict__.items() if k in TorchModel.__dataclass_fields__}
    return TensorParallelModel(**fields, mesh=mesh)


@dataclass
class TensorParallelModel(TorchModel):
    """A `TorchModel` whose parameters are split over `mesh` (`shard_model`); every rank runs the same
    calls with the same inputs and gets the same, full outputs. Entries run under `torch.no_grad` (DTensor
    writes to the KV cache are refused under `torch.inference_mode`)."""

    mesh: Any = None

    def _call(self, entry: str, tensors: list[torch.Tensor]):
        fn = self.module.entry(entry)
        with torch.no_grad(), implicit_replication(), RowwiseOutputs():
            return _local(fn(*tensors))

    def _native_entry(self, entry: str) -> Callable:
        return lambda *tensors: self._call(entry, list(tensors))

    def _run_arrays(self, entry: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = self._call(entry, [to_torch(a).to(self.module.device_) for a in arrays])
        return [to_numpy(t) for t in (out if isinstance(out, tuple) else (out,))]

    def step_model(self) -> "TensorParallelStepModel":
        return TensorParallelStepModel(self)


class TensorParallelStepModel(TorchStepModel):
    """The runner's `StepModel` over a tensor-parallel `step` (numpy in, numpy f32 logits out, the same on
    every rank, so every rank's runner picks the same tokens)."""

    def __init__(self, model: TensorParallelModel):
        super().__init__(model.module)
        self.model = model

    def step(self, input_ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        entry = step_entry(self.module.program.entries, input_ids.shape[1])
        arrays = (input_ids, positions, rows)
        tensors = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self._device) for a in arrays]
        return self.model._call(entry, tensors).float().cpu().numpy()


LOAD_OPTIONS: dict[str, Any] = {}  # what `linnet.runtimes.parallel.load_options` adds to a load to be split here


def tensor_parallel(model: TorchModel) -> tuple[TensorParallelModel, bool]:
    """`model` split over every torchrun process (`init_mesh` on its device); whether this process reports (rank 0).
    Raises BackendError outside torchrun or for a plan that does not fit."""
    import torch.distributed as dist

    mesh = init_mesh(str(model.module.device_))
    return shard_model(model, mesh), dist.get_rank() == 0


def load_tensor_parallel(
    source: str | Path,
    weights: str | Path | None = None,
    mesh: DeviceMesh | None = None,
    plan: dict[str, str] = LLAMA_TP_PLAN,
    **options: Any,
) -> TensorParallelModel:
    """`linnet.torch.load(source, weights, **options)` (mode "generated" unless given), split over `mesh`
    (default: `init_mesh(device)`, every torchrun process). Raises what `load` raises, and BackendError
    (outside torchrun, a plan that does not fit)."""
    mesh = mesh if mesh is not None else init_mesh(options.get("device", "cpu"))
    model = backend_for("torch_backend", options.pop("mode", "generated")).load(source, weights, **options)
    return shard_model(model, mesh, plan)
