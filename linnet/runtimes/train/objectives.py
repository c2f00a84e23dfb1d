"""Objectives: what a training method minimises. An objective turns data rows into token rows and batches,
and computes a loss and its metrics from a batch and the model's entry outputs (`Policy.logits`, the
`forward` entry's logits). The trainer (`trainer.Trainer`) owns everything else: the optimizer, the schedule,
accumulation, clipping, logging.

The registry `OBJECTIVES` maps a `--method` to a factory; `sft` and `full` live here (the same objective:
`full` trains every parameter, `sft` LoRA adapters unless told otherwise); `dpo` and `grpo` register
themselves from their own modules (`register`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from linnet.errors import TrainError

from .data import Batch, Row, TokenRow, encode_prompt_completion, field_choice, pad_batch, token_ids

if TYPE_CHECKING:
    import torch

__all__ = ["Policy", "Objective", "LossOutput", "SFT", "OBJECTIVES", "register", "objective_for", "token_nll"]


class Policy(Protocol):
    """What an objective sees of the model being trained (`policy.TorchPolicy` on PyTorch).

    `logits(input_ids: i64[B, S]) -> f32[B, S, vocab]` runs the `forward` entry with gradients;
    `adapters_disabled()` is a context in which `logits` is the base model (LoRA adapters off: the DPO
    reference, as PEFT's `disable_adapter()`); `tokenizer` the checkpoint's (or None); `device` where tensors go;
    `pad_token_id` the id right padding uses."""

    tokenizer: Any
    device: Any
    pad_token_id: int
    vocab_size: int

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def adapters_disabled(self) -> AbstractContextManager: ...


@dataclass
class LossOutput:
    """A micro-batch's loss (a scalar tensor to call `backward` on, already divided by the step's global
    normaliser so that micro-batch losses add up to the step's loss) and its metrics: floats the trainer adds
    over the micro-batches of a step (`sums`) and averages over them (`means`) before logging."""

    loss: torch.Tensor
    sums: dict[str, float] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)


class Objective:
    """A training method's loss.

    Subclasses set `name`, `shapes` (the row field sets it reads, in order of preference, e.g.
    `(("prompt", "completion"), ("prompt_ids", "completion_ids"))`) and `default_learning_rate`, and implement
    `token_row` and `loss`. The trainer calls, per optimizer step: `collate` on each micro-batch of token rows,
    `prepare_step` once on the step's micro-batches (GRPO generates its completions there), `num_items` on each
    to get the step's global normaliser (summed over micro-batches and, in a distributed run, over ranks), then
    `loss` on each."""

    name: str = ""
    shapes: tuple[tuple[str, ...], ...] = ()
    default_learning_rate: float = 2e-5

    def token_rows(
        self, rows: Sequence[Row], tokenizer: Any, vocab_size: int, max_length: int | None
    ) -> list[TokenRow]:
        """Every row as a `TokenRow` (`token_row`), truncated to `max_length` tokens keeping the start (TRL's
        `truncation_mode="keep_start"`); rows left without a loss token are dropped, as TRL drops them. Raises
        TrainError (file:line, field) for a bad row and when no row is left."""
        out = []
        for row in rows:
            r = self.token_row(row, tokenizer, vocab_size)
            if max_length is not None:
                r.input_ids, r.completion_mask = r.input_ids[:max_length], r.completion_mask[:max_length]
            if any(r.completion_mask[1:]):
                out.append(r)
        if not out:
            raise TrainError(f"{rows[0].where.rsplit(':', 1)[0]}: no row has a token to train on")
        return out

    def token_row(self, row: Row, tokenizer: Any, vocab_size: int) -> TokenRow:
        raise NotImplementedError

    def collate(self, rows: Sequence[TokenRow], pad_token_id: int) -> Batch:
        return pad_batch(rows, pad_token_id)

    def prepare_step(self, policy: Policy, micro_batches: list[Batch]) -> list[Batch]:
        """The step's micro-batches as the loss reads them (unchanged here; GRPO samples completions)."""
        return micro_batches

    def resume(self, policy: Policy, step: int) -> None:
        """Called by a run resumed from a checkpoint after `step` optimizer steps, before the checkpoint's trained
        values are bound (the policy still holds the starting ones): an objective sets up what its first step
        would have (a reference model of the starting weights) and the state its steps advance."""

    def num_items(self, batch: Batch) -> int:
        """This micro-batch's share of the step's normaliser (loss tokens by default)."""
        return batch.num_loss_tokens

    def loss(self, policy: Policy, batch: Batch, num_items: int) -> LossOutput:
        raise NotImplementedError


def token_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """The negative log-likelihood of each next token: `logits` [B, S, vocab] (any float dtype, computed in f32),
    `input_ids` i64[B, S] -> f32[B, S - 1], entry s = -log p(input_ids[s + 1] | tokens ..s).
    (transformers' `ForCausalLMLoss` and TRL's `selective_log_softmax`: log-softmax, then the target's entry.)"""
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


class SFT(Objective):
    """Supervised fine-tuning: the token NLL over the loss tokens, summed, divided by the number of loss tokens
    of the whole optimizer step (every micro-batch of the accumulation, every rank). That is TRL's SFT loss
    (trl/trainer/sft_trainer.py, `SFTTrainer.compute_loss`: `per_token_loss.sum() / num_items_in_batch`, the
    default `loss_type="nll"`; `chunked_nll` computes the same without the full logits).

    Rows: prompt-completion (`prompt`/`completion` or `prompt_ids`/`completion_ids`): completion-only loss, TRL's
    default for prompt-completion data (`completion_only_loss=None`); language modelling (`text` or `input_ids`):
    every token after the first."""

    name = "sft"
    shapes = (("prompt", "completion"), ("prompt_ids", "completion_ids"), ("text",), ("input_ids",))
    default_learning_rate = 2e-5  # SFTConfig.learning_rate

    def token_row(self, row: Row, tokenizer: Any, vocab_size: int) -> TokenRow:
        shape = field_choice(row, self.shapes)
        if len(shape) == 2:
            prompt, completion = encode_prompt_completion(row, shape[0], shape[1], tokenizer, vocab_size)
            return TokenRow(prompt + completion, [0] * len(prompt) + [1] * len(completion), row.where)
        if shape == ("input_ids",):
            ids = token_ids(row, "input_ids", vocab_size)
        else:
            text = row.fields["text"]
            if not isinstance(text, str):
                raise row.error(f'field "text" must be a string, got {type(text).__name__}')
            if tokenizer is None:
                raise row.error('field "text" is text, and the checkpoint has no tokenizer: give "input_ids"')
            eos = tokenizer.eos_token
            ids = tokenizer.encode(text if eos is None or text.endswith(eos) else text + eos)
        return TokenRow(ids, [1] * len(ids), row.where)

    def loss(self, policy: Policy, batch: Batch, num_items: int) -> LossOutput:
        import torch

        ids = torch.as_tensor(batch.input_ids, device=policy.device)
        mask = torch.as_tensor(batch.loss_mask, device=policy.device)
        logits = policy.logits(ids)
        nll = token_nll(logits, ids)
        loss = (nll * mask).sum() / max(1, num_items)
        with torch.no_grad():
            loss_value = loss.detach()
            correct = (logits[:, :-1].argmax(-1) == ids[:, 1:]).float()
            correct = float((correct * mask).sum())
            sums = {"loss": float(loss_value), "num_loss_tokens": float(mask.sum()), "correct": correct}
        return LossOutput(loss, sums=sums)


OBJECTIVES: dict[str, Callable[..., Objective]] = {"sft": SFT, "full": SFT}


def register(name: str, factory: Callable[..., Objective]) -> None:
    """Add a `--method` (train-pref's `dpo`, `grpo`)."""
    OBJECTIVES[name] = factory


def objective_for(method: str, **options: Any) -> Objective:
    """The objective of `--method` with its options. Raises TrainError naming the methods."""
    if method not in OBJECTIVES:  # DPO's and GRPO's modules import torch: SFT on JAX runs without it
        _register_builtin()
    try:
        factory = OBJECTIVES[method]
    except KeyError:
        raise TrainError(f"unknown training method `{method}` (methods: {', '.join(OBJECTIVES)})") from None
    return factory(**options)


def _register_builtin() -> None:
    """Import the modules of the methods defined elsewhere (each registers itself), when they exist."""
    import importlib

    for module in ("dpo", "grpo"):
        try:
            importlib.import_module(f"{__package__}.{module}")
        except ModuleNotFoundError as err:
            if err.name != f"{__package__}.{module}":
                raise
