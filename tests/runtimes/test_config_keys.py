"""Every key of a checkpoint's config is accounted for (issue 14, "silently wrong" item 3): a field of the source's
config (checked against its type; a one-value type such as `hidden_act: "silu"` refuses other values), a key
transformers writes for every model (`linnet.ir.build.METADATA_KEYS`), or a key the config declares inert with
`@inert(...)`. Anything else is error L503 naming the key and the config.json. Errors about a loaded config point at
the config.json key and at the source field's declaration, never at lines past the end of the source.

Small Llama checkpoints are made by transformers (seeded, perturbed, `save_pretrained`); the examples'
classification is checked against transformers' own config classes."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.runtimes.conftest import BERT, GPT2, LLAMA, MISTRAL, QWEN2, QWEN3, max_abs_diff, perturb

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import linnet.torch as lt  # noqa: E402
from linnet.ir.build import METADATA_KEYS, check_source  # noqa: E402
from linnet.runtimes.loading import LoadError  # noqa: E402
from linnet.semantics.attributes import inert_keys  # noqa: E402
from linnet.syntax import ast as A  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

LLAMA_LINES = len(LLAMA.read_text(encoding="utf-8").splitlines())


def small_llama_config(**changes):
    return transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        **changes,
    )


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(folder, transformers model) of a seeded 2-layer Llama saved with save_pretrained."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(small_llama_config()).eval()
    perturb(model, seed=1)
    folder = tmp_path_factory.mktemp("llama")
    model.save_pretrained(folder)
    return folder, model


def with_config(folder, tmp_path, **changes):
    """A copy of the checkpoint folder whose config.json has `changes` (None deletes a key); returns
    (folder, config.json path, config.json text)."""
    out = tmp_path / "ckpt"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    (out / "config.json").write_text(text)
    return out, out / "config.json", text


def line_of(text: str, key: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(f'"{key}"'))


def source_line(fragment: str) -> int:
    return next(i for i, line in enumerate(LLAMA.read_text().splitlines(), 1) if fragment in line)


def test_a_transformers_llama_loads_exactly_without_notes(llama):
    """The four "ignored" notes of every Hugging Face Llama load (hidden_act, initializer_range, pretraining_tp,
    attention_dropout) are gone: each key is a checked field or declared inert."""
    folder, model = llama
    keys = set(json.loads((folder / "config.json").read_text()))
    assert {"hidden_act", "initializer_range", "pretraining_tp", "attention_dropout", "use_cache"} <= keys
    m = lt.load(LLAMA, weights=folder, mode="interpret", max_positions=16, progress=False)
    assert m.notes == []
    ids = torch.tensor([[5, 17, 3, 90, 41, 8]])
    with torch.inference_mode():
        assert max_abs_diff(m.native.forward(ids), model(ids).logits) < 1e-4


def test_hidden_act_relu_is_an_error_on_the_field(llama, tmp_path):
    """Before, `hidden_act: "relu"` was skipped with a note and the model ran SiLU: transformers' relu model is far
    from it. Now the load stops at the config.json key, with the field's declaration as the label."""
    folder, model = llama
    relu = transformers.LlamaForCausalLM(small_llama_config(hidden_act="relu")).eval()
    relu.load_state_dict(model.state_dict())
    ids = torch.tensor([[5, 17, 3, 90, 41, 8]])
    with torch.inference_mode():
        assert max_abs_diff(relu(ids).logits, model(ids).logits) > 0.05  # ignoring the key would be silently wrong

    ckpt, cfg, text = with_config(folder, tmp_path, hidden_act="relu")
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=ckpt, mode="interpret", max_positions=16, progress=False)
    line, decl = line_of(text, "hidden_act"), source_line('hidden_act: "silu"')
    w = len(str(max(line, decl)))
    assert err.value.message == "\n".join(
        [
            f"{LLAMA} does not check under the loaded config (defaults + {cfg}):",
            f'{cfg}:{line}:3: error[L401]: `hidden_act` can only be "silu"; got "relu"',
            f"{'':{w}} |",
            f'{line:>{w}} |   "hidden_act": "relu",',
            f"{'':{w}} |   ^^^^^^^^^^^^",
            f"{'':{w}} |",
            f"{'':{w}}--> {LLAMA}:{decl}:5",
            f"{'':{w}} |",
            f'{decl:>{w}} |     hidden_act: "silu" = "silu"',
            f"{'':{w}} |     --------------------------- the source declares the field here",
        ]
    )


