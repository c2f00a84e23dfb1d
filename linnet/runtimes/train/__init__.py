"""Training from the same source (`linnet.runtimes.train`; `linnet train` and `linnet.train(...)`).

It lives in `runtimes` because training binds weights, reads data and drives a backend, which only
`runtimes` may do (ARCHITECTURE.md); the backends only have to run under autograd (`Backend.can_train`).

Modules, one job each:
- `config`: `TrainConfig` (optimizer, schedule, accumulation, clipping, bf16, ...) and `LoraSettings`;
- `data`: JSONL rows in TRL's shapes -> `TokenRow`s -> right-padded `Batch`es;
- `objectives`: the `Objective` interface (token rows, batches, a loss and metrics from a batch and the
  model's `forward` logits) and SFT; `register` adds DPO and GRPO;
- `schedule`: transformers' learning-rate schedules, framework-free;
- `policy`: `TorchPolicy`, a loaded torch model's `forward` under autograd with its trained parameters;
- `trainer`: `Trainer`, the torch loop (AdamW, schedule, accumulation, clipping);
- `jax_trainer`: `JaxPolicy` and `JaxTrainer`, the same loop on JAX (`jax.value_and_grad`, optax);
- `metrics`: the per-step record both trainers write;
- `lora`: LoRA adapters as a source transform, PEFT's adapter format.
"""

from __future__ import annotations

from .config import LoraSettings, TrainConfig
from .data import Batch, Row, TokenRow, read_jsonl
from .objectives import OBJECTIVES, SFT, LossOutput, Objective, Policy, objective_for, register, token_nll
from .schedule import SCHEDULES, lr_multiplier

__all__ = [
    "TrainConfig",
    "LoraSettings",
    "Row",
    "TokenRow",
    "Batch",
    "read_jsonl",
    "Objective",
    "Policy",
    "LossOutput",
    "SFT",
    "OBJECTIVES",
    "register",
    "objective_for",
    "token_nll",
    "SCHEDULES",
    "lr_multiplier",
]
