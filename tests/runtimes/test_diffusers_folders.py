"""Diffusers folders (config.json with `_class_name`, diffusion_pytorch_model.safetensors) open like transformers
folders, through the same checkpoint reader, and the zoo picks their source by the class name in snake case."""

from __future__ import annotations

import copy
import json

import pytest

from linnet.errors import CheckpointError, LoadError
from linnet.runtimes.formats.checkpoints import open_checkpoint
from linnet.runtimes.zoo import choose, diffusers_model_type

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def tiny_vae(tmp_path_factory):
    """(folder, model): a one-level AutoencoderKL of 8 channels saved by diffusers, with an fp16 variant beside."""
    torch.manual_seed(0)
    model = diffusers.AutoencoderKL(block_out_channels=(8,), norm_num_groups=4).eval()
    folder = tmp_path_factory.mktemp("vae")
    model.save_pretrained(folder)
    copy.deepcopy(model).half().save_pretrained(folder, variant="fp16")
    return folder, model


def test_a_diffusers_folder_opens_with_its_tensors_and_config(tiny_vae):
    folder, model = tiny_vae
    assert (folder / "diffusion_pytorch_model.fp16.safetensors").is_file()
    with open_checkpoint(folder) as ckpt:
        assert ckpt.config["_class_name"] == "AutoencoderKL" and ckpt.config["block_out_channels"] == [8]
        assert set(ckpt.tensor_names) == set(model.state_dict())  # the fp16 variant is not read
        name = "decoder.conv_in.weight"
        assert ckpt.dtype(name) == "f32" and ckpt.shape(name) == tuple(model.state_dict()[name].shape)
        assert (ckpt.load(name) == model.state_dict()[name].numpy()).all()
        assert ckpt.tokenizer() is None


def test_a_sharded_diffusers_folder_reads_its_index(tiny_vae, tmp_path):
    _, model = tiny_vae
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "diffusion_pytorch_model.safetensors.index.json").is_file()
    with open_checkpoint(tmp_path) as ckpt:
        assert set(ckpt.tensor_names) == set(model.state_dict())


def test_pickled_diffusers_weights_are_refused(tiny_vae, tmp_path):
    _, model = tiny_vae
    model.save_pretrained(tmp_path, safe_serialization=False)
    with pytest.raises(CheckpointError, match=r"pickle files \(diffusion_pytorch_model\.bin\)"):
        open_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("class_name", "model_type"),
    [("AutoencoderKL", "autoencoder_kl"), ("UNet2DConditionModel", "unet_2d_condition"), ("UNet2DModel", "unet_2d")],
)
def test_the_class_name_in_snake_case_is_the_model_type(class_name, model_type):
    assert diffusers_model_type(class_name) == model_type


# A stand-in for examples/autoencoder_kl.linnet: the zoo reads which file a folder names, and its presets.
STAND_IN = """
@inert("in_channels", "out_channels", "down_block_types", "up_block_types", "block_out_channels", "layers_per_block",
    "act_fn", "norm_num_groups", "sample_size", "scaling_factor", "shift_factor", "latents_mean", "latents_std",
    "force_upcast", "use_quant_conv", "use_post_quant_conv", "mid_block_add_attention")
config AutoencoderKL {
    latent_channels: int = 4
}

preset four = AutoencoderKL {}

preset eight = AutoencoderKL { latent_channels = 8 }

model Latents(c: AutoencoderKL) {
    entry fn decode(latents: [B, c.latent_channels, H, W]) -> [B, c.latent_channels, H, W] {
        latents
    }
}
"""


def test_the_zoo_picks_the_source_by_class_name(tiny_vae, tmp_path):
    folder, _ = tiny_vae
    (tmp_path / "autoencoder_kl.linnet").write_text(STAND_IN)
    (tmp_path / "llama.linnet").write_text("")
    choice = choose(folder, tmp_path)
    assert choice.source == tmp_path / "autoencoder_kl.linnet" and choice.model_type == "autoencoder_kl"
    assert choice.preset == "four"


def test_an_unknown_diffusers_class_names_itself(tiny_vae, tmp_path):
    folder, _ = tiny_vae
    config = json.loads((folder / "config.json").read_text()) | {"_class_name": "AutoencoderTiny"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "diffusion_pytorch_model.safetensors").write_bytes(
        (folder / "diffusion_pytorch_model.safetensors").read_bytes()
    )
    with pytest.raises(LoadError, match=r"no example for model_type 'autoencoder_tiny'"):
        choose(tmp_path)
