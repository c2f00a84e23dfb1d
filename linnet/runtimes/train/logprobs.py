"""Log-probabilities of given tokens under a decoder's logits, the quantity DPO and GRPO are built from.

`forward(input_ids: i64[B, S]) -> f32[B, S, vocab]` takes no attention mask (docs/runtimes.md), so batches are
right-padded: under causal attention a real token never attends to a later pad, so its logits are exact, and the
pads are masked out of every sum here.
"""

from __future__ import annotations

import torch

__all__ = ["token_logps", "sequence_logps"]


def token_logps(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[..., target] per position.

    Args:
        logits: f32[B, T, vocab], the logits predicting `targets` (already shifted: position t predicts
            targets[:, t]).
        targets: i64[B, T].
        temperature: GRPO divides the logits by the sampling temperature before the log-softmax
            (trl/trainer/grpo_trainer.py, `_get_per_token_logps_and_entropies`); DPO uses 1.

    Returns f32[B, T]. The log-softmax is taken in f32 whatever the logits' dtype."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def sequence_logps(logits: torch.Tensor, input_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Summed log-probability of each row's completion tokens: Σ_t log p(input_ids[t] | input_ids[<t]) over the
    positions t where `completion_mask` is 1 (TRL's DPO: `per_token_logps.sum(dim=1)` with the prompt and pads
    masked, trl/trainer/dpo_trainer.py `DPOTrainer._compute_loss`).

    Args:
        logits: f32[B, S, vocab], the `forward` entry's output on `input_ids`.
        input_ids: i64[B, S], prompt then completion, right-padded.
        completion_mask: i64[B, S], 1 on completion tokens (never on position 0: nothing predicts it).

    Returns f32[B]."""
    per_token = token_logps(logits[:, :-1], input_ids[:, 1:])
    return (per_token * completion_mask[:, 1:].to(per_token.dtype)).sum(dim=1)
