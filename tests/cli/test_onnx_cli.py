"""`linnet onnx`, and `linnet run` / `linnet generate` with `--backend onnxruntime`, as a user runs them."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_backends import run_cli

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnx_ir")


def test_onnx_writes_a_checked_model(tmp_path):
    out = tmp_path / "step.onnx"
    r = run_cli(
        "onnx", "examples/gpt2.linnet", "--config", "n_layer=2", "--entry", "step", "--max-positions", "16",
        "-o", str(out), "--no-weights",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stderr and "graph inputs" in r.stderr
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    names = [i.name for i in model.graph.input]
    assert names[:3] == ["input_ids", "positions", "rows"]
    assert "transformer.wte.weight" in names and "past_key_values.1.value" in names
    assert [o.name for o in model.graph.output] == [
        "logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value",
    ]  # fmt: skip


def test_onnx_writes_a_checked_fast_model_that_onnxruntime_runs(tmp_path):
    """Under `fast` the file holds the fused nodes (RMSNormalization, com.microsoft RotaryEmbedding), passes
    `onnx.checker` (it refused ORT's SimplifiedLayerNormalization, a default-domain op without an ONNX schema) and
    computes what the `equivalent` file computes, to rounding."""
    ort = pytest.importorskip("onnxruntime")
    np = pytest.importorskip("numpy")
    config = ("num_hidden_layers=2", "hidden_size=64", "intermediate_size=128", "num_attention_heads=4",
              "num_key_value_heads=2", "vocab_size=128")  # fmt: skip
    small = [arg for pair in config for arg in ("--config", pair)]
    logits = {}
    for numerics in ("fast", "equivalent"):
        out = tmp_path / f"{numerics}.onnx"
        r = run_cli("onnx", "examples/llama.linnet", *small, "--entry", "forward", "--numerics", numerics,
                    "-o", str(out), "--no-weights")  # fmt: skip
        assert r.returncode == 0, r.stderr
        model = onnx.load(str(out))
        onnx.checker.check_model(model, full_check=True)
        ops = {n.op_type for n in model.graph.node}
        assert ("RMSNormalization" in ops and "RotaryEmbedding" in ops) == (numerics == "fast"), ops
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {}
        for i in session.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = rng.integers(0, 128, (2, 5))
            else:
                shape = [d if isinstance(d, int) else 2 for d in i.shape]
                feeds[i.name] = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        logits[numerics] = session.run(None, feeds)[0]
    np.testing.assert_allclose(logits["fast"], logits["equivalent"], rtol=1e-4, atol=1e-4)


def test_onnx_reports_a_missing_entry(tmp_path):
    r = run_cli("onnx", "examples/mlp.linnet", "--preset", "tiny", "--entry", "nope", "-o", str(tmp_path / "x.onnx"))
    assert r.returncode == 1 and "no entry `nope`" in r.stderr


@pytest.mark.onnxruntime
def test_run_on_onnxruntime_prints_shapes_that_agree_with_the_checker():
    pytest.importorskip("onnxruntime")
    r = run_cli("run", "examples/mlp.linnet", "--preset", "tiny", "--backend", "onnxruntime", "--batch", "3")
    assert r.returncode == 0, r.stderr
    assert "entry forward (onnxruntime, random weights)" in r.stdout
    assert "output [3, 2] float32" in r.stdout and "disagreement" not in r.stdout


@pytest.mark.onnxruntime
@pytest.mark.slow
def test_main_job_answers_on_onnxruntime():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    r = run_cli(
        "generate", "examples/llama.linnet", "--backend", "onnxruntime", "--chat", "--max-new-tokens", "12",
        "--max-positions", "128", "--prompt", "What is the capital of France?",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_onnx_writes_bf16_as_lowered(tmp_path):
    """`--dtype bf16` writes a bf16 model for any runtime: weights, cache and logits in bf16, and its
    MatMuls multiply bf16 (no upcast: that is `--backend onnxruntime --numerics fast`'s business)."""
    out = tmp_path / "step.onnx"
    r = run_cli(
        "onnx", "examples/gpt2.linnet", "--config", "n_layer=2", "--entry", "step", "--max-positions", "16",
        "--dtype", "bf16", "-o", str(out), "--no-weights",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    model = onnx.shape_inference.infer_shapes(onnx.load(str(out)), strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    bf16 = onnx.TensorProto.BFLOAT16
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    assert types["transformer.wte.weight"] == bf16 and types["past_key_values.0.key"] == bf16
    assert {o.type.tensor_type.elem_type for o in model.graph.output} == {bf16}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert matmuls and {types[i] for n in matmuls for i in n.input} == {bf16}
    assert "upcast" not in r.stderr
    r = run_cli(
        "onnx", "examples/gpt2.linnet", "--config", "n_layer=2", "--entry", "step", "--max-positions", "16",
        "--dtype", "bf16", "--numerics", "fast", "-o", str(out), "--no-weights",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "bf16 is written as lowered, for any runtime" in r.stderr  # fast does not upcast the file, and says so


@pytest.mark.onnxruntime
def test_run_bf16_on_onnxruntime_needs_numerics_fast():
    pytest.importorskip("onnxruntime")
    args = ("run", "examples/mlp.linnet", "--preset", "tiny", "--backend", "onnxruntime", "--dtype", "bf16")
    r = run_cli(*args)
    assert r.returncode == 1 and "no bf16 kernel" in r.stderr and "MatMul (e.g." in r.stderr
    assert "--numerics fast" in r.stderr
    r = run_cli(*args, "--numerics", "fast")
    assert r.returncode == 0, r.stderr
    assert "output [1, 2] bfloat16" in r.stdout
    assert "note: numerics fast:" in r.stderr and "run in f32 (upcast)" in r.stderr  # what ran upcast is said
    r = run_cli(*args, "--numerics", "fast", "--format", "json")
    assert any("run in f32 (upcast)" in n for n in json.loads(r.stdout)["notes"])
