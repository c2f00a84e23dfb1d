"""`dropout` on the JAX backend: the identity unless the entry's `p` holds a random key (`DROPOUT_KEY`, what the JAX
trainer passes per micro-batch); with one, PyTorch's semantics (about a fraction p zeroed, every survivor scaled by
exactly 1 / (1 - p)), the same masks for the same key, a new key for each dropout the call runs (two dropouts of
one tensor, in a method or in a free function, are two masks). The program is dropout_program.py's."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.ir.build import build
from tests.compiler.dropout_program import SOURCE, P

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.jax

from linnet.compiler.jax.codegen import DROPOUT_KEY  # noqa: E402
from linnet.compiler.jax.module import compile_program  # noqa: E402


@pytest.fixture(scope="module")
def compiled():
    return compile_program(build(SOURCE))


def test_a_key_zeroes_p_and_scales_the_rest(compiled):
    forward = jax.jit(compiled.entry_fn("forward"))
    x = np.ones((1024, 256), dtype=np.float32)  # 262144 elements: the zeroed fraction within 0.005 of p
    np.testing.assert_array_equal(forward({}, {}, x), x)  # no key: inference
    key = jax.random.PRNGKey(0)
    y = np.asarray(forward({DROPOUT_KEY: key}, {}, x))
    zeroed = float((y == 0).mean())
    assert abs(zeroed - P) < 0.005, zeroed
    np.testing.assert_array_equal(y[y != 0], np.float32(1 / (1 - P)))  # F.dropout's scale, to the last bit
    np.testing.assert_array_equal(forward({DROPOUT_KEY: key}, {}, x), y)  # the masks come from the key
    assert not np.array_equal(forward({DROPOUT_KEY: jax.random.PRNGKey(1)}, {}, x), y)


@pytest.mark.parametrize("entry", ["twice", "free", "calls"])
def test_two_dropouts_of_one_tensor_are_two_masks(compiled, entry):
    run = jax.jit(compiled.entry_fn(entry))
    x = np.ones((64, 256), dtype=np.float32)
    np.testing.assert_array_equal(run({}, {}, x), np.zeros_like(x))  # inference: x - x
    assert np.asarray(run({DROPOUT_KEY: jax.random.PRNGKey(0)}, {}, x)).any()
    assert "def noise_twice(x, dropout_keys):" in compiled.source
    assert "noise_twice(x, dropout_keys=self.dropout_keys)" in compiled.source
