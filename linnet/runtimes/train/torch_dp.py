"""Data parallel and FSDP2 training on PyTorch through `torch.distributed`, launched by torchrun:

    torchrun --nproc-per-node 2 -m linnet train FILE --weights W --method sft --data D.jsonl -o OUT
    torchrun --nproc-per-node 2 -m linnet train ... --fsdp

Each optimizer step's global micro-batch (`per_device_train_batch_size x ranks` rows, in the order one process
would take them) is split into consecutive slices, one a rank; the loss normaliser is the step's loss tokens
over every rank (`reduce_sum`, an all-reduce), so each rank's loss is its share of the one-process loss and the
sum of the ranks' gradients is the one-process gradient. Two engines, chosen by `fsdp`:

- DDP (`torch.nn.parallel.DistributedDataParallel`): parameters replicated, gradients all-reduced in buckets
  during the backward pass. DDP averages them; a comm hook sums them instead (our losses are already shares of
  the global mean).
- FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer state sharded across the
  ranks (DTensors), all-gathered for the forward and backward, gradients reduce-scattered and summed
  (`set_gradient_divide_factor(1.0)` with plain SUM reductions: gloo has no PREMUL_SUM). The model is one FSDP
  unit: the generated code calls each decoder layer's `forward` directly, which skips the per-layer hooks
  `fully_shard(layer)` would need.

Both wrap the `LinnetModule`, whose `__call__` runs the `forward` entry, so their hooks run. gloo on CPU, NCCL on
CUDA: the same code. Only rank 0 writes the output and the metrics; the records it writes are the global
step's (losses and token counts summed over the ranks).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from linnet.errors import TrainError

from ..parallel.torch_tp import DIST_BACKENDS, init_mesh
from .data import TokenRow, batches

__all__ = ["DataParallel", "data_parallel", "global_record"]

# the records' fields that are sums over a step's rows (summed over the ranks too)
SUMMED = ("loss", "num_loss_tokens", "num_tokens")


@dataclass
class DataParallel:
    """What the trainer takes for a distributed run: `reduce_sum`, this rank's `micro_batches`, `is_main`."""

    rank: int
    ranks: int
    reduce_sum: Any
    micro_batches: Iterator[list[TokenRow]]

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _sum_hook(state, bucket):
    """A DDP comm hook: all-reduce the bucket as a sum (DDP's default divides by the world size)."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class _SyncLastMicroBatch:
    """DDP's call, all-reducing gradients in the backward pass of each step's last micro-batch only (what
    `DistributedDataParallel.no_sync()` does for the others): DDP all-reduces a parameter's whole `.grad`,
    so reducing after every micro-batch would count the earlier micro-batches' reduced gradients again.
    Forwards without gradients (a reference model's) are not counted."""

    def __init__(self, ddp, accumulation: int):
        self.ddp, self.accumulation, self.calls = ddp, accumulation, 0

    def __call__(self, *inputs):
        if torch.is_grad_enabled():
            self.calls += 1
            self.ddp.require_backward_grad_sync = self.calls % self.accumulation == 0
        return self.ddp(*inputs)


def data_parallel(policy, rows: Sequence[TokenRow], config, fsdp: bool = False) -> DataParallel:
    """Join torchrun's process group (gloo on CPU, NCCL on CUDA), wrap `policy`'s module in DDP or FSDP2, and
    give this rank its slices of the global micro-batches. Raises TrainError when a short last micro-batch
    would leave a rank without rows."""
    from torch.nn.parallel import DistributedDataParallel

    init_mesh(policy.device.type if policy.device.type in DIST_BACKENDS else "cpu")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    per_rank = config.per_device_train_batch_size
    size = per_rank * ranks
    tail = len(rows) % size
    if 0 < tail < ranks:
        raise TrainError(
            f"{len(rows)} rows in global micro-batches of {size} ({per_rank} a rank x {ranks} ranks) leave a last "
            f"micro-batch of {tail}, fewer than the ranks: give a row count that splits, or another batch size"
        )
    module = policy.module
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(module, mesh=init_mesh(policy.device.type))
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM; a factor of 1 needs no scaling
        named = dict(module.named_parameters())
        policy.trainable = {name: named[name] for name in policy.trainable}  # now DTensors
        policy.forward_module = module
    else:
        devices = None if policy.device.type == "cpu" else [policy.device]
        ddp = DistributedDataParallel(module, device_ids=devices, broadcast_buffers=False)  # buffers: the KV cache
        ddp.register_comm_hook(None, _sum_hook)
        policy.forward_module = _SyncLastMicroBatch(ddp, config.gradient_accumulation_steps)

    def reduce_sum(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=policy.device)
        dist.all_reduce(t)
        return float(t.item())

    def mine() -> Iterator[list[TokenRow]]:
        for batch in batches(rows, size, shuffle=config.shuffle, seed=config.seed):
            n = len(batch)  # a short last micro-batch is split as evenly as it goes
            yield batch[rank * n // ranks : (rank + 1) * n // ranks]

    return DataParallel(rank, ranks, reduce_sum, mine())


def global_record(record: dict[str, Any], reduce_sum) -> dict[str, Any]:
    """A rank's step record with the step's sums over every rank (`SUMMED`; `mean_token_accuracy` re-weighted
    by each rank's loss tokens), so rank 0 logs what one process would."""
    out = dict(record)
    local_tokens = record.get("num_loss_tokens", 0.0)
    if "mean_token_accuracy" in record:
        correct = reduce_sum(record["mean_token_accuracy"] * local_tokens)
    for key in SUMMED:
        if key in record:
            out[key] = reduce_sum(float(record[key]))
    if "mean_token_accuracy" in record:
        out["mean_token_accuracy"] = correct / max(1.0, out.get("num_loss_tokens", 0.0))
    out["tokens_per_s"] = out.get("num_tokens", 0) / record["elapsed_s"] if record.get("elapsed_s") else 0.0
    return out
