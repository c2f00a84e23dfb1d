"""The reference model of DPO and of GRPO with a KL term, as TRL 1.16 chooses it when no `ref_model` is given:

- new LoRA adapters (TRL given a `peft_config`): the same model with its adapters disabled
  (`use_adapter(model, adapter_name=None)` in trl/trainer/dpo_trainer.py `DPOTrainer._compute_loss` and
  grpo_trainer.py `GRPOTrainer._generate_and_score_completions`), so no second copy of the weights;
- training on from an existing adapter (TRL given a `PeftModel`, `--adapter DIR`): a frozen copy of the starting
  adapter (TRL's "ref" adapter, `DPOTrainer.__init__`); with B = 0 both are the base model exactly;
- full fine-tuning: a frozen copy of the starting weights (TRL loads the checkpoint a second time).
In the last two cases the starting values of the trained parameters are kept (the frozen ones are shared) and
swapped into the module for the reference forward (`swapped_parameters`).

Both run under `torch.no_grad()`: the reference gets no gradient.
"""

from __future__ import annotations

import contextlib

import torch

from .objectives import Policy

__all__ = ["has_adapters", "ReferenceModel", "swapped_parameters"]


def has_adapters(policy: Policy) -> bool:
    """Whether the policy trains LoRA adapters (its trained parameters are `lora_A` / `lora_B` matrices)."""
    return any("lora_" in name for name in getattr(policy, "trainable", {}))


class ReferenceModel:
    """The reference's `forward` logits for a policy (see the module docstring). Create it before the first
    optimizer step: for full fine-tuning it snapshots the trained parameters' current values."""

    def __init__(self, policy: Policy):
        self.policy = policy
        trained = getattr(policy, "trainable", {})
        fresh = all(not p.any() for name, p in trained.items() if "lora_B" in name)
        self.adapters = has_adapters(policy) and fresh
        self.initial: dict[str, torch.Tensor] | None = None
        if not self.adapters:
            self.initial = {name: p.detach().clone() for name, p in trained.items()}

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """f32[B, S, vocab] of the reference on `input_ids` i64[B, S]."""
        if self.adapters:
            with self.policy.adapters_disabled():
                return self.policy.logits(input_ids)
        with swapped_parameters(self.policy.module, self.initial):
            return self.policy.logits(input_ids)


@contextlib.contextmanager
def swapped_parameters(module, values: dict[str, torch.Tensor]):
    """Within, the `LinnetModule`'s parameters named in `values` (checkpoint paths) are those tensors, for the
    generated code (which reads each owner's attribute: the generated `Module` mirrors its parameters into its
    `__dict__` for fast access, which `torch.func.functional_call` does not update) and the interpreter (which
    reads `module.tensors`)."""
    saved = {}
    try:
        for path, tensor in values.items():
            owner, leaf = module._leaves[path]
            saved[path] = owner._parameters[leaf]
            owner._parameters[leaf] = tensor
            owner.__dict__[leaf] = tensor
            module.tensors[path] = tensor
        yield
    finally:
        for path, param in saved.items():
            owner, leaf = module._leaves[path]
            owner._parameters[leaf] = param
            owner.__dict__[leaf] = param
            module.tensors[path] = param
