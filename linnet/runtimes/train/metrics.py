"""The metrics record of one optimizer step, the same for every trainer (PyTorch's `trainer.Trainer`, JAX's
`jax_trainer.JaxTrainer`): what `metrics.jsonl` holds and the progress bar shows. Imports no framework."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .data import Batch

__all__ = ["StepRecord", "step_record"]

StepRecord = dict[str, Any]


def step_record(
    step: int, metrics: dict[str, float], micro: Sequence[Batch], grad_norm: float, lr_used: float, elapsed: float
) -> StepRecord:
    """One optimizer step's metrics record (every trainer's, PyTorch's and JAX's): the objective's `metrics`
    (`correct` turned into `mean_token_accuracy`), `grad_norm` before clipping, the learning rate the step
    used, the real tokens of its micro-batches and their rate over `elapsed` seconds."""
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
