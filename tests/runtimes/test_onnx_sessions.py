"""The ONNX Runtime sessions the backend makes: a decoder's (a program with a KV cache, whose shapes change every
step) run without ORT's per-shape memory pattern, which only grew their arena
(linnet/runtimes/backends/onnx_backend.py, `session`);
an encoder's keep it; on the CPU their weights are mapped from a file, not copied (`_mapped_session`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import EXAMPLES, ROOT

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_ir")

import linnet.onnx as lo  # noqa: E402

pytestmark = pytest.mark.onnxruntime

LLAMA = {"num_hidden_layers": 1, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}  # fmt: skip
BERT = {"num_hidden_layers": 1, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}


@pytest.fixture(autouse=True)
def _without_ort_cache(monkeypatch):
    """These tests make sessions from the weights (`_new_session`: the mapped route, its folders). ONNX Runtime's
    persistent cache is process-wide once a backend's `setup_process` turns it on (`caches.enable`), and an earlier
    test in the same worker may have: its hits skip `_new_session`, so the mapped route was never tried (the suite
    failed three of these whenever pytest-xdist put such a test first). Off here, as in a process that never
    enabled it."""
    from linnet.runtimes.backends import caches

    monkeypatch.delitem(caches._ENABLED, "onnxruntime", raising=False)


def test_a_decoder_runs_without_the_memory_pattern_and_an_encoder_with_it():
    decoder = lo.load(EXAMPLES / "llama.linnet", config=LLAMA, random_weights=True, max_positions=16, progress=False)
    encoder = lo.load(EXAMPLES / "bert.linnet", config=BERT, random_weights=True, max_positions=16, progress=False)
    for entry in decoder.program.entries:
        assert decoder.session(entry).get_session_options().enable_mem_pattern is False
    for entry in encoder.program.entries:
        assert encoder.session(entry).get_session_options().enable_mem_pattern is True
    # and the decoder still decodes: a prefill then a step, each the forward's logits at that position
    ids = np.array([[3, 9, 4, 1]])
    want = np.asarray(decoder.forward(ids))[0]
    decoder.reset_state()
    rows = np.array([0])
    got = [np.asarray(decoder.run("step", ids[:, :3], np.array([0]), rows)[0])[0]]
    got.append(np.asarray(decoder.run("step", ids[:, 3:], np.array([3]), rows)[0])[0])
    np.testing.assert_allclose(np.stack(got), want[[2, 3]], rtol=1e-5, atol=1e-6)


# A model whose one large weight ORT reads in place (an Add: no kernel prepacks it): the anonymous memory a session
# adds, measured in a fresh process, says whether ORT took a copy of the weight or maps it from the file.
MAPPED_PROBE = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import onnx_ir as ir
    from linnet.runtimes.backends import onnx_backend as ob
    sys.path.insert(0, sys.argv[2])
    from generate_speed import proc_status_mb  # bench/

    weight = np.arange(16 << 20, dtype=np.float32).reshape(4096, 4096) / 7  # 64 MiB
    x = ir.Value(name="x", shape=ir.Shape([4096, 4096]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([4096, 4096]), type=ir.TensorType(ir.DataType.FLOAT),
                 const_value=ir.Tensor(weight, name="w"))
    add = ir.node("Add", [x, w])
    add.outputs[0].name = "y"
    graph = ir.Graph([x], add.outputs, nodes=[add], initializers=[w], opset_imports={"": 21})
    model = ir.Model(graph, ir_version=10)
    before = proc_status_mb("RssAnon")
    session = ob.make_session(model, [ob.PROVIDERS["cpu"]], threads=1)
    added = proc_status_mb("RssAnon") - before
    left = [p for p in os.listdir(sys.argv[1]) if p.startswith("linnet-ort-")]
    (y,) = session.run(None, {"x": np.ones((4096, 4096), np.float32)})
    print(json.dumps({"added_mib": added, "left": left, "equal": bool(np.array_equal(y, weight + 1))}))
    """
)


