"""`linnet run` on an entry whose dims are not `B` and `S`: sizes from `--dim NAME=SIZE`, computed
by the dim algebra (the CLI once `eval`ed a dim's text and died with a NameError on `N`)."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_backends import run_cli

FIXTURE = "tests/fixtures/dims/vector_dims.linnet"  # forward(x: [N, c.features], weights: [K, N]) -> [K, c.features]


@pytest.mark.torch
def test_run_takes_sizes_for_any_dim():
    pytest.importorskip("torch")
    r = run_cli("run", FIXTURE, "--dim", "N=5", "--dim", "K=3", "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert [i["shape"] for i in report["inputs"]] == [[5, 4], [3, 5]]
    (out,) = report["outputs"]
    assert out["shape"] == out["checker_shape"] == [3, 4] and report["disagreements"] == []


@pytest.mark.parametrize(
    "dims, message",
    [
        ((), "entry `forward` has input dim(s) K, N with no size: give --dim K=SIZE --dim N=SIZE"),
        (("--dim", "N=4"), "entry `forward` has input dim(s) K with no size: give --dim K=SIZE"),
        (("--dim", "N=4", "--dim", "K=2", "--dim", "M=1"), "--dim M: entry `forward` has no such dim (its dims: K, N)"),
        (("--dim", "N=four"), "--dim N must be a positive integer, got 'four'"),
        (("--dim", "N=0"), "--dim N must be a positive integer, got '0'"),
        (("--dim", "N"), "--dim takes NAME=SIZE (for example N=8), got 'N'"),
        (("--dim", "2=3"), "--dim takes NAME=SIZE (for example N=8), got '2=3'"),
        (("--dim", "N=3", "--dim", "N=5", "--dim", "K=1"), "--dim N is given twice (N=3 and N=5): give it once"),
        (
            ("--dim", "N=99999999999999999999", "--dim", "K=2"),
            "--dim K=2 --dim N=99999999999999999999: input `x` would have 399999999999999999996 elements, "
            "more than numpy can hold",
        ),
    ],
)
@pytest.mark.torch
def test_a_dim_without_a_good_size_is_a_usage_error(dims, message):
    pytest.importorskip("torch")
    r = run_cli("run", FIXTURE, "--backend", "torch-interpret", *dims)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"linnet run: {message}" and "Traceback" not in r.stderr


@pytest.mark.torch
def test_inputs_too_big_for_memory_are_a_usage_error_before_allocating():
    """`--dim N=100000 --dim K=100000` died in numpy with `_ArrayMemoryError` (a traceback); now the inputs'
    bytes are checked against the memory available first (372.5 TiB here, more than any machine has)."""
    pytest.importorskip("torch")
    r = run_cli("run", FIXTURE, "--backend", "torch-interpret", "--dim", "N=10000000", "--dim", "K=10000000")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "linnet run: --dim K=10000000 --dim N=10000000: the random inputs of entry `forward` need 372529.2 GiB"
    ) and line.endswith("available: give smaller sizes")


@pytest.mark.torch
def test_an_output_with_a_zero_sized_dim_is_reported_empty(tmp_path):
    """A config size of 0 checks (L213 asks for sizes of 0 or more); the output has no mean or min to print, and
    `linnet run` once died there with numpy's ValueError."""
    pytest.importorskip("torch")
    source = tmp_path / "zero.linnet"
    source.write_text(
        "config C {\n    out: int = 0\n}\n\nmodel M(c: C) {\n    proj: Linear(4, c.out)\n\n"
        "    entry fn forward(x: [B, 4]) -> [B, c.out] {\n        proj(x)\n    }\n}\n"
    )
    r = run_cli("run", str(source), "--backend", "torch-interpret")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "  output [1, 0] float32: empty" in r.stdout.splitlines()
    r = run_cli("run", str(source), "--backend", "torch-interpret", "--format", "json")
    assert r.returncode == 0, r.stderr
    (out,) = json.loads(r.stdout)["outputs"]
    assert out["shape"] == out["checker_shape"] == [1, 0]
    assert (out["mean"], out["std"], out["min"], out["max"]) == (None, None, None, None)
