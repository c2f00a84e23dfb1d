"""linnet/compiler/onnx/rotary.py: under `fast` each rotate-half rotary embedding whose cos and sin provably repeat
their halves is one com.microsoft RotaryEmbedding, and ONNX Runtime computes with it what the written rotation computes
(rows of a batch at different positions, prefill and decode); what does not provably match stays as written."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from tests.conftest import EXAMPLES

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
import onnx_ir as ir  # noqa: E402
from onnx import TensorProto  # noqa: E402
from onnx import helper as h  # noqa: E402

import linnet.onnx as lo  # noqa: E402
from linnet.compiler.onnx import lower  # noqa: E402
from linnet.compiler.onnx.rotary import fuse_rotary_embedding  # noqa: E402

LLAMA = EXAMPLES / "llama.linnet"
TINY = {"num_hidden_layers": 2, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def _ops(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph)


def _tiny(numerics: str, params: dict | None = None):
    return lo.load(LLAMA, config=TINY, random_weights=params is None, seed=3, params=params, numerics=numerics,
                   max_batch=2, max_positions=24, progress=False)  # fmt: skip


def _sharp_params() -> dict:
    """Random weights whose queries and keys are large enough that attention depends on the rotation (at N(0, 0.02)
    every score is near 0, the softmax near uniform, and a wrong angle would hardly show in the logits)."""
    params = dict(_tiny("equivalent").params)
    for name in params:
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            params[name] = np.asarray(params[name]) * 40
    return params


@pytest.mark.parametrize("entry", ["forward", "step"])
def test_fast_lowers_every_rotation_of_a_llama_to_one_node_and_equivalent_none(entry):
    fast, equivalent = _tiny("fast").model_ir(entry), _tiny("equivalent").model_ir(entry)
    assert _ops(fast)["RotaryEmbedding"] == 2 * TINY["num_hidden_layers"]  # q and k of each layer
    assert _ops(fast)["Neg"] == 0  # every rotate_half's body gone
    assert _ops(equivalent)["RotaryEmbedding"] == 0 and _ops(equivalent)["Neg"] == 2 * TINY["num_hidden_layers"]
    assert {"": lower.OPSET, "com.microsoft": 1}.items() <= dict(fast.opset_imports).items()


def test_fused_rotations_compute_the_written_ones_for_rows_at_different_positions(monkeypatch):
    params = _sharp_params()
    fused = _tiny("fast", params)
    for entry in ("forward", "step"):  # lowered now (entries are lowered on first use), before the patch below
        assert _ops(fused.model_ir(entry))["RotaryEmbedding"] == 2 * TINY["num_hidden_layers"]
    monkeypatch.setattr(lower, "fuse_rotary_embedding", lambda model: 0)
    written = _tiny("fast", params)
    assert _ops(written.model_ir("step"))["RotaryEmbedding"] == 0
    ids = np.random.default_rng(0).integers(0, TINY["vocab_size"], (2, 7))
    want, got = np.asarray(written.forward(ids)), np.asarray(fused.forward(ids))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # the cache's two rows at different positions: a prefill of 7 and 4 tokens' worth, then decode steps
    steps = [(ids, [0, 3]), (ids[:, :1], [7, 10]), (ids[:, 1:2], [8, 11])]
    for model in (written, fused):
        model.reset_state()
    for step_ids, positions in steps:
        args = (step_ids, np.array(positions, dtype=np.int64), np.array([0, 1], dtype=np.int64))
        want, got = (np.asarray(m.run("step", *args)[0]) for m in (written, fused))
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


# ----------------------------------------------------------------------------- hand-made graphs


def _rotation(
    *, repeat_halves: bool = True, negate_first_half: bool = False, freqs_dims: tuple = ("B", "S", 4)
) -> onnx.ModelProto:
    """x [B, H, S, 8] rotated by angles freqs [B, S, 4] (or `freqs_dims`) written as rope.linnet's body: cos and sin
    of concat([freqs, freqs]) (or, with `repeat_halves` False, of concat([freqs, 2 * freqs]))."""
    i64 = lambda name, values: onnx.numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    second = "freqs" if repeat_halves else "freqs2"
    nodes = [
        h.make_node("Add", ["freqs", "freqs"], ["freqs2"]),
        h.make_node("Concat", ["freqs", second], ["angles"], axis=-1),
        h.make_node("Cos", ["angles"], ["cos"]),
        h.make_node("Sin", ["angles"], ["sin"]),
        h.make_node("Unsqueeze", ["cos", "one"], ["cos4"]),
        h.make_node("Unsqueeze", ["sin", "one"], ["sin4"]),
        h.make_node("Mul", ["x", "cos4"], ["plain"]),
        h.make_node("Slice", ["x", "zero", "four", "last"], ["x1"]),
        h.make_node("Slice", ["x", "four", "big", "last"], ["x2"]),
        h.make_node("Neg", ["x1" if negate_first_half else "x2"], ["minus"]),
        h.make_node("Concat", ["minus", "x2" if negate_first_half else "x1"], ["turned"], axis=-1),
        h.make_node("Mul", ["turned", "sin4"], ["rotated"]),
        h.make_node("Add", ["plain", "rotated"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "rope",
        [
            h.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, "S", 8]),
            h.make_tensor_value_info("freqs", TensorProto.FLOAT, list(freqs_dims)),
        ],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3, "S", 8])],
        [i64("one", [1]), i64("zero", [0]), i64("four", [4]), i64("big", [2**62]), i64("last", [-1])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", lower.OPSET)], ir_version=lower.IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def _run(proto: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_a_written_rotation_is_one_node_computing_the_same_values():
    proto = _rotation()
    model = ir.from_proto(proto)
    assert fuse_rotary_embedding(model) == 1
    ops = _ops(model)
    assert ops["RotaryEmbedding"] == 1
    assert ops["Neg"] == ops["Mul"] == ops["Unsqueeze"] == 0  # the body is gone
    assert ops["Add"] == 1  # what is not the rotation's (the unread freqs + freqs) is left to ORT
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 3, 5, 8)).astype(np.float32),
             "freqs": rng.uniform(0, 20, (2, 5, 4)).astype(np.float32)}  # fmt: skip
    want = _run(proto, feeds)
    got = _run(ir.to_proto(model), feeds)
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


@pytest.mark.parametrize(
    "variant",
    [{"repeat_halves": False}, {"negate_first_half": True}, {"freqs_dims": (1, "S", 4)}, {"freqs_dims": ("B", 1, 4)}],
    ids=["halves-differ", "other-rotation", "angles-broadcast-over-the-batch", "angles-broadcast-over-positions"],
)
def test_a_rotation_that_is_not_provably_rope_stays_as_written(variant):
    # broadcast angles: the op reads one cache row per (b, s) of x through position_ids made from the angles' shape,
    # and ONNX Runtime refuses a batch of 1 beside x's 3 (found by review: a crash at B = 3, not a wrong value)
    proto = _rotation(**variant)
    model = ir.from_proto(proto)
    before = _ops(model)
    assert fuse_rotary_embedding(model) == 0
    assert _ops(model) == before
    rng = np.random.default_rng(2)
    b, s = 3, 5
    freqs = [d if isinstance(d, int) else {"B": b, "S": s}[d] for d in variant.get("freqs_dims", ("B", "S", 4))]
    feeds = {"x": rng.standard_normal((b, 3, s, 8)).astype(np.float32),
             "freqs": rng.uniform(0, 20, freqs).astype(np.float32)}  # fmt: skip
    assert _run(ir.to_proto(model), feeds).shape == (b, 3, s, 8)
