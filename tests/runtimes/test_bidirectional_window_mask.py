"""std.attention's `bidirectional_window_mask` (an encoder's local band, ModernBERT's `local_attention`) against
masking_utils' `sliding_window_bidirectional_overlay` (`abs(q_idx - kv_idx) <= sliding_window`), on the
backends that run it as plain ops, for a window of no neighbours, one shorter than the sequence and one longer."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch]

SOURCE = """config C {
    window: int = 5
}
model Masks(c: C) {
    entry fn band(query_positions: i64[B, S], key_positions: i64[T]) -> bool[B, S, T] {
        bidirectional_window_mask(query_positions, key_positions, c.window)
    }
}
"""


@pytest.mark.parametrize("backend", ["torch-interpret", "jax", "onnxruntime"])
@pytest.mark.parametrize("window", [0, 3, 30])
def test_bidirectional_window_mask_is_transformers(tmp_path, backend, window):
    from transformers.masking_utils import sliding_window_bidirectional_overlay

    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    source = tmp_path / "masks.linnet"
    source.write_text(SOURCE)
    m = BACKENDS[backend].load(source, config={"window": window}, random_weights=True, progress=False)
    queries, keys = np.arange(16)[None], np.arange(16)
    (ours,) = m.run("band", queries, keys)
    rule = sliding_window_bidirectional_overlay(window)
    theirs = rule(0, 0, torch.from_numpy(queries[0])[:, None], torch.from_numpy(keys)[None, :]).tolist()
    assert np.asarray(ours)[0].tolist() == theirs
    assert any(not x for row in theirs for x in row) == (window < 15)  # the band really cuts (or not)
