"""Group Relative Policy Optimization (Shao et al. 2024, arXiv:2402.03300) as TRL 1.16 defines it by default
(trl/trainer/grpo_trainer.py, `GRPOTrainer._generate_and_score_completions` and `GRPOTrainer._compute_loss`;
defaults from trl/trainer/grpo_config.py `GRPOConfig`): `loss_type="dapo"`, `beta=0.0` (no KL term, no reference
forward), `epsilon=0.2`, `num_iterations=1`, `importance_sampling_level="token"`, `scale_rewards="group"`,
`num_generations=8`, `temperature=1.0`.

Each prompt is sampled G = `num_generations` times; the reward function scores each completion; then

    A_i      = (r_i − mean(r_group)) / (std(r_group) + 1e-4)          std Bessel-corrected (trl/trainer/utils.py nanstd)
    ratio_t  = exp(log π_θ(o_t) − log π_old(o_t))                     π_old = π_θ detached when num_iterations = 1
    L_t      = −min(ratio_t · A_i, clip(ratio_t, 1 − ε, 1 + ε) · A_i) + β · KL_t
    KL_t     = ratio_t · (exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1)   (k3, only when β > 0)
    loss     = Σ_{i,t} L_t · mask_{i,t} / (active completion tokens of the whole generation batch)   ("dapo")

The ratio on the k3 term is TRL 1.16's `use_bias_correction_kl=True` default (DeepSeek-V3.2, arXiv:2512.02556): its
value is 1 when num_iterations = 1, but it turns the term's gradient into the unbiased reverse-KL gradient.
Log-probs are taken from logits divided by the sampling temperature, as TRL does. With β > 0 and LoRA the
reference is the model with adapters disabled (TRL with a PEFT model and no `ref_model`).
"""

from __future__ import annotations

import torch

from .logprobs import token_logps

__all__ = [
    "GRPO_DEFAULT_BETA",
    "GRPO_DEFAULT_EPSILON",
    "GRPO_DEFAULT_NUM_GENERATIONS",
    "group_advantages",
    "completion_logps",
    "grpo_loss",
]

GRPO_DEFAULT_BETA = 0.0  # GRPOConfig.beta (0.04 before TRL PR #3516)
GRPO_DEFAULT_EPSILON = 0.2  # GRPOConfig.epsilon
GRPO_DEFAULT_NUM_GENERATIONS = 8  # GRPOConfig.num_generations
ADVANTAGE_EPS = 1e-4  # grpo_trainer.py: `advantages / (std_rewards + 1e-4)`


def group_advantages(rewards: torch.Tensor, num_generations: int) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-normalised advantages of rewards f32[N] laid out as N / G consecutive groups of G = `num_generations`
    completions of one prompt: (r − group mean) / (group std + 1e-4), the std with Bessel's correction.

    Returns (advantages f32[N], metrics): TRL's `reward` (mean), `reward_std` (Bessel std over all N),
    `frac_reward_zero_std` (share of completions whose group has equal rewards)."""
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    std = grouped.std(dim=1, unbiased=True).repeat_interleave(num_generations)
    advantages = (rewards - mean) / (std + ADVANTAGE_EPS)
    metrics = {
        "reward": rewards.mean().item(),
        "reward_std": rewards.std(unbiased=True).item() if rewards.numel() > 1 else 0.0,
        "frac_reward_zero_std": torch.isclose(std, torch.zeros_like(std)).float().mean().item(),
    }
    return advantages, metrics


def completion_logps(
    logits: torch.Tensor, completion_ids: torch.Tensor, prompt_length: int, temperature: float = 1.0
) -> torch.Tensor:
    """Per-token log-probs of the completions under the `forward` logits of [prompt, completion] rows.

    Args:
        logits: f32[N, P + C, vocab], `forward` on the concatenated ids.
        completion_ids: i64[N, C].
        prompt_length: P (every prompt of the batch has P ids: `forward` takes no mask, so prompts are not padded).
        temperature: the sampling temperature; the logits are divided by it (TRL does).

    Returns f32[N, C]."""
    c = completion_ids.shape[1]
    return token_logps(logits[:, prompt_length - 1 : prompt_length - 1 + c], completion_ids, temperature)


def grpo_loss(
    per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    num_items: float,
    old_per_token_logps: torch.Tensor | None = None,
    ref_per_token_logps: torch.Tensor | None = None,
    beta: float = GRPO_DEFAULT_BETA,
    epsilon: float = GRPO_DEFAULT_EPSILON,
    bias_correction_kl: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's default ("dapo") GRPO loss of one micro-batch.

    Args:
        per_token_logps: f32[N, C] under the trained model (with gradient).
        advantages: f32[N].
        completion_mask: i64[N, C], 1 up to and including each completion's EOS.
        num_items: active completion tokens of the whole generation batch (all micro-batches of the step), the
            "dapo" normaliser.
        old_per_token_logps: f32[N, C] of the sampling policy, or None for `per_token_logps.detach()` (TRL with
            num_iterations = 1, so the ratio is 1 and the gradient is the policy gradient).
        ref_per_token_logps: f32[N, C] under the reference; needed when `beta` > 0.
        beta: the k3 KL coefficient (TRL's default 0.0).
        epsilon: the PPO clip range (0.2).
        bias_correction_kl: multiply KL_t by the ratio (TRL's `use_bias_correction_kl`, default True).

    Returns (loss, metrics): `kl` (masked mean of KL_t, when β > 0) and `clip_ratio/region_mean`.
    Raises ValueError when β > 0 without reference log-probs."""
    mask = completion_mask.to(per_token_logps.dtype)
    old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    ratio = torch.exp(per_token_logps - old)
    adv = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
    per_token_loss = -torch.min(ratio * adv, clipped * adv)
    active = mask.sum().clamp(min=1.0)
    metrics: dict[str, float] = {}
    if beta != 0.0:
        if ref_per_token_logps is None:
            raise ValueError("grpo_loss: beta > 0 needs the reference model's log-probs")
        delta = ref_per_token_logps - per_token_logps
        per_token_kl = torch.exp(delta) - delta - 1
        if bias_correction_kl:
            per_token_kl = per_token_kl * ratio
        per_token_loss = per_token_loss + beta * per_token_kl
        metrics["kl"] = ((per_token_kl.detach() * mask).sum() / active).item()
    region = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + epsilon) & (adv > 0))
    metrics["clip_ratio/region_mean"] = ((region.float() * mask).sum() / active).item()
    loss = (per_token_loss * mask).sum() / max(float(num_items), 1.0)
    return loss, metrics
