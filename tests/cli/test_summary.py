"""`linnet check --summary`: the table (a golden snapshot), JSON equal to the cost model's numbers with units in
the key names, exit codes, and that it loads neither a backend nor a framework."""

from __future__ import annotations

import json
from pathlib import Path

from linnet.cli import main
from linnet.ir import build
from linnet.ir.cost import program_cost
from tests.cli.test_check import heavy_modules_loaded
from tests.conftest import EXAMPLES, ROOT, check_golden

GOLDEN = Path(__file__).parent / "golden"


def test_table(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc = main(["check", "--summary", "--seq-len", "128", "examples/gpt2.linnet", "examples/mlp.linnet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    check_golden(GOLDEN / "summary.txt", captured.out)


def test_json_is_the_cost_model(capsys):
    rc = main(["check", "--summary", "--format", "json", "--preset", "gpt2", "--dtype", "bf16", "--max-batch", "2",
               str(EXAMPLES)])  # fmt: skip
    assert rc == 0
    [record] = json.loads(capsys.readouterr().out)  # only gpt2.linnet declares the preset
    expected = program_cost(build(EXAMPLES / "gpt2.linnet", preset="gpt2", dtype="bf16", max_batch=2)).as_json()
    assert record == {"path": str(EXAMPLES / "gpt2.linnet"), **expected}
    assert record["parameters"] == 124_439_808  # transformers' GPT2LMHeadModel, tied head once
    assert record["kv_cache_bytes_per_token"] == 2 * 12 * 768 * 2  # keys and values, 12 layers of 768, bf16
    assert record["kv_cache_bytes"] == record["kv_cache_bytes_per_token"] * 2 * 768
    assert [(e["entry"], e["batch"], e["seq_len"]) for e in record["entries"]] == [
        ("forward", 2, 768),
        ("step", 2, 768),
        ("step", 2, 1),
    ]


def test_every_preset_without_preset(capsys):
    assert main(["check", "--summary", "--format", "json", str(EXAMPLES / "bert.linnet")]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["preset"] for r in records] == ["all_minilm_l6_v2", "bert_base_uncased"]
    assert [r["parameters"] for r in records] == [22_713_216, 109_482_240]


def test_errors_and_usage(tmp_path, capsys):
    broken = tmp_path / "broken.linnet"
    broken.write_text((EXAMPLES / "mlp.linnet").read_text().replace("c.hidden_features)", "c.hidden_features + 1)"))
    assert main(["check", "--summary", str(broken)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "error[" in captured.err
    library = tmp_path / "blocks.linnet"  # no root model: nothing to cost, nothing wrong
    library.write_text("module Twice(n: int) {\n    fn forward(x: [B, n]) -> [B, n] {\n        x * 2.0\n    }\n}\n")
    assert main(["check", "--summary", str(library)]) == 0
    assert capsys.readouterr().out == ""
    assert main(["check", "--summary", "--preset", "nope", str(EXAMPLES)]) == 2
    assert main(["check", "--summary", "--seq-len", "0", str(EXAMPLES / "mlp.linnet")]) == 2
    assert main(["check", "--summary", "--max-batch", "0", str(EXAMPLES / "mlp.linnet")]) == 2
    err = capsys.readouterr().err
    assert "no model declares preset `nope`" in err and "--seq-len must be at least 1" in err


def test_summary_loads_no_backend_and_no_framework():
    """Lowering may use numpy (constant folding); never a backend, torch, jax or pygls."""
    heavy = ("torch", "jax", "jaxlib", "onnx", "onnxruntime", "pygls")
    assert heavy_modules_loaded(["check", "--summary", "examples/llama.linnet"], heavy) == (0, "[]")


def test_the_table_in_the_language_docs_is_what_the_command_prints(capsys, monkeypatch):
    """docs/language.md section 12 shows the output of one command; running it prints exactly that."""
    doc = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    block = doc[doc.index("```console\n$ linnet check --summary") + len("```console\n") :]
    command, _, rest = block.partition("\n")
    shown = rest[: rest.index("```")]
    monkeypatch.chdir(ROOT)
    assert main(command.split()[2:]) == 0
    assert capsys.readouterr().out == shown
