"""`linnet ir`, `linnet torch`, `linnet run` and `linnet generate` as a user runs them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, ROOT


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "linnet", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "HOME": str(ROOT / ".venv")},
    )


def test_ir_prints_the_entry():
    r = run_cli("ir", "examples/mlp.linnet", "--preset", "tiny", "--entry", "forward")
    assert r.returncode == 0, r.stderr
    assert "entry forward(%x: f32[B, 8]) -> (f32[B, 2])" in r.stdout
    assert 'param "fc1.weight"' in r.stdout


def test_ir_reports_a_bad_config_field():
    r = run_cli("ir", "examples/llama.linnet", "--config", "num_attention_heads=7", "--preset", "smollm2_135m")
    assert r.returncode == 1
    assert "error[" in r.stderr and r.stdout == ""


def test_torch_writes_a_module(tmp_path):
    out = tmp_path / "model.py"
    r = run_cli("torch", "examples/gpt2.linnet", "--config", "n_layer=1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    compile(text, str(out), "exec")
    imports = [line for line in text.splitlines() if re.match(r"(import \S+|from \S+ import )", line)]
    assert imports == ["import torch", "import torch.nn.functional as F", "from torch import nn"]
    assert "class GPT2LMHeadModel(Module):" in text and "for block in self.h:" in text
    assert "    def forward(self, input_ids):" in text and "    def step(self, input_ids, positions, rows):" in text


@pytest.mark.parametrize("cmd", ["torch", "jax"])
def test_torch_and_jax_build_the_preset_run_picks(cmd):
    """Without --preset, the first preset with default weights, as `linnet run` (SmolLM2's config, not Llama's 7B
    defaults); the written file carries the prelude's helpers and imports no linnet."""
    r = run_cli(cmd, "examples/llama.linnet", "--max-positions", "16")
    assert r.returncode == 0, r.stderr
    assert "Preset smollm2_135m, working dtype f32" in r.stdout
    assert "from linnet" not in r.stdout and "import linnet" not in r.stdout and "\nclass Module" in r.stdout


@pytest.mark.torch
def test_the_written_module_runs_on_its_own(tmp_path):
    """What `linnet torch -o` writes is a model file: build the root class, load a checkpoint's
    tensors into it as its docstring says, and it computes what the backend computes."""
    torch = pytest.importorskip("torch")
    import importlib.util

    import linnet.torch as lt

    config = {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 64}
    out = tmp_path / "gpt2_model.py"
    args = [f"--config={k}={v}" for k, v in config.items()]
    r = run_cli("torch", "examples/gpt2.linnet", *args, "--max-positions", "16", "-o", str(out))
    assert r.returncode == 0, r.stderr
    spec = importlib.util.spec_from_file_location("gpt2_model", out)
    generated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generated)
    loaded = lt.load(EXAMPLES / "gpt2.linnet", config=config, random_weights=True, max_positions=16, progress=False)
    model = generated.GPT2LMHeadModel("cpu")
    missing, unexpected = model.load_state_dict(loaded.module.state_dict(), strict=False, assign=True)
    assert not unexpected and not [m for m in missing if not m.endswith("_cache")]
    ids = torch.randint(0, 64, (2, 7))
    with torch.inference_mode():
        torch.testing.assert_close(model.forward(ids), loaded.module.forward(ids), rtol=0, atol=0)
        logits = model.step(ids[:1], torch.tensor([0]), torch.tensor([0]))
        torch.testing.assert_close(logits, model.forward(ids[:1])[:, -1], rtol=1e-5, atol=1e-6)
    # what `.to(...)` does: new tensor objects; the methods then read the new ones
    model._apply(lambda t: t.clone())
    attn = model.transformer.h[0].attn
    assert attn.k_cache is attn._buffers["k_cache"] and attn.c_attn.weight is attn.c_attn._parameters["weight"]
    with torch.inference_mode():
        torch.testing.assert_close(model.forward(ids), loaded.module.forward(ids), rtol=0, atol=0)


@pytest.mark.torch
def test_run_prints_shapes_that_agree_with_the_checker():
    pytest.importorskip("torch")
    r = run_cli("run", "examples/bert.linnet", "--preset", "all_minilm_l6_v2", "--batch", "2", "--seq", "5")
    assert r.returncode == 0, r.stderr
    assert "output [2, 5, 384] float32" in r.stdout
    assert "disagreement" not in r.stdout


