"""examples/sam.linnet against transformers' SamModel (image encoder, prompt encoder for points, mask decoder).

At real size (no weights): the source checks clean under its preset, whose parameters are those of transformers'
SamModel for sam-vit-base's config built on the `meta` device (names, shapes and count), whose config is the
config.json transformers writes for it, and a header-only copy of that checkpoint fits.
At shrunk size: a seeded SamModel (64×64 images in 8×8 patches, a 2-layer ViT whose first layer attends in 3×3 windows
of the 8×8 grid, padded to 9×9 as SAM ViT-B pads its 64×64 grid to 70×70 for windows of 14, and whose second is
global; a 16-wide two-way decoder), every parameter perturbed, saved with `save_pretrained` and loaded through the
folder on every backend: `embed_image` against `get_image_embeddings`, and `predict_masks` against SamModel's forward
on those embeddings with 2 images × 2 prompts × 3 points whose labels cover 1, 0, -1 and -10 (`pred_masks` and
`iou_scores`, three masks a prompt). The reference is transformers' eager attention."""

from __future__ import annotations

import json

import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import ALL_BACKENDS, assert_real_layout_fits, max_abs_diff, perturb, record

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

SAM = EXAMPLES / "sam.linnet"
# f32 against transformers' eager f32: what we see is ~5e-6 on the image embeddings (values up to ~5) and ~1e-6 on
# the masks and scores.
ATOL = 1e-4
CHECKPOINT = "seeded 2-layer, 64x64 images, 3x3 windows"

# sam-vit-base's config: transformers' SamConfig defaults are its values.
REAL_CONFIGS = {"sam_vit_base": {}}


def test_checks_clean_under_every_preset():
    result = Document(str(SAM), SAM.read_text(encoding="utf-8")).analyze()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    """Names, shapes and count of the preset's parameters against transformers' SamModel of the real config on the
    `meta` device (93,735,728 for ViT-B): a layer's relative-position tables are sized by whether
    `global_attn_indexes` lists it. The prompt encoder's Fourier features are the tied `shared_image_embedding`, one
    tensor, as transformers counts it."""
    with torch.device("meta"):
        ref = transformers.SamModel(transformers.SamConfig(**REAL_CONFIGS[preset]))
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}
    tree = Document(str(SAM), SAM.read_text(encoding="utf-8")).analyze().trees[preset]
    ours = {p.path: p.shape() for p in tree.params}
    assert ours == theirs
    assert tree.param_count() == ref.num_parameters() == 93_735_728
    assert ours["vision_encoder.layers.0.attn.rel_pos_h"] == (2 * 14 - 1, 64)  # windows of 14
    assert ours["vision_encoder.layers.2.attn.rel_pos_h"] == (2 * 64 - 1, 64)  # global over the 64×64 grid


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    """Every field of each part's preset config equals the value in the config.json transformers writes for the
    real config, where it writes one (`head_dim`, `grid_size` and `num_mask_tokens` are derived)."""
    from linnet.ir import build

    transformers.SamConfig(**REAL_CONFIGS[preset]).save_pretrained(tmp_path)
    real = json.loads((tmp_path / "config.json").read_text())
    ours = build(SAM, preset=preset).config
    for part in ("vision_config", "prompt_encoder_config", "mask_decoder_config"):
        mine, theirs = ours[part], real[part]
        assert set(mine) - set(theirs) <= {"head_dim", "grid_size", "num_mask_tokens"}, part
        assert {k: theirs[k] for k in mine if k in theirs} == {k: v for k, v in mine.items() if k in theirs}, part


def small_config(**changes):
    vision = dict(
        hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=4, image_size=64, patch_size=8,
        window_size=3, global_attn_indexes=[1], num_pos_feats=8, mlp_dim=48,
    )  # fmt: skip
    prompt = dict(hidden_size=16, image_size=64, patch_size=8, mask_input_channels=8)
    decoder = dict(hidden_size=16, mlp_dim=32, num_hidden_layers=2, num_attention_heads=2, iou_head_hidden_dim=16)
    return transformers.SamConfig(
        vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder, **changes
    )


