"""`linnet train` (linnet/cli/train.py) on the shrunk Llama of this folder's conftest (2 layers, hidden 32): a
LoRA SFT run writes the adapters, the metrics and the run's settings; bad input exits 2 with one clear message
and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.runtimes.train.conftest import LLAMA, id_rows, write_jsonl

pytest.importorskip("torch")
pytest.importorskip("transformers")

from linnet.cli import main  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "linnet", *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def test_lora_sft_writes_the_adapter_and_the_metrics(tiny_llama, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(6))
    out = tmp_path / "out"
    r = run("train", str(LLAMA), "--weights", str(tiny_llama), "--data", str(data), "--max-steps", "3",
            "--batch-size", "2", "--lr", "1e-3", "--lora-r", "4", "--save-merged", "-o", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "training" in r.stderr  # the progress bar
    assert "trained 3 steps: loss" in r.stderr.splitlines()[-1]
    assert sorted(f.name for f in out.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "merged", "metrics.jsonl", "train_config.json",
    ]  # fmt: skip
    assert (out / "merged" / "config.json").is_file() and (out / "merged" / "model.safetensors").is_file()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["loss"] > 0 and m["tokens_per_s"] > 0 and m["grad_norm"] > 0 for m in metrics)
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["target_modules"]) == (
        "LORA", 4, 8.0, ["q_proj", "v_proj"],
    )  # fmt: skip
    assert json.loads((out / "train_config.json").read_text())["max_steps"] == 3


def bad(capsys, *args: str) -> str:
    """Run `linnet train ARGS` in-process; assert exit 2 and one message without a traceback; return it."""
    capsys.readouterr()  # what the fixtures printed
    status = main(["train", *args, "--quiet"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err and err.startswith("linnet train: ")
    return err


def test_bad_input_exits_2_and_writes_nothing(tiny_llama, tmp_path, capsys):
    weights = ["--weights", str(tiny_llama)]
    rows = id_rows(3)
    del rows[1]["completion_ids"]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "out"
    err = bad(capsys, str(LLAMA), *weights, "--data", str(data), "-o", str(out))
    assert f'{data}:2: field "completion_ids" is missing' in err
    assert not out.exists()

    good = write_jsonl(tmp_path / "good.jsonl", id_rows(3))
    err = bad(capsys, str(LLAMA), *weights, "--data", str(good), "--lora-targets", "qkv_proj", "-o", str(out))
    assert "matches no Linear member of LlamaForCausalLM (Linear members: q_proj (model.layers.0.self_att" in err
    assert "down_proj (model.layers.0.mlp.down_proj), lm_head (lm_head)" in err
    assert not out.exists()

    err = bad(capsys, str(LLAMA), *weights, "--data", str(good), "--backend", "onnxruntime", "-o", str(out))
    assert "backend onnxruntime does not train (ONNX Runtime runs inference only); backends that train: " in err
    assert not out.exists()

    row = {"prompt_ids": [3, 4], "completion_ids": [5, 500]}
    err = bad(capsys, str(LLAMA), *weights, "--data", str(write_jsonl(tmp_path / "v.jsonl", [row])), "-o", str(out))
    assert 'v.jsonl:1: field "completion_ids" holds token id 500, outside the vocabulary [0, 128)' in err

    out.mkdir()
    (out / "x").write_text("keep me")
    err = bad(capsys, str(LLAMA), *weights, "--data", str(good), "-o", str(out))
    assert "already exists and is not an empty folder" in err
    assert [f.name for f in out.iterdir()] == ["x"]


def test_a_device_the_backend_does_not_run_on_is_refused_before_anything_is_written(tiny_llama, tmp_path, capsys):
    """`--device tpu` on torch (LoRA loads go around `Backend.load`, which checks the device): the record's
    message and exit 1, as `linnet generate` gives, not torch's own RuntimeError."""
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(2))
    out = tmp_path / "out"
    capsys.readouterr()
    args = [str(LLAMA), "--weights", str(tiny_llama), "--data", str(data), "-o", str(out), "--device", "tpu"]
    status = main(["train", *args, "--quiet"])
    err = capsys.readouterr().err
    assert status == 1 and err == "linnet train: torch runs on cpu or cuda, got device 'tpu'\n", err
    assert not out.exists()


