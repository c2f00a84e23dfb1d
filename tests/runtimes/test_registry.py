"""The backend registry (`linnet.runtimes.backends`), the `LoadedModel` input checks, and the one error
hierarchy (`linnet.errors`): records agree with the docs, reading them imports no framework, a backend that
cannot run says why, bad options and inputs are refused by name. The backends' numerics are in
test_conformance.py."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from linnet.errors import BackendError, CheckpointError, LinnetError, LoadError, RunError, SourceError
from linnet.runtimes.backends import BACKENDS, CODE_VIEWS, backend_for, device_kind, get_backend
from linnet.runtimes.model import check_inputs, concrete_dim, random_inputs
from tests.conftest import EXAMPLES, ROOT

FRAMEWORKS = ("torch", "jax", "jaxlib", "onnx", "onnx_ir", "onnxruntime", "transformers")


def test_docs_table_is_the_registry():
    """docs/runtimes.md's table lists every backend with the registry's label, family, code view, dtypes,
    devices and summary, in the registry's order."""
    text = (ROOT / "docs" / "runtimes.md").read_text()
    rows = re.findall(r"^\| `([\w-]+)` \| (.+?) \| (\w+) \| (.+?) \| (.+?) \| (.+?) \| (.+?) \|$", text, re.M)
    assert [r[0] for r in rows] == list(BACKENDS)
    for name, label, family, view, dtypes, devices, summary in rows:
        b = BACKENDS[name]
        assert (label, family, summary) == (b.label, b.family, b.summary), name
        assert view == (f"`{b.code_view}`" if b.code_view else "none"), name
        assert dtypes.split(", ") == list(b.dtypes) and devices.split(", ") == list(b.devices), name


def test_records_are_consistent():
    for name, b in BACKENDS.items():
        assert b.name == name and b.code_view in (*CODE_VIEWS, None)
        assert set(b.numerics) == {"equivalent", "fast"}
        # training runs the generated code (or the interpreter) under autograd, JAX under jax.grad; ONNX Runtime
        # and the StableHLO artifact are inference only
        assert b.can_train == (name in {"torch-interpret", "torch", "torch-compile", "jax"}), name
        assert backend_for(b.runtime, b.mode) is b
    assert {b.code_view for b in BACKENDS.values()} - {None} == set(CODE_VIEWS)
    with pytest.raises(BackendError, match=r"unknown backend `tpu-magic` \(backends: torch-interpret, torch"):
        get_backend("tpu-magic")
    with pytest.raises(BackendError, match="mode must be one of generated, stablehlo, got 'eager'"):
        backend_for("jax_backend", "eager")
    assert device_kind("cuda:1") == device_kind("gpu") == "cuda" and device_kind("cpu") == "cpu"


