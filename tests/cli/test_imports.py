"""A model whose modules come from another file, through the command line and the torch backend:
`tests/fixtures/imports/causal_lm.linnet` builds its decoder from examples/llama.linnet's
`LlamaModel`, so with one config it is examples/llama.linnet's `LlamaForCausalLM`."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.test_backends import run_cli
from tests.conftest import ROOT
from tests.ir.test_ir import SMALL_LLAMA

SPLIT = "tests/fixtures/imports/causal_lm.linnet"
SMALL = {**SMALL_LLAMA, "max_position_embeddings": 64}  # the fixture's preset `tiny`


def test_check_checks_the_imported_files_too():
    r = run_cli("check", SPLIT)
    assert r.returncode == 0, r.stdout
    assert "checked 2 files: 0 errors, 0 warnings" in r.stderr


def test_an_error_in_an_imported_module_is_located_in_both_files(tmp_path):
    """The importer's preset breaks the imported attention: the error is on the importer's use,
    labelled where the imported module requires it, with its own file's path."""
    bad = tmp_path / "bad.linnet"
    bad.write_text(
        f'from "{ROOT / "examples" / "llama.linnet"}" import Llama, LlamaModel\n\n'
        "preset odd = Llama { hidden_size = 64, num_attention_heads = 5 }\n\n"
        "module Wrapper(c: Llama) {\n    decoder: LlamaModel(c)\n}\n"
    )
    r = run_cli("check", str(bad), "--format", "json")
    assert r.returncode == 1
    found = json.loads(r.stdout)
    errors = [d for d in found if d["location"]["path"] == str(bad)]
    assert [(d["code"], d["location"]["start"]["line"]) for d in errors] == [("L404", 3)]
    assert "`hidden_size` (64) is not divisible by `num_attention_heads` (5)" in errors[0]["message"]
    assert any(lab["location"]["path"].endswith("examples/llama.linnet") for lab in errors[0]["labels"])


def test_ir_origins_name_each_line_in_its_own_file():
    r = run_cli("ir", SPLIT, "--preset", "tiny", "--entry", "step")
    assert r.returncode == 0, r.stderr
    origins = set(re.findall(r"# ([a-z_]+\.linnet):\d+", r.stdout))
    assert {"causal_lm.linnet", "llama.linnet", "rope.linnet"} <= origins
    # the imported modules are functions of the program, reading their own members
    assert "fn LlamaAttention.project(self: LlamaAttention" in r.stdout
    assert 'param "q_proj.weight"' in r.stdout


@pytest.mark.parametrize("emitter", ["torch", "jax"])
def test_code_emitters_write_the_imported_modules(emitter, tmp_path):
    out = tmp_path / "model.py"
    r = run_cli(emitter, SPLIT, "--preset", "tiny", "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    compile(text, str(out), "exec")
    assert "class LlamaMLP(Module):" in text and "'down_proj.weight'" in text
    # the loop over the layers: a plain loop (torch), `scan_layers` over the list (jax: one `lax.scan` when stacked)
    loop = "for layer in self.layers:" if emitter == "torch" else "= scan_layers(self.layers, "
    assert "class CausalLM(Module):" in text and loop in text


@pytest.mark.torch
def test_run_runs_the_split_model():
    r = run_cli("run", SPLIT, "--preset", "tiny", "--entry", "step", "--seq", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["outputs"][0]["shape"] == [1, 96] and report["disagreements"] == []


@pytest.mark.torch
def test_the_split_model_runs_as_the_one_file_model_on_torch():
    import torch

    import linnet.torch as lt

    split = lt.load(ROOT / SPLIT, preset="tiny", random_weights=True, max_positions=16, progress=False, seed=1)
    whole = lt.load(
        ROOT / "examples/llama.linnet", config=SMALL, random_weights=True, max_positions=16, progress=False, seed=2
    )
    weights = whole.module.state_dict()
    assert sorted(split.module.state_dict()) == sorted(weights)
    split.module.load_state_dict(weights)
    ids = torch.tensor([[5, 17, 3, 88, 41, 9]])
    assert torch.equal(split.native.forward(ids), whole.native.forward(ids))
    for model in (split, whole):
        model.native.step(ids, torch.tensor([0]), torch.tensor([0]))  # prefill
    token, at, row = torch.tensor([[7]]), torch.tensor([6]), torch.tensor([0])
    assert torch.equal(split.native.step(token, at, row), whole.native.step(token, at, row))
