"""A generated function that reads one symbolic dim of an input binds it to an int
(`B = x.shape[0]`), not to a one-element shape (`x.shape[:1]`, or `positions.shape` for a
rank-1 input), which reshapes and broadcasts then refused."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from linnet.compiler.jax.codegen import generate as generate_jax
from linnet.compiler.torch.codegen import generate as generate_torch
from linnet.ir import build

SOURCE = """config C {
    d: int = 4
}

fn first(x: [B, S, D]) -> [B, D] {
    reshape(x[:, :1], [B, D])
}

fn count(positions: i64[B]) -> i64[B] {
    positions + reshape(arange(B), [B])
}

model M(c: C) {
    entry fn forward(x: [B, S, c.d], positions: i64[B]) -> [B, c.d] {
        first(x) + cast(unsqueeze(count(positions), 1), x.dtype)
    }
}
"""


@pytest.mark.parametrize("generate", [generate_torch, generate_jax], ids=["torch", "jax"])
def test_one_dim_of_an_input_is_read_as_an_int(generate):
    text = generate(build(SOURCE))
    assert "B = x.shape[0]" in text and "B = positions.shape[0]" in text
    assert "shape[:1]" not in text and "B = positions.shape\n" not in text


BACKENDS = [b for b, module in (("torch", "torch"), ("jax", "jax")) if importlib.util.find_spec(module)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_it_runs(backend, tmp_path):
    import linnet

    path = tmp_path / "dims.linnet"
    path.write_text(SOURCE)
    model = linnet.load(path, backend=backend, random_weights=True, progress=False)
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    (out,) = model.run("forward", x, np.array([10, 20]))
    np.testing.assert_array_equal(out, x[:, 0] + np.array([[10.0], [21.0]], dtype=np.float32))