def test_a_cpu_session_maps_its_weights_instead_of_copying_them(tmp_path):
    """ORT 1.32 copies an initializer handed over from memory; from a file it maps it: a 64 MiB weight adds 64 MiB of
    anonymous memory the first way and almost none the second (the page-cache pages ORT reads are the file's). The
    temporary folder is gone once the session exists, and the session still reads the weight (the mapping outlives
    the file's name)."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    probe = [sys.executable, "-c", MAPPED_PROBE, str(tmp_path), str(ROOT / "bench")]
    out = subprocess.run(probe, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    # here: 14 MiB mapped (ORT's own buffers), 78 MiB when ORT copies the weight
    assert got["added_mib"] < 32, f"the session added {got['added_mib']:.0f} MiB of anonymous memory for 64 MiB"
    assert got["left"] == [] and got["equal"], got


DiskUsage = namedtuple("DiskUsage", "total used free")  # shutil.disk_usage's


def tiny_llama():
    return lo.load(EXAMPLES / "llama.linnet", config=LLAMA, random_weights=True, max_positions=16, progress=False)


@pytest.mark.parametrize("failure", ["no file", "no space"])
def test_a_session_falls_back_to_memory_where_no_file_can_be_written(failure, monkeypatch):
    """No temporary folder to write in, or not the space for the weights (checked before writing): the weights go
    to ORT from memory, and the model runs the same."""
    import linnet.runtimes.backends.onnx_backend as ob

    ids = np.array([[3, 9, 4, 1]])
    model = tiny_llama()
    want = np.asarray(model.forward(ids))
    assert "forward" not in model.lowered  # dropped once the session holds the weights
    real, tried = ob._mapped_session, []

    def spy(*args):
        tried.append(args)
        return real(*args)

    monkeypatch.setattr(ob, "_mapped_session", spy)
    if failure == "no file":

        def unwritable(*_args, **_kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(ob.tempfile, "TemporaryDirectory", unwritable)
    else:
        full = DiskUsage(total=1 << 30, used=1 << 30, free=0)
        monkeypatch.setattr(ob.shutil, "disk_usage", lambda _path: full)
    again = tiny_llama()
    np.testing.assert_array_equal(np.asarray(again.forward(ids)), want)
    assert len(tried) == 1  # the mapped route was tried, and refused
    assert again.model_proto("forward").graph.node  # lowered again on demand, and not kept
    assert "forward" not in again.lowered


def test_threads_asking_for_one_session_together_get_one():
    model = tiny_llama()
    barrier = threading.Barrier(4)

    def ask(_):
        barrier.wait()
        return model.session("forward")

    with ThreadPoolExecutor(4) as pool:
        sessions = list(pool.map(ask, range(4)))
    assert all(s is sessions[0] for s in sessions)


def test_a_lowered_model_handed_out_keeps_its_weights_once_the_session_exists():
    """`model_ir`'s model is the caller's: making the session drops the backend's reference to it but leaves its
    initializers' values (the backend's own lowered models have theirs released, since no one else holds them)."""
    model = tiny_llama()
    held = model.model_ir("forward")
    before = {name: v.const_value.numpy().copy() for name, v in held.graph.initializers.items()}
    model.forward(np.array([[3, 9, 4, 1]]))
    assert "forward" not in model.lowered
    for name, v in held.graph.initializers.items():
        np.testing.assert_array_equal(v.const_value.numpy(), before[name])


def test_folders_left_by_a_killed_session_build_are_removed_by_the_next():
    """A folder of a process that is gone, older than STALE_AFTER_S, goes; a recent one, or a live process's,
    stays."""
    import linnet.runtimes.backends.onnx_backend as ob

    root = Path(tempfile.gettempdir())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    old = time.time() - ob.STALE_AFTER_S - 60
    folders = {
        "stale": root / f"{ob.MAPPED_PREFIX}{dead}-test-stale",
        "recent": root / f"{ob.MAPPED_PREFIX}{dead}-test-recent",
        "live": root / f"{ob.MAPPED_PREFIX}{os.getpid()}-test-live",
    }
    try:
        for kind, folder in folders.items():
            folder.mkdir()
            (folder / ob.MAPPED_DATA).write_bytes(b"\0" * 4096)
            if kind != "recent":
                os.utime(folder, (old, old))
        tiny_llama().forward(np.array([[3, 9, 4, 1]]))
        assert not folders["stale"].exists()
        assert folders["recent"].exists() and folders["live"].exists()
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
