"""examples/siglip.linnet against transformers' SiglipModel (both towers).

At real size (no weights): the source checks clean under its preset, whose parameters are those of transformers'
SiglipModel for siglip-base-patch16-224's config built on the `meta` device (names, shapes and count), whose config is
the config.json transformers writes for it, and a header-only copy of that checkpoint fits.
At shrunk size: a seeded SiglipModel (2 + 2 layers, 32 wide, 32×32 images in 8×8 patches), every parameter perturbed
(norms away from 1, `logit_scale` and `logit_bias` too), saved with `save_pretrained` and loaded through the folder on
every backend: `logits_per_image` of 2 images against 3 texts, and the normalized `text_embeds` and `image_embeds`.
The reference is transformers' eager attention."""

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

SIGLIP = EXAMPLES / "siglip.linnet"
VOCAB = 99
# f32 against transformers' eager f32: what we see is ~3e-7 on every backend. Tighter than the zoo's usual 1e-4: the
# embeddings are unit vectors, and the two GELU forms move them by only ~1e-4 (test_what_the_parity_test_tells_apart).
ATOL = 1e-5
CHECKPOINT = "seeded 2+2-layer, 32x32 images"

# siglip-base-patch16-224's config: transformers' SiglipConfig defaults are its values.
REAL_CONFIGS = {"siglip_base_patch16_224": {}}


def analysis():
    return Document(str(SIGLIP), SIGLIP.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    result = analysis()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    """Names, shapes and count of the preset's parameters against transformers' SiglipModel of the real config on
    the `meta` device (203,155,970 for the base checkpoint)."""
    with torch.device("meta"):
        ref = transformers.SiglipModel(transformers.SiglipConfig(**REAL_CONFIGS[preset]))
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}
    tree = analysis().trees[preset]
    assert {p.path: p.shape() for p in tree.params} == theirs
    assert tree.param_count() == ref.num_parameters() == 203_155_970
    assert theirs["vision_model.head.attention.in_proj_weight"] == (3 * 768, 768)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    """Every field of each tower's preset config equals the value in the config.json transformers writes for the
    real config, where it writes one (`head_dim` and `grid_size` are derived)."""
    from linnet.ir import build

    transformers.SiglipConfig(**REAL_CONFIGS[preset]).save_pretrained(tmp_path)
    real = json.loads((tmp_path / "config.json").read_text())
    ours = build(SIGLIP, preset=preset).config
    for tower in ("text_config", "vision_config"):
        mine, theirs = ours[tower], real[tower]
        assert set(mine) - set(theirs) <= {"head_dim", "grid_size"}, tower
        assert {k: theirs[k] for k in mine if k in theirs} == {k: v for k, v in mine.items() if k in theirs}, tower


def small_config(**changes):
    text = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=16, projection_size=32, pad_token_id=1, bos_token_id=2, eos_token_id=3,
    )  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    return transformers.SiglipConfig(text_config=text, vision_config=vision, **changes)


@pytest.fixture(scope="module")
def small_siglip(tmp_path_factory):
    """(folder, transformers model) of a seeded small SiglipModel saved with save_pretrained."""
    torch.manual_seed(0)
    model = transformers.SiglipModel(small_config(attn_implementation="eager")).eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("siglip")
    model.save_pretrained(folder)
    return folder, model


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Three texts of 10 token ids and two 32×32 images (seeded)."""
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, VOCAB, (3, 10), generator=g), torch.randn(2, 3, 32, 32, generator=g)


def load(backend: str, folder, **kwargs):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(SIGLIP, weights=folder, max_batch=3, progress=False, **kwargs)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_logits_and_embeddings(small_siglip, backend):
    folder, ref = small_siglip
    m = load(backend, folder)
    ids, pixels = inputs()
    (logits,) = m.run("forward", ids.numpy(), pixels.numpy())
    (text_embeds,) = m.run("embed_text", ids.numpy())
    (image_embeds,) = m.run("embed_image", pixels.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids, pixel_values=pixels)
    for what, ours, reference in (
        ("logits_per_image [2, 3]", logits, theirs.logits_per_image),
        ("text_embeds [3, 32]", text_embeds, theirs.text_embeds),
        ("image_embeds [2, 32]", image_embeds, theirs.image_embeds),
    ):
        delta = max_abs_diff(ours, reference)
        record(f"small SigLIP ({backend}) {what}", delta, model="siglip", backend=backend, checkpoint=CHECKPOINT)
        assert delta < ATOL, what


def test_what_the_parity_test_tells_apart(small_siglip):
    """The text pooling position and the image tower's activation each move the embeddings beyond the tolerance, so
    the parity above sees them: the reference pools the last token (not the first), and the checkpoint's
    `gelu_pytorch_tanh` is not `gelu` (loaded with the vision tower's `hidden_act` changed by `config=`)."""
    folder, ref = small_siglip
    ids, pixels = inputs()
    with torch.inference_mode():
        theirs = ref(input_ids=ids, pixel_values=pixels)
        states = ref.text_model.encoder(ref.text_model.embeddings(ids)).last_hidden_state
        first = ref.text_model.final_layer_norm(states)
        first = ref.text_model.head(first[:, 0])
    assert max_abs_diff(first / first.norm(dim=-1, keepdim=True), theirs.text_embeds) > 100 * ATOL
    # `config=` replaces a whole record (its fields not given take the source's defaults), so give every field the
    # source declares, as the checkpoint has them, but `hidden_act`.
    vision_config = json.loads((folder / "config.json").read_text())["vision_config"]
    del vision_config["attention_dropout"], vision_config["model_type"]
    m = load("torch", folder, config={"vision_config": {**vision_config, "hidden_act": "gelu"}})
    (image_embeds,) = m.run("embed_image", pixels.numpy())
    assert max_abs_diff(image_embeds, theirs.image_embeds) > 5 * ATOL


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_the_real_checkpoint_layout_fits_every_parameter(preset, tmp_path):
    """L501 against a header-only description of the real checkpoint: the names and shapes transformers saves for
    SiglipModel of the real config fit the source under that config.json (nested `text_config` and
    `vision_config`); one wrong shape is refused naming the tensor."""
    config = transformers.SiglipConfig(**REAL_CONFIGS[preset])
    with torch.device("meta"):
        model = transformers.SiglipModel(config)

    def changed(model):
        model.vision_model.head.probe = torch.nn.Parameter(torch.empty(1, 2, 768, device="meta"))

    wrong = r"vision_model.head.probe.*\[1, 2, 768\]"
    assert_real_layout_fits(SIGLIP, preset, config, model, changed, tmp_path, wrong)
