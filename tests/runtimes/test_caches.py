"""The persistent compile caches (`linnet.runtimes.backends.caches`): where they live, that a second `linnet generate`
of the same model in a fresh process finds its compiled programs there and says "cache hit" (xla, jax, onnxruntime),
that ONNX Runtime's cached optimized model computes exactly what a fresh session does and is never used stale, and
`linnet cache`. Assertions are on the reported cache state, never on timings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from linnet.runtimes.backends import caches
from tests.conftest import ROOT
from tests.runtimes.conftest import LLAMA
from tests.runtimes.test_timing_lines import generate, generated_lines


@pytest.fixture
def clean_env(monkeypatch):
    for name in (caches.ENV_DIR, caches.ENV_OFF, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_cache_folder_follows_linnet_cache_dir_then_xdg_then_home(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path / "home"))
    assert caches.cache_root() == tmp_path / "home" / ".cache" / "linnet"
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert caches.cache_root() == tmp_path / "xdg" / "linnet"
    clean_env.setenv(caches.ENV_DIR, str(tmp_path / "mine"))
    assert caches.cache_dir("jax") == tmp_path / "mine" / "jax"
    clean_env.setenv(caches.ENV_OFF, "1")
    assert caches.cache_root() is None and caches.cache_dir("onnxruntime") is None
    with pytest.raises(ValueError, match="no cache for 'tvm'"):
        caches.cache_dir("tvm")


def test_a_report_says_hit_miss_partial_or_off():
    folder = Path("/tmp/c")
    assert caches.CompileReport("compile", 1.0, hits=3, folder=folder).cache == "hit"
    assert caches.CompileReport("compile", 1.0, misses=2, folder=folder).cache == "miss"
    assert caches.CompileReport("compile", 1.0, hits=1, misses=1, folder=folder).cache == "partial"
    assert caches.CompileReport("compile", 1.0, misses=2).cache == "off"
    assert caches.CompileReport("session build", 1.0, uncached=1, folder=folder).cache == "off"
    assert caches.CompileReport("compile", 0.41, hits=3, folder=folder).describe() == (
        "compile 0.41 s (cache hit: 3 programs from /tmp/c)"
    )
    miss = caches.CompileReport("session build", 2.0, misses=1, folder=folder, noun="optimized model")
    assert miss.describe() == "session build 2.00 s (cache miss: 1 optimized model made and written to /tmp/c)"
    assert caches.CompileReport("").describe() == "no compile (eager)"


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("xla", marks=pytest.mark.jax),
        pytest.param("jax", marks=pytest.mark.jax),
        pytest.param("onnxruntime", marks=pytest.mark.onnxruntime),
    ],
)
def test_a_second_generate_in_a_fresh_process_hits_the_cache(backend, tmp_path):
    cold = generated_lines(backend, tmp_path)
    assert cold["compile"]["cache"].startswith("cache miss: ")  # an empty cache: a miss, written
    assert f"and written to {tmp_path}" in cold["compile"]["cache"]
    warm = generated_lines(backend, tmp_path)
    folder = tmp_path / ("onnxruntime" if backend == "onnxruntime" else "jax")
    assert warm["compile"]["cache"].startswith("cache hit: ") and str(folder) in warm["compile"]["cache"]
    assert warm["stdout"] == cold["stdout"]  # the cached programs compute the same tokens


@pytest.mark.slow
@pytest.mark.jax
def test_no_cache_turns_the_persistent_cache_off(tmp_path):
    pytest.importorskip("jax")
    r = generate("xla", tmp_path, "--max-new-tokens", "1")
    assert r.returncode == 0
    env_off = dict(os.environ, LINNET_NO_CACHE="1", LINNET_CACHE_DIR=str(tmp_path / "unused"), PYTHONPATH=str(ROOT))
    args = ["generate", "examples/llama.linnet", "--prompt", "Hi", "--max-new-tokens", "1", "--backend", "xla"]
    r = subprocess.run([sys.executable, "-m", "linnet", *args], cwd=ROOT, capture_output=True, text=True, env=env_off)
    assert r.returncode == 0, r.stderr
    assert "(compiled, not cached (LINNET_NO_CACHE is set))" in r.stderr
    assert not (tmp_path / "unused").exists()


# ----------------------------------------------------------------------------------------------- ONNX Runtime


@pytest.fixture
def ort_cache(tmp_path, monkeypatch):
    """ONNX Runtime's cache on in this process, in `tmp_path` (restored afterwards)."""
    pytest.importorskip("onnxruntime")
    monkeypatch.setitem(caches._ENABLED, "onnxruntime", tmp_path)
    return tmp_path