@pytest.mark.torch
def test_run_defaults_to_a_real_checkpoints_config_and_reports_json():
    """Without --preset, random weights under the first preset with default weights (SmolLM2's
    config), not Llama's 7B defaults."""
    pytest.importorskip("torch")
    r = run_cli("run", "examples/llama.linnet", "--entry", "forward", "--seq", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["preset"] == "smollm2_135m" and report["weights"] == "random weights"
    (out,) = report["outputs"]
    assert out["shape"] == out["checker_shape"] == [1, 3, 49152] and report["disagreements"] == []


@pytest.mark.torch
@pytest.mark.parametrize(
    "sizes, message, status",
    [
        (("--batch", "2"), "--batch 2 is more than the cache's 1 rows; raise --max-batch", 1),
        (("--seq", "40"), "--seq 40 is more than the cache's 32 positions; raise --max-positions", 1),
        (("--seq", "0"), "--batch and --seq must be at least 1, got 1 and 0", 2),
    ],
)
def test_run_refuses_sizes_the_cache_cannot_hold(sizes, message, status):
    """A step that would write outside the KV cache is refused by the CLI in one line, not by the runtime's
    index error; a size below 1 is a usage error."""
    pytest.importorskip("torch")
    r = run_cli("run", "examples/llama.linnet", "--entry", "step", "--max-positions", "32", *sizes)
    assert r.returncode == status
    assert r.stderr.strip().splitlines()[-1] == f"linnet run: {message}" and "Traceback" not in r.stderr


@pytest.mark.torch
def test_generate_with_a_one_position_cache_is_a_clear_error():
    pytest.importorskip("torch")
    r = run_cli("generate", "examples/llama.linnet", "--max-positions", "1", "--prompt", "hi")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "linnet generate: model.max_positions must be an integer >= 2, got 1" in r.stderr


@pytest.mark.torch
def test_generate_reports_a_prompt_that_fills_the_cache_and_a_single_token():
    """A prompt that leaves no position to generate into says so; one generated token has no decode rate."""
    pytest.importorskip("torch")
    r = run_cli("generate", "examples/llama.linnet", "--max-positions", "2", "--prompt", "one two three")
    assert r.returncode == 1 and "one position more than the prompt for a generated token" in r.stderr
    r = run_cli("generate", "examples/llama.linnet", "--max-new-tokens", "1", "--prompt", "The capital of France is")
    assert r.returncode == 0, r.stderr
    assert "1 generated (length)" in r.stderr and "no decode step" in r.stderr and "0.0 tokens/s" not in r.stderr


def test_random_weights_that_do_not_fit_are_refused(monkeypatch):
    from linnet.ir.build import build
    from linnet.runtimes import loading

    program = build(ROOT / "examples/mlp.linnet")
    loading._check_fits_in_memory(program, random_weights=True)  # a few kB fit
    monkeypatch.setattr(loading, "RANDOM_WEIGHTS_SHARE", 1e-9)
    with pytest.raises(loading.LoadError, match=r"random weights for Mlp under the config defaults need 0\.0 GiB"):
        loading._check_fits_in_memory(program, random_weights=True)


@pytest.mark.torch
@pytest.mark.slow
def test_main_job_answers_from_the_embedded_checkpoint():
    pytest.importorskip("torch")
    r = run_cli("generate", "examples/llama.linnet", "--chat", "--prompt", "What is the capital of France?")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "The capital of France is Paris.\n"  # only the text on stdout
    assert "time to first token" in r.stderr


def test_generate_without_default_weights_is_a_clear_error():
    r = run_cli("generate", "examples/gpt2.linnet", "--prompt", "hi")
    assert r.returncode == 1
    assert "names no default weights" in r.stderr and "--weights" in r.stderr


def test_unwritable_output_and_missing_sources_are_usage_errors(tmp_path):
    r = run_cli("torch", "examples/mlp.linnet", "-o", str(tmp_path / "no" / "such" / "model.py"))
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("ir", "examples/mlp.linet")  # misspelt: a path, not source text
    assert r.returncode == 2 and "No such file" in r.stderr
    (tmp_path / "mlp.txt").write_text((ROOT / "examples" / "mlp.linnet").read_text())
    r = run_cli("ir", str(tmp_path / "mlp.txt"), "--preset", "tiny")  # another suffix is still a file
    assert r.returncode == 0 and "model Mlp" in r.stdout


@pytest.mark.torch
def test_a_device_this_machine_lacks_is_refused_before_loading():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = run_cli("run", "examples/mlp.linnet", "--device", "cuda")
    assert r.returncode == 1 and "needs CUDA" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.torch
@pytest.mark.parametrize("device", ["CPU", "cpu:x"])
@pytest.mark.parametrize("command", ["run", "train"])
def test_a_device_string_torch_cannot_read_is_one_line_not_a_traceback(device, command, tmp_path):
    """The kind check reads "CPU" as cpu and "cpu:x" as cpu, but `torch.device` refuses both (RuntimeError): a
    traceback from `linnet run` and `linnet train`."""
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError):
        torch.device(device)  # the reference: what torch reads
    args = ("examples/mlp.linnet", "--preset", "tiny")
    if command == "train":
        data = tmp_path / "d.jsonl"
        data.write_text('{"prompt_ids": [1, 2], "completion_ids": [3]}\n')
        args = ("examples/llama.linnet", "--preset", "smollm2_135m", "--data", str(data), "-o", str(tmp_path / "o"))
    r = run_cli(command, *args, "--device", device)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"linnet {command}: backend torch: device {device!r} is not a device torch reads (cpu, cuda or cuda:N)"
    )


@pytest.mark.torch
def test_train_on_cuda_without_cuda_is_refused_as_run_refuses_it(tmp_path):
    """LoRA training loads around `Backend.load` and skipped its device probe: torch's AssertionError ("Torch not
    compiled with CUDA enabled") came out as a traceback."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt_ids": [1, 2], "completion_ids": [3]}\n')
    r = run_cli("train", "examples/llama.linnet", "--preset", "smollm2_135m", "--data", str(data),
                "-o", str(tmp_path / "o"), "--device", "cuda")  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("linnet train: backend torch: device 'cuda' needs CUDA")
    assert not (tmp_path / "o").exists()


def test_dtype_stored_is_refused_where_it_is_not_built():
    r = run_cli(
        "run", "examples/llama.linnet", "--preset", "smollm2_135m", "--backend", "torch-interpret", "--dtype", "stored"
    )
    assert r.returncode == 1, r.stderr
    assert "--dtype stored (GGUF weights kept quantized) is not built for torch-interpret: it runs on " in r.stderr
    assert "onnxruntime" in r.stderr.split("it runs on ")[1] and "xla" in r.stderr.split("it runs on ")[1]
    assert "Traceback" not in r.stderr
