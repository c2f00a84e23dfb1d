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

torch is imported where the loss, the advantages or a reference run (on PyTorch), not with this module, so that
`--method grpo` on a machine without torch reaches the JAX trainer's error (it does not train GRPO yet) instead of
failing on the import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from linnet.errors import TrainError

from ..generation import Generator
from ..sampling import SamplingParams
from .data import Batch, Row, TokenRow, field_choice, pad_batch, token_ids
from .objectives import LossOutput, Objective, Policy, register
from .rewards import load_reward

if TYPE_CHECKING:
    import torch

    from .reference import ReferenceModel

__all__ = [
    "GRPO",
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
    import torch

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
    from .logprobs import token_logps

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
    import torch

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


class GRPO(Objective):
    """`--method grpo`: sample `num_generations` completions of each prompt through Linnet's generation runner
    (`linnet/runtimes/generation.py`, the `step` entry with its KV cache: the same sampler `linnet generate` uses,
    seeded),
    score them with the user's reward function (`rewards.load_reward`), and minimise `grpo_loss` on them.

    Rows: `{"prompt": str | messages, ...}` (messages rendered with the chat template and the generation prompt,
    text tokenized with special tokens, as TRL's `_tokenize_prompts`), or `{"prompt_ids": [...], ...}`; the other
    fields go to the reward function as columns.

    Batching: `per_device_train_batch_size` counts prompts here; each micro-batch holds that many prompts times
    `num_generations` completions (TRL's `per_device_train_batch_size` counts completions: TRL's B is Linnet's
    B × G). The dapo normaliser is the active completion tokens of the step's micro-batches together, as TRL's
    `num_items_in_batch` over one generation batch.

    Options (TRL 1.16's `GRPOConfig` defaults): `reward` (import path or callable; required), `num_generations`
    (8), `max_completion_length` (512), `temperature` (1.0), `top_p` (1.0), `top_k` (0: off), `beta` (0.0),
    `epsilon` (0.2), `seed` (0: completion i of prompt j at step t samples with a seed drawn from (seed, t, j, i)),
    `rollout` (None; as TRL's experimental `rollout_func`: a function `(prompt_ids: list[list[int]], step: int) ->
    completion ids` in the order `sample` returns them, replacing Linnet's sampling, e.g. to replay another
    library's samples)."""

    name = "grpo"
    shapes = (("prompt",), ("prompt_ids",))
    default_learning_rate = 1e-6  # GRPOConfig.learning_rate

    def __init__(
        self,
        reward: str | Callable | None = None,
        num_generations: int = GRPO_DEFAULT_NUM_GENERATIONS,
        max_completion_length: int = 512,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        beta: float = GRPO_DEFAULT_BETA,
        epsilon: float = GRPO_DEFAULT_EPSILON,
        seed: int = 0,
        rollout: Callable[[list[list[int]], int], list[list[int]]] | None = None,
    ):
        if reward is None:
            raise TrainError("--method grpo needs a reward function: --reward module:function")
        if num_generations < 2:
            raise TrainError(
                f"--num-generations must be at least 2 (advantages compare a group), got {num_generations}"
            )
        if max_completion_length < 1:
            raise TrainError(f"max_completion_length must be at least 1, got {max_completion_length}")
        if not beta >= 0:  # NaN fails it too
            raise TrainError(f"--beta must be 0 or more for GRPO, got {beta}")
        if not 0 < temperature < float("inf"):  # greedy sampling (0) would divide the log-probabilities' logits by 0
            raise TrainError(
                "GRPO's --temperature must be a number > 0 (its log-probabilities divide the logits by it), got "
                f"{float(temperature)}"
            )
        self.reward = load_reward(reward)
        self.num_generations = int(num_generations)
        self.sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                       max_new_tokens=max_completion_length)  # fmt: skip
        self.temperature = float(temperature)
        self.beta = float(beta)
        self.epsilon = float(epsilon)
        self.seed = int(seed)
        self.rollout = rollout
        self.steps_done = 0
        self.reference: ReferenceModel | None = None

    def token_row(self, row: Row, tokenizer: Any, vocab_size: int) -> TokenRow:
        shape = field_choice(row, self.shapes)
        if shape == ("prompt_ids",):
            ids = token_ids(row, "prompt_ids", vocab_size)
        else:
            prompt = row.fields["prompt"]
            if tokenizer is None:
                raise row.error('field "prompt" is text, and the checkpoint has no tokenizer: give "prompt_ids"')
            if isinstance(prompt, str):
                ids = tokenizer.encode(prompt)
            elif isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
                from linnet.runtimes.inputs.chat import encode_chat

                try:
                    ids = encode_chat(tokenizer, prompt, add_generation_prompt=True)
                except ValueError as err:
                    raise row.error(f"cannot render the messages: {err}") from None
            else:
                raise row.error(f'field "prompt" must be a string or a list of messages, got {type(prompt).__name__}')
        columns = {k: v for k, v in row.fields.items() if k not in shape}
        prompt_value = row.fields[shape[0]]
        return TokenRow(list(ids), [0] * len(ids), row.where, {"prompt": prompt_value, "columns": columns})

    def token_rows(self, rows, tokenizer, vocab_size, max_length):
        # prompt-only rows have no loss token until completions are sampled: nothing to drop here
        self.tokenizer = tokenizer
        return [self.token_row(row, tokenizer, vocab_size) for row in rows]

    def collate(self, rows: Sequence[TokenRow], pad_token_id: int) -> Batch:
        self.pad_token_id = pad_token_id
        return Batch(np.zeros((len(rows), 1), np.int64), np.zeros((len(rows), 0), np.float32), [], list(rows))

    def generation_rows(self, config: Any) -> int:
        """The KV-cache rows to load the model with (`--max-batch`): one micro-batch's completions, sampled
        together by the runner's `generate_batch` (more prompts are sampled in chunks of this many)."""
        return config.per_device_train_batch_size * self.num_generations

    # ---- one step: sample, score, batch
    def sample(self, policy: Policy, prompts: list[list[int]], step: int) -> list[list[int]]:
        """`num_generations` completions (token ids, the EOS that ended one included) of each prompt, in order:
        prompt 0's group, then prompt 1's. Seeded by (seed, step, prompt index, sample index)."""
        step_model = policy.model.step_model()
        tokenizer = getattr(self, "tokenizer", None)
        generator = Generator(step_model, tokenizer)
        jobs = [(j, i) for j in range(len(prompts)) for i in range(self.num_generations)]
        out: list[list[int]] = []
        for start in range(0, len(jobs), step_model.max_batch):
            chunk = jobs[start : start + step_model.max_batch]
            params = [replace(self.sampling, seed=_seed(self.seed, step, j, i)) for j, i in chunk]
            results = generator.generate_batch([prompts[j] for j, _ in chunk], params)
            for r in results:
                out.append(list(r.token_ids) + ([r.stop_token_id] if r.finish_reason == "stop" else []))
        return out

    def prepare_step(self, policy: Policy, micro_batches: list[Batch]) -> list[Batch]:
        import torch

        from .reference import ReferenceModel

        if self.reference is None and self.beta != 0.0:
            self.reference = ReferenceModel(policy)
        step = self.steps_done
        self.steps_done += 1
        rows = [r for b in micro_batches for r in b.rows]
        prompts = [r.input_ids for r in rows]
        completions = self.rollout(prompts, step) if self.rollout else self.sample(policy, prompts, step)
        owners = [r for r in rows for _ in range(self.num_generations)]
        texts = self._texts(completions)
        columns = {k: [r.extra["columns"].get(k) for r in owners] for k in owners[0].extra["columns"]}
        rewards = self.reward([r.extra["prompt"] for r in owners], texts, completions, columns,
                              [r.where for r in owners])  # fmt: skip
        advantages, metrics = group_advantages(torch.tensor(rewards, dtype=torch.float32), self.num_generations)
        lengths = [len(c) for c in completions]
        metrics["completions/mean_length"] = float(np.mean(lengths))
        out, k = [], 0
        for b in micro_batches:
            n = len(b.rows) * self.num_generations
            sampled = [
                TokenRow(
                    owners[k + i].input_ids + completions[k + i],
                    [0] * len(owners[k + i].input_ids) + [1] * len(completions[k + i]),
                    owners[k + i].where,
                    {"advantage": float(advantages[k + i])},
                )  # fmt: skip
                for i in range(n)
            ]
            batch = pad_batch(sampled, self.pad_token_id)
            batch.rows = sampled
            self._step_metrics = metrics
            out.append(batch)
            k += n
        return out

    def resume(self, policy: Policy, step: int) -> None:
        from .reference import ReferenceModel

        if self.reference is None and self.beta != 0.0:  # the start's reference, before the checkpoint's values
            self.reference = ReferenceModel(policy)
        self.steps_done = step  # the sampling seeds of step t are drawn from (seed, t, ...)

    def _texts(self, completions: list[list[int]]) -> list[Any]:
        tok = getattr(self, "tokenizer", None)
        if tok is None:
            return [list(c) for c in completions]
        return [tok.decode(c, skip_special_tokens=True) for c in completions]

    def loss(self, policy: Policy, batch: Batch, num_items: int) -> LossOutput:
        import torch

        from .logprobs import token_logps

        ids = torch.as_tensor(batch.input_ids, device=policy.device)
        mask = torch.as_tensor(batch.loss_mask, device=policy.device)
        advantages = torch.tensor([r.extra["advantage"] for r in batch.rows], device=policy.device)
        logps = token_logps(policy.logits(ids)[:, :-1], ids[:, 1:], self.temperature)
        ref = None
        if self.beta != 0.0:
            ref = token_logps(self.reference.logits(ids)[:, :-1], ids[:, 1:], self.temperature)
        loss, metrics = grpo_loss(logps, advantages, mask, num_items, ref_per_token_logps=ref, beta=self.beta,
                                  epsilon=self.epsilon)  # fmt: skip
        return LossOutput(loss, sums={"loss": float(loss.detach())}, means={**self._step_metrics, **metrics})


def _seed(seed: int, step: int, prompt: int, sample: int) -> int:
    """A sampling seed per completion, from numpy's SeedSequence over the four indices (independent streams)."""
    return int(np.random.SeedSequence([seed, step, prompt, sample]).generate_state(1)[0])


register("grpo", GRPO)
