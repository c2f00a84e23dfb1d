"""`linnet run --compare`: one entry on several real backends with the same inputs and weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from linnet.runtimes.backends.compare import _agreement, _pairs, max_abs_diff
from tests.cli.test_backends import run_cli
from tests.conftest import EXAMPLES

TINY_LLAMA = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 128,
}


def _backends_installed():
    for module in ("torch", "jax", "onnxruntime"):
        pytest.importorskip(module)


def compare(*args) -> tuple[int, dict]:
    r = run_cli("run", *args, "--format", "json")
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def _mlp_in_numpy(x: np.ndarray, preset: str) -> np.ndarray:
    """`fc2(gelu(fc1(x)))` of examples/mlp.linnet with the seeded random weights every backend
    gets (`random_params`), in numpy: the erf form of GELU (torch.nn.functional.gelu's default)."""
    from linnet.ir import build
    from linnet.runtimes.loading import random_params

    p = random_params(build(EXAMPLES / "mlp.linnet", preset=preset), seed=0)
    h = x @ p["fc1.weight"].T.astype(np.float64) + p["fc1.bias"]
    h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    return h @ p["fc2.weight"].T.astype(np.float64) + p["fc2.bias"]


@pytest.mark.torch
@pytest.mark.jax
@pytest.mark.onnxruntime
def test_mlp_on_every_backend_agrees_with_numpy_and_the_checker():
    _backends_installed()
    from linnet.runtimes.model import random_inputs

    status, report = compare("examples/mlp.linnet", "--preset", "tiny", "--batch", "3", "--compare")
    assert status == 0, report["disagreements"]
    assert [r["backend"] for r in report["backends"]] == ["torch-interpret", "torch", "xla", "onnxruntime"]
    assert [r["label"] for r in report["backends"]] == ["PyTorch (interpreter)", "PyTorch", "XLA", "ONNX Runtime"]
    assert report["inputs"] == [{"name": "x", "shape": [3, 8], "dtype": "float32"}]
    # the values are the model's: the largest |output| is the numpy reference's, on every backend
    from linnet.ir import build

    graph = build(EXAMPLES / "mlp.linnet", preset="tiny").entries["forward"]
    (x,) = random_inputs(graph, {"B": 3}, seed=0)
    expected = np.abs(_mlp_in_numpy(x.astype(np.float64), "tiny")).max()
    for row in report["backends"]:
        assert row["status"] == "ok" and row["reason"] is None and row["disagreements"] == []
        (out,) = row["outputs"]
        assert out == {"shape": [3, 2], "dtype": "float32", "checker_shape": [3, 2], "checker_dtype": "float32"}
        assert row["max_abs"] == pytest.approx(expected, rel=1e-5)
        assert row["max_abs_diff"] < 1e-6 and row["time_ms"] > 0
    pairs = [(p["a"], p["b"]) for p in report["pairs"]]
    assert len(pairs) == 6 and ("xla", "onnxruntime") in pairs
    assert all(p["agree"] and 0 <= p["max_abs_diff"] < 1e-6 for p in report["pairs"])
    assert report["tolerance"] == 1e-4 and report["weights"] == "random weights"


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.jax
@pytest.mark.onnxruntime
def test_a_llama_decode_step_agrees_across_backends_in_text():
    """A small Llama's `step` (KV cache in and out) on every backend: the text table."""
    _backends_installed()
    config = [f"--config={k}={v}" for k, v in TINY_LLAMA.items()]
    r = run_cli("run", "examples/llama.linnet", "--entry", "step", "--seq", "4", "--max-positions", "16", *config,
                "--compare", "torch,xla,onnxruntime")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("examples/llama.linnet: entry step, preset smollm2_135m")
    assert lines[0].endswith("inputs input_ids[1, 4], positions[1], rows[1]")
    assert lines[1].startswith("  torch-interpret  [1, 128] float32  max |out| ") and "reference" in lines[1]
    for line, name in zip(lines[2:5], ("torch", "xla", "onnxruntime")):
        assert line.startswith(f"  {name} ") and "[1, 128] float32" in line and "max |Δ| " in line
    assert lines[5] == "max |Δ| between backends (tolerance 0.0001):"
    assert len(lines) == 12 and not any("disagree" in line for line in lines)


@pytest.mark.torch
def test_backends_that_cannot_run_are_rows_saying_why():
    """On a CPU machine: CUDA graphs are unavailable, XLA does not run f16, and an ONNX Runtime
    without the CUDA provider fails to load; the others still run, and the failure is exit 1."""
    pytest.importorskip("torch")
    status, report = compare(
        "examples/mlp.linnet", "--preset", "tiny", "--dtype", "f16",
        "--compare", "torch,cuda-graphs,xla,onnxruntime", "--provider", "cuda",
    )  # fmt: skip
    rows = {r["backend"]: r for r in report["backends"]}
    assert rows["torch-interpret"]["status"] == rows["torch"]["status"] == "ok"
    assert rows["torch"]["outputs"][0]["dtype"] == rows["torch"]["outputs"][0]["checker_dtype"] == "float16"
    assert rows["cuda-graphs"] == rows["cuda-graphs"] | {"status": "unavailable", "outputs": []}
    assert rows["cuda-graphs"]["reason"] == "cuda-graphs runs on cuda, not cpu"
    assert rows["xla"]["status"] == "unavailable"
    assert rows["xla"]["reason"] in ("xla runs f32, bf16, not f16", "xla needs jax, which is not installed "
                                     "(pip install 'linnet[jax]')")  # fmt: skip
    assert rows["onnxruntime"]["status"] in ("failed", "unavailable")
    assert "CUDA" in rows["onnxruntime"]["reason"] or "not installed" in rows["onnxruntime"]["reason"]
    assert [(p["a"], p["b"]) for p in report["pairs"]] == [("torch-interpret", "torch")]
    assert report["tolerance"] == 1e-2
    assert status == (1 if rows["onnxruntime"]["status"] == "failed" else 0)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--compare", "torch,tpu"), "--compare: unknown backend tpu (backends: torch-interpret, torch,"),
        (("--compare", ","), "--compare takes backend names separated by commas"),
        (("--compare", "--backend", "xla"), "--compare runs the backends it lists; drop --backend"),
        (("--compare", "--tolerance", "-1"), "--tolerance must be a number >= 0, got -1.0"),
        (("--tolerance", "1e-3"), "--tolerance is the agreement --compare asks of the backends; add --compare"),
    ],
)
def test_usage_errors(args, message):
    r = run_cli("run", "examples/mlp.linnet", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"linnet run: {message}")


