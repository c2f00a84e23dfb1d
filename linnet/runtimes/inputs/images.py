"""Images into `pixel_values`: the preprocessing of transformers' image processors, with pillow and numpy.

`linnet run FILE --image x.png` feeds a model the tensor its own image processor would: the steps and parameters of
the checkpoint folder's `preprocessor_config.json` when there is one, else the defaults of the model's processor on
its real checkpoint (`DEFAULTS`, by `model_type`). The three processor classes of the vision zoo, step for step as
transformers' pillow backend runs them (transformers/image_processing_backends.py `PilBackend`, image_transforms.py):

- `ViTImageProcessor` (ViT): resize to `size.height` x `size.width` (pillow, `resample`), rescale, normalize.
- `ConvNextImageProcessor` (ResNet): below 384, resize the shortest edge to `int(shortest_edge / crop_pct)` keeping
  the aspect ratio, then center-crop `shortest_edge` square; from 384 up, resize to a square. Rescale, normalize.
- `BitImageProcessor` (DINOv2): convert to RGB, resize the shortest edge to `size.shortest_edge`, center-crop
  `crop_size`, rescale, normalize.

Every image is converted to RGB first (transparency composited onto white, as transformers' `convert_to_rgb` does):
the models take three channels, and a grey or RGBA file would otherwise be refused by the processors that do not
convert. Resizing runs on the 8-bit image, so the rounding is pillow's, as in transformers.

Needs pillow and numpy only (the `image` extra); no torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import LoadError

__all__ = ["DEFAULTS", "ImageProcessing", "load_image", "preprocess", "processing_for"]

# transformers/utils/constants.py
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)

# Pillow's resampling filters by the numbers preprocessor_config.json writes (PIL.Image.Resampling).
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

# The processor classes handled, by the names preprocessor_config.json uses for them (transformers 4 wrote
# `feature_extractor_type` for the older checkpoints, naming the feature extractor the processor replaced).
PROCESSORS = {
    "ViTImageProcessor": "vit",
    "ViTImageProcessorFast": "vit",
    "ViTFeatureExtractor": "vit",
    "ConvNextImageProcessor": "convnext",
    "ConvNextImageProcessorFast": "convnext",
    "ConvNextFeatureExtractor": "convnext",
    "BitImageProcessor": "bit",
    "BitImageProcessorFast": "bit",
}


@dataclass(frozen=True)
class ImageProcessing:
    """What one image processor does, in transformers' terms.

    kind: "vit" (resize to a fixed size), "convnext" (shortest edge over `crop_pct`, then a center crop) or "bit"
        (shortest edge, then a center crop of `crop_size`).
    size: the processor's `size` dict (`{"height", "width"}` or `{"shortest_edge"}`).
    crop_size: `{"height", "width"}` of the center crop (bit), or None.
    resample: a pillow filter number (2 bilinear, 3 bicubic).
    rescale_factor: multiplies the 8-bit values (1/255).
    image_mean, image_std: per channel, after rescaling.
    crop_pct: ConvNext's crop fraction (224 / 256).
    source: where the values came from, for messages ("DIR/preprocessor_config.json", or the defaults used)."""

    kind: str
    size: dict[str, int]
    resample: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float = 1 / 255
    crop_size: dict[str, int] | None = None
    crop_pct: float = 224 / 256
    do_resize: bool = True
    do_center_crop: bool = False
    do_rescale: bool = True
    do_normalize: bool = True
    source: str = ""

    def describe(self) -> str:
        """One line for stderr: `ViT preprocessing from DIR/preprocessor_config.json: resize 224x224 bilinear, ...`."""
        steps = []
        if self.do_resize:
            target = (
                f"{self.size['height']}x{self.size['width']}"
                if "height" in self.size
                else f"shortest edge {self.size['shortest_edge']}"
            )
            steps.append(f"resize {target} {RESAMPLE_NAMES.get(self.resample, self.resample)}")
        if self.kind == "convnext" and self.size.get("shortest_edge", 384) < 384:
            steps.append(f"crop_pct {self.crop_pct:g}")
        if self.do_center_crop and self.crop_size:
            steps.append(f"center crop {self.crop_size['height']}x{self.crop_size['width']}")
        if self.do_rescale:
            steps.append(f"rescale {self.rescale_factor:.6g}")
        if self.do_normalize:
            steps.append(f"normalize mean {list(self.image_mean)} std {list(self.image_std)}")
        return f"{self.kind} preprocessing ({self.source}): " + ", ".join(steps)


# The processor of each model type's real checkpoint, as its preprocessor_config.json sets it (used when a folder
# has none, or when there is no folder: random weights).
DEFAULTS: dict[str, dict[str, Any]] = {
    # google/vit-base-patch16-224: ViTImageProcessor, 224 x 224 bilinear, mean and std 0.5.
    "vit": {"image_processor_type": "ViTImageProcessor", "size": {"height": 224, "width": 224}, "resample": 2,
            "image_mean": IMAGENET_STANDARD_MEAN, "image_std": IMAGENET_STANDARD_STD},
    # microsoft/resnet-50 and -18: ConvNextImageProcessor, shortest edge 224 with crop_pct 0.875 (resize to 256,
    # crop 224), bicubic, ImageNet mean and std.
    "resnet": {"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 224}, "crop_pct": 0.875,
               "resample": 3, "image_mean": IMAGENET_DEFAULT_MEAN, "image_std": IMAGENET_DEFAULT_STD},
    # facebook/dinov2-base: BitImageProcessor, shortest edge 256, center crop 224, bicubic, ImageNet mean and std.
    "dinov2": {"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 256},
               "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "resample": 3,
               "image_mean": IMAGENET_DEFAULT_MEAN, "image_std": IMAGENET_DEFAULT_STD},
}  # fmt: skip


def processing_for(weights: str | Path | None, model_type: str) -> ImageProcessing:
    """The preprocessing of a checkpoint: `weights/preprocessor_config.json` when `weights` is a folder holding one,
    else the defaults of `model_type` (`DEFAULTS`). Raises LoadError for a file that is not a JSON object, a
    processor class not handled here (naming the ones that are), a value of the wrong kind (naming the key), or a
    model type without defaults and no file."""
    path = Path(weights) / "preprocessor_config.json" if weights is not None else None
    if path is not None and path.is_file():
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise LoadError(f"{path}: cannot read it as JSON: {err}") from None
        if not isinstance(values, dict):
            raise LoadError(f"{path}: expected a JSON object, got {type(values).__name__}")
        return _processing(values, str(path))
    if model_type not in DEFAULTS:
        where = f"{weights} has no preprocessor_config.json" if weights is not None else "no checkpoint folder"
        raise LoadError(
            f"{where}, and model type {model_type!r} has no default image preprocessing "
            f"(defaults exist for {', '.join(sorted(DEFAULTS))}); give a folder with a preprocessor_config.json"
        )
    return _processing(DEFAULTS[model_type], f"the defaults of {model_type}'s checkpoints")


def _processing(values: dict[str, Any], source: str) -> ImageProcessing:
    name = values.get("image_processor_type") or values.get("feature_extractor_type")
    kind = PROCESSORS.get(name) if isinstance(name, str) else None
    if kind is None:
        handled = ", ".join(sorted({n for n in PROCESSORS if not n.endswith(("Fast", "FeatureExtractor"))}))
        raise LoadError(f"{source}: image processor {name!r} is not one `--image` handles ({handled})")
    try:
        square = kind == "vit"  # ViT reads a bare int size as a square; the others as the shortest edge
        size = _size(values.get("size", {"height": 224, "width": 224} if square else {"shortest_edge": 224}), square)
        crop = values.get("crop_size")
        return ImageProcessing(
            kind=kind,
            size=size,
            resample=int(values.get("resample", 2 if kind == "vit" else 3)),
            image_mean=_triple(values.get("image_mean", IMAGENET_STANDARD_MEAN if square else IMAGENET_DEFAULT_MEAN)),
            image_std=_triple(values.get("image_std", IMAGENET_STANDARD_STD if square else IMAGENET_DEFAULT_STD)),
            rescale_factor=float(values.get("rescale_factor", 1 / 255)),
            crop_size=_size(crop, True) if crop is not None else None,
            crop_pct=float(values.get("crop_pct", 224 / 256) or 224 / 256),
            do_resize=bool(values.get("do_resize", True)),
            do_center_crop=bool(values.get("do_center_crop", kind == "bit")),
            do_rescale=bool(values.get("do_rescale", True)),
            do_normalize=bool(values.get("do_normalize", True)),
            source=source,
        )
    except (TypeError, ValueError, KeyError) as err:
        raise LoadError(f"{source}: {err}") from None


def _size(value: Any, square: bool) -> dict[str, int]:
    """A processor's size as transformers' `get_size_dict` reads it: an int is a square (`square`) or the shortest
    edge; a dict keeps `height`/`width` or `shortest_edge`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"height": value, "width": value} if square else {"shortest_edge": value}
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return {"height": int(value["height"]), "width": int(value["width"])}
        if "shortest_edge" in value:
            return {"shortest_edge": int(value["shortest_edge"])}
    raise ValueError(f"`size` must be an int, {{height, width}} or {{shortest_edge}}, got {value!r}")


