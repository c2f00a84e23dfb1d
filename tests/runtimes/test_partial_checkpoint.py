"""A source that takes a part of a checkpoint (`@takes_part` on its model; examples/roberta.linnet): the encoder out
of a RobertaForSequenceClassification checkpoint (under `roberta.`, beside `classifier.`), out of a RobertaModel
checkpoint with its pooler, and under a prefix of two segments (`model.encoder.`, as an encoder sits in a full
encoder-decoder checkpoint). The tensors it leaves are a note naming how many and a few; the hidden states are
transformers' own encoder's. Without `@takes_part` the same checkpoint is L502, as is a prefix holding every
parameter twice (two copies) until `@takes_part("...")` names one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from linnet.errors import LoadError
from linnet.runtimes.backends import BACKENDS
from tests.runtimes.conftest import ROBERTA, max_abs_diff, perturb, report

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 99
PAD = 1
STATES_ATOL = 1e-4


def small_config(**changes):
    values = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=PAD, num_labels=3,
        attn_implementation="eager",
    )  # fmt: skip
    return transformers.RobertaConfig(**{**values, **changes})


def seeded(model_class, seed: int, **kwargs):
    torch.manual_seed(seed)
    model = model_class(small_config(), **kwargs).eval()
    perturb(model, seed=seed + 1)
    return model


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """(folder, model) of a seeded RobertaForSequenceClassification saved with save_pretrained: `roberta.*` (no
    pooler) and `classifier.{dense,out_proj}.{weight,bias}`."""
    model = seeded(transformers.RobertaForSequenceClassification, seed=0)
    folder = tmp_path_factory.mktemp("roberta-classifier")
    model.save_pretrained(folder)
    return folder, model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, VOCAB, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    return torch.where(mask.bool(), ids, PAD), mask


def encoder_states(encoder) -> torch.Tensor:
    ids, mask = batch()
    with torch.inference_mode():
        return encoder(input_ids=ids, attention_mask=mask).last_hidden_state


def load(folder, source=ROBERTA):
    return BACKENDS["torch"].load(source, weights=folder, max_batch=2, progress=False)


def linnet_states(m) -> torch.Tensor:
    ids, mask = batch()
    return torch.from_numpy(m.run("forward", ids.numpy(), mask.numpy())[0])


def without_takes_part(tmp_path, replacement: str = ""):
    """examples/roberta.linnet with its `@takes_part` line replaced (dropped, or another form of it)."""
    text = ROBERTA.read_text(encoding="utf-8")
    assert text.count("@takes_part\n") == 1
    path = tmp_path / "roberta.linnet"
    path.write_text(text.replace("@takes_part\n", replacement), encoding="utf-8")
    return path


def test_the_encoder_of_a_sequence_classification_checkpoint(classifier):
    folder, model = classifier
    m = load(folder)
    delta = max_abs_diff(linnet_states(m), encoder_states(model.roberta))
    report("RoBERTa encoder from RobertaForSequenceClassification (torch) last_hidden_state", delta)
    assert delta < STATES_ATOL
    (note,) = [n for n in m.notes if "takes a part" in n]
    assert "under `roberta.`" in note and "4 tensor(s) not used" in note and "`classifier.dense.weight`" in note


def test_the_note_reaches_the_command_line(classifier):
    folder, _ = classifier
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "run", str(ROBERTA), "--weights", str(folder)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "note: " in r.stderr and "takes a part of the checkpoint (under `roberta.`); 4 tensor(s)" in r.stderr


def test_a_base_model_checkpoint_with_its_pooler(tmp_path):
    """RobertaModel's own names (no prefix) with a pooler the source has not: the pooler is left, with a note."""
    model = seeded(transformers.RobertaModel, seed=3)
    model.save_pretrained(tmp_path)
    m = load(tmp_path)
    assert max_abs_diff(linnet_states(m), encoder_states(model)) < STATES_ATOL
    (note,) = [n for n in m.notes if "takes a part" in n]
    assert "2 tensor(s) not used: `pooler.dense.bias`, `pooler.dense.weight`" in note


def save_renamed(folder, tensors: dict, config: dict) -> None:
    safetensors_torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))


def test_a_prefix_of_two_segments(classifier, tmp_path):
    """The encoder's tensors under `model.encoder.` beside others (a `base_model_prefix` of two segments)."""
    folder, model = classifier
    state = model.state_dict()
    tensors = {"model.encoder." + k.removeprefix("roberta."): v for k, v in state.items() if k.startswith("roberta.")}
    tensors |= {"model.decoder.head.weight": torch.zeros(3, 32), "lm_head.weight": torch.ones(VOCAB, 32)}
    save_renamed(tmp_path, tensors, json.loads((folder / "config.json").read_text()))
    m = load(tmp_path)
    assert max_abs_diff(linnet_states(m), encoder_states(model.roberta)) < STATES_ATOL
    (note,) = [n for n in m.notes if "takes a part" in n]
    assert "under `model.encoder.`" in note and "2 tensor(s) not used" in note


def test_without_takes_part_the_unused_tensors_are_an_error(classifier, tmp_path):
    folder, _ = classifier
    with pytest.raises(LoadError) as err:
        load(folder, without_takes_part(tmp_path))
    assert err.value.code == "L502"
    message = str(err.value)
    assert "4 checkpoint tensor(s) no parameter takes: `classifier.dense.bias`" in message
    assert "`@takes_part`" in message


def test_two_copies_are_refused_until_the_source_names_one(classifier, tmp_path):
    """Every parameter under `student.` and under `teacher.`: which to load is not guessed (L502 naming both);
    `@takes_part("teacher")` loads the teacher's."""
    folder, model = classifier
    other = seeded(transformers.RobertaForSequenceClassification, seed=7)
    tensors = {"student." + k.removeprefix("roberta."): v for k, v in model.state_dict().items()}
    tensors |= {"teacher." + k.removeprefix("roberta."): v for k, v in other.state_dict().items()}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_renamed(ckpt, tensors, json.loads((folder / "config.json").read_text()))
    with pytest.raises(LoadError) as err:
        load(ckpt)
    assert err.value.code == "L502" and "(`student.`, `teacher.`)" in str(err.value)
    assert '`@takes_part("student")`' in str(err.value)

    m = load(ckpt, without_takes_part(tmp_path, '@takes_part("teacher")\n'))
    assert max_abs_diff(linnet_states(m), encoder_states(other.roberta)) < STATES_ATOL
    assert max_abs_diff(encoder_states(other.roberta), encoder_states(model.roberta)) > 100 * STATES_ATOL


def test_a_named_prefix_the_checkpoint_lacks_is_an_error(classifier, tmp_path):
    folder, _ = classifier
    with pytest.raises(LoadError) as err:
        load(folder, without_takes_part(tmp_path, '@takes_part("model.encoder")\n'))
    assert err.value.code == "L502" and "parameter(s) missing from the checkpoint" in str(err.value)


def test_the_encoder_of_a_masked_lm_checkpoint(tmp_path):
    """RobertaForMaskedLM, the class of FacebookAI/roberta-base's checkpoint: `roberta.*` and `lm_head.*`."""
    model = seeded(transformers.RobertaForMaskedLM, seed=9)
    model.save_pretrained(tmp_path)
    m = load(tmp_path)
    assert max_abs_diff(linnet_states(m), encoder_states(model.roberta)) < STATES_ATOL
    (note,) = [n for n in m.notes if "takes a part" in n]
    assert "under `roberta.`" in note and "`lm_head.dense.weight`" in note
