"""Helpers for the zoo's vision tests (`test_parity_vit.py`, `test_parity_resnet.py`, `test_parity_dinov2.py`): a
source checked under its presets at real size against the names, shapes and count of what transformers saves for the
real config (built on the `meta` device), and a seeded shrunk checkpoint saved by transformers and loaded through its
folder on every backend.

Nothing here imports torch or transformers at import time. Nothing is fetched: the real checkpoints are described by
their config values (each preset's source is given in the .linnet file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document

# f32 vision models against transformers' eager f32: what we see is ~1e-6 on the logits of the shrunk models.
OUTPUT_ATOL = 1e-4


def analysis(source: Path):
    return Document(str(source), source.read_text(encoding="utf-8")).analyze()


def saved_tensors(model) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor `save_pretrained` writes for `model` (which may live on `meta`): its parameters and
    persistent buffers under the names of the checkpoint files. transformers 5 renames some families' modules when it
    loads (ViT's `attention.attention.query` is `attention.q_proj` in memory) and reverts the renaming when it saves;
    the real checkpoints hold the saved names. BatchNorm's `num_batches_tracked` counts training steps, and Linnet's
    loader accepts it without a parameter (std `BatchNorm2d`): it is left out here."""
    from transformers.core_model_loading import revert_weight_conversion

    tensors = revert_weight_conversion(model, dict(model.state_dict()))
    return {name: tuple(t.shape) for name, t in tensors.items() if not name.endswith("num_batches_tracked")}


def check_preset_parameters(source: Path, preset: str, model) -> None:
    """The preset's parameters (paths and shapes) are exactly the tensors transformers saves for the real config, and
    its parameter count is transformers' `num_parameters()` plus the saved buffers the source declares as parameters
    (BatchNorm's running statistics)."""
    tree = analysis(source).trees[preset]
    theirs = saved_tensors(model)
    assert {p.path: p.shape() for p in tree.params} == theirs
    buffers = sum(b.numel() for name, b in model.named_buffers() if not name.endswith("num_batches_tracked"))
    assert tree.param_count() == model.num_parameters() + buffers


def load(source: Path, backend: str, folder, device: str = "cpu", **kwargs):
    """`source` on `backend` and `device` with the weights of `folder` (skipped where the backend cannot run there)."""
    if (why := BACKENDS[backend].unavailable(device)) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(source, weights=folder, max_batch=2, device=device, progress=False, **kwargs)


def seeded_pixels(batch: int, size: int | tuple[int, int], seed: int = 3):
    """A [batch, 3, H, W] f32 batch of normal noise (what a processor's normalised image looks like), seeded."""
    import torch

    height, width = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


def config_fields_match(ours: dict[str, Any], config) -> dict[str, tuple[Any, Any]]:
    """The fields of `ours` (a preset's config) whose value differs from `config`'s (a transformers config object) of
    the same name: {field: (ours, theirs)}; fields transformers does not have are not compared."""
    return {
        key: (value, getattr(config, key))
        for key, value in ours.items()
        if hasattr(config, key) and getattr(config, key) != value
    }
