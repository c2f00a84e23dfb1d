"""The model being trained on PyTorch: the `forward` entry of a loaded `TorchModel` under autograd.

Loading (`linnet.runtimes.backends.torch_backend.load`) binds every parameter frozen (`requires_grad=False`) and
inference runs under `torch.inference_mode()`; `TorchPolicy` marks the trained parameters
(`requires_grad=True`: every parameter for full fine-tuning, the LoRA adapters otherwise) and runs the
entry outside inference mode, so the generated code (or the interpreter) records the graph autograd
differentiates. Backends that cannot train say so (`Backend.can_train` in the registry).

Activation checkpointing (`gradient_checkpointing=True`): the generated decoders run their layers as
`for layer in self.layers: h = layer.forward(h, ...)`, so replacing each list item's `forward` with a
`torch.utils.checkpoint.checkpoint` of it (non-reentrant) recomputes one decoder layer's activations in the
backward pass instead of keeping them, as transformers' `gradient_checkpointing_enable()` does per layer.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from linnet.errors import TrainError
from linnet.runtimes.backends.torch_backend import TorchModel

__all__ = ["TorchPolicy"]


class TorchPolicy:
    """A `TorchModel` being trained (the objectives' `Policy`).

    Args:
        model: the loaded model (any torch mode that trains: interpret, generated, inductor).
        trainable: the checkpoint paths of the parameters to train (`module.named_parameters()` names).
        gradient_checkpointing: recompute each decoder layer in the backward pass.
        autocast_dtype: run the forward under `torch.autocast` in this dtype (bf16 mixed precision), or None.
    """

    def __init__(
        self,
        model: TorchModel,
        trainable: list[str],
        *,
        gradient_checkpointing: bool = False,
        autocast_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.module = model.module
        self.device = self.module.device_
        self.tokenizer = model.tokenizer()
        tok = self.tokenizer
        pad = getattr(tok, "eos_token_id", None) if tok is not None else None
        self.pad_token_id = int(pad) if pad is not None else 0  # TRL pads with the EOS token when there is no PAD
        forward = self.module.program.entries.get("forward")
        if forward is None:
            raise TrainError(f"{self.module.program.source} has no `forward` entry to train (entries: "
                             f"{', '.join(self.module.program.entries)})")  # fmt: skip
        self.vocab_size = forward.outputs[0].dims[-1].as_int()
        self.autocast_dtype = autocast_dtype
        self.forward_module: nn.Module | None = None  # set by linnet.runtimes.train.torch_dp
        self._adapters_on = True
        params = dict(self.module.named_parameters())
        unknown = [p for p in trainable if p not in params]
        if unknown:
            raise TrainError(f"no parameter {', '.join(unknown[:5])} to train")
        for name, p in params.items():
            p.requires_grad_(name in set(trainable))
        self.trainable = {name: params[name] for name in trainable}
        if gradient_checkpointing:
            self._checkpoint_layers()

    def parameters(self) -> Iterator[nn.Parameter]:
        """The trained parameters, in checkpoint order."""
        return iter(self.trainable.values())

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The `forward` entry's logits [B, S, vocab] with gradients (under autocast when asked), through
        `forward_module` when a distributed run wrapped the model (DDP, FSDP2: their hooks run on its call)."""
        entry = self.forward_module if self.forward_module is not None else self.module.entry("forward")
        if self.autocast_dtype is None:
            return entry(input_ids)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype):
            return entry(input_ids)

    @contextlib.contextmanager
    def training(self):
        """Within, the model is in PyTorch's training mode (`module.train()`: dropout draws its masks, as in a
        transformers `Trainer` step); back in `eval()` (inference: dropout is the identity) on exit."""
        self.module.train()
        try:
            yield
        finally:
            self.module.eval()

    @contextlib.contextmanager
    def adapters_disabled(self):
        """Within, `logits` is the base model: every LoRA adapter adds 0 (PEFT's `disable_adapter()`); for
        forwards without gradients (the DPO reference)."""
        from .lora import adapters_disabled

        with adapters_disabled(self.module):
            yield

    def _checkpoint_layers(self) -> None:
        lists = [m for m in self.module.modules() if isinstance(m, nn.ModuleList) and len(m)]
        if not lists or self.module.mode == "interpret":
            raise TrainError(
                "gradient checkpointing wraps each decoder layer's `forward`; "
                + ("the interpreter runs a flat graph with no layers" if lists else "this model has no list of layers")
            )
        for layers in lists:
            for layer in layers:
                if hasattr(layer, "forward") and any(True for _ in layer.parameters()):
                    layer.forward = functools.partial(_checkpointed, layer.forward)


def _checkpointed(fn: Any, *args: Any) -> Any:
    from torch.utils.checkpoint import checkpoint

    return checkpoint(fn, *args, use_reentrant=False)