def test_an_undeclared_key_is_refused_naming_it_and_the_file(llama, tmp_path):
    """Phi-3's `partial_rotary_factor` in a file loaded as Llama changes the rotary embedding: refused (L503)."""
    folder, _ = llama
    ckpt, cfg, text = with_config(folder, tmp_path, partial_rotary_factor=0.5)
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=ckpt, mode="interpret", max_positions=16, progress=False)
    lines = err.value.message.splitlines()
    assert lines[0] == (
        f"{cfg}:{line_of(text, 'partial_rotary_factor')}:3: error[L503]: `partial_rotary_factor` in {cfg} "
        "is not a field of `Llama`, nor a key `Llama` declares inert"
    )
    assert f"--> {LLAMA}:{source_line('config Llama {')}:8" in err.value.message
    assert "add it to `@inert(...)` on `config Llama`" in err.value.message


def test_a_config_that_breaks_a_shape_points_at_config_json_not_past_the_source(llama, tmp_path):
    """Checker errors under the loaded config label the config.json keys the values came from; no line of
    llama.linnet past its end is cited (the merged preset used to be shown as if it were in the file)."""
    folder, _ = llama
    ckpt, cfg, text = with_config(folder, tmp_path, num_key_value_heads=3)
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=ckpt, mode="interpret", max_positions=16, progress=False)
    message = err.value.message
    assert "4 is not divisible by 3" in message
    assert f"--> {cfg}:{line_of(text, 'num_attention_heads')}:3" in message
    assert f'{line_of(text, "num_key_value_heads")} |   "num_key_value_heads": 3,' in message
    assert "`num_key_value_heads` = 3" in message
    assert "linnet_loaded" not in message
    cited = [int(n) for n in re.findall(rf"{LLAMA}:(\d+):", message)]
    assert cited and max(cited) <= LLAMA_LINES


def test_bookkeeping_and_inert_keys_are_skipped(llama, tmp_path):
    folder, _ = llama
    ckpt, _, _ = with_config(
        folder, tmp_path, torch_dtype="bfloat16", use_cache=False, initializer_range=0.5, max_length=20, num_labels=3
    )
    m = lt.load(LLAMA, weights=ckpt, mode="interpret", max_positions=16, progress=False)
    assert m.notes == []


def test_a_misspelt_config_flag_is_an_error_with_a_suggestion(llama):
    folder, _ = llama
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=folder, config={"hiden_size": 32}, mode="interpret", progress=False)
    lines = err.value.message.splitlines()
    assert lines[0] == (
        "--config:1:10: error[L503]: `hiden_size` in --config is not a field of `Llama`, so it cannot be set"
    )
    assert lines[2:4] == [" 1 | --config hiden_size=32", "   |          ^^^^^^^^^^"]
    assert "did you mean `hidden_size`?" in err.value.message


def test_cli_reports_the_config_error_located_without_a_traceback(llama, tmp_path):
    folder, _ = llama
    ckpt, cfg, text = with_config(folder, tmp_path, hidden_act="relu")
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "run", str(LLAMA), "--weights", str(ckpt)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f'{cfg}:{line_of(text, "hidden_act")}:3: error[L401]: `hidden_act` can only be "silu"' in r.stderr


# Keys of transformers' config classes that are not fields, bookkeeping or inert in the examples, and why.
# transformers writes `is_encoder_decoder` only when true (`to_diff_dict`), and true changes the wiring (BERT reads
# it), so a checkpoint holding it is refused (L503). transformers 5's `rope_parameters` is read as the `rope_theta`
# and `rope_scaling` fields (`checkpoints.normalize_config`), so its values are checked there.
NOT_FIELDS = {
    "LlamaConfig": {"is_encoder_decoder", "rope_parameters"},
    "GPT2Config": {"is_encoder_decoder"},
    "BertConfig": {"is_encoder_decoder"},
    "MistralConfig": {"is_encoder_decoder", "rope_parameters"},
    "Phi3Config": {"is_encoder_decoder", "rope_parameters"},
    "Qwen2Config": {"is_encoder_decoder", "rope_parameters"},
    "Qwen3Config": {"is_encoder_decoder", "rope_parameters"},
    "RobertaConfig": {"is_encoder_decoder"},
    "GptOssConfig": {"is_encoder_decoder", "rope_parameters"},
}


