"""examples/autoencoder_kl.linnet against diffusers' AutoencoderKL.decode.

At real size (no weights): the source checks clean under its preset, whose parameters are the decoder's and
`post_quant_conv`'s of diffusers' AutoencoderKL for that config built on the `meta` device (names, shapes and
count), and whose config is the config.json diffusers writes for it. At shrunk size: a seeded two-level
AutoencoderKL (8 and 16 channels, GroupNorm of 4 groups), every parameter perturbed (norms away from 1, biases
from 0), saved with diffusers' `save_pretrained` (a diffusers folder: `_class_name`,
diffusion_pytorch_model.safetensors) and loaded through that folder on every backend: the images decoded from a
batch of 2 latents of 8x6 (not square, so height and width cannot be swapped unseen), against
`AutoencoderKL.decode(latents).sample`."""

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

AUTOENCODER_KL = EXAMPLES / "autoencoder_kl.linnet"
# f32 images against diffusers in f32: what we see is ~1e-6.
IMAGE_ATOL = 1e-4

# stabilityai/sd-vae-ft-mse's config.json (diffusers' defaults for the rest).
REAL_CONFIGS = {
    "sd_vae_ft_mse": dict(
        block_out_channels=(128, 256, 512, 512),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=2,
        sample_size=256,
    )
}
DECODER_PARTS = ("decoder.", "post_quant_conv.")


def analysis():
    return Document(str(AUTOENCODER_KL), AUTOENCODER_KL.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    result = analysis()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_decoder(preset):
    """Names, shapes and count of the preset's parameters against the decoder half of diffusers' AutoencoderKL of
    the real config on the `meta` device: 49,490,199 for sd-vae-ft-mse."""
    with torch.device("meta"):
        ref = diffusers.AutoencoderKL(**REAL_CONFIGS[preset])
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters() if name.startswith(DECODER_PARTS)}
    tree = analysis().trees[preset]
    assert {p.path: p.shape() for p in tree.params} == theirs
    assert tree.param_count() == sum(p.numel() for name, p in ref.named_parameters() if name in theirs)
    assert tree.param_count() == 49_490_199


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    """Every field of the preset equals the value in the config.json diffusers writes for the real config (lists
    as lists); `num_levels` and `upscale` are derived."""
    from linnet.ir import build

    diffusers.AutoencoderKL(**REAL_CONFIGS[preset]).save_config(tmp_path)
    real = json.loads((tmp_path / "config.json").read_text())
    ours = build(AUTOENCODER_KL, preset=preset).config
    assert set(ours) - set(real) == {"num_levels", "upscale"}
    assert {key: real[key] for key in ours if key in real} == {k: v for k, v in ours.items() if k in real}
    assert ours["upscale"] == 8


def small_config(**changes):
    values = dict(
        block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, norm_num_groups=4, latent_channels=4,
        sample_size=32,
    )  # fmt: skip
    return {**values, **changes}


@pytest.fixture(scope="module")
def small_vae(tmp_path_factory):
    """(folder, diffusers model) of a seeded two-level AutoencoderKL saved with save_pretrained."""
    torch.manual_seed(0)
    model = diffusers.AutoencoderKL(**small_config()).eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("autoencoder_kl")
    model.save_pretrained(folder)
    assert (folder / "diffusion_pytorch_model.safetensors").is_file()
    return folder, model


def latents():
    return torch.randn(2, 4, 8, 6, generator=torch.Generator().manual_seed(3))


def load(backend: str, folder, **kwargs):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(AUTOENCODER_KL, weights=folder, max_batch=2, progress=False, **kwargs)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_decoded_images(small_vae, backend):
    folder, ref = small_vae
    m = load(backend, folder)
    z = latents()
    (images,) = m.run("decode", z.numpy())
    with torch.inference_mode():
        theirs = ref.decode(z).sample
    assert tuple(theirs.shape) == (2, 3, 16, 12)
    delta = max_abs_diff(images, theirs)
    record(f"small AutoencoderKL ({backend}) decode [2, 4, 8, 6] -> [2, 3, 16, 12]", delta,
           model="autoencoder_kl", backend=backend, checkpoint="seeded 2-level", against="diffusers")  # fmt: skip
    assert delta < IMAGE_ATOL


def test_the_encoder_is_left_with_a_note(small_vae):
    """The decoder takes its half of the checkpoint: the encoder's tensors and `quant_conv` are named in a note."""
    from linnet.runtimes.loading import prepare

    folder, ref = small_vae
    prepared = prepare(AUTOENCODER_KL, weights=folder)
    assert set(prepared.plan.values()) == {k for k in ref.state_dict() if k.startswith(DECODER_PARTS)}
    (note,) = [n for n in prepared.notes if "encoder." in n]
    assert "encoder.conv_in.weight" in note and "more" in note


def test_what_the_parity_test_tells_apart(small_vae):
    """The mid block's attention moves the images far beyond the tolerance, so the parity above sees it (loaded
    with `mid_block_add_attention` off by `config=`: its tensors are then left with a note)."""
    folder, ref = small_vae
    z = latents()
    m = load("torch", folder, config={"mid_block_add_attention": False})
    (images,) = m.run("decode", z.numpy())
    with torch.inference_mode():
        theirs = ref.decode(z).sample
    assert max_abs_diff(images, theirs) > 100 * IMAGE_ATOL


def test_a_missing_decoder_tensor_is_named(small_vae, tmp_path):
    """A decoder tensor the folder lacks is a located load error naming it (the encoder's absence is not)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from linnet.runtimes.loading import LoadError

    folder, _ = small_vae
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    tensors = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    tensors["decoder.up_blocks.0.upsamplers.0.conv.kernel"] = tensors.pop(
        "decoder.up_blocks.0.upsamplers.0.conv.weight"
    )
    save_file(tensors, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(LoadError, match=r"decoder\.up_blocks\.0\.upsamplers\.0\.conv\.weight") as err:
        load("torch", tmp_path)
    assert err.value.code in ("L501", "L502")
