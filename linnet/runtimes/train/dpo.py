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

torch is imported where a loss or a reference runs on PyTorch, not with this module: on JAX (`jax_trainer`) DPO's
rows, batches and losses need none, and train there on a machine without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from linnet.errors import TrainError

from .data import Batch, Row, TokenRow, encode_prompt_completion, field_choice
from .objectives import LossOutput, Objective, Policy, register

if TYPE_CHECKING:
    import torch

    from .reference import ReferenceModel

__all__ = ["DPO", "DPO_DEFAULT_BETA", "dpo_loss", "preference_batch", "preference_arrays", "masked_logps"]

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
    import torch.nn.functional as F

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
    import torch

    input_ids, completion_mask, n_tokens = preference_arrays(rows, pad_id, max_length)
    return PreferenceBatch(torch.from_numpy(input_ids), torch.from_numpy(completion_mask), n_tokens)


def preference_arrays(
    rows: list[tuple[list[int], list[int], list[int]]], pad_id: int, max_length: int | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """`preference_batch` in numpy (what the JAX trainer takes, without torch): i64[2B, S] input_ids, i64[2B, S]
    completion_mask and the real tokens' count."""
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
    input_ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    completion_mask = np.zeros((len(sequences), width), dtype=np.int64)
    for i, (ids, mask) in enumerate(zip(sequences, masks, strict=True)):
        input_ids[i, : len(ids)] = ids
        completion_mask[i, : len(mask)] = mask
    return input_ids, completion_mask, sum(len(s) for s in sequences)


class DPO(Objective):
    """`--method dpo`: the sigmoid DPO loss above on preference rows.

    Rows: `{"prompt", "chosen", "rejected"}` (text, or lists of messages rendered with the chat template), or
    `{"prompt_ids", "chosen_ids", "rejected_ids"}` used as given. Text is tokenized as TRL's
    `DPOTrainer._prepare_dataset` does: an EOS is appended to `chosen` and `rejected` when missing, `prompt`,
    `prompt + chosen` and `prompt + rejected` are tokenized, and the completions start where the three first
    differ. With `max_length`, each sequence keeps its first `max_length` tokens, and a row whose prompt alone
    fills `max_length` is dropped (TRL's `keep_start` truncation).

    Normalisation: TRL averages −log σ(β·Δ) over the pairs of each micro-batch and the transformers Trainer divides
    by the number of micro-batches of the step (and averages over ranks), so each micro-batch counts 1 in the
    step's normaliser (`num_items`). Options: `beta` (0.1)."""

    name = "dpo"
    shapes = (("prompt", "chosen", "rejected"), ("prompt_ids", "chosen_ids", "rejected_ids"))
    default_learning_rate = 1e-6  # DPOConfig.learning_rate

    def __init__(self, beta: float = DPO_DEFAULT_BETA):
        if not beta > 0:
            raise TrainError(f"--beta must be positive for DPO, got {beta}")
        self.beta = float(beta)
        self.reference: ReferenceModel | None = None
        self.max_length: int | None = None

    def token_rows(
        self, rows: Sequence[Row], tokenizer: Any, vocab_size: int, max_length: int | None
    ) -> list[TokenRow]:
        out = []
        for row in rows:
            r = self.token_row(row, tokenizer, vocab_size)
            if max_length is not None and len(r.extra["prompt_ids"]) >= max_length:
                continue
            out.append(r)
        if not out:
            raise TrainError(f"{rows[0].where.rsplit(':', 1)[0]}: every row's prompt fills max_length")
        self.max_length = max_length
        return out

    def token_row(self, row: Row, tokenizer: Any, vocab_size: int) -> TokenRow:
        shape = field_choice(row, self.shapes)
        prompt, chosen = encode_prompt_completion(row, shape[0], shape[1], tokenizer, vocab_size)
        prompt_r, rejected = encode_prompt_completion(row, shape[0], shape[2], tokenizer, vocab_size)
        n = min(len(prompt), len(prompt_r))  # TRL: the shorter common prefix of the two
        chosen, rejected = prompt[n:] + chosen, prompt_r[n:] + rejected
        prompt = prompt[:n]
        extra = {"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}
        return TokenRow(prompt + chosen, [0] * len(prompt) + [1] * len(chosen), row.where, extra)

    def collate(self, rows: Sequence[TokenRow], pad_token_id: int) -> Batch:
        triples = [(r.extra["prompt_ids"], r.extra["chosen_ids"], r.extra["rejected_ids"]) for r in rows]
        input_ids, completion_mask, _ = preference_arrays(triples, pad_token_id, self.max_length)
        mask = completion_mask.astype("float32")[:, 1:].copy()
        lengths = [len(p) + len(c) for p, c, _ in triples] + [len(p) + len(r) for p, _, r in triples]
        if self.max_length is not None:
            lengths = [min(n, self.max_length) for n in lengths]
        return Batch(input_ids, mask, lengths, list(rows))

    def prepare_step(self, policy: Policy, micro_batches: list[Batch]) -> list[Batch]:
        from .reference import ReferenceModel

        if self.reference is None:  # before the first update: a full fine-tune's reference is the start
            self.reference = ReferenceModel(policy)
        return micro_batches

    def resume(self, policy: Policy, step: int) -> None:
        from .reference import ReferenceModel

        if self.reference is None:  # the start's reference, before the checkpoint's values are bound
            self.reference = ReferenceModel(policy)

    def num_items(self, batch: Batch) -> int:
        return 1

    def loss(self, policy: Policy, batch: Batch, num_items: int) -> LossOutput:
        import torch

        ids = torch.as_tensor(batch.input_ids, device=policy.device)
        mask = torch.as_tensor(batch.loss_mask, device=policy.device)
        logps = masked_logps(policy.logits(ids), ids, mask)
        ref = masked_logps(self.reference.logits(ids), ids, mask)
        n = ids.shape[0] // 2
        loss, metrics = dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], self.beta)
        loss = loss / max(1, num_items)
        return LossOutput(loss, sums={"loss": float(loss.detach())}, means=metrics)


def masked_logps(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Summed log-probs f32[B] of the tokens `loss_mask` f32[B, S - 1] selects (entry s: token s + 1)."""
    from .logprobs import token_logps

    return (token_logps(logits[:, :-1], input_ids[:, 1:]) * loss_mask).sum(dim=1)


register("dpo", DPO)
