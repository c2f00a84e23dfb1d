"""examples/roberta.linnet against transformers' RobertaModel.

At real size (no weights): the source checks clean under each preset, and each preset's parameters are those of
transformers' model for that config built on the `meta` device (names, shapes and count), its config the real
config.json's. At shrunk size: a seeded 2-layer RoBERTa, every parameter perturbed (norms away from 1, biases away
from 0), saved with `save_pretrained` and loaded through the folder on every backend: the hidden states at every
position and the pooled output of a batch padded on the right and on the left (a left-padded row's positions
start past the padding index only when they are counted as transformers counts them). The reference is
transformers' eager attention, the maths the source states."""

from __future__ import annotations

import json

import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document
from tests.runtimes.conftest import (
    ALL_BACKENDS,
    ROBERTA,
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
PAD = 1
# f32 encoders against transformers' eager f32: what we see is ~1e-6.
STATES_ATOL = 1e-4

# The real configs of the presets (the checkpoints' config.json, less bookkeeping and dropouts).
REAL_CONFIGS = {
    "roberta_base": dict(
        vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        hidden_act="gelu", max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
        bos_token_id=0, eos_token_id=2,
    ),
}  # fmt: skip


def analysis():
    return Document(str(ROBERTA), ROBERTA.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    result = analysis()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    """Names, shapes and count of the preset's parameters against transformers' RobertaModel of the real config on
    the `meta` device, without the pooler (as RobertaForMaskedLM, roberta-base's class, builds it)."""
    with torch.device("meta"):
        ref = transformers.RobertaModel(transformers.RobertaConfig(**REAL_CONFIGS[preset]), add_pooling_layer=False)
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}
    tree = analysis().trees[preset]
    assert {p.path: p.shape() for p in tree.params} == theirs
    assert tree.param_count() == ref.num_parameters()


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    """Every field of the preset equals the value in the config.json transformers writes for the real config
    (`head_dim` is derived; `position_embedding_type` is in the real roberta-base config.json, which transformers 4
    wrote, but transformers 5 no longer writes it)."""
    from linnet.ir import build

    transformers.RobertaConfig(**REAL_CONFIGS[preset]).save_pretrained(tmp_path)
    real = json.loads((tmp_path / "config.json").read_text())
    ours = build(ROBERTA, preset=preset).config
    assert set(ours) - set(real) <= {"head_dim", "position_embedding_type"}
    assert {key: real[key] for key in ours if key in real} == {k: v for k, v in ours.items() if k in real}


def small_config(**changes):
    values = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=PAD, bos_token_id=0,
        eos_token_id=2, initializer_range=0.1,
    )  # fmt: skip
    return transformers.RobertaConfig(**{**values, **changes})


@pytest.fixture(scope="module")
def small_roberta(tmp_path_factory):
    """(folder, transformers model) of a seeded 2-layer RobertaModel without a pooler, saved with save_pretrained."""
    torch.manual_seed(0)
    model = transformers.RobertaModel(small_config(attn_implementation="eager"), add_pooling_layer=False).eval()
    assert model.config._attn_implementation == "eager"
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("roberta")
    model.save_pretrained(folder)
    return folder, model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 12, padded on neither side, the right, the left; no real token is the padding id."""
    return padded_encoder_batch(VOCAB, PAD, 2)


def load(backend: str, folder, **kwargs):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(ROBERTA, weights=folder, max_batch=3, progress=False, **kwargs)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hidden_states(small_roberta, backend):
    folder, ref = small_roberta
    m = load(backend, folder)
    assert m.config["pad_token_id"] == PAD and m.config["max_position_embeddings"] == 40
    ids, mask = padded_batch()
    (states,) = m.run("forward", ids.numpy(), mask.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids, attention_mask=mask)
    delta = max_abs_diff(states, theirs.last_hidden_state)
    record(f"small RoBERTa ({backend}) last_hidden_state [3, 12, 32], every position, padded both sides", delta,
           model="roberta", backend=backend, checkpoint="seeded 2-layer, padded both sides")  # fmt: skip
    assert delta < STATES_ATOL


def test_position_ids_are_transformers(small_roberta):
    """The source's position ids are create_position_ids_from_input_ids' on the padded batch (read back through
    the position embeddings: the embeddings' output before the norm is not an entry, so the check is that a
    BERT-style `arange` would be far off on the left-padded row)."""
    folder, ref = small_roberta
    ids, mask = padded_batch()
    theirs = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(ids, PAD)
    assert theirs[2, 7].item() == PAD + 1 and theirs[2, 0].item() == PAD
    shifted = torch.arange(12).expand(3, 12) + PAD + 1
    with torch.inference_mode():
        right = ref(input_ids=ids, attention_mask=mask, position_ids=theirs).last_hidden_state
        wrong = ref(input_ids=ids, attention_mask=mask, position_ids=shifted).last_hidden_state
    assert max_abs_diff(right[2], wrong[2]) > 100 * STATES_ATOL
    (states,) = load("torch", folder).run("forward", ids.numpy(), mask.numpy())
    assert max_abs_diff(states, right) < STATES_ATOL


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_the_real_checkpoint_layout_fits_every_parameter(preset, tmp_path):
    """L501/L502 against a header-only description of the real checkpoint: the names and shapes transformers saves
    for RobertaForMaskedLM (roberta-base's class: `roberta.*` and `lm_head.*`) of the real config fit the source
    under that config.json, the head left with a note; one wrong shape is refused naming the tensor."""
    from linnet.ir.build import bind_config, check_source, lower_program
    from linnet.runtimes.formats.checkpoints import open_checkpoint
    from linnet.runtimes.loading import LoadError, match_weights

    info = check_source(str(ROBERTA), ROBERTA.read_text(), preset)
    config = transformers.RobertaConfig(**REAL_CONFIGS[preset])
    with torch.device("meta"):
        model = transformers.RobertaForMaskedLM(config)
    header_only_checkpoint(tmp_path, config, model)
    ckpt = open_checkpoint(tmp_path)
    program = lower_program(bind_config(info, ckpt.config, labels=(str(tmp_path),)), max_positions=16)
    notes: list[str] = []
    plan = match_weights(program, ckpt, notes)
    assert len(plan) == len(program.params) == 12 * 16 + 5 and set(plan.values()) < set(ckpt.tensor_names)
    (note,) = notes
    assert "under `roberta.`" in note and "lm_head.bias" in note

    with torch.device("meta"):
        model.roberta.encoder.layer[7].attention.self.query = torch.nn.Linear(768, 776)
    header_only_checkpoint(tmp_path, config, model)
    with pytest.raises(LoadError, match=r"roberta.encoder.layer.7.attention.self.query.weight.*\[776, 768\]") as err:
        match_weights(program, open_checkpoint(tmp_path), notes)
    assert err.value.code == "L501"
