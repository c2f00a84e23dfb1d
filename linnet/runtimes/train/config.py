"""The settings of a training run (`TrainConfig`), with transformers' `TrainingArguments` and TRL's defaults
where they have one, and the LoRA settings (`LoraSettings`) with PEFT's `LoraConfig` defaults.

Every backend's trainer reads the same `TrainConfig` (the torch trainer here, the JAX trainer of
`linnet.runtimes.train.jax_trainer`), so the same run is spelled once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from linnet.errors import TrainError

from .schedule import SCHEDULES

__all__ = ["TrainConfig", "LoraSettings"]


@dataclass
class LoraSettings:
    """LoRA adapters (PEFT's `LoraConfig`, peft/tuners/lora/config.py): `r` the rank, `lora_alpha` the scale
    numerator (scaling = lora_alpha / r), `lora_dropout` the dropout on the adapter's input, `targets` a regular
    expression over `Linear` members' checkpoint paths (`model.layers.0.self_attn.q_proj`) matched as PEFT
    matches a string `target_modules` (`re.fullmatch`), or None for PEFT's default for the family
    (`q_proj|v_proj` members for Llama-like models)."""

    r: int = 8
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    targets: str | None = None

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.r

    def check(self) -> None:
        """Raises TrainError for a rank below 1, an alpha that is not finite (the scaling written into the source)
        or a dropout outside [0, 1)."""
        if self.r < 1:
            raise TrainError(f"--lora-r must be at least 1, got {self.r}")
        if not math.isfinite(self.lora_alpha):
            raise TrainError(f"--lora-alpha must be a finite number, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise TrainError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")


@dataclass
class TrainConfig:
    """One training run.

    Fields (defaults: transformers' `TrainingArguments` and TRL's `SFTConfig` unless said):
        method: the objective (`sft`, `full`; `dpo`, `grpo` from `objectives`' registry).
        max_steps: optimizer steps.
        learning_rate: the peak learning rate; None takes the method's default (TRL's: 2e-5 for SFT).
        lr_scheduler_type: `linear` (default), `cosine`, `constant`, `constant_with_warmup`.
        warmup_steps: linear warmup steps (0).
        per_device_train_batch_size: rows per micro-batch (8).
        gradient_accumulation_steps: micro-batches per optimizer step (1); the loss is normalised by the
            number of loss tokens across all of them (TRL's `num_items_in_batch`).
        max_grad_norm: clip the global gradient norm to this (1.0); 0 or None: no clipping.
        weight_decay, adam_beta1, adam_beta2, adam_epsilon: torch AdamW's (0.0, 0.9, 0.999, 1e-8).
        bf16: run the forward under `torch.autocast` in bfloat16 over f32 master weights (False here: CPU runs
            are f32 unless asked; TRL turns it on by default on GPUs); on JAX, the model in bf16 and the trained
            parameters' f32 masters cast to it (`jax_trainer`).
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass (on JAX under
            `jax.checkpoint`).
        max_length: truncate each row's tokens to this many (TRL's 1024, `keep_start`); None keeps them all.
        shuffle: visit the rows in a seeded random order each epoch (True); False keeps the file's order.
        seed: seeds the row order, LoRA's initial A and dropout.
        lora: LoRA adapters, or None to train every parameter (`full`).
        fsdp: under torchrun, shard parameters, gradients and optimizer state with FSDP2 (`fully_shard`) instead
            of replicating them with DDP (`linnet.runtimes.train.torch_dp`); one process ignores it.
        method_options: the objective's own options (DPO's `beta`, ...), passed to its factory.
        save_steps: write `OUT/checkpoint-K` every this many optimizer steps and after the last
            (`linnet.runtimes.train.checkpoints`; transformers' `save_steps` with `save_strategy="steps"`); None: only
            when a signal stops the run.

    Every optimizer step writes one metrics record (TRL's `logging_steps=1`).
    """

    method: str = "sft"
    max_steps: int = 100
    learning_rate: float | None = None
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_grad_norm: float | None = 1.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    bf16: bool = False
    gradient_checkpointing: bool = False
    max_length: int | None = 1024
    shuffle: bool = True
    seed: int = 42
    lora: LoraSettings | None = None
    method_options: dict = field(default_factory=dict)
    fsdp: bool = False
    save_steps: int | None = None

    def check(self) -> None:
        """Raises TrainError for a value out of range, naming the option."""
        positive = {
            "max_steps": self.max_steps,
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
        }
        for name, value in positive.items():
            if value < 1:
                raise TrainError(f"{name} must be at least 1, got {value}")
        if self.save_steps is not None and self.save_steps < 1:
            raise TrainError(f"save_steps must be at least 1, got {self.save_steps}")
        if self.warmup_steps < 0:
            raise TrainError(f"warmup_steps must be 0 or more, got {self.warmup_steps}")
        # a negative max_norm makes clip_grad_norm_'s (and optax's) coefficient negative: every step climbs the loss
        if self.max_grad_norm is not None and not self.max_grad_norm >= 0:  # NaN fails it too
            raise TrainError(f"max_grad_norm must be a number >= 0 (0 turns clipping off), got {self.max_grad_norm}")
        if not math.isfinite(self.weight_decay):
            raise TrainError(f"weight_decay must be a finite number, got {self.weight_decay}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise TrainError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.lr_scheduler_type not in SCHEDULES:
            raise TrainError(f"unknown lr schedule `{self.lr_scheduler_type}` (schedules: {', '.join(SCHEDULES)})")
        if self.max_length is not None and self.max_length < 2:
            raise TrainError(f"max_length must be at least 2 tokens, got {self.max_length}")
        if not 0 <= self.seed < 2**32:  # LoRA's initial A: a Mersenne Twister seeded as torch.manual_seed does
            raise TrainError(f"seed must be in [0, 2^32), got {self.seed}")
        if self.lora is not None:
            self.lora.check()
