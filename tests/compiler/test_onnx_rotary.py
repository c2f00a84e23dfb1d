"""linnet/compiler/onnx/rotary.py: under `fast` each `apply_rope` (a composite) whose cos and sin provably repeat
their halves is one com.microsoft RotaryEmbedding, and ONNX Runtime computes with it what the composite's body computes
(rows of a batch at different positions, prefill and decode); what does not provably fit runs the body."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from tests.conftest import EXAMPLES

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
import onnx_ir as ir  # noqa: E402

import linnet.onnx as lo  # noqa: E402
from linnet.compiler.onnx import lower  # noqa: E402

LLAMA = EXAMPLES / "llama.linnet"
TINY = {"num_hidden_layers": 2, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def _ops(model) -> collections.Counter:
    """Op types of an onnx_ir model or an ONNX proto."""
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    return collections.Counter(n.op_type for n in nodes)


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
    monkeypatch.setitem(lower.NATIVE, "apply_rope", lambda L, op: None)  # the body, as written
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


# ----------------------------------------------------------------------------- small sources

ROTATE = """
config RotateConfig {
    half: int = 4
}

model Rotate(c: RotateConfig) {
    entry fn forward(x: [B, 3, S, 2 * c.half], freqs: [B, S, c.half]) -> [B, 3, S, 2 * c.half] {
        let angles = concat([freqs, SECOND], dim=-1)
        apply_rope(x, COS, SIN)
    }
}
"""


def _rotation(second: str = "freqs", cos: str = "cos(angles)", sin: str = "sin(angles)") -> onnx.ModelProto:
    """x [B, 3, S, 8] rotated by `apply_rope` with cos and sin of concat([freqs, `second`]), under `fast`."""
    source = ROTATE.replace("SECOND", second).replace("COS", cos).replace("SIN", sin)
    return ir.to_proto(lo.lower_source(source, "forward", numerics="fast"))


def _run(proto: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _feeds(b: int = 2, s: int = 5) -> dict:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((b, 3, s, 8)).astype(np.float32),
            "freqs": rng.uniform(0, 20, (b, s, 4)).astype(np.float32)}  # fmt: skip


def _body(proto: onnx.ModelProto, feeds: dict) -> np.ndarray:
    """The rotation as the composite's body computes it (numpy, f64): x * cos + rotate_half(x) * sin."""
    x, freqs = feeds["x"].astype(np.float64), feeds["freqs"].astype(np.float64)
    angles = np.concatenate([freqs, freqs], axis=-1)[:, None]
    turned = np.concatenate([-x[..., 4:], x[..., :4]], axis=-1)
    return x * np.cos(angles) + turned * np.sin(angles)


def test_a_rotation_of_repeated_angles_is_one_node_computing_the_same_values():
    proto = _rotation()
    ops = _ops(proto)
    assert ops["RotaryEmbedding"] == 1
    assert ops["Neg"] == ops["Mul"] == ops["Unsqueeze"] == 0  # the body is not lowered
    feeds = _feeds()
    want = _body(proto, feeds)
    assert np.abs(_run(proto, feeds) - want).max() <= 1e-5 * np.abs(want).max()


def test_angles_through_casts_still_repeat_their_halves():
    proto = _rotation(cos="cast(cos(angles), x.dtype)", sin="cast(sin(angles), x.dtype)")
    assert _ops(proto)["RotaryEmbedding"] == 1


@pytest.mark.parametrize(
    ("second", "cos", "sin"),
    [("freqs * 2.0", "cos(angles)", "sin(angles)"), ("freqs", "cos(angles) * 2.0", "sin(angles)"),
     ("freqs", "sin(angles)", "cos(angles)")],
    ids=["halves-differ", "cos-scaled", "cos-and-sin-swapped"],
)  # fmt: skip
def test_a_rotation_that_is_not_provably_rope_runs_the_body(second, cos, sin):
    proto = _rotation(second, cos, sin)
    ops = _ops(proto)
    assert ops["RotaryEmbedding"] == 0 and ops["Neg"] == 1  # rotate_half's, in the body
    assert _run(proto, _feeds(3, 5)).shape == (3, 3, 5, 8)
