"""Warning L904: parameters and state no entry reads (linnet/semantics/unread.py).

The annotated cases are in cases/unread.linnet; here, the porting mistake it is for on a real source (Llama's layer
calling `input_layernorm` where `post_attention_layernorm` belongs, which runs and gives wrong logits), through
`linnet check`, `check --weights` on the embedded SmolLM2 checkpoint, and no false alarm on any correct source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from linnet.cli import main
from linnet.semantics.program import Document
from tests.conftest import EXAMPLES, ROOT

LLAMA = EXAMPLES / "llama.linnet"
CORRECT = sorted(EXAMPLES.glob("*.linnet")) + sorted((ROOT / "linnet" / "std").glob("*.linnet"))
CORRECT += sorted((ROOT / "tests" / "lsp" / "workspace" / "imports").glob("*.linnet"))


def wrong_norm(tmp_path: Path) -> Path:
    """examples/llama.linnet with the MLP's norm replaced by the attention's, in `forward` and `step`."""
    text = LLAMA.read_text(encoding="utf-8")
    assert text.count("x + mlp(post_attention_layernorm(x))") == 2
    path = tmp_path / "llama.linnet"
    path.write_text(text.replace("x + mlp(post_attention_layernorm(x))", "x + mlp(input_layernorm(x))"))
    return path


@pytest.mark.parametrize("path", CORRECT, ids=[str(p.relative_to(ROOT)) for p in CORRECT])
def test_correct_sources_read_every_parameter_under_every_preset(path: Path):
    analysis = Document(str(path), path.read_text(encoding="utf-8")).analyze()
    unread = [f"{d.location.line}: {d.message}" for d in analysis.diagnostics if d.code == "L904"]
    assert unread == []
    if path.parent == EXAMPLES:
        assert [d.code for d in analysis.diagnostics] == []  # no warning of any kind on an example


def test_a_norm_called_in_place_of_another_is_reported_on_the_unread_member(tmp_path, capsys):
    path = wrong_norm(tmp_path)
    rc = main(["check", str(path), "--format", "json"])
    found = json.loads(capsys.readouterr().out)
    assert rc == 0  # a warning: the model runs
    (d,) = found
    assert (d["code"], d["severity"]) == ("L904", "warning")
    assert d["message"] == "`post_attention_layernorm` is loaded but never read by any entry of `LlamaForCausalLM`"
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "post_attention_layernorm: RMSNorm" in t)
    assert d["location"]["start"]["line"] == line
    assert "`model.layers.*.post_attention_layernorm.weight`" in d["notes"][0]
    assert d["presets"] is None  # under every preset


def test_check_weights_reports_it_beside_the_checkpoint(tmp_path, capsys):
    path = wrong_norm(tmp_path)
    weights = ["--weights", "smollm2-135m-instruct", "--preset", "smollm2_135m"]
    rc = main(["check", str(path), *weights, "--format", "json"])
    found = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [d["code"] for d in found] == ["L904"]


def test_a_file_with_errors_gets_no_unread_warnings(tmp_path):
    text = wrong_norm(tmp_path).read_text().replace("let h = embed_tokens(input_ids)", "let h = embed_tokns(input_ids)")
    codes = sorted({d.code for d in Document("x.linnet", text).analyze().diagnostics})
    assert codes == ["L101"]
