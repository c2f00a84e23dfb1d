"""The ONNX Runtime sessions the backend makes: a decoder's (a program with a KV cache, whose shapes change every
step) run without ORT's per-shape memory pattern, which only grew their arena (runtimes/onnx_backend.py, `session`);
an encoder's keep it; on the CPU their weights are mapped from a file, not copied (`_mapped_session`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import EXAMPLES

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_ir")

import linnet.onnx as lo  # noqa: E402

pytestmark = pytest.mark.onnxruntime

LLAMA = {"num_hidden_layers": 1, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}  # fmt: skip
BERT = {"num_hidden_layers": 1, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}


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
    from linnet.runtimes import onnx_backend as ob

    def anon_mb():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024

    weight = np.arange(16 << 20, dtype=np.float32).reshape(4096, 4096) / 7  # 64 MiB
    x = ir.Value(name="x", shape=ir.Shape([4096, 4096]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([4096, 4096]), type=ir.TensorType(ir.DataType.FLOAT),
                 const_value=ir.Tensor(weight, name="w"))
    add = ir.node("Add", [x, w])
    add.outputs[0].name = "y"
    graph = ir.Graph([x], add.outputs, nodes=[add], initializers=[w], opset_imports={"": 21})
    model = ir.Model(graph, ir_version=10)
    before = anon_mb()
    session = ob.make_session(model, [ob.PROVIDERS["cpu"]], threads=1)
    added = anon_mb() - before
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
    out = subprocess.run([sys.executable, "-c", MAPPED_PROBE, str(tmp_path)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    # here: 14 MiB mapped (ORT's own buffers), 78 MiB when ORT copies the weight
    assert got["added_mib"] < 32, f"the session added {got['added_mib']:.0f} MiB of anonymous memory for 64 MiB"
    assert got["left"] == [] and got["equal"], got


def test_a_session_falls_back_to_memory_where_no_file_can_be_written(tmp_path, monkeypatch):
    """No temporary folder to write in: the weights go to ORT from memory, and the model runs the same."""
    import linnet.runtimes.onnx_backend as ob

    model = lo.load(EXAMPLES / "llama.linnet", config=LLAMA, random_weights=True, max_positions=16, progress=False)
    ids = np.array([[3, 9, 4, 1]])
    want = np.asarray(model.forward(ids))
    assert "forward" not in model.lowered  # dropped once the session holds the weights

    def unwritable(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ob.tempfile, "TemporaryDirectory", unwritable)
    again = lo.load(EXAMPLES / "llama.linnet", config=LLAMA, random_weights=True, max_positions=16, progress=False)
    np.testing.assert_array_equal(np.asarray(again.forward(ids)), want)
    assert again.model_proto("forward").graph.node  # lowered again on demand
