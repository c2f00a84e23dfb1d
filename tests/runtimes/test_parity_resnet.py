"""examples/resnet.linnet against transformers' ResNetForImageClassification.

At real size (no weights): the source checks clean under its presets, whose parameters are the tensors transformers
saves for microsoft/resnet-18 and microsoft/resnet-50 (built on the `meta` device: names, shapes and count, BatchNorm's
running statistics included) and whose configs are those models'. At shrunk size: seeded 2-stage ResNets (basic, and
bottleneck with and without `downsample_in_bottleneck`) on 32 x 32 images, every parameter perturbed and BatchNorm's
running statistics moved away from 0 and 1, in eval mode, saved with `save_pretrained` and loaded through the folder on
every backend: the logits of a batch of two images."""

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

RESNET = EXAMPLES / "resnet.linnet"
# microsoft/resnet-18 and microsoft/resnet-50 (their config.json files): ImageNet-1k's 1000 labels; resnet-50 is
# ResNetConfig's defaults.
REAL_CONFIGS = {
    "resnet_18": dict(hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic", num_labels=1000),
    # ResNetConfig's defaults, spelt out: its signature's defaults are tuples, config.json holds lists.
    "resnet_50": dict(
        hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3], layer_type="bottleneck", num_labels=1000
    ),
}
# The model cards' parameter counts (11.7 M and 25.6 M): transformers' num_parameters() of the real configs.
PARAMETERS = {"resnet_18": 11_689_512, "resnet_50": 25_557_032}
IMAGE = 32
# Shrunk configs: two stages of two layers, widths 8-16 (the bottleneck's quarter of 16 is 4).
SMALL = {
    "basic": dict(layer_type="basic", embedding_size=8, hidden_sizes=[8, 16], depths=[2, 2]),
    "bottleneck": dict(layer_type="bottleneck", embedding_size=8, hidden_sizes=[16, 16], depths=[2, 2]),
    "bottleneck v1": dict(
        layer_type="bottleneck",
        embedding_size=8,
        hidden_sizes=[16, 32],
        depths=[1, 2],
        downsample_in_bottleneck=True,
        downsample_in_first_stage=True,
    ),
}


def test_checks_clean_under_every_preset():
    result = analysis(RESNET)
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    with torch.device("meta"):
        ref = transformers.ResNetForImageClassification(transformers.ResNetConfig(**REAL_CONFIGS[preset]))
    check_preset_parameters(RESNET, preset, ref)
    assert ref.num_parameters() == PARAMETERS[preset]


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config(preset):
    from linnet.ir import build

    ours = build(RESNET, preset=preset).config
    assert config_fields_match(ours, transformers.ResNetConfig(**REAL_CONFIGS[preset])) == {}
    assert ours["num_labels"] == 1000


def perturb_running_stats(model, seed: int) -> None:
    """Move every BatchNorm's running mean off 0 and running variance off 1 (transformers initialises them so, which
    would hide a BatchNorm that ignores them); the variances stay in [0.5, 1.5]."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.add_(torch.randn(module.running_mean.shape, generator=g) * 0.1)
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=g))


@pytest.fixture(scope="module")
def small_resnets(tmp_path_factory):
    """{kind: (folder, transformers model)} of seeded shrunk ResNetForImageClassification models saved with
    save_pretrained."""
    out = {}
    for seed, (kind, fields) in enumerate(SMALL.items()):
        torch.manual_seed(seed)
        model = transformers.ResNetForImageClassification(transformers.ResNetConfig(num_labels=5, **fields)).eval()
        perturb(model, seed=2 + seed)
        perturb_running_stats(model, seed=7 + seed)
        folder = tmp_path_factory.mktemp("resnet")
        model.save_pretrained(folder)
        out[kind] = (folder, model)
    return out


@pytest.mark.parametrize("kind", sorted(SMALL))
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_logits(small_resnets, kind, backend):
    folder, ref = small_resnets[kind]
    m = load(RESNET, backend, folder)
    assert m.config["num_labels"] == 5  # from config.json's id2label
    pixels = seeded_pixels(2, IMAGE)
    (logits,) = m.run("forward", pixels.numpy())
    with torch.inference_mode():
        theirs = ref(pixel_values=pixels).logits
    delta = max_abs_diff(logits, theirs)
    record(f"small ResNet, {kind} ({backend}) logits [2, 5] of two 32x32 images", delta, model="resnet",
           backend=backend, checkpoint=f"seeded 2-stage {kind}, widths 8-32")  # fmt: skip
    assert delta < OUTPUT_ATOL


def test_odd_image_size(small_resnets):
    """Any image size: on 37 x 29 images (odd sides through every stride-2 step) the logits are transformers'."""
    folder, ref = small_resnets["basic"]
    m = load(RESNET, "torch", folder)
    pixels = seeded_pixels(2, (37, 29))
    (logits,) = m.run("forward", pixels.numpy())
    with torch.inference_mode():
        theirs = ref(pixel_values=pixels).logits
    assert max_abs_diff(logits, theirs) < OUTPUT_ATOL


def test_run_image_gives_transformers_top_labels(small_resnets, tmp_path, capsys):
    """`linnet run --image` on the folder (with a ConvNextImageProcessor for 32 x 32 saved beside the weights: the
    shortest edge resized to 32 / crop_pct, a 32 x 32 center crop): the five classes and probabilities transformers'
    processor and model give for the same file, with config.json's labels."""
    import json

    import numpy as np
    from PIL import Image

    from linnet.cli import main

    folder, ref = small_resnets["bottleneck"]
    processor = transformers.ConvNextImageProcessor(size={"shortest_edge": IMAGE}, crop_pct=0.875)
    processor.save_pretrained(folder)
    path = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (45, 61, 3)).astype(np.uint8)).save(path)
    assert main(["run", str(RESNET), "--weights", str(folder), "--image", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    with torch.inference_mode():
        pixels = processor(images=Image.open(path), return_tensors="pt")["pixel_values"]
        probs = torch.softmax(ref(pixel_values=pixels).logits[0].double(), dim=-1)
    top = torch.argsort(probs, descending=True).tolist()
    assert [r["id"] for r in report["top_labels"]] == top
    assert [r["label"] for r in report["top_labels"]] == [ref.config.id2label[i] for i in top]
    assert max(abs(r["probability"] - probs[r["id"]].item()) for r in report["top_labels"]) < 1e-5
