"""The comparison report as a file (`linnet.lsp.compare`): read-only, replaced by the next run,
and a Markdown table that marks what disagrees. The report itself comes from real backends in
tests/cli/test_compare.py and through the server in test_views.py; here, one with a disagreement
and a backend that could not run, which real backends on this machine do not produce."""

from __future__ import annotations

import os
import stat

import pytest

from linnet.lsp.compare import lens_title, report_markdown, write_report
from linnet.lsp.views import ViewError

REPORT = {
    "file": "/work/examples/mlp.linnet",
    "entry": "forward",
    "preset": "tiny",
    "dtype": "f32",
    "weights": "random weights",
    "seed": 0,
    "inputs": [{"name": "x", "shape": [1, 8], "dtype": "float32"}],
    "reference": "torch-interpret",
    "tolerance": 1e-4,
    "backends": [
        {"backend": "torch-interpret", "label": "PyTorch (interpreter)", "status": "ok", "reason": None,
         "outputs": [{"shape": [1, 2], "dtype": "float32", "checker_shape": [1, 2], "checker_dtype": "float32"}],
         "disagreements": [], "time_ms": 0.3, "max_abs": 0.0042, "max_abs_diff": 0.0, "notes": []},
        {"backend": "onnxruntime", "label": "ONNX Runtime", "status": "ok", "reason": None,
         "outputs": [{"shape": [1, 3], "dtype": "float32", "checker_shape": [1, 2], "checker_dtype": "float32"}],
         "disagreements": ["output 0: the checker says shape [1, 2], onnxruntime gave [1, 3]"], "time_ms": 1.2,
         "max_abs": 0.0042, "max_abs_diff": None, "notes": ["upcast | op"]},
        {"backend": "cuda-graphs", "label": "PyTorch (CUDA graphs)", "status": "unavailable",
         "reason": "cuda-graphs runs on cuda, not cpu", "outputs": [], "disagreements": []},
    ],
    "pairs": [{"a": "torch-interpret", "b": "onnxruntime", "max_abs_diff": None, "agree": False}],
    "disagreements": [
        "output 0: the checker says shape [1, 2], onnxruntime gave [1, 3]",
        "torch-interpret and onnxruntime give outputs of different shapes",
    ],
}  # fmt: skip


def test_the_lens_names_the_registry_labels():
    assert lens_title() == "Compare ▸ PyTorch · XLA · ONNX Runtime"


def test_the_report_marks_disagreements_and_says_why_a_backend_did_not_run():
    text = report_markdown(REPORT)
    lines = text.splitlines()
    assert lines[0] == "# `forward` compared across backends"
    assert "| PyTorch (interpreter) (`torch-interpret`) | ok | [1, 2] float32 | 0.0042 | reference | 0.30 ms |" in lines
    assert "| ONNX Runtime (`onnxruntime`) | ok | [1, 3] float32 (checker: **[1, 2] float32**) | 0.0042 | " \
        "shapes differ | 1.20 ms |" in lines  # fmt: skip
    assert "| PyTorch (CUDA graphs) (`cuda-graphs`) | unavailable: cuda-graphs runs on cuda, not cpu | | | | |" in lines
    assert "| `torch-interpret` | `onnxruntime` | shapes differ | **disagree** |" in lines
    assert "- torch-interpret and onnxruntime give outputs of different shapes" in lines
    assert "- `onnxruntime`: upcast \\| op" in lines  # a pipe cannot break the list or a table


def test_without_the_reference_the_rows_say_so_not_that_shapes_differ():
    """The reference unavailable (`--dtype stored`, which torch-interpret does not run): the rows' distance to it is
    None, which the table showed as "shapes differ" of outputs of one shape, as `linnet run --compare` did."""
    row = REPORT["backends"][0] | {"status": "unavailable", "reason": "torch-interpret does not run --dtype stored"}
    ran = {"backend": "torch", "label": "PyTorch", "status": "ok", "reason": None, "disagreements": [],
           "outputs": [{"shape": [1, 2], "dtype": "float32", "checker_shape": [1, 2], "checker_dtype": "float32"}],
           "time_ms": 1.0, "max_abs": 0.5, "max_abs_diff": None, "notes": []}  # fmt: skip
    lines = report_markdown(REPORT | {"backends": [row, ran], "pairs": [], "disagreements": []}).splitlines()
    assert "| PyTorch (`torch`) | ok | [1, 2] float32 | 0.5 | - (no reference) | 1.00 ms |" in lines


def test_the_report_file_is_read_only_and_replaced_by_the_next_run(tmp_path):
    path = write_report(REPORT, "/work/examples/mlp.linnet", tmp_path)
    assert path.parent == tmp_path and path.name.startswith("mlp-") and path.name.endswith(".forward.compare.md")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o444
    again = write_report(REPORT | {"seed": 7}, "/work/examples/mlp.linnet", tmp_path)
    assert again == path and "(seed 7)" in path.read_text()
    other = write_report(REPORT, "/elsewhere/mlp.linnet", tmp_path)
    assert other != path  # same name, another file: its own report


def test_an_unwritable_folder_is_a_clear_refusal(tmp_path):
    blocker = tmp_path / "reports"
    blocker.write_text("a file where the folder should be")
    with pytest.raises(ViewError, match=f"cannot write the comparison report in {blocker}"):
        write_report(REPORT, "/work/examples/mlp.linnet", blocker)