def test_a_checkpoint_of_another_model_exits_2(tmp_path, capsys):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(2))
    out = tmp_path / "out"
    err = bad(capsys, str(LLAMA), "--weights", str(tmp_path / "gpt2"), "--data", str(data), "-o", str(out))
    assert "gpt2 holds a gpt2 model (its config.json's model_type), and " in err
    assert "llama.linnet is LlamaForCausalLM (llama)" in err and "is not a field of `Llama`" in err
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


@pytest.mark.parametrize("backend", ["torch", pytest.param("jax", marks=pytest.mark.jax)])
def test_a_step_whose_loss_is_nan_stops_the_run_and_writes_no_adapter(tiny_llama, tmp_path, capsys, backend):
    """Weights whose activations overflow f32 (finite, so loading takes them) give a NaN loss and gradients: the
    run went on, wrote adapters of NaN and exited 0 (adapters that this project's own `--resume` refuses: "holds
    NaN or inf"). Now the first such step stops it, before anything of it is written."""
    if backend == "jax":
        pytest.importorskip("jax")
    import shutil

    from safetensors.numpy import load_file, save_file

    weights = shutil.copytree(tiny_llama, tmp_path / "overflowing")
    tensors = load_file(weights / "model.safetensors")
    tensors["model.layers.0.input_layernorm.weight"][:] = 3e38  # q . k overflows to inf, softmax gives NaN
    save_file(tensors, weights / "model.safetensors", metadata={"format": "pt"})
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(4))
    out = tmp_path / "out"
    capsys.readouterr()
    args = [str(LLAMA), "--weights", str(weights), "--data", str(data), "-o", str(out), "--max-steps", "2"]
    status = main(["train", *args, "--backend", backend, "--quiet"])
    err = capsys.readouterr().err
    assert status == 1, err
    assert "Traceback" not in err and err.startswith("linnet train: step 1: the loss is nan"), err
    assert not out.exists() or not any(out.glob("adapter_model.safetensors")), sorted(out.iterdir())


@pytest.mark.parametrize("backend", ["torch", pytest.param("jax", marks=pytest.mark.jax)])
def test_fsdp_outside_torchrun_is_refused_not_ignored(tiny_llama, tmp_path, capsys, monkeypatch, backend):
    """`--fsdp` shards across the processes torchrun starts (its help says so); in one process it was accepted and
    ignored, the run training unsharded and exiting 0, on JAX too."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(2))
    out = tmp_path / "out"
    err = bad(capsys, str(LLAMA), "--weights", str(tiny_llama), "--data", str(data), "-o", str(out), "--fsdp",
              "--backend", backend)  # fmt: skip
    assert "--fsdp shards across the processes torchrun starts" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--max-grad-norm", "-1", "max_grad_norm must be a number >= 0 (0 turns clipping off), got -1.0"),
        ("--max-grad-norm", "nan", "max_grad_norm must be a number >= 0 (0 turns clipping off), got nan"),
        ("--weight-decay", "nan", "weight_decay must be a finite number, got nan"),
        ("--lora-alpha", "nan", "--lora-alpha must be a finite number, got nan"),
        ("--lora-alpha", "inf", "--lora-alpha must be a finite number, got inf"),
    ],
)
def test_values_that_train_wrong_are_refused_before_anything_runs(tiny_llama, tmp_path, capsys, option, value, message):
    """`--max-grad-norm -1` trained uphill (the loss of the shrunk Llama rose step after step: `clip_grad_norm_`'s
    coefficient max_norm / norm is then negative and flips every gradient, below), NaN there or in
    `--weight-decay` made the parameters NaN, and a NaN `--lora-alpha` reached the LoRA source transform
    (`scaling=nan`: "unknown name `nan`" on a line of code the user never wrote)."""
    import torch

    w = torch.nn.Parameter(torch.ones(2))
    w.grad = torch.full((2,), 3.0)
    torch.nn.utils.clip_grad_norm_([w], -1.0)
    assert (w.grad < 0).all()  # the reference: a negative max_norm turns the gradient around
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(2))
    out = tmp_path / "out"
    err = bad(capsys, str(LLAMA), "--weights", str(tiny_llama), "--data", str(data), "-o", str(out), option, value)
    assert err == f"linnet train: {message}\n"
    assert not out.exists()
