"""The std library's convolution and normalisation modules (linnet/std/nn.linnet: Conv1d, Conv2d,
GroupNorm, BatchNorm2d, LayerNorm2d) on every backend against the PyTorch module they mirror:
the same checkpoint names (the module's state_dict, BatchNorm's `num_batches_tracked` the one
tensor left unused), random weights and running statistics, outputs within f32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.ir import build
from tests.compiler.test_composites import BACKENDS, Runner, passes

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
nn = torch.nn


def _sam_layer_norm(c):
    from transformers.models.sam.modeling_sam import SamLayerNorm

    return SamLayerNorm(c, eps=1e-6, data_format="channels_first")


# name -> (the Linnet constructor, the PyTorch module, the input's shape)
MODULES = {
    "conv2d_strided_grouped": (
        "Conv2d(4, 6, 3, stride=2, padding=1, groups=2)",
        lambda: nn.Conv2d(4, 6, 3, 2, 1, groups=2),
        (2, 4, 9, 8),
    ),
    "conv2d_dilated_no_bias": (
        "Conv2d(3, 4, 3, padding=2, dilation=2, use_bias=false)",
        lambda: nn.Conv2d(3, 4, 3, padding=2, dilation=2, bias=False),
        (1, 3, 7, 6),
    ),
    "conv2d_patches": ("Conv2d(3, 8, 4, stride=4)", lambda: nn.Conv2d(3, 8, 4, stride=4), (2, 3, 16, 12)),
    "conv2d_depthwise": (
        "Conv2d(6, 6, 3, padding=1, groups=6)",
        lambda: nn.Conv2d(6, 6, 3, padding=1, groups=6),
        (1, 6, 5, 5),
    ),
    "conv1d": ("Conv1d(4, 6, 3, stride=2, padding=1)", lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1), (2, 4, 11)),
    "group_norm": ("GroupNorm(2, 6)", lambda: nn.GroupNorm(2, 6), (2, 6, 5, 3)),
    "group_norm_no_affine": (
        "GroupNorm(3, 6, eps=1e-6, affine=false)",
        lambda: nn.GroupNorm(3, 6, eps=1e-6, affine=False),
        (2, 6, 4, 4),
    ),
    "batch_norm": ("BatchNorm2d(6)", lambda: nn.BatchNorm2d(6).eval(), (2, 6, 5, 3)),
    "layer_norm_2d": ("LayerNorm2d(6)", lambda: _sam_layer_norm(6), (2, 6, 5, 3)),
}


def reference_module(name: str):
    """The PyTorch module with every float tensor random (norms' weights near 1, running
    variances positive), seeded."""
    torch.manual_seed(0)
    module = MODULES[name][1]()
    with torch.no_grad():
        for key, t in module.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand_like(t) + 0.5 if key.endswith(("weight", "running_var")) else torch.randn_like(t))
    return module


def program_for(name: str, module, x: torch.Tensor):
    ctor, _, shape = MODULES[name]
    out = tuple(module(x).shape)
    dims = lambda s: ", ".join(map(str, s))  # noqa: E731
    source = (
        f"config C {{ unused: int = 0 }}\nmodel M(c: C) {{\n    layer: {ctor}\n"
        f"    entry fn forward(x: [{dims(shape)}]) -> [{dims(out)}] {{ layer(x) }}\n}}\n"
    )
    return build(source)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_matches_pytorch(name, backend):
    module = reference_module(name)
    x = torch.randn(MODULES[name][2], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = module(x).numpy()
    program = program_for(name, module, x)
    state = {f"layer.{k}": v.numpy() for k, v in module.state_dict().items()}
    # checkpoint names as PyTorch writes them: every parameter is in the state_dict, and only
    # BatchNorm's training counter is left over
    assert {p.path for p in program.params} == {k for k in state if not k.endswith("num_batches_tracked")}
    params = {p.path: state[p.path] for p in program.params}
    got = Runner(backend, program, passes(backend), "equivalent", params).run("forward", x.numpy())
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# DINOv2's position-embedding resize (transformers' Dinov2Embeddings.interpolate_pos_encoding): the
# class position kept, the 5x5 grid of patch positions resized bicubically (align_corners false, no
# antialias) to the 4x5 patches of an 8x10 image with 2x2 patches.
DINOV2_RESIZE = """config C { hidden: int = 8 }
model M(c: C) {
    entry fn forward(positions: [1, 26, c.hidden]) -> [1, 21, c.hidden] {
        let grid = rearrange(positions[:, 1:, :], "b (h w) d -> b d h w", h=5)
        let resized = interpolate(grid, size=[4, 5], mode="bicubic")
        concat([positions[:, :1, :], rearrange(resized, "b d h w -> b (h w) d")], dim=1)
    }
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_bicubic_resize_matches_dinov2_position_embeddings(backend):
    from transformers import Dinov2Config
    from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings

    config = Dinov2Config(hidden_size=8, patch_size=2, image_size=10, num_channels=3)
    embeddings = Dinov2Embeddings(config)
    with torch.no_grad():
        embeddings.position_embeddings.copy_(torch.randn(1, 26, 8, generator=torch.Generator().manual_seed(2)))
        want = embeddings.interpolate_pos_encoding(torch.zeros(1, 21, 8), 8, 10).numpy()
    positions = embeddings.position_embeddings.detach().numpy()
    got = Runner(backend, build(DINOV2_RESIZE), passes(backend), "equivalent", {}).run("forward", positions)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
