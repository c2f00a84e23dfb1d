"""Check-speed benchmark: writes bench/results/check_speed.json.

- `linnet check examples`: wall time of the whole command in a fresh process (bytecode
  cached, as a user's second run), min and median of N runs;
- a generated 5,000-line file: full check time in one process (parse + check under every
  preset), then the re-check time after a one-line edit inside one function body
  (Document.edit + analyze, the language server's path), p50 and p95 over many edits.

Goals (issue 2): the examples under 0.3 s wall; the re-check under 30 ms.
Run: `python bench/check_speed.py [--runs N]`. Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from linnet.semantics.program import Document, std_library  # noqa: E402

CONFIG = """config Net {
    hidden_size: int = 256
    num_heads: int = 8
    head_dim: int = hidden_size / num_heads
    intermediate_size: int = 1024
    eps: float = 1e-5
}

preset small = Net { hidden_size = 128, num_heads = 4, intermediate_size = 512 }

preset large = Net { hidden_size = 1024, num_heads = 16, intermediate_size = 4096 }
"""

MODULE = """
## Block {i}: attention and a gated MLP.
module Block{i}(c: Net) {{
    q_proj: Linear(c.hidden_size, c.hidden_size, use_bias=false)
    k_proj: Linear(c.hidden_size, c.hidden_size, use_bias=false)
    v_proj: Linear(c.hidden_size, c.hidden_size, use_bias=false)
    o_proj: Linear(c.hidden_size, c.hidden_size, use_bias=false)
    gate_proj: Linear(c.hidden_size, c.intermediate_size, use_bias=false)
    up_proj: Linear(c.hidden_size, c.intermediate_size, use_bias=false)
    down_proj: Linear(c.intermediate_size, c.hidden_size, use_bias=false)
    norm1: RMSNorm(c.hidden_size, c.eps)
    norm2: RMSNorm(c.hidden_size, c.eps)

    fn heads(x: [B, S, c.hidden_size]) -> [B, c.num_heads, S, c.head_dim] {{
        rearrange(x, "b s (h d) -> b h s d", h=c.num_heads)
    }}

    fn attend(x: [B, S, c.hidden_size], mask: bool[B, S, S]) -> [B, S, c.hidden_size] {{
        let q = heads(q_proj(x))
        let k = heads(k_proj(x))
        let v = heads(v_proj(x))
        let out = attention(q, k, v, mask, c.head_dim ** -0.5)
        o_proj(rearrange(out, "b h s d -> b s (h d)"))
    }}

    fn mlp(x: [B, S, c.hidden_size]) -> [B, S, c.hidden_size] {{
        let gate = silu(gate_proj(x))
        let up = up_proj(x)
        down_proj(gate * up)
    }}

    fn forward(h: [B, S, c.hidden_size], mask: bool[B, S, S]) -> [B, S, c.hidden_size] {{
        let x = h + attend(norm1(h), mask)
        x + mlp(norm2(x))
    }}
}}
"""


def generated_source(lines: int = 5000) -> str:
    parts = [CONFIG]
    i = 0
    while sum(p.count("\n") for p in parts) < lines:
        parts.append(MODULE.format(i=i))
        i += 1
    return "".join(parts)


def time_cli(runs: int) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's bytecode is cached after the first run
    cmd = [sys.executable, "-m", "linnet", "check", "examples"]
    subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True)
        times.append(time.perf_counter() - start)
        assert result.returncode == 0, result.stderr
    return {"min_s": min(times), "median_s": statistics.median(times), "runs": runs}


def time_big_file(edits: int) -> dict:
    std_library()
    text = generated_source()
    start = time.perf_counter()
    doc = Document("generated.linnet", text)
    analysis = doc.analyze()
    full = time.perf_counter() - start
    assert not analysis.diagnostics, analysis.diagnostics[:3]
    checks = analysis.stats.checks_run
    # one-line edits inside one function body, alternating to and fro
    anchors = [i for i in range(len(text)) if text.startswith("        let up = up_proj(x)", i)]
    times, rechecked = [], []
    for n in range(edits):
        # `up_proj(x)` becomes `up_proj((x))`, timed, then goes back (untimed)
        at = anchors[(n * 7) % len(anchors)] + len("        let up = up_proj(")
        t0 = time.perf_counter()
        doc.edit(at, at + 1, "(x)")
        a = doc.analyze()
        times.append(time.perf_counter() - t0)
        rechecked.append(a.stats.items_checked)
        doc.edit(at, at + 3, "x")
        doc.analyze()
    times.sort()
    return {
        "lines": text.count("\n"),
        "items": len(doc.items),
        "configs_checked": len(analysis.scenarios),
        "full_check_s": full,
        "full_checks_run": checks,
        "recheck_p50_s": times[len(times) // 2],
        "recheck_p95_s": times[int(len(times) * 0.95) - 1],
        "items_rechecked_per_edit": max(rechecked),
        "edits": edits,
    }


def calibration_s() -> float:
    """Seconds for a fixed pure-Python workload, measured beside the benchmark: this machine's
    speed varies by half from one minute to the next, and results are comparable only
    relative to it."""
    start = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i % 7
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--edits", type=int, default=60)
    args = parser.parse_args()
    result = {
        "benchmark": "check_speed",
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "versions": {"linnet": __import__("linnet").__version__, "lark": __import__("lark").__version__},
        "calibration_before_s": calibration_s(),
        "check_examples": time_cli(args.runs),
        "generated_5000_lines": time_big_file(args.edits),
        "calibration_after_s": calibration_s(),
        "goals": {"check_examples_s": 0.3, "recheck_s": 0.03},
    }
    out = ROOT / "bench" / "results" / "check_speed.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
