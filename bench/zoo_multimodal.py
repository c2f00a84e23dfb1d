"""bench/zoo_speed.py's image-text and segmentation rows: SigLIP and SAM (kind "multimodal").

Each workload is a seeded random-init transformers model (saved once with `save_pretrained`, loaded by both sides
from that folder) and one batch of inputs in an .npz file that feeds every side:
- siglip: `forward(input_ids, pixel_values)` against SiglipModel's `logits_per_image` (texts of 16 tokens, as many
  texts as images);
- sam: `embed_image` then `predict_masks` (one foreground point a prompt, one prompt an image) against SamModel's
  forward on `pixel_values` and the points (`pred_masks`).
The shrunk sizes are the quick run's; `--full` adds SigLIP Base/16 224 and SAM ViT-B at their real sizes (random
weights). A row times one whole call (median of the runs after a warm-up) and saves its output for the distance.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import generate_speed as gs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TEXT_TOKENS = 16

# (model, shape, config class, model class, config, batch sizes); shrunk first, then the real sizes (`--full`).
SHRUNK = [
    (
        "siglip", "SigLIP-shaped, shrunk (2+2 layers, 64 wide, 64x64 images), random weights", "SiglipConfig",
        "SiglipModel",
        dict(text_config=dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, max_position_embeddings=TEXT_TOKENS, projection_size=64),
             vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                image_size=64, patch_size=8)),
        [1, 8],
    ),
    (
        "sam", "SAM-shaped, shrunk (2 layers, 64 wide, 128x128 images, windows of 4), random weights", "SamConfig",
        "SamModel",
        dict(vision_config=dict(hidden_size=64, output_channels=32, num_hidden_layers=2, num_attention_heads=4,
                                image_size=128, patch_size=8, window_size=4, global_attn_indexes=[1],
                                num_pos_feats=16, mlp_dim=128),
             prompt_encoder_config=dict(hidden_size=32, image_size=128, patch_size=8, mask_input_channels=8),
             mask_decoder_config=dict(hidden_size=32, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32)),
        [1, 4],
    ),
]  # fmt: skip
# The real checkpoints' configs: transformers' defaults are siglip-base-patch16-224's and sam-vit-base's.
REAL = [
    ("siglip", "SigLIP Base/16 224-shaped, random weights", "SiglipConfig", "SiglipModel", {}, [1, 8]),
    ("sam", "SAM ViT-B-shaped (1024x1024), random weights", "SamConfig", "SamModel", {}, [1]),
]


def workloads(cache: Path, work: Path, full: bool, random_checkpoint) -> list[tuple]:
    """(model, shape, folder, batch, inputs file) for each row pair; `random_checkpoint` is zoo_speed's."""
    import numpy as np
    import transformers

    rows = []
    for model, shape, config_class, model_class, config, sizes in SHRUNK + (REAL if full else []):
        folder = random_checkpoint(cache, config_class, config, model_class)
        cfg = getattr(transformers, config_class)(**config)
        rng = np.random.default_rng(0)
        for size in sizes:
            path = work / f"{model}-{cfg.vision_config.image_size}-{size}.npz"
            image = cfg.vision_config.image_size
            pixels = rng.standard_normal((size, 3, image, image)).astype(np.float32)
            if model == "siglip":
                ids = rng.integers(0, cfg.text_config.vocab_size, (size, TEXT_TOKENS))
                np.savez(path, input_ids=ids, pixel_values=pixels)
            else:
                points = rng.uniform(0, cfg.prompt_encoder_config.image_size, (size, 1, 1, 2)).astype(np.float32)
                np.savez(path, pixel_values=pixels, input_points=points, input_labels=np.ones((size, 1, 1), np.int64))
            rows.append((model, shape, str(folder), size, str(path)))
    return rows


def run(spec: dict) -> dict:
    """One row: load the model on its side, time `runs` calls on the batch in `ids_file`, save the output."""
    import numpy as np

    inputs = dict(np.load(spec["ids_file"]))
    siglip = spec["source"] == "siglip"
    t0 = time.perf_counter()
    if spec["side"] == "linnet":
        from linnet.runtimes.backends import get_backend

        backend = get_backend(spec["backend"])
        options = {"threads": gs.THREADS} if "threads" in backend.options else {}
        batch = len(inputs["pixel_values"])
        m = backend.load(EXAMPLES / f"{spec['source']}.linnet", weights=spec["weights"], max_batch=batch,
                         progress=False, **options)  # fmt: skip

        def call():
            if siglip:
                return m.run("forward", inputs["input_ids"], inputs["pixel_values"])[0]
            (embeddings,) = m.run("embed_image", inputs["pixel_values"])
            return m.run("predict_masks", embeddings, inputs["input_points"], inputs["input_labels"])[0]
    else:
        import torch
        import transformers

        model = getattr(transformers, "SiglipModel" if siglip else "SamModel").from_pretrained(
            spec["weights"], attn_implementation="eager"
        )
        model = model.eval()
        forward = torch.compile(model) if spec["side"] == "transformers-compile" else model
        tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}

        def call():
            with torch.inference_mode():
                out = forward(**tensors)
            return (out.logits_per_image if siglip else out.pred_masks).numpy()

    return time_call(call, time.perf_counter() - t0, spec, len(inputs["pixel_values"]))


def time_call(call, load_s: float, spec: dict, batch: int) -> dict:
    """A row's timings: one warm-up `call()`, then `runs` timed calls (median), the warm-up's output saved as
    `<out_dir>/<name>.npy` for the distance; shared by the encoders' rows and these."""
    import numpy as np

    t0 = time.perf_counter()
    output = call()
    warmup_s = time.perf_counter() - t0

    def one() -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    timed, contention = gs.timed_runs(one, spec["runs"])
    np.save(Path(spec["out_dir"]) / f"{spec['name']}.npy", np.asarray(output, dtype=np.float32))
    forward_s = statistics.median(timed)
    return {
        "load_s": load_s,
        "warmup_s": warmup_s,
        "forward_ms": forward_s * 1000,
        "sequences_per_s": batch / forward_s,
        "peak_rss_mb": gs.peak_rss_mb(),
        **contention,
    }