def small_onnx(seed: int = 1):
    import linnet.onnx as lo

    config = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    config |= {"num_attention_heads": 8, "num_key_value_heads": 2}
    return lo.load(LLAMA, config=config, max_positions=32, random_weights=True, seed=seed, progress=False)


def logits(model) -> np.ndarray:
    ids = np.array([[5, 7, 11, 13, 2, 3]])
    (out,) = model.run("forward", ids)
    return out


@pytest.mark.onnxruntime
def test_the_cached_optimized_model_computes_exactly_what_a_fresh_session_does(ort_cache, monkeypatch):
    monkeypatch.delitem(caches._ENABLED, "onnxruntime")
    reference = logits(small_onnx())  # no cache
    monkeypatch.setitem(caches._ENABLED, "onnxruntime", ort_cache)
    with caches.watch("onnx", "session build") as miss:
        written = logits(small_onnx())
    assert (miss.hits, miss.misses) == (0, 1)
    with caches.watch("onnx", "session build") as hit:
        cached = logits(small_onnx())
    assert (hit.hits, hit.misses) == (1, 0) and hit.cache == "hit"
    np.testing.assert_array_equal(written, reference)
    np.testing.assert_array_equal(cached, reference)
    entries = [p for p in ort_cache.iterdir()]
    assert len(entries) == 1 and not entries[0].name.endswith(".partial")  # one complete entry, no leftovers


@pytest.mark.onnxruntime
def test_other_weights_never_find_a_stale_entry(ort_cache):
    a = small_onnx(seed=1)
    with caches.watch("onnx", "session build") as first:
        out_a = logits(a)
    with caches.watch("onnx", "session build") as other:
        out_b = logits(small_onnx(seed=2))  # the same graph, other weights: another key
    assert first.misses == 1 and other.misses == 1 and other.hits == 0
    assert not np.array_equal(out_a, out_b)
    assert len(list(ort_cache.iterdir())) == 2


@pytest.mark.onnxruntime
def test_a_damaged_entry_is_rebuilt_not_used(ort_cache):
    reference = logits(small_onnx())
    (entry,) = ort_cache.iterdir()
    data = entry / "model.data"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # truncated: ORT cannot read it
    with caches.watch("onnx", "session build") as rebuilt:
        again = logits(small_onnx())
    assert rebuilt.misses == 1 and rebuilt.hits == 0
    np.testing.assert_array_equal(again, reference)
    with caches.watch("onnx", "session build") as hit:
        logits(small_onnx())
    assert hit.hits == 1


@pytest.mark.onnxruntime
def test_a_cache_folder_that_cannot_be_written_costs_the_cache_not_the_session(ort_cache, monkeypatch):
    blocked = ort_cache / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setitem(caches._ENABLED, "onnxruntime", blocked / "onnxruntime")  # mkdir under a file fails
    with caches.watch("onnx", "session build") as report:
        out = logits(small_onnx())
    assert report.misses == 1 and np.isfinite(out).all()


def test_the_ort_key_covers_graph_weights_and_options():
    pytest.importorskip("onnxruntime")
    w = [("w", np.arange(6, dtype=np.float32).reshape(2, 3))]
    key = caches.ort_key(b"graph", w, "CPUExecutionProvider", "basic")
    assert key == caches.ort_key(b"graph", [("w", w[0][1].copy())], "CPUExecutionProvider", "basic")
    changed = w[0][1].copy()
    changed[1, 2] += 1
    assert key != caches.ort_key(b"graph", [("w", changed)], "CPUExecutionProvider", "basic")
    assert key != caches.ort_key(b"graph2", w, "CPUExecutionProvider", "basic")
    assert key != caches.ort_key(b"graph", w, "CPUExecutionProvider", "all")
    assert key != caches.ort_key(b"graph", [("v", w[0][1])], "CPUExecutionProvider", "basic")


