"""Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290) as TRL 1.16 defines it by default
(trl/trainer/dpo_trainer.py, `DPOTrainer._compute_loss`; defaults from trl/trainer/dpo_config.py `DPOConfig`):
`loss_type="sigmoid"`, `beta=0.1`, `label_smoothing=0`, `f_divergence_type="reverse_kl"`.

For a prompt x with a chosen completion y_w and a rejected one y_l, with log π(y|x) the *summed* log-probability
of the completion tokens (`logprobs.sequence_logps`):

    chosen_logratio   = log π_θ(y_w|x) − log π_ref(y_w|x)
    rejected_logratio = log π_θ(y_l|x) − log π_ref(y_l|x)
    loss              = mean over pairs of −log σ(β · (chosen_logratio − rejected_logratio))

The reference π_ref is, as in TRL with a PEFT model and `ref_model=None`, the same model with its LoRA adapters
disabled (computed live each step under `torch.no_grad`, `precompute_ref_log_probs=False`); without LoRA it is a
frozen copy of the starting weights. Chosen and rejected rows go through the model in one batch,
`[chosen_0..chosen_{B-1}, rejected_0..rejected_{B-1}]`, as TRL's `DataCollatorForPreference` stacks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["DPO_DEFAULT_BETA", "dpo_loss", "preference_batch"]

DPO_DEFAULT_BETA = 0.1  # trl/trainer/dpo_config.py, DPOConfig.beta


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = DPO_DEFAULT_BETA,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The sigmoid DPO loss of B pairs and TRL's logged metrics.

    Args:
        chosen_logps, rejected_logps: f32[B], summed completion log-probs under the trained model.
        ref_chosen_logps, ref_rejected_logps: f32[B], the same under the reference (no gradient).
        beta: β, the strength of the implicit KL penalty (TRL's default 0.1).

    Returns (loss, metrics): loss a scalar, the mean of −log σ(β·Δ) over pairs; metrics TRL's names,
    `rewards/chosen` = mean β·chosen_logratio, `rewards/rejected` likewise, `rewards/accuracies` = the share of
    pairs with chosen reward > rejected reward, `rewards/margins` = mean of their difference, `logps/chosen`,
    `logps/rejected` = mean summed log-probs under the trained model."""
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    loss = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios)).mean()
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    metrics = {
        "rewards/chosen": chosen_rewards.mean().item(),
        "rewards/rejected": rejected_rewards.mean().item(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
        "logps/chosen": chosen_logps.detach().mean().item(),
        "logps/rejected": rejected_logps.detach().mean().item(),
    }
    return loss, metrics


@dataclass
class PreferenceBatch:
    """B preference pairs as one right-padded batch of 2B rows, chosen rows first.

    input_ids: i64[2B, S] (prompt + completion, `pad_id` after); completion_mask: i64[2B, S] (1 on completion
    tokens); n_tokens: the number of real (non-pad) tokens, for tokens/s."""

    input_ids: torch.Tensor
    completion_mask: torch.Tensor
    n_tokens: int


def preference_batch(
    rows: list[tuple[list[int], list[int], list[int]]], pad_id: int, max_length: int | None = None
) -> PreferenceBatch:
    """Stack `rows` of (prompt_ids, chosen_ids, rejected_ids) as TRL's `DataCollatorForPreference` does
    (trl/trainer/dpo_trainer.py): [prompt + chosen for each row] then [prompt + rejected for each row], each cut
    to its first `max_length` tokens (`truncation_mode="keep_start"`), right-padded with `pad_id`."""
    sequences, masks = [], []
    for part in (1, 2):
        for row in rows:
            prompt, completion = row[0], row[part]
            ids = list(prompt) + list(completion)
            mask = [0] * len(prompt) + [1] * len(completion)
            if max_length is not None:
                ids, mask = ids[:max_length], mask[:max_length]
            sequences.append(ids)
            masks.append(mask)
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, (ids, mask) in enumerate(zip(sequences, masks, strict=True)):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        completion_mask[i, : len(mask)] = torch.tensor(mask, dtype=torch.long)
    return PreferenceBatch(input_ids, completion_mask, sum(len(s) for s in sequences))
