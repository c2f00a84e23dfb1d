"""Shared test helpers: paths, golden files, documents, the device of the tests marked tpu."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
UPDATE_GOLDEN = os.environ.get("LINNET_UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="session", autouse=True)
def _private_compile_cache(tmp_path_factory):
    """The CLI caches compiled programs under ~/.cache/linnet (linnet/runtimes/backends/caches.py). The suite runs
    with its own empty cache folder, inherited by the CLI processes it starts, so a test neither
    fills the user's cache nor passes because of what an earlier run left there. Tests of the
    cache itself point LINNET_CACHE_DIR at their own folders."""
    if "LINNET_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["LINNET_CACHE_DIR"] = str(tmp_path_factory.mktemp("linnet-cache"))
    yield
    del os.environ["LINNET_CACHE_DIR"]


# `make test` runs pytest-xdist with `--dist loadfile`: each file's tests run together on one worker, so a
# module-scoped fixture (a model saved, a language server started, a checkpoint read) is built once. These files'
# tests share no costly fixture and each runs long (a sweep over every config key of a family, a CLI process per
# case), so they go test by test to whichever worker is free instead of lengthening one worker's queue.
SPLIT_ACROSS_WORKERS = {
    "tests/runtimes/test_config_sweep.py",
    "tests/runtimes/test_verify.py",
    "tests/runtimes/test_caches.py",
    "tests/cli/test_backends.py",
    "tests/syntax/test_parser.py",
}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: `-p no:xdist` (and a machine without it) runs without it
def pytest_xdist_make_scheduler(config, log):
    """With `--dist loadfile`, pytest-xdist's scheduling by file, but the tests of SPLIT_ACROSS_WORKERS each a unit
    of their own. (Its `xdist_group` marks would say this, but `--dist loadgroup` renames node ids in a way pytest 9.2
    ignores, so every test ran alone.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    missing = sorted(f for f in SPLIT_ACROSS_WORKERS if not (ROOT / f).is_file())
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: SPLIT_ACROSS_WORKERS names files that do not exist: {missing}")
    from xdist.scheduler import LoadScopeScheduling

    class FileOrTestScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return nodeid if file in SPLIT_ACROSS_WORKERS else file

    return FileOrTestScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread_per_worker():
    """Under pytest-xdist (`make test` runs `-n 2`) each worker process runs PyTorch in this process with one
    intra-op thread: two workers of two threads each on two cores wait for each other at every op (OpenMP's
    threads spin at each barrier), many times slower than one thread each. OMP_NUM_THREADS is left alone, so the
    CLI processes the tests start choose their threads as a user's would (linnet/runtimes/backends/threads.py)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and installed("torch"):
        import torch

        torch.set_num_threads(1)
    yield


# ---- the tests marked tpu -----------------------------------------------------------------------------------------
# They run JAX's backends on a TPU (one chip, one process: `pytest -m tpu -p no:xdist`; bench/tpu_tests.sh is the
# device call). Where JAX has no TPU they skip, saying why; LINNET_TPU_TESTS_DEVICE=cpu runs them on the CPU instead (a
# dry run of that call: the same tests and bounds), and LINNET_TPU_TESTS_DEVICE=tpu fails them where there is no TPU
# (on the device, where every test skipped would read as a pass).
TPU_DEVICE_ENV = "LINNET_TPU_TESTS_DEVICE"


@functools.cache
def _tpu_tests_device() -> tuple[str | None, str]:
    """(the device the tests marked tpu run on, "") or (None, why there is none)."""
    chosen = os.environ.get(TPU_DEVICE_ENV, "")
    if chosen not in ("", "cpu", "tpu"):
        raise pytest.UsageError(f"{TPU_DEVICE_ENV} must be cpu or tpu (or unset), got {chosen!r}")
    if chosen == "cpu":
        return "cpu", ""
    why = _no_tpu()
    return (None, why) if why else ("tpu", "")


def _no_tpu() -> str | None:
    """Why JAX has no TPU here, or None. JAX is imported only where libtpu (what its TPU backend loads, from the
    `libtpu` package or TPU_LIBRARY_PATH) is there, so a machine without it (CI) answers at once."""
    if not installed("jax"):
        return "JAX is not installed"
    if not installed("libtpu") and "TPU_LIBRARY_PATH" not in os.environ:
        return "libtpu is not installed"
    import jax

    try:
        jax.devices("tpu")
    except RuntimeError as err:
        return f"JAX has no TPU here ({err})"
    return None


def tpu_tests_device() -> str:
    """The device the tests marked tpu run on: "tpu", or "cpu" under LINNET_TPU_TESTS_DEVICE=cpu. Where JAX has no
    TPU it skips the calling test (fails it under LINNET_TPU_TESTS_DEVICE=tpu)."""
    device, why = _tpu_tests_device()
    if device is None:
        if os.environ.get(TPU_DEVICE_ENV) == "tpu":
            pytest.fail(f"{TPU_DEVICE_ENV}=tpu, but {why}", pytrace=False)
        pytest.skip(f"no TPU: {why} ({TPU_DEVICE_ENV}=cpu runs the tests marked tpu on the CPU)")
    return device


def pytest_report_header(config) -> list[str] | None:
    """Under `-m tpu`: where the tests marked tpu run (or why they skip) and the versions of what they run on."""
    if "tpu" not in (config.option.markexpr or ""):
        return None
    import importlib.metadata

    device, why = _tpu_tests_device()
    if device == "tpu":
        import jax

        device = f"tpu ({jax.devices('tpu')[0].device_kind})"
    versions = []
    for name in ("jax", "jaxlib", "libtpu", "torch", "transformers"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    where = f"on {device}" if device else f"nowhere: {why}"
    return [f"tests marked tpu: {where} ({TPU_DEVICE_ENV}={os.environ.get(TPU_DEVICE_ENV, '')})", ", ".join(versions)]


def pytest_runtest_setup(item):
    """A test marked tpu skips where there is no TPU (`tpu_tests_device`) before any of its fixtures is built."""
    if item.get_closest_marker("tpu") is not None:
        tpu_tests_device()


@pytest.fixture(scope="session")
def tpu_device() -> str:
    """The device string a test marked tpu passes as `device=` to a JAX backend's load: "tpu", or "cpu" under
    LINNET_TPU_TESTS_DEVICE=cpu (a dry run on the CPU). Skips where JAX has no TPU (`tpu_tests_device`)."""
    return tpu_tests_device()


def check_golden(path: Path, actual: str) -> None:
    """Compare `actual` with the golden file at `path`. A missing golden is written (and the
    test fails so that it gets reviewed); LINNET_UPDATE_GOLDEN=1 rewrites goldens."""
    if UPDATE_GOLDEN or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        path.write_text(actual, encoding="utf-8")
        if not UPDATE_GOLDEN and not existed:
            pytest.fail(f"golden file {path.relative_to(ROOT)} was missing and has been written; review it")
        return
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"output differs from {path.relative_to(ROOT)} (LINNET_UPDATE_GOLDEN=1 rewrites it)"


def apply_fix(text: str, fix) -> str:
    """`text` with a diagnostic's fix (`Diagnostic.fixes`) applied: each edit's range replaced by its new text."""
    for edit in sorted(fix.edits, key=lambda e: -e.location.start.offset):
        text = text[: edit.location.start.offset] + edit.new_text + text[edit.location.end.offset :]
    return text


@pytest.fixture
def analyze():
    """Analyse a source text: `analyze(text, path="t.linnet")` returns the Analysis."""
    from linnet.semantics.program import Document

    def run(text: str, path: str = "test.linnet"):
        return Document(path, text).analyze()

    return run


def installed(module: str) -> bool:
    """Whether `module` can be imported here (found, not imported)."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def write_mlp_checkpoint(folder: Path, poison: dict | None = None, dtype=None) -> Path:
    """Weights for examples/mlp.linnet's `tiny` preset (fc1 [32, 8], fc2 [2, 32]) as a Hugging Face folder,
    written with numpy (config.json + model.safetensors, N(0, 1) values, seed 0). `poison` sets values,
    `{tensor: (index, value)}`; `dtype` is the stored numpy dtype (f32). Returns the model.safetensors path."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    shapes = {"fc1.weight": (32, 8), "fc1.bias": (32,), "fc2.weight": (2, 32), "fc2.bias": (2,)}
    tensors = {name: rng.standard_normal(shape) for name, shape in shapes.items()}
    for name, (index, value) in (poison or {}).items():
        tensors[name][index] = value
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / "model.safetensors"
    save_file({k: v.astype(dtype or np.float32) for k, v in tensors.items()}, str(file))
    (folder / "config.json").write_text(json.dumps({"in_features": 8, "hidden_features": 32, "out_features": 2}))
    return file
