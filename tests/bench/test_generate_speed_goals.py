"""bench/generate_speed.py's judging (no timing is measured here): which round of a configuration a row keeps, and how
issue 21's goals judge rows, on rows written out as the children report them."""

from __future__ import annotations

import sys

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import generate_speed as gs  # noqa: E402  (bench/ is not a package; stdlib-only at import)


def row(name: str, **fields) -> dict:
    side, mode, dtype = gs.CONFIGS[name]
    base = {"name": name, "side": side, "mode": mode, "dtype": dtype, "cpu_wait_pct": 2.0, "load_s": 2.0}
    return base | {"peak_rss_mb": 500.0} | fields


def test_pick_round_keeps_the_fastest_quiet_round():
    quiet_slow = row("onnxruntime-f32", decode_tok_s_median=50.0, cpu_wait_pct=5.0)
    busy_fast = row("onnxruntime-f32", decode_tok_s_median=60.0, cpu_wait_pct=60.0)
    quiet_fast = row("onnxruntime-f32", decode_tok_s_median=55.0, cpu_wait_pct=10.0)
    kept = gs.pick_round([quiet_slow, busy_fast, quiet_fast], 20.0)
    assert kept is quiet_fast and not kept.get("contended") and kept["rounds"] == 3
    assert [r["decode_tok_s_median"] for r in kept["other_rounds"]] == [50.0, 60.0]


def test_pick_round_marks_a_configuration_contended_in_every_round():
    a = row("onnxruntime-f32", decode_tok_s_median=60.0, cpu_wait_pct=70.0)
    b = row("onnxruntime-f32", decode_tok_s_median=40.0, cpu_wait_pct=30.0)
    kept = gs.pick_round([a, b], 20.0)
    assert kept is b and kept["contended"] is True


def judged(goals: dict, goal: str) -> dict[tuple[str, str], bool]:
    return {(c["row"], c["what"]): c["met"] for c in goals[goal]["checks"]}


def test_goals_judge_each_row_against_its_reference_and_the_limit():
    rows = [
        row("transformers-eager-f32", ttft_ms_median=700.0, decode_tok_s_median=25.0),
        row("transformers-eager-bf16", ttft_ms_median=300.0, decode_tok_s_median=36.0),
        row("linnet-interpret-f32", ttft_ms_median=9000.0, decode_tok_s_median=1.0),  # never judged
        row("linnet-generated-f32", ttft_ms_median=800.0, decode_tok_s_median=30.0),  # under 2x, within 10 % of limit
        row("onnxruntime-f32", ttft_ms_median=330.0, decode_tok_s_median=58.0),
        row("linnet-generated-bf16", ttft_ms_median=200.0, decode_tok_s_median=50.0, contended=True),
        row("xla-bf16", ttft_ms_median=150.0, decode_tok_s_median=80.0),
        row("torch-stored", ttft_ms_median=600.0, decode_tok_s_median=90.0, peak_rss_mb=300.0),
        row("onnxruntime-stored", skipped="onnxruntime does not run --dtype stored"),
        row("llama.cpp-stored", ttft_ms_median=1500.0, decode_tok_s_median=82.0, peak_rss_mb=250.0),
        row("limit-f32", bound_tok_s=32.0),
        row("limit-bf16", bound_tok_s=120.0),
    ]
    calibrations = [{"matmul_bf16_tflops": 0.5}, {"matmul_bf16_tflops": 1.0}]  # the higher rate counts
    recorded = {"date": "before", "load_s": {"onnxruntime-f32": 1.0, "linnet-generated-f32": 2.0}}
    g = gs.goals(rows, calibrations, n_params=100_000_000, prompt_tokens=512, recorded=recorded)

    assert g["flop_bound_ms"] == 2 * 100_000_000 * 512 / 1e12 * 1000  # 102.4 ms
    assert judged(g, "ttft") == {
        ("linnet-generated-f32", "TTFT ms"): False,
        ("onnxruntime-f32", "TTFT ms"): True,
        ("xla-bf16", "TTFT ms"): True,
        ("torch-stored", "TTFT ms"): True,  # against eager f32
    }
    assert g["ttft"]["met"] is False
    assert judged(g, "ttft_flop_bound") == {("xla-bf16", "TTFT ms"): True}  # 150 <= 1.5 x 102.4
    assert judged(g, "decode") == {
        ("linnet-generated-f32", "decode tok/s"): True,  # 30 >= 0.9 x 32
        ("onnxruntime-f32", "decode tok/s"): True,  # 58 >= 2 x 25
        ("xla-bf16", "decode tok/s"): True,  # 80 >= 2 x 36
    }
    assert judged(g, "stored") == {("torch-stored", "decode tok/s"): True, ("torch-stored", "peak RSS MB"): False}
    assert g["stored"]["met"] is False
    assert judged(g, "load") == {
        ("linnet-generated-f32", "load s"): True,
        ("onnxruntime-f32", "load s"): False,  # 2.0 s against 1.0 s recorded
        ("torch-stored", "load s"): True,  # against linnet-generated-f32 in this run
    }
    assert {n["row"] for n in g["not_judged"]} == {"linnet-generated-bf16", "onnxruntime-stored"}
    assert g["best_linnet_f32"] == "onnxruntime-f32"  # read by bench/zoo_speed.py


def test_goals_markdown_says_met_or_not_with_the_numbers():
    rows = [
        row("transformers-eager-f32", ttft_ms_median=700.0, decode_tok_s_median=25.0),
        row("onnxruntime-f32", ttft_ms_median=330.0, decode_tok_s_median=40.0),
    ]
    g = gs.goals(rows, [], n_params=None, prompt_tokens=512, recorded=None)
    text = "\n".join(gs.goals_markdown(g))
    assert "**1. TTFT at or below transformers eager" in text and ": met." in text
    assert "onnxruntime-f32: decode tok/s 40.0 against 50.0 (2.0x transformers-eager-f32): not met" in text