def test_reading_the_registry_imports_no_framework():
    code = (
        "import sys\n"
        "from linnet.runtimes.backends import BACKENDS\n"
        "[b.describe('cpu') for b in BACKENDS.values()]\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_backend_that_cannot_run_says_why():
    assert "runs on cuda, not cpu" in BACKENDS["cuda-graphs"].unavailable("cpu")
    assert BACKENDS["jax"].unavailable("npu") == "jax runs on cpu or cuda or tpu, not npu"
    b = dataclasses.replace(BACKENDS["onnxruntime"], requires=("onnxruntime_that_is_not_installed",))
    reason = b.unavailable("cpu")
    assert reason == (
        "onnxruntime needs onnxruntime_that_is_not_installed, which is not installed (pip install 'linnet[onnx]')"
    )
    described = b.describe("cpu")
    assert described["available"] is False and described["reason"] == reason
    with pytest.raises(BackendError, match="not installed"):
        b.load(EXAMPLES / "mlp.linnet", random_weights=True)


def test_load_refuses_options_a_backend_lacks_before_loading_anything():
    takes = r"\(takes fuse_linear_weights, scan_layers, cpu_offload_gb\)"
    with pytest.raises(BackendError, match=r"backend jax has no option providers " + takes):
        BACKENDS["jax"].load(EXAMPLES / "mlp.linnet", providers=["cpu"])
    with pytest.raises(BackendError, match=r"jax runs f32, bf16, got dtype 'f16'"):
        BACKENDS["jax"].load(EXAMPLES / "mlp.linnet", dtype="f16")
    with pytest.raises(BackendError, match="numerics must be one of equivalent, fast, got 'exact'"):
        BACKENDS["torch"].load(EXAMPLES / "mlp.linnet", numerics="exact")
    with pytest.raises(BackendError, match="cuda-graphs runs on cuda, got device 'cpu'"):
        BACKENDS["cuda-graphs"].load(EXAMPLES / "mlp.linnet")


@pytest.fixture(scope="module")
def llama_step():
    from linnet.ir import build

    config = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
    return build(EXAMPLES / "llama.linnet", config=config, max_batch=2, max_positions=8).entries["step"]


def test_inputs_are_converted_and_checked_by_name(llama_step):
    ids, positions, rows = random_inputs(llama_step, {"B": 2, "S": 3}, vocab_size=32)
    out = check_inputs(llama_step, [ids.astype(np.int32), [0, 4], rows], 2, 8)
    assert [a.dtype for a in out] == [np.int64] * 3 and out[1].tolist() == [0, 4]
    refused = [
        ((ids,), r"`step` takes 3 input\(s\) \(input_ids, positions, rows\), got 1"),
        ((ids[0], positions, rows), r"`step` input `input_ids` has shape \[3\], the entry takes i64\[B, S\]"),
        ((ids + 0.5, positions, rows), r"`step` input `input_ids` is float64, the entry takes i64\[B, S\]"),
        (
            (ids, positions[:1], rows),
            r"`step` input `positions` has shape \[1\], the entry takes i64\[B\] \(B = 2 from the inputs before\)",
        ),
        ((ids, positions, np.array([0, 2])), r"rows \[0, 2\] are outside the cache's 2 rows \(max_batch\)"),
        (
            (ids, np.array([0, 6]), rows),
            r"positions \[0, 6\] with 3 tokens reach position 8, outside the cache's 8 positions \(max_positions\)",
        ),
    ]
    for args, message in refused:
        with pytest.raises(RunError, match=message):
            check_inputs(llama_step, list(args), 2, 8)
    assert issubclass(RunError, ValueError)  # callers that catch ValueError keep working
    assert [concrete_dim(d, {"B": 2, "S": 3}) for d in llama_step.outputs[0].dims] == [2, 32]


def test_one_hierarchy_with_codes_rendered_in_one_place():
    from linnet.compiler.onnx.upcast import MissingKernels
    from linnet.errors import CodegenError
    from linnet.ir import ProgramError
    from linnet.runtimes.formats.embedded import EmbeddedError
    from linnet.runtimes.formats.gguf_reader import GGUFError
    from linnet.runtimes.formats.tokenizer import TokenizerError
    from linnet.runtimes.loading import LoadError as LoadingLoadError

    assert ProgramError is SourceError and LoadingLoadError is LoadError
    for cls in (GGUFError, EmbeddedError, TokenizerError):
        assert issubclass(cls, CheckpointError) and issubclass(cls, LoadError)
    assert issubclass(CodegenError, LinnetError) and issubclass(MissingKernels, CodegenError)
    err = LoadError("`lm_head.weight` is [3, 4], the model [4, 4]", code="L501")
    assert str(err) == "error[L501]: `lm_head.weight` is [3, 4], the model [4, 4]" and err.code == "L501"
    assert str(BackendError("no such device")) == "no such device"


def test_a_source_error_met_while_loading_is_a_load_error_with_its_message(tmp_path):
    from linnet.runtimes.loading import LoadOptions, prepare

    bad = tmp_path / "bad.linnet"
    bad.write_text((EXAMPLES / "mlp.linnet").read_text().replace("fc2(h)", "fc2(x)"))
    with pytest.raises(LoadError, match="has errors") as err:
        prepare(bad, options=LoadOptions(random_weights=True))
    assert isinstance(err.value.__cause__, SourceError)
    with pytest.raises(LoadError, match="no such file or folder"):
        prepare(EXAMPLES / "mlp.linnet", weights=tmp_path / "nowhere")


def test_cli_lists_backends_and_refuses_an_unknown_one():
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "linnet", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
        )

    done = cli("backends", "--format", "json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [b["name"] for b in listed] == list(BACKENDS)
    assert next(b for b in listed if b["name"] == "cuda-graphs")["available"] is False
    done = cli("run", "examples/mlp.linnet", "--backend", "tpu-magic")
    assert done.returncode == 2 and "invalid choice: 'tpu-magic' (choose from 'torch-interpret'" in done.stderr
    done = cli("run", "examples/mlp.linnet", "--backend", "jax", "--provider", "cpu")
    assert done.returncode == 1
    assert done.stderr.strip() == "linnet run: --provider is an option of onnxruntime, not of jax"