def test_a_bad_entry_is_refused_before_any_backend_loads():
    r = run_cli("run", "examples/mlp.linnet", "--compare", "--entry", "nope")
    assert r.returncode == 1 and r.stderr == "linnet run: no entry `nope` (entries: forward)\n"


def test_pairs_beyond_the_tolerance_and_shape_mismatches_are_disagreements():
    a = [np.array([[0.0, 1.0]])]
    assert max_abs_diff(a, [np.array([[0.0, 1.5]])]) == 0.5
    assert max_abs_diff(a, [np.array([0.0, 1.0])]) is None
    assert math.isnan(max_abs_diff(a, [np.array([[np.nan, 1.0]])]))
    values = {"torch-interpret": a, "torch": [a[0] + 1e-6], "xla": [a[0] + 1.0], "jax": [a[0][0]]}
    report = {"tolerance": 1e-4, "disagreements": [], "pairs": _pairs(values, 1e-4)}
    report["backends"] = [{"backend": n, "disagreements": []} for n in values]
    report["backends"][3]["disagreements"] = ["output 0: the checker says shape [1, 2], jax gave [2]"]
    _agreement(report, values)
    assert [r["max_abs_diff"] for r in report["backends"]] == [0.0, pytest.approx(1e-6), 1.0, None]
    assert report["disagreements"] == [
        "output 0: the checker says shape [1, 2], jax gave [2]",
        "torch-interpret and xla differ by 1, more than 0.0001",
        "torch-interpret and jax give outputs of different shapes",
        "torch and xla differ by 1, more than 0.0001",
        "torch and jax give outputs of different shapes",
        "xla and jax give outputs of different shapes",
    ]


@pytest.mark.torch
@pytest.mark.jax
def test_rows_without_the_reference_say_so_not_that_shapes_differ(tmp_path):
    """`--dtype stored`: torch-interpret does not run it, so no row has a distance to the reference; each row
    said "max |Δ| shapes differ" of outputs of the same shape as the others'."""
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from tests.runtimes.gguf_writing import write_llama_gguf
    from tests.runtimes.test_gguf_stored import tiny_llama

    write_llama_gguf(tmp_path / "q8.gguf", tiny_llama(), quantize={"*": "q8_0"})
    r = run_cli("run", "examples/llama.linnet", "--weights", str(tmp_path / "q8.gguf"), "--dtype", "stored",
                "--compare", "torch,jax")  # fmt: skip
    lines = r.stdout.splitlines()
    assert lines[1].startswith("  torch-interpret  unavailable: "), r.stdout + r.stderr
    for line, name in zip(lines[2:4], ("torch", "jax")):
        assert line.startswith(f"  {name} ") and "[1, 8, 96] float32" in line, line
        assert "shapes differ" not in line and "max |Δ| - (no reference)" in line, line
    assert lines[4].startswith("max |Δ| between backends") and lines[5].startswith("  torch vs jax: ")


@pytest.mark.torch
@pytest.mark.jax
@pytest.mark.onnxruntime
@pytest.mark.parametrize("seq", [2, 8])
def test_clamped_slice_starts_agree_with_the_checker_and_numpy(seq, tmp_path):
    """Slices whose start a sequence of `seq` tokens may not reach (`x[:, 4:]`, `x[:, :-4]`, `x[:, :S - 4]`, ...)
    on every backend, at a length below the bounds and one above: the checker's clamped dims are what each backend
    computes (the reshapes to them ran; `x[:, 4:]` was [B, S - 4], -2 columns at 2 tokens), and the values are
    numpy's."""
    _backends_installed()
    from tests.compiler.test_generated_dims import STARTS, _starts_in_numpy

    path = tmp_path / "starts.linnet"
    path.write_text(STARTS)
    status, report = compare(str(path), "--seq", str(seq), "--compare")
    assert status == 0, report
    from linnet.ir import build
    from linnet.runtimes.model import random_inputs

    (x,) = random_inputs(build(path).entries["forward"], {"B": 1, "S": seq}, seed=0)
    expected = np.abs(_starts_in_numpy(x.astype(np.float64))).max()
    for row in report["backends"]:
        assert row["status"] == "ok" and row["disagreements"] == [], row
        assert row["max_abs"] == pytest.approx(expected, rel=1e-5)