def _triple(value: Any) -> tuple[float, float, float]:
    values = [float(value)] * 3 if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != 3:
        raise ValueError(f"a per-channel mean or std has 3 values, got {value!r}")
    return (values[0], values[1], values[2])


def load_image(path: str | Path):
    """The image file at `path` as an 8-bit RGB pillow image, transparency composited onto white (transformers'
    `convert_to_rgb`). Raises LoadError naming the file when it cannot be read or is not an image pillow knows."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            opened.load()
            image = opened
    except (OSError, UnidentifiedImageError, ValueError) as err:
        raise LoadError(f"{path}: cannot read it as an image: {err}") from None
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def preprocess(image, processing: ImageProcessing) -> np.ndarray:
    """`pixel_values` f32[1, 3, H, W] of a pillow RGB image (`load_image`), as the processor computes them. H and W
    are the processor's output size (224 x 224 for the zoo's checkpoints)."""
    if processing.do_resize:
        image = _resize(image, processing)
    array = np.asarray(image)  # [H, W, 3] uint8
    if processing.do_center_crop and processing.crop_size:
        array = _center_crop(array, processing.crop_size["height"], processing.crop_size["width"])
    values = array.astype(np.float32)
    if processing.do_rescale:
        values = (array.astype(np.float64) * processing.rescale_factor).astype(np.float32)
    if processing.do_normalize:
        mean = np.asarray(processing.image_mean, dtype=np.float32)
        std = np.asarray(processing.image_std, dtype=np.float32)
        values = (values - mean) / std
    return np.ascontiguousarray(values.transpose(2, 0, 1)[None], dtype=np.float32)


def _resize(image, p: ImageProcessing):
    """Pillow's resize to the processor's size (transformers' `PilBackend.resize`, ConvNext's `resize`)."""
    width, height = image.size
    if p.kind == "convnext":
        shortest = p.size["shortest_edge"]
        if shortest < 384:
            h, w = _shortest_edge(height, width, int(shortest / p.crop_pct))
            resized = np.asarray(image.resize((w, h), resample=p.resample))
            from PIL import Image

            return Image.fromarray(_center_crop(resized, shortest, shortest))
        return image.resize((shortest, shortest), resample=p.resample)
    if "shortest_edge" in p.size:
        h, w = _shortest_edge(height, width, p.size["shortest_edge"])
    else:
        h, w = p.size["height"], p.size["width"]
    return image.resize((w, h), resample=p.resample)


def _shortest_edge(height: int, width: int, size: int) -> tuple[int, int]:
    """(height, width) with the shorter side `size` and the longer scaled to keep the aspect ratio, rounded down
    (transformers' `get_resize_output_image_size` with `default_to_square=False`)."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(size * long / short)
    return (new_long, size) if width <= height else (size, new_long)


def _center_crop(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centered `height` x `width` window of an [H, W, C] array, zero-padded where the image is smaller
    (transformers' `center_crop`: top = (H - height) // 2, padding split with the extra pixel at the start)."""
    h, w = array.shape[:2]
    if h < height or w < width:
        new_h, new_w = max(height, h), max(width, w)
        padded = np.zeros((new_h, new_w) + array.shape[2:], dtype=array.dtype)
        top_pad, left_pad = math.ceil((new_h - h) / 2), math.ceil((new_w - w) / 2)
        padded[top_pad : top_pad + h, left_pad : left_pad + w] = array
        top = (h - height) // 2 + top_pad
        left = (w - width) // 2 + left_pad
        return padded[top : top + height, left : left + width]
    top, left = (h - height) // 2, (w - width) // 2
    return array[top : top + height, left : left + width]