@pytest.mark.parametrize(
    "source, config_class",
    [
        (LLAMA, "LlamaConfig"),
        (GPT2, "GPT2Config"),
        (BERT, "BertConfig"),
        (MISTRAL, "MistralConfig"),
        (EXAMPLES / "phi3.linnet", "Phi3Config"),
        (QWEN2, "Qwen2Config"),
        (QWEN3, "Qwen3Config"),
        (EXAMPLES / "roberta.linnet", "RobertaConfig"),
        (EXAMPLES / "gpt_oss.linnet", "GptOssConfig"),
    ],
    ids=str,
)
def test_every_key_of_the_transformers_config_is_classified(source, config_class):
    """Each attribute transformers' config class writes is a field of the example's config, a bookkeeping key, an
    inert key of the example, or one of NOT_FIELDS; and no inert key is one that changes the maths."""
    info = check_source(str(source), source.read_text(encoding="utf-8"))
    config = info.analysis.globals(info.config_type).ast
    fields = {f.name.id for f in config.fields if isinstance(f, A.ConfigField)}
    inert = set(inert_keys(config))
    keys = set(getattr(transformers, config_class)().to_dict())
    assert keys - fields - METADATA_KEYS - inert == NOT_FIELDS[config_class]
    assert not inert & METADATA_KEYS and not inert & fields
    # An inert key transformers' modeling code reads must be one that leaves inference outputs alone.
    module = importlib.import_module(getattr(transformers, config_class.replace("Config", "Model")).__module__)
    reads = set(re.findall(r"config\.(\w+)", Path(module.__file__).read_text(encoding="utf-8")))
    one_value_false = {
        f.name.id
        for f in config.fields
        if isinstance(f, A.ConfigField)
        and isinstance(f.type, A.LiteralType)
        and [getattr(v, "value", None) for v in f.type.values] == [False]
    }
    inert_while = {key for key, flag in INERT_WHILE_FALSE.items() if flag in one_value_false}
    assert inert & reads <= READ_BUT_INERT | inert_while, inert & reads - READ_BUT_INERT - inert_while


# Keys modeling code reads that do not change inference outputs: dropout rates (eval mode runs none), the KV cache
# switch (the same logits with or without it), the init scale, GPT2DoubleHeadsModel's sequence-summary head, and a
# mixture of experts' load-balancing loss (its weight, and whether the router logits are returned to compute it).
READ_BUT_INERT = {
    "attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "classifier_dropout", "use_cache", "initializer_range", "summary_type",
    "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "router_aux_loss_coef", "output_router_logits",
}  # fmt: skip

# Keys modeling code reads that change nothing while a flag is false, for a source that types that flag as the
# one-value `false` (so a checkpoint with it true is refused, L401): Qwen2Config and Qwen3Config set
# `sliding_window` to None unless `use_sliding_window`, and then no layer has a window whatever `layer_types`
# (derived from `max_window_layers`) says.
INERT_WHILE_FALSE = {
    "sliding_window": "use_sliding_window",
    "layer_types": "use_sliding_window",
    "max_window_layers": "use_sliding_window",
}


def test_a_field_named_rope_parameters_is_refused_where_loading_reads_other_keys(llama, tmp_path):
    """transformers 5 writes a flat `rope_parameters`; loading reads it as `rope_theta` and `rope_scaling`. A source
    that declares `rope_parameters` instead ran with its default (here linear scaling by 4 where the checkpoint
    says none) and no error: now L507 at the config.json key, labelled at the field."""
    folder, _ = llama
    ckpt, cfg, text = with_config(folder, tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    source = LLAMA.read_text(encoding="utf-8").replace(
        "    rope_scaling: RopeScaling? = none\n",
        "    rope_scaling: RopeScaling? = none\n"
        '    rope_parameters: RopeScaling? = RopeScaling { rope_type = "linear", factor = 4.0 }\n',
    )
    assert "rope_parameters: RopeScaling?" in source
    port = tmp_path / "port.linnet"
    port.write_text(source.replace("c.rope_scaling)", "c.rope_parameters)"), encoding="utf-8")
    assert "c.rope_parameters)" in port.read_text()
    with pytest.raises(LoadError) as err:
        lt.load(port, weights=ckpt, mode="interpret", max_positions=16, progress=False)
    lines = err.value.message.splitlines()
    assert lines[0] == (
        f"{cfg}:{line_of(text, 'rope_parameters')}:3: error[L507]: `rope_parameters` in {cfg} is read as "
        "`rope_theta` and `rope_scaling`, so the field `Llama.rope_parameters` would keep its default"
    )
    assert "the source declares the field here" in err.value.message
    # `linnet check --weights` (pre-commit, the editor's `@weights`) reads the headers the same way
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "check", str(port), "--weights", str(ckpt)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "error[L507]: `rope_parameters`" in r.stdout + r.stderr


def test_a_per_layer_type_rope_parameters_is_still_bound(tmp_path):
    """ModernBERT's `rope_parameters` (one entry per attention type) is not spread over other keys: its field binds."""
    from linnet.runtimes.formats.checkpoints import flattened_keys

    nested = {"full_attention": {"rope_type": "default", "rope_theta": 160000.0}}
    assert flattened_keys({"rope_parameters": nested}) == frozenset()
    assert flattened_keys({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}) == {"rope_parameters"}
