"""examples/vit.linnet against transformers' ViTForImageClassification.

At real size (no weights): the source checks clean under its preset, whose parameters are the tensors transformers
saves for ViT-Base/16 224 (built on the `meta` device: names, shapes and count) and whose config is that model's.
At shrunk size: a seeded 2-layer ViT on 32 x 32 images in 8 x 8 patches, every parameter perturbed (norms away from 1),
saved with `save_pretrained` and loaded through the folder on every backend (JAX's on a TPU too: the tests marked tpu):
the logits of a batch of two images."""

from __future__ import annotations

import pytest

from linnet.errors import RunError
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import (
    ALL_BACKENDS,
    TPU_STATES_ATOL,
    device_label,
    max_abs_diff,
    on_devices,
    perturb,
    record,
    run_device,
)
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

VIT = EXAMPLES / "vit.linnet"
# google/vit-base-patch16-224: ViTConfig's defaults with the 1000 ImageNet-1k labels.
REAL_CONFIGS = {"vit_base_patch16_224": dict(num_labels=1000)}
IMAGE = 32


def test_checks_clean_under_every_preset():
    result = analysis(VIT)
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    with torch.device("meta"):
        ref = transformers.ViTForImageClassification(transformers.ViTConfig(**REAL_CONFIGS[preset]))
    check_preset_parameters(VIT, preset, ref)
    assert ref.num_parameters() == 86_567_656  # ViT-B/16's 86.6 M with the 1000-way head


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config(preset):
    from linnet.ir import build

    ours = build(VIT, preset=preset).config
    assert config_fields_match(ours, transformers.ViTConfig(**REAL_CONFIGS[preset])) == {}
    assert ours["grid_size"] == 14 and ours["num_labels"] == 1000


@pytest.fixture(scope="module")
def small_vit(tmp_path_factory):
    """(folder, transformers model) of a seeded 2-layer ViTForImageClassification saved with save_pretrained."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=IMAGE,
        patch_size=8, num_labels=5, layer_norm_eps=1e-6,
    )  # fmt: skip
    model = transformers.ViTForImageClassification(config).eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("vit")
    model.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize("backend, device", on_devices(ALL_BACKENDS))
def test_logits(small_vit, backend, device):
    folder, ref = small_vit
    m = load(VIT, backend, folder, run_device(device))
    assert m.config["num_labels"] == 5  # from config.json's id2label
    pixels = seeded_pixels(2, IMAGE)
    (logits,) = m.run("forward", pixels.numpy())
    with torch.inference_mode():
        theirs = ref(pixel_values=pixels).logits
    delta = max_abs_diff(logits, theirs)
    label = device_label(backend, device)
    record(f"small ViT ({label}) logits [2, 5] of two 32x32 images", delta, model="vit", backend=label,
           checkpoint="seeded 2-layer, 8x8 patches")  # fmt: skip
    assert delta < (TPU_STATES_ATOL if device == "tpu" else OUTPUT_ATOL)


def test_another_image_size_is_refused(small_vit):
    """The position embeddings are for `image_size` only: a 40 x 40 batch is refused before it runs, naming the
    dim, as transformers refuses it without `interpolate_pos_encoding`."""
    folder, _ = small_vit
    m = load(VIT, "torch", folder)
    refused = r"input `pixel_values` has shape \[2, 3, 40, 40\], the entry takes f32\[B, 3, 32, 32\]"
    with pytest.raises(RunError, match=refused):
        m.run("forward", seeded_pixels(2, 40).numpy())


def test_run_image_gives_transformers_top_labels(small_vit, tmp_path, capsys):
    """`linnet run --image` on the folder (with a ViTImageProcessor for 32 x 32 saved beside the weights): the five
    classes and probabilities transformers' processor and model give for the same file, with config.json's labels."""
    import json

    import numpy as np
    from PIL import Image

    from linnet.cli import main

    folder, ref = small_vit
    processor = transformers.ViTImageProcessor(size={"height": IMAGE, "width": IMAGE})
    processor.save_pretrained(folder)
    path = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (45, 61, 3)).astype(np.uint8)).save(path)
    assert main(["run", str(VIT), "--weights", str(folder), "--image", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    with torch.inference_mode():
        pixels = processor(images=Image.open(path), return_tensors="pt")["pixel_values"]
        probs = torch.softmax(ref(pixel_values=pixels).logits[0].double(), dim=-1)
    top = torch.argsort(probs, descending=True).tolist()
    assert [r["id"] for r in report["top_labels"]] == top
    assert [r["label"] for r in report["top_labels"]] == [ref.config.id2label[i] for i in top]
    assert max(abs(r["probability"] - probs[r["id"]].item()) for r in report["top_labels"]) < 1e-5
