"""Which standard-library bodies a call checks again with its sizes (`linnet.semantics.specialize`)."""

from __future__ import annotations

from linnet.semantics import specialize
from linnet.semantics.program import Document
from linnet.types import dims
from linnet.types.core import F32, Shape, TensorT
from linnet.types.dims import Dim
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


def _tensor(*dims) -> TensorT:
    return TensorT(F32, Shape(tuple(d if isinstance(d, Dim) else Dim.of(d) for d in dims)))


def test_sizes_key_renames_unknown_dims_and_keeps_how_they_repeat():
    """Two calls share a clean specialised check only when one renaming of their unknown dims maps one onto the
    other: `[B, 9, S, 64]` in any caller is one key, `[S, 9, S, 64]` (one dim twice) another."""
    fn = object()
    b1, s1, b2, s2 = (Dim.atom(dims.var(n)) for n in ("B", "S", "B", "S"))
    first = specialize.sizes_key(fn, {"x": _tensor(b1, 9, s1, 64)}, {"B": b1, "S": s1, "R": Dim.of(32)})
    second = specialize.sizes_key(fn, {"x": _tensor(b2, 9, s2, 64)}, {"B": b2, "S": s2, "R": Dim.of(32)})
    assert first is not None and first == second
    repeated = specialize.sizes_key(fn, {"x": _tensor(s2, 9, s2, 64)}, {"B": s2, "S": s2, "R": Dim.of(32)})
    assert repeated != first
    assert specialize.sizes_key(fn, {"x": _tensor(b1, 9, s1, 63)}, {"B": b1, "S": s1, "R": Dim.of(32)}) != first
    # a config field's value counts, not the field: `c.head_dim` of 64 is 64
    head_dim = Dim.atom(dims.const("c.head_dim", 64))
    assert specialize.sizes_key(fn, {"x": _tensor(b2, 9, s2, head_dim)}, {"B": b2, "S": s2, "R": Dim.of(32)}) == first
    # a floor division of unknowns is not keyed by value: no shared entry
    half = dims.floor_divide(s1, Dim.of(2))
    assert specialize.sizes_key(fn, {"x": _tensor(b1, 9, half, 64)}, {"B": b1, "S": s1, "R": Dim.of(32)}) is None


def test_a_clean_specialised_check_is_shared_across_bindings_and_edits(monkeypatch):
    """`apply_rope`'s body is checked once per distinct size (heads, head_dim) in one analysis, not once per call
    (10), and an edit of the caller's body checks it no more: the clean entries are lent from one analysis to the
    next."""
    checked: list[str] = []
    check_body = specialize._check_body

    def counting(checker, target, *args):
        checked.append(target.fn.name.id)
        return check_body(checker, target, *args)

    monkeypatch.setattr(specialize, "_check_body", counting)
    text = (EXAMPLES / "llama.linnet").read_text()
    doc = Document("llama.linnet", text)
    doc.analyze()
    # q and k under each of five bindings (the defaults and four presets), but (heads, head_dim) repeats: SmolLM2-1.7B's
    # (32, 64) is TinyLlama's q, the defaults' (32, 128) Llama 3.1's
    assert checked.count("apply_rope") == 6
    checked.clear()
    at = text.index('v_proj(x), "b s') + len("v_proj(x")
    doc.edit(at, at, " + 0.0")  # in LlamaAttention.project, which calls apply_rope: checked again, same sizes
    assert not doc.analyze().errors
    assert checked == []
