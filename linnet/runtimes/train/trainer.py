"""The training loop on PyTorch: AdamW, a warmup schedule, gradient accumulation with the loss normalised over
the whole step, gradient clipping, optional bf16 autocast; one metrics record per optimizer step.

One optimizer step (as transformers' `Trainer` with `num_items_in_batch`, which TRL's trainers inherit):
1. take `gradient_accumulation_steps` micro-batches and let the objective prepare them (`prepare_step`);
2. `N` = the step's loss tokens over every micro-batch (and every rank: `reduce_sum`);
3. for each micro-batch, with the model in training mode (dropout active; every other forward, the objectives'
   `prepare_step` included, runs in eval mode): `loss = objective.loss(policy, batch, N)` (a sum over its tokens
   divided by N), `loss.backward()`: the gradients add up to the gradient of the step's mean token loss;
4. clip the global gradient norm to `max_grad_norm` (`torch.nn.utils.clip_grad_norm_`, the norm before clipping
   is logged as `grad_norm`), `AdamW.step()`, advance the schedule, zero the gradients.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from .config import TrainConfig
from .data import Batch, TokenRow, batches
from .metrics import StepRecord, step_record
from .objectives import Objective
from .policy import TorchPolicy
from .schedule import lr_multiplier

__all__ = [
    "Trainer",
    "StepRecord",
    "evaluate",
    "LOAD_OPTIONS",
    "DATA_PARALLEL",
    "trainable_paths",
    "policy_and_trainer",
]

# The hooks of a backend record's `trainer` (`linnet.runtimes.backends.Backend.trainer`), read by `train.run`:
LOAD_OPTIONS: dict = {}  # what a model to train loads with beyond the common options
DATA_PARALLEL = True  # trains across torchrun processes (`train.torch_dp`)


def trainable_paths(model) -> list[str]:
    """The checkpoint names of every parameter of a loaded `TorchModel` (what `--method full` trains)."""
    return [name for name, _ in model.module.named_parameters()]


def policy_and_trainer(model, trainable: list[str], cfg: TrainConfig) -> tuple[TorchPolicy, type[Trainer]]:
    """The policy being trained (`model` under autograd, `trainable` its parameters to train; gradient checkpointing
    and bf16 autocast as `cfg` says) and the loop that trains it."""
    autocast = torch.bfloat16 if cfg.bf16 else None
    policy = TorchPolicy(model, trainable, gradient_checkpointing=cfg.gradient_checkpointing, autocast_dtype=autocast)
    return policy, Trainer


class Trainer:
    """Trains `policy` on `rows` under `objective` as `config` says.

    `on_step(record)` is called after each optimizer step with its metrics (`step` 1-based, `loss`,
    `grad_norm`, `learning_rate` (the one this step used), `num_tokens` (real tokens this step),
    `num_loss_tokens`, `tokens_per_s`, `elapsed_s`, the objective's own). `reduce_sum(x)` sums a float over the
    ranks of a distributed run (identity in one process); `micro_batches` overrides where micro-batches of
    token rows come from (a distributed run hands each rank its share)."""

    def __init__(
        self,
        policy: TorchPolicy,
        objective: Objective,
        rows: Sequence[TokenRow],
        config: TrainConfig,
        *,
        on_step: Callable[[StepRecord], None] | None = None,
        reduce_sum: Callable[[float], float] = lambda x: x,
        micro_batches: Iterator[list[TokenRow]] | None = None,
    ):
        self.policy = policy
        self.objective = objective
        self.config = config
        self.on_step = on_step
        self.reduce_sum = reduce_sum
        self.micro_batches = micro_batches or batches(
            rows, config.per_device_train_batch_size, shuffle=config.shuffle, seed=config.seed
        )
        lr = config.learning_rate if config.learning_rate is not None else objective.default_learning_rate
        self.learning_rate = lr
        params = list(policy.parameters())
        # AdamW's own defaults differ (weight_decay=0.01): transformers passes every one of these explicitly
        self.optimizer = torch.optim.AdamW(
            params,
            lr=lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_epsilon,
            weight_decay=config.weight_decay,
        )
        multiplier = lr_multiplier(config.lr_scheduler_type, config.warmup_steps, config.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, multiplier)
        self.params = params
        self.history: list[StepRecord] = []
        self.first_step = 1  # a resumed run starts after its checkpoint's step (`load_state`)

    def step(self, step: int) -> StepRecord:
        """Run optimizer step `step` (1-based) and return its record."""
        t0 = time.perf_counter()
        cfg = self.config
        pad = self.policy.pad_token_id
        micro: list[Batch] = [
            self.objective.collate(next(self.micro_batches), pad) for _ in range(cfg.gradient_accumulation_steps)
        ]
        micro = self.objective.prepare_step(self.policy, micro)
        num_items = int(self.reduce_sum(float(sum(self.objective.num_items(b) for b in micro))))
        sums: dict[str, float] = {}
        means: dict[str, float] = {}
        for batch in micro:
            # dropout on for the forward whose loss is differentiated, and for its backward: gradient checkpointing
            # recomputes the layers there (with the forward's random state, so with the same masks)
            with self.policy.training():
                out = self.objective.loss(self.policy, batch, num_items)
                out.loss.backward()
            for k, v in out.sums.items():
                sums[k] = sums.get(k, 0.0) + v
            for k, v in out.means.items():
                means[k] = means.get(k, 0.0) + v / len(micro)
        lr_used = self.optimizer.param_groups[0]["lr"]
        if cfg.max_grad_norm:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm))
        else:
            grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None]))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return step_record(step, {**sums, **means}, micro, grad_norm, lr_used, time.perf_counter() - t0)

    def train(self) -> list[StepRecord]:
        """Run optimizer steps `first_step` .. `config.max_steps`; returns their records (also passed to
        `on_step`)."""
        for step in range(self.first_step, self.config.max_steps + 1):
            record = self.step(step)
            self.history.append(record)
            if self.on_step is not None:
                self.on_step(record)
        return self.history

    # ---- checkpoints (`checkpoints.Checkpointer`): the files transformers' Trainer writes, by the same names
    def trained_arrays(self) -> dict[str, np.ndarray]:
        """The trained parameters' values by checkpoint path, on the host."""
        return {name: p.detach().cpu().float().numpy() for name, p in self.policy.trainable.items()}

    def save_state(self, folder: Path, step: int) -> None:
        """`optimizer.pt`, `scheduler.pt` and `rng_state.pth` into `folder`, as transformers' `Trainer` writes them
        (`_save_optimizer_and_scheduler`, `_save_rng_state`)."""
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), folder / "scheduler.pt")
        torch.save(rng_states(self.policy.device), folder / "rng_state.pth")

    def load_state(self, folder: Path, step: int, arrays: dict[str, np.ndarray]) -> None:
        """Continue after optimizer step `step` of the checkpoint `folder`: the objective's start state
        (`Objective.resume`, before the trained values change), the trained values `arrays`, the optimizer and
        scheduler state, the data position (step x accumulation micro-batches skipped) and, last, the RNG states."""
        self.objective.resume(self.policy, step)
        with torch.no_grad():
            for name, p in self.policy.trainable.items():
                p.copy_(torch.from_numpy(np.asarray(arrays[name])).to(p.dtype))
        device = self.policy.device
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location=device, weights_only=True))
        self.scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
        # the learning rate of the next step from this run's schedule (a resumed run may set another max_steps)
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            group["lr"] = base * fn(self.scheduler.last_epoch)
        for _ in range(step * self.config.gradient_accumulation_steps):
            next(self.micro_batches)
        set_rng_states(torch_load_numpy(folder / "rng_state.pth"), device)
        self.first_step = step + 1


def rng_states(device: torch.device) -> dict:
    """The generators' states as transformers' `Trainer._save_rng_state` keeps them: `python`, `numpy`, `cpu`,
    and `cuda` (every device's) when training on CUDA."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def set_rng_states(states: dict, device: torch.device) -> None:
    """Restore what `rng_states` saved (transformers' `Trainer._load_rng_state`)."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.random.set_rng_state_all(states["cuda"])


def torch_load_numpy(path: Path):
    """`torch.load(path, weights_only=True)` allowing numpy's RNG state (transformers' `safe_globals`)."""
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, weights_only=True)


def evaluate(policy: TorchPolicy, objective: Objective, rows: Sequence[TokenRow], batch_size: int = 8) -> float:
    """The objective's loss over `rows` without gradients: for SFT the mean NLL per loss token over all of them
    (each batch's summed loss over the total loss-token count: TRL's eval loss with `num_items_in_batch`)."""
    pad = policy.pad_token_id
    batches_ = [objective.collate(rows[i : i + batch_size], pad) for i in range(0, len(rows), batch_size)]
    total = sum(objective.num_items(b) for b in batches_)
    with torch.no_grad():
        return float(sum(float(objective.loss(policy, b, total).loss) for b in batches_))
