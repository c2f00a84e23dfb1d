"""Which standard-library bodies a call checks again with its sizes (`linnet.semantics.specialize`)."""

from __future__ import annotations

from linnet.semantics.program import Document
from tests.conftest import EXAMPLES


def _checked_again(path) -> tuple[set[str], set[str]]:
    """The names of the standard-library functions a check of `path` calls: those whose bodies its calls check
    again with their sizes, and the others."""
    doc = Document(path.name, path.read_text())
    doc.analyze()
    found = doc._context[1].size_dependent
    return {fn.name.id for fn, f in found.items() if f}, {fn.name.id for fn, f in found.items() if not f}


def test_only_bodies_that_sizes_can_break_are_checked_again():
    """Llama's layers use only ops that decide their rules for every size (checking each again cost a third of
    `linnet check`), but for rotary embeddings' slices; a convolution's window needs the call's sizes."""
    again, not_again = _checked_again(EXAMPLES / "llama.linnet")
    assert {"forward", "rms_norm", "attention", "softmax", "causal_mask", "rope_inv_freq"} <= not_again
    assert again == {"rotate_half", "apply_rope"}  # slices: their bounds are checked only with known sizes
    again, _ = _checked_again(EXAMPLES / "resnet.linnet")
    assert "forward" in again  # Conv2d's window
