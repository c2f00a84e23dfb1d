"""The metrics record of one optimizer step, the same for every trainer (PyTorch's `trainer.Trainer`, JAX's
`jax_trainer.JaxTrainer`): what `metrics.jsonl` holds and the progress bar shows. Imports no framework."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from linnet.errors import RunError

from .data import Batch

__all__ = ["StepRecord", "step_record"]

StepRecord = dict[str, Any]


def step_record(
    step: int, metrics: dict[str, float], micro: Sequence[Batch], grad_norm: float, lr_used: float, elapsed: float
) -> StepRecord:
    """One optimizer step's metrics record (every trainer's, PyTorch's and JAX's): the objective's `metrics`
    (`correct` turned into `mean_token_accuracy`), `grad_norm` before clipping, the learning rate the step
    used, the real tokens of its micro-batches and their rate over `elapsed` seconds. Raises RunError when the loss
    or the gradient norm is NaN or infinite: the step has put non-finite values into the trained parameters (the
    run stops before a checkpoint or the result holds them; `--resume` would refuse them)."""
    loss = metrics.get("loss", 0.0)
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        raise RunError(
            f"step {step}: the loss is {loss:.4g} and the gradient norm {grad_norm:.4g}: the weights, the data or "
            "the learning rate make the model compute non-finite values (try a lower --lr, or without --bf16, or "
            "check the checkpoint); nothing of this step was written"
        )
    tokens = sum(b.num_tokens for b in micro)
    record: StepRecord = {"step": step, **metrics}
    if "correct" in record:
        record["mean_token_accuracy"] = record.pop("correct") / max(1.0, record.get("num_loss_tokens", 0.0))
    record.update(
        grad_norm=grad_norm,
        learning_rate=lr_used,
        num_tokens=tokens,
        tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0,
        elapsed_s=elapsed,
    )
    return record
