"""`linnet verify` on the command line: exit 0 and one line a check when the source agrees with itself, 1 naming the
check, the entries, the first position and the first module whose outputs part (text and JSON), and 2 with one
clear line when it cannot run (an unknown preset, a source with errors, a model with no pair of computations to
compare). The checks themselves are tests/runtimes/test_verify.py's."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli_errors import linnet, one_line
from tests.runtimes.verify_sizes import SHRUNK, source

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

LLAMA_CONFIG = [arg for key, value in SHRUNK["llama"][0].items() for arg in ("--config", f"{key}={value}")]


def test_a_source_that_agrees_with_itself_exits_0():
    r = linnet("verify", str(source("llama")), "--preset", "smollm2_135m", *LLAMA_CONFIG)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{source('llama')}, preset smollm2_135m")
    assert [line.split(":")[0] for line in lines[1:4]] == ["ok   cache", "ok   batch", "ok   batch"]
    assert lines[-1].startswith("3 checks, all agree")


def _norm_dropped_from_forward(tmp_path):
    text = source("llama").read_text()
    old = "let x = h + self_attn(input_layernorm(h), cos, sin, mask)"
    assert text.count(old) == 1
    mutated = tmp_path / "llama.linnet"
    mutated.write_text(text.replace(old, "let x = h + self_attn(h, cos, sin, mask)"))
    return mutated


def test_a_norm_dropped_from_forward_exits_1_naming_the_member(tmp_path):
    r = linnet("verify", str(_norm_dropped_from_forward(tmp_path)), "--preset", "smollm2_135m", *LLAMA_CONFIG)
    assert r.returncode == 1, r.stderr
    assert "PART cache: `forward` on 7 tokens against step" in r.stdout
    assert "first module whose outputs part: model.layers.0 (forward vs step) at 0" in r.stdout
    assert "read only by `step`'s way: model.layers.0.input_layernorm.weight" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("3 checks, 1 of 3 part")


def test_json_names_the_entries_position_and_module(tmp_path):
    mutated = _norm_dropped_from_forward(tmp_path)
    r = linnet("verify", str(mutated), "--preset", "smollm2_135m", *LLAMA_CONFIG, "--format", "json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["agree"] is False
    cache = report["checks"][0]
    assert (cache["kind"], cache["ways"], cache["agree"]) == ("cache", ["forward", "step"], False)
    assert cache["position"] == 2  # the prefill's logits are its last token's
    assert cache["max_delta"] > cache["tolerance"] > 0
    assert (cache["module"]["path"], cache["module"]["position"]) == ("model.layers.0", 0)
    assert cache["module"]["before"] == "model.layers.0.self_attn"


def test_an_unknown_preset_exits_2():
    line = one_line(linnet("verify", str(source("gpt2")), "--preset", "gpt3"), 2)
    assert line == f"linnet verify: {source('gpt2')} has no preset `gpt3` (presets: gpt2)"


def test_a_source_with_errors_exits_2(tmp_path):
    broken = tmp_path / "broken.linnet"
    broken.write_text("model M {\n    entry fn forward(x: [B, 4]) -> [B, 4] {\n        y\n    }\n}\n")
    r = linnet("verify", str(broken))
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.startswith(f"linnet verify: {broken} has errors:")


def test_a_model_with_nothing_to_compare_exits_2(tmp_path):
    fixed = tmp_path / "fixed.linnet"
    fixed.write_text(
        "config C {\n    n: int = 4\n}\n\nmodel Fixed(c: C) {\n    w: Linear(c.n, 2)\n\n"
        "    entry fn forward(x: [4, c.n]) -> [4, 2] {\n        w(x)\n    }\n}\n"
    )
    line = one_line(linnet("verify", str(fixed)), 2)
    assert line.startswith(f"linnet verify: {fixed}: no pair of computations to compare: entries `forward`")


def test_a_backend_verify_cannot_run_on_is_a_usage_error():
    r = linnet("verify", str(source("mlp")), "--backend", "onnxruntime")
    assert r.returncode == 2 and "invalid choice: 'onnxruntime'" in r.stderr
