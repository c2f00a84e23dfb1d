"""`linnet run FILE --image x.png`: an image file as the entry's `pixel_values`, preprocessed as the model's image
processor does (`linnet.runtimes.inputs.images`), and the top labels of a classifier's logits.

The processor's parameters come from the `--weights` folder's preprocessor_config.json when it has one, else from the
defaults of the model type's real checkpoint: the model type is the checkpoint config's `model_type`, or, with random
weights, the source file's name (the zoo's `examples/<model_type>.linnet`). Imports pillow only when an image is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TOP_LABELS = 5


@dataclass
class ImageInput:
    """The preprocessed image and what `linnet run` reports about it."""

    pixel_values: np.ndarray  # f32[1, 3, H, W]
    described: str  # the preprocessing, one line
    id2label: dict[int, str] = field(default_factory=dict)  # from the checkpoint's config; empty without one


def prepare(args, graph) -> ImageInput:
    """Read and preprocess `args.image` for entry `graph`, whose inputs include `pixel_values`
    (`cli_inputs.check_arguments`), and set the sizes of its dim variables from the image (`args.batch` = 1,
    `args.dim` for H and W), so the other inputs are made to match. Raises ValueError (`pixel_values` of rank
    other than 4) and LoadError (an unreadable image or preprocessor config)."""
    from linnet.cli.inputs import size_dims, target
    from linnet.runtimes.formats.checkpoints import open_checkpoint
    from linnet.runtimes.inputs.images import load_image, preprocess, processing_for

    pixel_values = target(graph, "image", 4)
    config: dict[str, Any] = {}
    if args.weights is not None:
        checkpoint = open_checkpoint(args.weights)
        try:
            config = dict(checkpoint.config)
        finally:
            checkpoint.close()
    model_type = config.get("model_type") or Path(args.file).stem
    weights_dir = args.weights if args.weights is not None and Path(args.weights).is_dir() else None
    processing = processing_for(weights_dir, str(model_type))
    pixels = preprocess(load_image(args.image), processing)
    size_dims(args, pixel_values, pixels.shape)  # B, H and W as dim variables take the image's sizes
    labels = config.get("id2label") or {}
    id2label = {int(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
    return ImageInput(pixels, processing.describe(), id2label)


def top_labels(logits: np.ndarray, image: ImageInput, k: int = TOP_LABELS) -> list[dict[str, Any]]:
    """The `k` most likely classes of a classifier's logits [1, num_labels]: id, label (config.json's `id2label`,
    else None) and softmax probability, most likely first. Empty when the output is not [1, N]."""
    if logits.ndim != 2 or logits.shape[0] != 1:
        return []
    row = logits[0].astype(np.float64)
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    order = np.argsort(-row, kind="stable")[:k]
    return [{"id": int(i), "label": image.id2label.get(int(i)), "probability": float(probs[i])} for i in order]


def format_labels(rows: list[dict[str, Any]]) -> list[str]:
    """`linnet run`'s lines for `top_labels`: `  top 1: 281 tabby, tabby cat (p 0.912)`."""
    return [
        f"  top {n}: {r['id']}{' ' + r['label'] if r['label'] is not None else ''} (p {r['probability']:.4f})"
        for n, r in enumerate(rows, 1)
    ]
