"""The spatial ops' numpy references (linnet/ops/spatial.py) against the torch.nn.functional call
each op is defined by, on the op's own random cases (hypothesis draws the sizes and the seed;
the cases draw odd and even sizes, strides above 1, dilations, groups, every padding style).
The backends' op tests (tests/compiler/test_*_ops.py) then hold every backend to these
references, so each backend is checked against PyTorch's functional op through them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.ops import REGISTRY
from linnet.ops.spatial import ints
from tests.compiler.op_cases import case, reference, single_op_graph

torch = pytest.importorskip("torch")
F = torch.nn.functional
# PyTorch warns that an even kernel under padding="same" copies the input; the cases draw those on purpose
pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:Using padding=.same.")]


def _window(const: dict, arg: str, n: int):
    value = const[arg]
    return value if isinstance(value, str) else ints(value, n)


def _conv(fn):
    def call(t: dict, const: dict):
        n = t["x"].ndim - 2
        return fn(
            t["x"], t["weight"], t.get("bias"),
            stride=ints(const["stride"], n), padding=_window(const, "padding", n),
            dilation=ints(const["dilation"], n), groups=const["groups"].as_int(),
        )  # fmt: skip

    return call


def _avg_pool(t: dict, const: dict):
    stride = None if const["stride"] is None else ints(const["stride"], 2)
    return F.avg_pool2d(
        t["x"], ints(const["kernel_size"], 2), stride, ints(const["padding"], 2),
        ceil_mode=const["ceil_mode"], count_include_pad=const["count_include_pad"],
    )  # fmt: skip


def _interpolate(t: dict, const: dict):
    how = {"size": ints(const["size"], 2)} if const.get("size") is not None else {"scale_factor": const["scale_factor"]}
    corners = None if const["mode"] == "nearest" else const["align_corners"]
    return F.interpolate(t["x"], mode=const["mode"], align_corners=corners, **how)


# op -> the PyTorch call it is defined by, on the case's tensors (as torch tensors) and constants
TORCH_CALLS = {
    "conv1d": _conv(F.conv1d),
    "conv2d": _conv(F.conv2d),
    "pad": lambda t, c: F.pad(
        t["x"], ints(c["pad"], len(c["pad"])), mode=c["mode"], value=c["value"] if c["mode"] == "constant" else None
    ),
    "max_pool2d": lambda t, c: F.max_pool2d(
        t["x"],
        ints(c["kernel_size"], 2),
        None if c["stride"] is None else ints(c["stride"], 2),
        ints(c["padding"], 2),
        ints(c["dilation"], 2),
        ceil_mode=c["ceil_mode"],
    ),  # fmt: skip
    "avg_pool2d": _avg_pool,
    "adaptive_avg_pool2d": lambda t, c: F.adaptive_avg_pool2d(t["x"], ints(c["output_size"], 2)),
    "interpolate": _interpolate,
    "conv_transpose2d": lambda t, c: F.conv_transpose2d(
        t["x"],
        t["weight"],
        t.get("bias"),
        ints(c["stride"], 2),
        ints(c["padding"], 2),
        ints(c["output_padding"], 2),
        c["groups"].as_int(),
        ints(c["dilation"], 2),
    ),  # fmt: skip
}
SPATIAL = sorted(name for name, op in REGISTRY.items() if op.category == "spatial")


def test_every_spatial_op_has_its_pytorch_call():
    assert sorted(TORCH_CALLS) == SPATIAL


@pytest.mark.parametrize("name", SPATIAL)
@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_reference_matches_pytorch(name, shape, seed):
    tensors, const = case(name, np.random.default_rng(seed), shape)
    want = TORCH_CALLS[name]({k: torch.from_numpy(v) for k, v in tensors.items()}, const).numpy()
    got = np.asarray(reference(name, tensors, const))
    _, types, _ = single_op_graph(name, tensors, const)
    assert got.shape == want.shape == tuple(d.as_int() for d in types[0].shape.dims)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
