"""List-valued config fields and `int(...)` through the real loading path: a checkpoint folder's
config.json sets a `list[float]` field (as Phi-3's `rope_scaling.short_factor`) and a float that a
derived field truncates with `int(...)`; the loaded model computes with them, on every PyTorch mode,
against numpy; a list of the wrong kind or length is refused on its key."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import linnet.torch as lt  # noqa: E402
from linnet.runtimes.loading import LoadError  # noqa: E402

pytestmark = [pytest.mark.torch]

SOURCE = """
config Scaled {
    head_dim: int = 8
    partial_rotary_factor: float = 1.0
    rotary_dim: int = int(head_dim * partial_rotary_factor)
    factors: list[float] = [1.0, 1.0, 1.0]
    size: int = len(factors)
}

model Scale(c: Scaled) {
    weight: [c.size]

    ## `x * factors * weight + factors[-1] + rotary_dim`, the factors rounded to f32.
    entry fn forward(x: f32[B, c.size]) -> f32[B, c.size] {
        x * tensor(c.factors, f32) * cast(weight, f32) + c.factors[-1] + c.rotary_dim
    }
}
"""


def folder_with(tmp_path, config: dict, size: int):
    (tmp_path / "config.json").write_text(json.dumps(config))
    weight = np.linspace(0.5, 1.5, size, dtype=np.float32)
    safetensors_numpy.save_file({"weight": weight}, str(tmp_path / "model.safetensors"))
    return weight


@pytest.mark.parametrize("mode", ["interpret", "generated"])
def test_list_and_int_from_config_json(tmp_path, mode):
    factors = [1.0, 1.0118, 1.1, 2.25, 0.3333333333]
    config = {"factors": factors, "partial_rotary_factor": 0.37, "head_dim": 10}
    weight = folder_with(tmp_path, config, len(factors))
    m = lt.load(SOURCE, weights=tmp_path, mode=mode, progress=False)
    assert m.config["factors"] == factors and m.config["size"] == 5
    assert m.config["rotary_dim"] == 3 == int(10 * 0.37)  # 3.7 truncated, not rounded
    x = np.arange(10, dtype=np.float32).reshape(2, 5) / 7
    expected = x * np.array(factors, dtype=np.float32) * weight + np.float32(factors[-1]) + np.float32(3)
    np.testing.assert_allclose(m.forward(x), expected, rtol=1e-6)


def test_int_truncates_toward_zero_like_python(tmp_path):
    """`int` of a negative product truncates toward zero (-2.5 -> -2, where floor would give -3)."""
    source = SOURCE.replace("c.rotary_dim\n", "c.rotary_dim + int(-c.partial_rotary_factor * 5.0)\n")
    weight = folder_with(tmp_path, {"partial_rotary_factor": 0.5}, 3)
    m = lt.load(source, weights=tmp_path, mode="interpret", progress=False)
    x = np.ones((1, 3), dtype=np.float32)
    assert math.trunc(-2.5) == -2
    np.testing.assert_allclose(m.forward(x), x * weight + 1.0 + 4 - 2, rtol=1e-6)


def test_a_list_of_the_wrong_kind_is_refused_on_its_key(tmp_path):
    folder_with(tmp_path, {"factors": [1.0, "two", 3.0]}, 3)
    with pytest.raises(LoadError, match=r"`factors` is a float"):
        lt.load(SOURCE, weights=tmp_path, mode="interpret", progress=False)
    folder_with(tmp_path, {"factors": 2.0}, 3)
    with pytest.raises(LoadError, match=r"`factors` is a list"):
        lt.load(SOURCE, weights=tmp_path, mode="interpret", progress=False)


def test_a_list_whose_length_breaks_a_shape_is_refused(tmp_path):
    """config.json's list has 4 factors, the checkpoint's `weight` 3: the size derived from the list
    does not match the tensor."""
    (tmp_path / "config.json").write_text(json.dumps({"factors": [1.0, 2.0, 3.0, 4.0]}))
    safetensors_numpy.save_file({"weight": np.ones(3, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(LoadError, match=r"weight"):
        lt.load(SOURCE, weights=tmp_path, mode="interpret", progress=False)
