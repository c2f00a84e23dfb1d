"""One rule for the values an export writes (issue 43, item 1), every format and type: a weight holding NaN or Inf
in memory is refused, and so is a finite weight its type would write as Inf or NaN (f16 beyond 65504; a q8_0 /
q4_0 / q4_1 block whose f16 scale overflows; bf16 beyond 3.39e38). Each refusal names the tensor and leaves no
file; the largest value each type holds is written and reads back finite through gguf's own reader (and
safetensors' for Hugging Face folders). Before the rule GGUF wrote Inf/NaN blocks and exited 0, and
`linnet.export.hf` wrote NaN weights in the model's own dtype."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest

from linnet.errors import ExportError
from tests.runtimes.conftest import LLAMA

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import linnet.export  # noqa: E402
import linnet.torch as lt  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

GGUF_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"]
HF_DTYPES = ["f32", "bf16", "f16"]
MATRIX = "model.layers.0.mlp.down_proj.weight"  # 2-D: takes the file type (not permuted)
NORM = "model.norm.weight"  # 1-D: f32 in every GGUF file


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("values") / "hf"
    LlamaForCausalLM(config).save_pretrained(folder)
    return lt.load(LLAMA, weights=folder, progress=False)


@contextlib.contextmanager
def poked(model, name: str, value: float, index=(3, 5)):
    """`model`'s weight `name` with `value` at `index` (a whole q-block's worth of the row when it is a matrix)."""
    w = model.module.state_dict()[name]
    keep = w.clone()
    with torch.no_grad():
        w[index[: w.dim()]] = value
    try:
        yield
    finally:
        with torch.no_grad():
            w.copy_(keep)


def refused(export, path: Path, *patterns: str) -> str:
    with pytest.raises(ExportError) as e:
        export()
    message = str(e.value)
    for pattern in patterns:
        assert pattern in message, message
    assert not path.exists() and not [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}")]
    return message


@pytest.mark.parametrize("file_type", GGUF_TYPES)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_gguf_refuses_a_nonfinite_weight_in_every_type(model, tmp_path, file_type, value):
    path = tmp_path / "out.gguf"
    kind = "NaN" if np.isnan(value) else "Inf"
    for name in (MATRIX, NORM):
        with poked(model, name, value):
            refused(lambda: linnet.export.gguf(model, path, type=file_type), path, "cannot export as ", name, kind)


@pytest.mark.parametrize("dtype", HF_DTYPES + [None])
def test_hf_refuses_a_nonfinite_weight_in_every_dtype(model, tmp_path, dtype):
    path = tmp_path / "out"
    with poked(model, NORM, np.nan):
        refused(lambda: linnet.export.hf(model, path, dtype=dtype), path, f"'{NORM}' holds NaN (1 of 64 values")


OVERFLOWS = [  # (file type, value): the file type cannot hold the value
    ("f16", 70000.0),
    ("f16", 65520.0),  # rounds to Inf in f16 (65504 is the largest)
    ("bf16", 3.4e38),
    ("q8_0", 1e7),  # the block's scale 1e7 / 127 overflows f16
    ("q4_0", 1e7),
    ("q4_1", 1e7),
    ("q4_1", -7e4),  # q4_1's block minimum is stored as f16
]


@pytest.mark.parametrize("file_type, value", OVERFLOWS, ids=[f"{t}-{v:g}" for t, v in OVERFLOWS])
def test_gguf_refuses_a_weight_its_type_would_write_as_inf(model, tmp_path, file_type, value):
    path = tmp_path / "out.gguf"
    with poked(model, MATRIX, value):
        refused(
            lambda: linnet.export.gguf(model, path, type=file_type),
            path,
            f"cannot export as {file_type}: tensor '{MATRIX} (blk.0.ffn_down.weight)' overflows {file_type}",
            "export in a wider type (f32",
        )


@pytest.mark.parametrize("dtype, value", [("f16", 70000.0), ("f16", 65520.0), ("bf16", 3.4e38)])
def test_hf_refuses_a_weight_its_dtype_would_write_as_inf(model, tmp_path, dtype, value):
    path = tmp_path / "out"
    with poked(model, NORM, value):
        refused(
            lambda: linnet.export.hf(model, path, dtype=dtype),
            path,
            f"cannot export as {dtype}: tensor '{NORM}' overflows {dtype} (1 of 64 values",
        )


HOLDS = [("f16", 65504.0), ("q8_0", 127 * 65504.0), ("q4_0", 65504.0 * 8), ("bf16", 3.38e38), ("f32", 3.4e38)]


@pytest.mark.parametrize("file_type, value", HOLDS, ids=[t for t, _ in HOLDS])
def test_gguf_writes_the_largest_value_each_type_holds(model, tmp_path, file_type, value):
    """The edge of each type is written and gguf's reader (and dequantizer) gives finite values back."""
    from gguf.quants import dequantize

    path = tmp_path / "out.gguf"
    with poked(model, MATRIX, value):
        linnet.export.gguf(model, path, type=file_type)
    (tensor,) = [t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_down.weight"]
    back = dequantize(np.array(tensor.data), tensor.tensor_type)
    assert np.isfinite(back).all() and np.abs(back).max() >= value * 0.9


def test_hf_writes_the_largest_f16(model, tmp_path):
    from safetensors.numpy import load_file

    with poked(model, NORM, 65504.0):
        linnet.export.hf(model, tmp_path / "out", dtype="f16")
    back = load_file(tmp_path / "out" / "model.safetensors")[NORM]
    assert back.dtype == np.float16 and back[3] == 65504.0 and np.isfinite(back).all()


def test_cli_refuses_with_one_located_line(model, tmp_path, capsys):
    """`linnet export gguf --type q8_0` of a checkpoint holding 1e7: exit 1, one line naming the tensor."""
    from safetensors.numpy import load_file, save_file

    from linnet.cli import main

    folder = Path(model.prepared.checkpoint.path)
    poisoned = tmp_path / "hf"
    poisoned.mkdir()
    for f in folder.iterdir():
        (poisoned / f.name).write_bytes(f.read_bytes())
    tensors = load_file(poisoned / "model.safetensors")
    tensors[MATRIX][3, :32] = 1e7
    save_file(tensors, poisoned / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out.gguf"
    code = main(["export", "gguf", str(LLAMA), "--weights", str(poisoned), "--type", "q8_0", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and not out.exists(), err
    assert f"cannot export as q8_0: tensor '{MATRIX} (blk.0.ffn_down.weight)' overflows q8_0 (32 of " in err
