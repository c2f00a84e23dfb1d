"""examples/dinov2.linnet against transformers' Dinov2Model.

At real size (no weights): the source checks clean under its preset, whose parameters are the tensors transformers
saves for facebook/dinov2-base's config (built on the `meta` device: names, shapes and count), and whose config is that
model's. At shrunk size: a seeded 2-layer DINOv2 whose position embeddings were learned at 32 x 32 (4 x 4 patches of
8), every parameter perturbed (norms and layer scales away from 1), saved with `save_pretrained` and loaded through the
folder on every backend: `last_hidden_state` of a batch of two images at the stored size, and of a batch at 48 x 40,
where the position embeddings are resized bicubically to a 6 x 5 grid as transformers resizes them."""

from __future__ import annotations

import pytest

from tests.conftest import EXAMPLES
from tests.runtimes.conftest import ALL_BACKENDS, max_abs_diff, perturb, record
from tests.runtimes.zoo_vision import (
    OUTPUT_ATOL,
    analysis,
    check_preset_parameters,
    config_fields_match,
    load,
    seeded_pixels,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

DINOV2 = EXAMPLES / "dinov2.linnet"
# facebook/dinov2-base's config.json: Dinov2Config's defaults but the image size its position embeddings were
# learned at (518: 37 x 37 patches of 14).
REAL_CONFIGS = {"dinov2_base": dict(image_size=518, patch_size=14)}
SIZES = {"stored size 32x32": (32, 32), "resized to 48x40": (48, 40)}


def test_checks_clean_under_every_preset():
    result = analysis(DINOV2)
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    with torch.device("meta"):
        ref = transformers.Dinov2Model(transformers.Dinov2Config(**REAL_CONFIGS[preset]))
    check_preset_parameters(DINOV2, preset, ref)
    assert ref.num_parameters() == 86_580_480  # ViT-B/14's 86.6 M (1370 positions, the mask token)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config(preset):
    from linnet.ir import build

    ours = build(DINOV2, preset=preset).config
    assert config_fields_match(ours, transformers.Dinov2Config(**REAL_CONFIGS[preset])) == {}
    assert ours["grid_size"] == 37 and ours["intermediate_size"] == 3072


@pytest.fixture(scope="module")
def small_dinov2(tmp_path_factory):
    """(folder, transformers model) of a seeded 2-layer Dinov2Model saved with save_pretrained."""
    torch.manual_seed(0)
    config = transformers.Dinov2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=3, image_size=32, patch_size=8,
        layerscale_value=0.5, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.Dinov2Model(config).eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("dinov2")
    model.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_last_hidden_state(small_dinov2, backend, size):
    folder, ref = small_dinov2
    m = load(DINOV2, backend, folder)
    pixels = seeded_pixels(2, SIZES[size])
    (states,) = m.run("forward", pixels.numpy())
    with torch.inference_mode():
        theirs = ref(pixel_values=pixels).last_hidden_state
    delta = max_abs_diff(states, theirs)
    record(f"small DINOv2 ({backend}) last_hidden_state {list(theirs.shape)}, images at {size}", delta,
           model="dinov2", backend=backend, checkpoint="seeded 2-layer, 8x8 patches")  # fmt: skip
    assert delta < OUTPUT_ATOL


def test_the_resize_is_what_the_parity_test_sees(small_dinov2):
    """At 48 x 40 the position embeddings are resized: the positions of a 4 x 4 grid cut to 6 x 5 (no resize) would
    move the hidden states far beyond the tolerance, so the parity above sees the bicubic resize."""
    folder, ref = small_dinov2
    pixels = seeded_pixels(2, SIZES["resized to 48x40"])
    embeddings = ref.embeddings
    with torch.inference_mode():
        theirs = ref(pixel_values=pixels).last_hidden_state
        stored = embeddings.position_embeddings
        patch = stored[:, 1:].reshape(1, 4, 4, -1)
        edge = patch[:, [0, 1, 2, 3, 3, 3]][:, :, [0, 1, 2, 3, 3]]  # the 4 x 4 grid, last row and column repeated
        tiled = edge.reshape(1, 30, -1)
        embeddings.interpolate_pos_encoding = lambda *_: torch.cat([stored[:, :1], tiled], dim=1)
        try:
            unresized = ref(pixel_values=pixels).last_hidden_state
        finally:
            del embeddings.interpolate_pos_encoding
    assert max_abs_diff(unresized, theirs) > 100 * OUTPUT_ATOL
