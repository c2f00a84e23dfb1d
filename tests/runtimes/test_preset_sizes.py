"""Every preset at its real size against transformers' model of the real config, built on the `meta`
device (shapes without memory): the same parameter names and shapes, the same count, and the real
config.json picks that preset through the zoo index with no field differing.

A family's preset joins with one `Row` in `ROWS`: its example, the preset, the transformers model
and config classes, and the real config's values (as its config.json on the Hub has them).
`examples/mlp.linnet` has no row: its `tiny` preset is no published model.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest

from linnet.runtimes import zoo
from linnet.runtimes.formats.checkpoints import normalize_config
from linnet.semantics.program import Document
from tests.conftest import EXAMPLES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class Row(NamedTuple):
    source: str  # the example's file name
    preset: str
    model_class: str  # in transformers
    config_class: str
    config: dict[str, Any]  # the real config (what its config.json sets that the model reads)
    # The Hub's config.json has these keys as written (by transformers 4), not as transformers 5 rewrites them
    # (ModernBERT's `global_rope_theta` and `local_rope_theta` become `rope_parameters` and `layer_types`).
    as_written: bool = False


ROWS = [
    Row(
        "llama.linnet", "smollm2_135m", "LlamaForCausalLM", "LlamaConfig",
        dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
             tie_word_embeddings=True),
    ),
    Row(
        "llama.linnet", "smollm2_1_7b_instruct", "LlamaForCausalLM", "LlamaConfig",
        dict(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
             num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=8192, rms_norm_eps=1e-5,
             rope_theta=130000.0, tie_word_embeddings=True),
    ),
    Row(
        "llama.linnet", "tinyllama_1_1b", "LlamaForCausalLM", "LlamaConfig",
        dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
             num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0),
    ),
    Row(
        "llama.linnet", "llama_3_1_8b", "LlamaForCausalLM", "LlamaConfig",
        dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
             rms_norm_eps=1e-5, rope_theta=500000.0,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}),
    ),
    Row("gpt2.linnet", "gpt2", "GPT2LMHeadModel", "GPT2Config", dict(vocab_size=50257, n_positions=1024, n_embd=768,
                                                                       n_layer=12, n_head=12)),
    Row(
        "bert.linnet", "bert_base_uncased", "BertModel", "BertConfig",
        dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    ),
    Row(
        "bert.linnet", "all_minilm_l6_v2", "BertModel", "BertConfig",
        dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    ),
    Row(
        "modernbert.linnet", "modernbert_base", "ModernBertModel", "ModernBertConfig",
        dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
             global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0,
             local_rope_theta=10000.0, norm_eps=1e-5, max_position_embeddings=8192),
        as_written=True,
    ),
]  # fmt: skip

_ANALYSES: dict[str, Any] = {}


def analysis(source: str):
    if source not in _ANALYSES:
        path = EXAMPLES / source
        _ANALYSES[source] = Document(str(path), path.read_text(encoding="utf-8")).analyze()
    return _ANALYSES[source]


def real_model(row: Row):
    with torch.device("meta"):
        config = getattr(transformers, row.config_class)(**row.config)
        return getattr(transformers, row.model_class)(config)


def test_every_preset_of_the_families_has_a_row():
    """A preset added to one of these examples without a row here fails, rather than going unchecked."""
    for source in {row.source for row in ROWS}:
        assert sorted(analysis(source).presets) == sorted(row.preset for row in ROWS if row.source == source)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.preset)
def test_parameters_are_the_real_models(row):
    """Names and shapes of the preset's parameters are those of transformers' model (tied ones once, as
    `named_parameters` lists them), and the count is its `num_parameters()`."""
    tree = analysis(row.source).trees[row.preset]
    ref = real_model(row)
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}
    assert {p.path: p.shape() for p in tree.params} == theirs
    assert tree.param_count() == ref.num_parameters()


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.preset)
def test_the_real_config_json_picks_the_preset(row, tmp_path):
    """The config.json transformers writes for the real config (the Hub's as written, for a row `as_written`)
    picks this preset in the zoo index, equal in every field it sets that the source reads (rope_theta, norm
    epsilons: what shapes do not show)."""
    if row.as_written:
        model_type = getattr(transformers, row.config_class).model_type
        (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, **row.config}))
    else:
        getattr(transformers, row.config_class)(**row.config).save_pretrained(tmp_path)
    config = normalize_config(json.loads((tmp_path / "config.json").read_text()))
    choice = zoo.closest_preset(EXAMPLES / row.source, config)
    assert (choice.preset, choice.differences) == (row.preset, ())
