"""NaN and Inf in weights are refused at load, naming the file and the tensor (they used to give NaN logits,
exit 0 and empty text); +-inf in a mask buffer is what additive masks hold, and loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from linnet.runtimes.formats.checkpoints import CheckpointError, check_finite, open_checkpoint
from tests.conftest import ROOT, installed, write_mlp_checkpoint


def _mlp_folder(folder: Path, poison: dict | None = None, dtype=np.float32) -> Path:
    return write_mlp_checkpoint(folder, poison, dtype).parent


@pytest.mark.parametrize("value, kind", [(np.nan, "NaN"), (np.inf, "Inf"), (-np.inf, "Inf")])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=["f32", "f16", "bf16"])
def test_safetensors_nonfinite_weight_is_refused(tmp_path, value, kind, dtype):
    folder = _mlp_folder(tmp_path / "mlp", {"fc1.weight": ((3, 5), value)}, dtype)
    with open_checkpoint(folder) as ckpt:
        ckpt.load("fc1.bias")  # the others load
        with pytest.raises(CheckpointError) as e:
            ckpt.load("fc1.weight", "f32")
    message = str(e.value)
    assert str(folder / "model.safetensors") in message and "'fc1.weight'" in message
    assert f"holds {kind} (1 of 256 values" in message and "index [3, 5]" in message


def test_cli_refuses_nan_weights_on_every_backend(tmp_path):
    """Through the real CLI: one located line, exit 1, on each installed backend (was exit 0 and NaN outputs)."""
    folder = _mlp_folder(tmp_path / "mlp", {"fc2.bias": ((1,), np.nan)})
    backends = [b for b in ("torch", "jax", "onnxruntime") if installed(b)]
    assert backends
    for backend in backends:
        r = subprocess.run(
            [sys.executable, "-m", "linnet", "run", "examples/mlp.linnet", "--weights", str(folder)]
            + ["--backend", backend],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 1, (backend, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == ""
        assert r.stderr.strip().splitlines()[-1] == (
            f"linnet run: {folder / 'model.safetensors'}: tensor 'fc2.bias' holds NaN (1 of 2 values, the first nan "
            "at index [1]); the checkpoint is corrupt or was saved after training diverged"
        ), backend


def test_overflow_when_cast_to_f16_is_named(tmp_path):
    folder = _mlp_folder(tmp_path / "mlp", {"fc1.weight": ((0, 0), 1e5)})
    with open_checkpoint(folder) as ckpt:
        assert ckpt.load("fc1.weight", "f32")[0, 0] == 1e5
        assert np.isfinite(ckpt.load("fc1.weight", "bf16").astype(np.float32)).all()
        with pytest.raises(CheckpointError, match=r"'fc1.weight' overflows float16 when cast \(1 of 256 values"):
            ckpt.load("fc1.weight", "f16")


def test_mask_buffers_may_hold_infinity_but_not_nan():
    mask = np.triu(np.full((4, 4), -np.inf, dtype=np.float32), 1)
    assert check_finite(mask, "h.0.attn.bias", "gpt2", buffer=True) is mask
    assert check_finite(mask, "encoder.attention_mask", "x", buffer=True) is mask
    assert check_finite(np.arange(4), "position_ids", "x") is not None  # integers pass
    with pytest.raises(CheckpointError, match="'embeddings.mask_token' holds Inf"):  # a parameter (ViT's)
        check_finite(mask, "embeddings.mask_token", "vit")
    mask[0, 0] = np.nan
    with pytest.raises(CheckpointError, match="'h.0.attn.bias' holds NaN and Inf"):
        check_finite(mask, "h.0.attn.bias", "gpt2", buffer=True)
    with pytest.raises(CheckpointError, match="'h.0.attn.c_attn.weight' holds Inf"):
        check_finite(np.array([1.0, -np.inf], np.float32), "h.0.attn.c_attn.weight", "gpt2")


@pytest.mark.parametrize("quantized", [False, True], ids=["f32", "q8_0"])
def test_gguf_nonfinite_weight_is_refused(tmp_path, quantized):
    """A NaN in an F32 tensor, and in a Q8_0 block (its f16 scale), as llama.cpp would write them."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "nan.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"embedding_length": 32, "block_count": 1, "attention.head_count": 4}.items():
        w.add_uint32(f"llama.{key}", value)
    rng = np.random.default_rng(1)
    norm = np.ones(32, np.float32)
    embed = rng.standard_normal((16, 32)).astype(np.float32)
    if quantized:
        q = gguf.quants.quantize(embed, gguf.GGMLQuantizationType.Q8_0)
        q[2, 0:2] = np.array([np.nan], np.float16).view(np.uint8)  # row 2's first block scale
        w.add_tensor("token_embd.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        norm[7] = np.nan
        w.add_tensor("token_embd.weight", embed)
    w.add_tensor("output_norm.weight", norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    bad, good = ("model.embed_tokens.weight", "model.norm.weight")[:: 1 if quantized else -1]
    gguf_name = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[bad]
    with open_checkpoint(path) as ckpt:
        ckpt.load(good)
        with pytest.raises(CheckpointError) as e:
            ckpt.load(bad)
    assert str(path) in str(e.value) and f"tensor {gguf_name!r} holds NaN" in str(e.value)


def test_overflow_when_cast_on_the_device_is_refused_on_every_backend(tmp_path):
    """PyTorch reads weights as stored and casts on the device, after the load check: an f32 weight of 1e5 run
    with `--dtype f16` became Inf there (NaN logits, empty text, exit 0, from safetensors and GGUF alike).
    Every backend now refuses it, naming the tensor."""
    folder = _mlp_folder(tmp_path / "mlp", {"fc1.weight": ((0, 0), 1e5)})
    backends = [b for b in ("torch", "onnxruntime") if installed(b)]  # JAX refuses f16 before loading
    assert "torch" in backends
    for backend in backends:
        r = subprocess.run(
            [sys.executable, "-m", "linnet", "run", "examples/mlp.linnet", "--weights", str(folder)]
            + ["--backend", backend, "--dtype", "f16"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 1, (backend, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == ""
        last = r.stderr.strip().splitlines()[-1]
        assert "'fc1.weight' overflows float16 when cast (1 of 256 values" in last, (backend, last)
    # bf16 holds 1e5: the same weights load there
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "run", "examples/mlp.linnet", "--weights", str(folder), "--dtype", "bf16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
