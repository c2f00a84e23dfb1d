"""Learning-rate schedules with warmup, as transformers' `get_scheduler` defines them
(transformers/optimization.py: `_get_linear_schedule_with_warmup_lr_lambda`,
`_get_cosine_schedule_with_warmup_lr_lambda` with `num_cycles=0.5`, `_get_constant_lambda`,
`_get_constant_schedule_with_warmup_lr_lambda`).

Each is a multiplier of the peak learning rate as a function of the optimizer step `t`
(0-based: the multiplier used for the step about to be taken), `warmup` warmup steps and `total`
steps. Pure Python, so the torch trainer (`torch.optim.lr_scheduler.LambdaLR`) and the JAX trainer
(an optax schedule) share one definition.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from linnet.errors import TrainError

__all__ = ["SCHEDULES", "lr_multiplier"]


def _linear(t: int, warmup: int, total: int) -> float:
    if t < warmup:
        return t / max(1, warmup)
    return max(0.0, (total - t) / max(1, total - warmup))


def _cosine(t: int, warmup: int, total: int) -> float:
    if t < warmup:
        return t / max(1, warmup)
    progress = (t - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * 0.5 * progress)))


def _constant(t: int, warmup: int, total: int) -> float:
    return 1.0


def _constant_with_warmup(t: int, warmup: int, total: int) -> float:
    return t / max(1.0, warmup) if t < warmup else 1.0


SCHEDULES: dict[str, Callable[[int, int, int], float]] = {
    "linear": _linear,
    "cosine": _cosine,
    "constant": _constant,
    "constant_with_warmup": _constant_with_warmup,
}


def lr_multiplier(name: str, warmup: int, total: int) -> Callable[[int], float]:
    """The multiplier `t -> factor` of schedule `name` (`linear`, the transformers and TRL default, `cosine`,
    `constant`, `constant_with_warmup`) over `total` optimizer steps with `warmup` warmup steps.
    Raises TrainError naming the schedules."""
    try:
        fn = SCHEDULES[name]
    except KeyError:
        raise TrainError(f"unknown lr schedule `{name}` (schedules: {', '.join(SCHEDULES)})") from None
    return lambda t: fn(t, warmup, total)
