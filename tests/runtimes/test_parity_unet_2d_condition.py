"""examples/unet_2d_condition.linnet against diffusers' UNet2DConditionModel (one denoising step).

At real size (no weights): the source checks clean under its preset, whose parameters are those of diffusers'
UNet2DConditionModel for SDXL's config built on the `meta` device (names, shapes and count: 2,567,463,684), and
whose config is the config.json diffusers writes for it. At shrunk size: a seeded two-level UNet (8 and 16
channels, a DownBlock2D and a CrossAttnDownBlock2D with two transformer blocks, two ResNet blocks a level as SDXL
has), every parameter perturbed, saved with diffusers' `save_pretrained` and loaded through that folder on every
backend: the noise prediction for a batch of two rows at different timesteps, against
`UNet2DConditionModel(...).sample`."""

from __future__ import annotations

import json

import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import ALL_BACKENDS, max_abs_diff, perturb, record

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

UNET = EXAMPLES / "unet_2d_condition.linnet"
# f32 noise predictions against diffusers in f32.
NOISE_ATOL = 1e-4

# stabilityai/stable-diffusion-xl-base-1.0's unet/config.json (diffusers' defaults for the rest).
REAL_CONFIGS = {
    "sdxl_base_unet": dict(
        sample_size=128, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(320, 640, 1280),
        layers_per_block=2, attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        transformer_layers_per_block=(1, 2, 10), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816, addition_embed_type_num_heads=64,
        upcast_attention=False,
    )
}  # fmt: skip


def analysis():
    return Document(str(UNET), UNET.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    result = analysis()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_unet(preset):
    """Names, shapes and count of the preset's parameters against diffusers' UNet2DConditionModel of the real
    config on the `meta` device."""
    with torch.device("meta"):
        ref = diffusers.UNet2DConditionModel(**REAL_CONFIGS[preset])
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}
    tree = analysis().trees[preset]
    assert {p.path: p.shape() for p in tree.params} == theirs
    assert tree.param_count() == ref.num_parameters() == 2_567_463_684


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    """Every field of the preset equals the value in the config.json diffusers writes for the real config (`null`
    spelled "none" where the source computes one way only); `num_levels` and `time_embed_dim` are derived."""
    from linnet.ir import build

    with torch.device("meta"):  # the config diffusers writes, without 10 GB of weights
        diffusers.UNet2DConditionModel.from_config(REAL_CONFIGS[preset]).save_config(tmp_path)
    real = json.loads((tmp_path / "config.json").read_text())
    ours = build(UNET, preset=preset).config
    assert set(ours) - set(real) == {"num_levels", "time_embed_dim"}
    real = {k: "none" if v is None else v for k, v in real.items()}
    assert {key: real[key] for key in ours if key in real} == {k: v for k, v in ours.items() if k in real}


def small_config():
    return dict(
        sample_size=8, block_out_channels=(8, 16), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), layers_per_block=2, attention_head_dim=(1, 2),
        transformer_layers_per_block=(1, 2), cross_attention_dim=12, norm_num_groups=4, use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=8, projection_class_embeddings_input_dim=10 + 6 * 8,
    )  # fmt: skip


@pytest.fixture(scope="module")
def small_unet(tmp_path_factory):
    """(folder, diffusers model) of a seeded two-level UNet2DConditionModel saved with save_pretrained."""
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(**small_config()).eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("unet_2d_condition")
    model.save_pretrained(folder)
    return folder, model


def inputs():
    """sample [2, 4, 8, 8], timesteps 999 and 17, text states [2, 5, 12], pooled text [2, 10], time ids [2, 6]."""
    g = torch.Generator().manual_seed(3)
    sample = torch.randn(2, 4, 8, 8, generator=g)
    timestep = torch.tensor([999.0, 17.0])
    states = torch.randn(2, 5, 12, generator=g)
    text_embeds = torch.randn(2, 10, generator=g)
    time_ids = torch.tensor([[1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0], [768.0, 512.0, 16.0, 8.0, 768.0, 512.0]])
    return sample, timestep, states, text_embeds, time_ids


def reference(model, sample, timestep, states, text_embeds, time_ids):
    with torch.inference_mode():
        cond = {"text_embeds": text_embeds, "time_ids": time_ids}
        return model(sample, timestep, encoder_hidden_states=states, added_cond_kwargs=cond).sample


def load(backend: str, folder, **kwargs):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(UNET, weights=folder, max_batch=2, progress=False, **kwargs)


# The UNet unrolls to some 1,700 ops; each backend compiles them in 1-4 s here, torch.compile in minutes (slow).
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_noise_prediction(small_unet, backend):
    folder, ref = small_unet
    m = load(backend, folder)
    args = inputs()
    (noise,) = m.run("forward", *(a.numpy() for a in args))
    theirs = reference(ref, *args)
    delta = max_abs_diff(noise, theirs)
    record(f"small UNet2DConditionModel ({backend}) noise prediction [2, 4, 8, 8], timesteps 999 and 17", delta,
           model="unet_2d_condition", backend=backend, checkpoint="seeded 2-level", against="diffusers")  # fmt: skip
    assert delta < NOISE_ATOL


@pytest.mark.slow
def test_what_the_parity_test_tells_apart(small_unet):
    """SDXL's flipped sinusoids (`flip_sin_to_cos`) move the prediction far beyond the tolerance, so the parity
    above sees the timestep embedding (loaded with it off by `config=`)."""
    folder, ref = small_unet
    args = inputs()
    (noise,) = load("torch", folder, config={"flip_sin_to_cos": False}).run("forward", *(a.numpy() for a in args))
    assert max_abs_diff(noise, reference(ref, *args)) > 100 * NOISE_ATOL