# ----------------------------------------------------------------------------------------------- linnet cache


def test_linnet_cache_shows_and_clears_the_folders(tmp_path):
    env = dict(os.environ, LINNET_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("LINNET_NO_CACHE", None)
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "entry").write_bytes(b"x" * 2048)
    cli = [sys.executable, "-m", "linnet", "cache"]
    r = subprocess.run(cli, capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(f"{tmp_path} (set LINNET_CACHE_DIR")
    lines = r.stdout.splitlines()
    assert any(line.split()[:2] == ["jax", "0.0"] and line.endswith(str(tmp_path / "jax")) for line in lines)
    r = subprocess.run([*cli, "clear"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0 and f"removed {tmp_path / 'jax'}" in r.stderr
    assert not (tmp_path / "jax").exists()
    r = subprocess.run([*cli, "clear"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0 and "nothing to remove" in r.stderr


def test_a_cache_folder_that_cannot_be_written_is_found_without_making_anything(tmp_path):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert caches.unusable(a_file) == f"{a_file} is not a writable folder"
    assert caches.unusable(a_file / "below") == f"{a_file / 'below'} is not a writable folder"
    assert caches.unusable(Path("/proc/nonexistent")) == "/proc/nonexistent is not a writable folder"
    assert caches.unusable(tmp_path / "new" / "cache") is None  # made by the first compile
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.jax
@pytest.mark.parametrize("where", ["afile", "/proc/nonexistent"])
def test_an_unwritable_cache_folder_runs_uncached_and_says_so(tmp_path, where):
    """LINNET_CACHE_DIR naming a regular file (or a folder under /proc) printed "cache miss: ... written to
    /tmp/x/afile/jax" on every run though nothing was written; `linnet cache` listed the folders as empty."""
    pytest.importorskip("jax")
    folder = tmp_path / where if where == "afile" else Path(where)
    if where == "afile":
        folder.write_text("not a folder")
    env = dict(os.environ, LINNET_CACHE_DIR=str(folder), PYTHONPATH=str(ROOT))
    env.pop("LINNET_NO_CACHE", None)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "linnet", *args], capture_output=True, text=True, env=env, cwd=ROOT
        )

    r = cli("run", "examples/mlp.linnet", "--backend", "jax")
    assert r.returncode == 0, r.stderr
    assert f"(compiled, not cached; cache off: {folder} is not a writable folder)" in r.stdout
    assert "written to" not in r.stdout + r.stderr
    r = cli("cache")
    assert r.returncode == 0 and r.stdout.startswith(f"persistent caches are off: {folder} is not a writable folder")
    r = cli("cache", "clear")
    assert r.returncode == 0 and f"nothing to remove: cache off: {folder} is not a writable folder" in r.stderr


def test_linnet_cache_lists_and_clears_the_extracted_embedded_checkpoints(clean_env, tmp_path):
    """`<cache>/embedded` (the extracted all-MiniLM copies, one per package install: 262 MB with 3 stale ones in
    the trial) was neither listed nor cleared by `linnet cache`."""
    from linnet.runtimes.formats.embedded import cache_dir as embedded_cache

    env = dict(os.environ, LINNET_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("LINNET_NO_CACHE", None)
    stale = tmp_path / "embedded" / "all-minilm-l6-v2-1-1"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"x" * 3 * 2**20)
    clean_env.setenv(caches.ENV_DIR, str(tmp_path))
    assert embedded_cache() / "embedded" == caches.cache_dir("embedded")  # the folder embedded.py extracts to
    cli = [sys.executable, "-m", "linnet", "cache"]
    r = subprocess.run(cli, capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert f"  embedded           3.0 MiB  {tmp_path / 'embedded'}" in r.stdout.splitlines()
    r = subprocess.run([*cli, "clear"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0 and f"removed {tmp_path / 'embedded'}" in r.stderr
    assert not (tmp_path / "embedded").exists()