@pytest.fixture(scope="module")
def small_sam(tmp_path_factory):
    """(folder, transformers model) of a seeded small SamModel saved with save_pretrained. The perturbation is
    larger than the other parity tests' (0.3): with transformers' init (std 0.02) the masks come out near 0.005, too
    small for the tolerance to see the decoder; perturbed so, they reach ~1.5."""
    torch.manual_seed(0)
    model = transformers.SamModel(small_config(attn_implementation="eager")).eval()
    perturb(model, seed=2, scale=0.3)
    folder = tmp_path_factory.mktemp("sam")
    model.save_pretrained(folder)
    return folder, model


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two 64×64 images, and for each two prompts of three points (seeded pixels) labelled 1 (foreground), 0
    (background), -1 (not a point) or -10 (padding)."""
    g = torch.Generator().manual_seed(3)
    pixels = torch.randn(2, 3, 64, 64, generator=g)
    points = torch.rand(2, 2, 3, 2, generator=g) * 64
    labels = torch.tensor([[[1, 0, -10], [1, -1, 1]], [[0, 1, 1], [1, -10, -10]]])
    return pixels, points, labels


def load(backend: str, folder, **kwargs):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(SAM, weights=folder, max_batch=2, progress=False, **kwargs)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_image_embeddings_and_masks(small_sam, backend):
    folder, ref = small_sam
    m = load(backend, folder)
    pixels, points, labels = inputs()
    (embeddings,) = m.run("embed_image", pixels.numpy())
    with torch.inference_mode():
        theirs = ref.get_image_embeddings(pixels)
        out = ref(image_embeddings=theirs, input_points=points, input_labels=labels)
    masks, iou_scores = m.run("predict_masks", theirs.numpy(), points.numpy(), labels.numpy())
    assert out.pred_masks.abs().max() > 0.5  # the decoder's output is large enough for the tolerance to see it
    for what, ours, reference in (
        ("image_embeddings [2, 16, 8, 8]", embeddings, theirs),
        ("pred_masks [2, 2, 3, 32, 32]", masks, out.pred_masks),
        ("iou_scores [2, 2, 3]", iou_scores, out.iou_scores),
    ):
        delta = max_abs_diff(ours, reference)
        record(f"small SAM ({backend}) {what}", delta, model="sam", backend=backend, checkpoint=CHECKPOINT)
        assert delta < ATOL, what


def test_what_the_parity_test_tells_apart(small_sam):
    """The prompt's labels and the first layer's windows each move the reference's outputs far beyond the
    tolerance, so the parity above sees them: a -10 (padding) point read as -1 (not a point) changes the masks, and
    the first layer attending the whole 8×8 grid (transformers' `window_size = 0`, its 5-row relative-position
    tables resized as transformers does) changes the image embeddings."""
    import copy

    _, ref = small_sam
    pixels, points, labels = inputs()
    unpadded = labels.masked_fill(labels == -10, -1)
    whole = copy.deepcopy(ref)
    whole.vision_encoder.layers[0].window_size = 0
    with torch.inference_mode():
        embeddings = ref.get_image_embeddings(pixels)
        out = ref(image_embeddings=embeddings, input_points=points, input_labels=labels)
        relabelled = ref(image_embeddings=embeddings, input_points=points, input_labels=unpadded)
        unwindowed = whole.get_image_embeddings(pixels)
    assert max_abs_diff(relabelled.pred_masks, out.pred_masks) > 100 * ATOL
    assert max_abs_diff(unwindowed, embeddings) > 100 * ATOL


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_the_real_checkpoint_layout_fits_every_parameter(preset, tmp_path):
    """L501 against a header-only description of the real checkpoint: the names and shapes transformers saves for
    SamModel of the real config (the tied Fourier features once, as `shared_image_embedding`) fit the source under
    that config.json; a global layer's relative-position table of a local layer's size is refused naming it."""
    config = transformers.SamConfig(**REAL_CONFIGS[preset])
    with torch.device("meta"):
        model = transformers.SamModel(config)

    def changed(model):
        with torch.device("meta"):
            model.vision_encoder.layers[5].attn.rel_pos_h = torch.nn.Parameter(torch.empty(27, 64))

    wrong = r"vision_encoder.layers.5.attn.rel_pos_h.*\[27, 64\]"
    assert_real_layout_fits(SAM, preset, config, model, changed, tmp_path, wrong)
