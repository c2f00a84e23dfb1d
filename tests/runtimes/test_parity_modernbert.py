"""examples/modernbert.linnet against transformers' ModernBertModel.

At real size (no weights): the source checks clean under its preset, whose parameters are those of transformers'
model for that config built on the `meta` device (names, shapes and count), and whose config is the config.json
transformers writes for it; a header-only copy of ModernBertForMaskedLM's checkpoint (ModernBERT-base's class) fits.
At shrunk size: a seeded 4-layer ModernBERT (global every 2nd layer, so both kinds run twice; a local window of
2 + 1 + 2 positions, shorter than the input), every parameter perturbed (norms away from 1), saved with
`save_pretrained` and loaded through the folder on every backend: the hidden states at every position of a batch
padded on the right and on the left. The reference is transformers' eager attention (transformers 5 runs
ModernBERT padded), the maths the source states."""

from __future__ import annotations

import json

import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document
from tests.runtimes.conftest import (
    ALL_BACKENDS,
    MODERNBERT,
    header_only_checkpoint,
    max_abs_diff,
    padded_encoder_batch,
    perturb,
    record,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 99
PAD = 0
# f32 encoders against transformers' eager f32: what we see is ~1e-6.
STATES_ATOL = 1e-4

# ModernBERT-base's config: transformers' defaults are its values, besides the layer pattern its config.json gives.
REAL_CONFIGS = {"modernbert_base": dict(global_attn_every_n_layers=3)}


def analysis():
    return Document(str(MODERNBERT), MODERNBERT.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    result = analysis()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    """Names, shapes and count of the preset's parameters against transformers' ModernBertModel of the real config
    on the `meta` device: layer 0 has no `attn_norm`, the others have one."""
    with torch.device("meta"):
        ref = transformers.ModernBertModel(transformers.ModernBertConfig(**REAL_CONFIGS[preset]))
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}
    tree = analysis().trees[preset]
    assert {p.path: p.shape() for p in tree.params} == theirs
    assert tree.param_count() == ref.num_parameters()
    assert "layers.0.attn_norm.weight" not in theirs and "layers.1.attn_norm.weight" in theirs


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    """Every field of the preset equals the value in the config.json transformers writes for the real config, where
    it writes one (`head_dim` is derived; transformers 5 writes the rope thetas into `rope_parameters`)."""
    from linnet.ir import build

    transformers.ModernBertConfig(**REAL_CONFIGS[preset]).save_pretrained(tmp_path)
    real = json.loads((tmp_path / "config.json").read_text())
    ours = build(MODERNBERT, preset=preset).config
    assert set(ours) - set(real) <= {"head_dim", "global_rope_theta", "local_rope_theta"}
    layer_types = real.pop("layer_types")
    assert [t == "sliding_attention" for t in layer_types] == [i % 3 != 0 for i in range(22)]
    assert real.pop("rope_parameters") == {
        "full_attention": {"rope_type": "default", "rope_theta": ours["global_rope_theta"]},
        "sliding_attention": {"rope_type": "default", "rope_theta": ours["local_rope_theta"]},
    }
    assert {key: real[key] for key in ours if key in real} == {k: v for k, v in ours.items() if k in real}


def small_config(**changes):
    values = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=4, pad_token_id=PAD,
        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, initializer_range=0.1,
        global_rope_theta=1000.0, local_rope_theta=50.0,
    )  # fmt: skip
    return transformers.ModernBertConfig(**{**values, **changes})


@pytest.fixture(scope="module")
def small_modernbert(tmp_path_factory):
    """(folder, transformers model) of a seeded 4-layer ModernBertModel saved with save_pretrained."""
    torch.manual_seed(0)
    model = transformers.ModernBertModel(small_config(attn_implementation="eager")).eval()
    assert model.config._attn_implementation == "eager"
    assert model.config.layer_types == ["full_attention", "sliding_attention"] * 2
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("modernbert")
    model.save_pretrained(folder)
    return folder, model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 12, padded on neither side, the right, the left; no real token is a special one."""
    return padded_encoder_batch(VOCAB, PAD, 3)


def load(backend: str, folder, **kwargs):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(MODERNBERT, weights=folder, max_batch=3, progress=False, **kwargs)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hidden_states(small_modernbert, backend):
    folder, ref = small_modernbert
    m = load(backend, folder)
    assert m.config["local_attention"] == 4 and m.config["layer_types"][1] == "sliding_attention"
    ids, mask = padded_batch()
    (states,) = m.run("forward", ids.numpy(), mask.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    delta = max_abs_diff(states, theirs)
    record(f"small ModernBERT ({backend}) last_hidden_state [3, 12, 32], every position, padded both sides", delta,
           model="modernbert", backend=backend, checkpoint="seeded 4-layer, window 2, padded both sides")  # fmt: skip
    assert delta < STATES_ATOL


@pytest.mark.parametrize(
    "changed",
    [
        {"local_attention": 24},  # a window that covers the input: local layers attend globally
        {"layer_types": ["full_attention"] * 4},  # every layer global
        {"rope_parameters": {"full_attention": {"rope_theta": 1000.0}, "sliding_attention": {"rope_theta": 1000.0}}},
    ],
    ids=["window", "layer_types", "local_theta"],
)
def test_what_the_parity_test_tells_apart(small_modernbert, changed):
    """The window, the layer pattern and the local layers' rope theta each move the hidden states far beyond the
    tolerance, so the parity above sees them (loaded with one config key changed by `config=`)."""
    folder, ref = small_modernbert
    ids, mask = padded_batch()
    (states,) = load("torch", folder, config=changed).run("forward", ids.numpy(), mask.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    assert max_abs_diff(states, theirs) > 100 * STATES_ATOL


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_the_real_checkpoint_layout_fits_every_parameter(preset, tmp_path):
    """L501/L502 against a header-only description of the real checkpoint: the names and shapes transformers saves
    for ModernBertForMaskedLM (ModernBERT-base's class: `model.*`, `head.*` and `decoder.*`) of the real config fit
    the source under that config.json, the head left with a note; one wrong shape is refused naming the tensor."""
    from linnet.ir.build import bind_config, check_source, lower_program
    from linnet.runtimes.formats.checkpoints import open_checkpoint
    from linnet.runtimes.loading import LoadError, match_weights

    info = check_source(str(MODERNBERT), MODERNBERT.read_text(), preset)
    config = transformers.ModernBertConfig(**REAL_CONFIGS[preset])
    with torch.device("meta"):
        model = transformers.ModernBertForMaskedLM(config)
    header_only_checkpoint(tmp_path, config, model)
    ckpt = open_checkpoint(tmp_path)
    program = lower_program(bind_config(info, ckpt.config, labels=(str(tmp_path),)), max_positions=16)
    notes: list[str] = []
    plan = match_weights(program, ckpt, notes)
    # 22 layers of Wqkv, Wo, Wi, Wo, mlp_norm and (but the first) attn_norm; embeddings and their norm; final norm.
    assert len(plan) == len(program.params) == 22 * 6 - 1 + 3 and set(plan.values()) < set(ckpt.tensor_names)
    (note,) = notes
    assert "under `model.`" in note and "head.dense.weight" in note

    with torch.device("meta"):
        model.model.layers[7].attn.Wqkv = torch.nn.Linear(768, 2312, bias=False)
    header_only_checkpoint(tmp_path, config, model)
    with pytest.raises(LoadError, match=r"model.layers.7.attn.Wqkv.weight.*\[2312, 768\]") as err:
        match_weights(program, open_checkpoint(tmp_path), notes)
    assert err.value.code == "L501"
