"""linnet/runtimes/inputs/images.py against transformers' image processors (their pillow backends: no torchvision here)
on the same files: ViTImageProcessor (ViT), ConvNextImageProcessor (ResNet), BitImageProcessor (DINOv2), each saved with
`save_pretrained` and read back from the folder's preprocessor_config.json, and each model type's defaults against the
processor configured as its real checkpoint's preprocessor_config.json is."""

from __future__ import annotations

import json

import numpy as np
import pytest

from linnet.errors import LoadError
from linnet.runtimes.inputs.images import DEFAULTS, load_image, preprocess, processing_for

PIL = pytest.importorskip("PIL")
transformers = pytest.importorskip("transformers")

from PIL import Image  # noqa: E402


def processor(kind: str):
    """The processor of each model type's real checkpoint (the values of its preprocessor_config.json)."""
    imagenet = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    if kind == "vit":  # google/vit-base-patch16-224
        return transformers.ViTImageProcessor(
            size={"height": 224, "width": 224}, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
    if kind == "resnet":  # microsoft/resnet-50
        return transformers.ConvNextImageProcessor(size={"shortest_edge": 224}, crop_pct=0.875, resample=3, **imagenet)
    # facebook/dinov2-base
    return transformers.BitImageProcessor(
        size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True, resample=3,
        **imagenet,
    )  # fmt: skip


def write_image(path, width: int, height: int, mode: str = "RGB", seed: int = 0):
    """A PNG of noise over gradients (so resampling filters differ visibly), in `mode`."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    noisy = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(noisy, "RGB")
    if mode == "RGBA":
        alpha = Image.fromarray(rng.integers(0, 256, (height, width)).astype(np.uint8), "L")
        image = image.copy()
        image.putalpha(alpha)
    elif mode != "RGB":
        image = image.convert(mode)
    image.save(path)
    return path


# (width, height): landscape, portrait, an odd square, one smaller than every crop (padded by center_crop)
SIZES = [(300, 217), (181, 403), (97, 97), (150, 120)]


@pytest.mark.parametrize("kind", ["vit", "resnet", "dinov2"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_pixel_values_match_the_processor_from_its_saved_config(kind, size, tmp_path):
    path = write_image(tmp_path / "x.png", *size)
    reference = processor(kind)
    reference.save_pretrained(tmp_path)
    ours = preprocess(load_image(path), processing_for(tmp_path, "unused"))
    theirs = reference(images=Image.open(path), return_tensors="np")["pixel_values"]
    assert ours.dtype == np.float32 and ours.shape == theirs.shape == (1, 3, 224, 224)
    assert np.abs(ours - theirs).max() <= 1e-6


@pytest.mark.parametrize("kind", ["vit", "resnet", "dinov2"])
def test_defaults_are_the_real_checkpoints_processors(kind, tmp_path):
    """Without a preprocessor_config.json (a folder without one, or random weights) the model type's defaults run,
    and they are what the real checkpoint's processor computes."""
    path = write_image(tmp_path / "x.png", 260, 190, seed=1)
    ours = preprocess(load_image(path), processing_for(None, kind))
    theirs = processor(kind)(images=Image.open(path), return_tensors="np")["pixel_values"]
    assert np.abs(ours - theirs).max() <= 1e-6
    assert processing_for(tmp_path, kind) == processing_for(None, kind)


@pytest.mark.parametrize("mode", ["RGBA", "L", "P"])
def test_other_modes_are_converted_to_rgb_as_transformers_does(mode, tmp_path):
    """BitImageProcessor converts to RGB (`do_convert_rgb`: transparency onto white); the others are given the same
    RGB image, since the models take three channels."""
    path = write_image(tmp_path / "x.png", 120, 90, mode=mode, seed=2)
    ours = preprocess(load_image(path), processing_for(None, "dinov2"))
    theirs = processor("dinov2")(images=Image.open(path), return_tensors="np")["pixel_values"]
    assert np.abs(ours - theirs).max() <= 1e-6


def test_an_old_config_with_an_int_size_and_a_feature_extractor(tmp_path):
    """Checkpoints saved by transformers 4 name `feature_extractor_type` and give `size` as an int: a square for ViT
    (google/vit-base-patch16-224's preprocessor_config.json is written so)."""
    values = {"feature_extractor_type": "ViTFeatureExtractor", "size": 224, "resample": 2, "do_normalize": True,
              "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(values))
    assert processing_for(tmp_path, "vit") == processing_for(None, "vit").__class__(
        **{**processing_for(None, "vit").__dict__, "source": str(tmp_path / "preprocessor_config.json")}
    )


def test_bad_inputs_are_located_errors(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "SamImageProcessor"}))
    with pytest.raises(LoadError, match=r"preprocessor_config.json: image processor 'SamImageProcessor' is not one"):
        processing_for(tmp_path, "vit")
    (tmp_path / "preprocessor_config.json").write_text("{")
    with pytest.raises(LoadError, match=r"preprocessor_config.json: cannot read it as JSON"):
        processing_for(tmp_path, "vit")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**DEFAULTS["vit"], "size": "big"}))
    with pytest.raises(LoadError, match=r"`size` must be"):
        processing_for(tmp_path, "vit")
    with pytest.raises(LoadError, match=r"model type 'gpt2' has no default image preprocessing"):
        processing_for(None, "gpt2")
    (tmp_path / "not.png").write_text("text")
    with pytest.raises(LoadError, match=r"not.png: cannot read it as an image"):
        load_image(tmp_path / "not.png")
