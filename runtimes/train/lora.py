"""LoRA adapters (filled in by the LoRA change)."""

from __future__ import annotations

import contextlib

__all__ = ["adapters_scaled"]


@contextlib.contextmanager
def adapters_scaled(module, factor: float):
    """No adapters yet: nothing to scale."""
    yield
