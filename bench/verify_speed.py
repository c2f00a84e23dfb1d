"""`linnet verify` speed: writes bench/results/verify_speed.json.

The whole command in a fresh process (`python -m linnet verify ...`: imports, checking the source, loading with
seeded random weights, every check), wall and CPU seconds, on 2-layer shrunk models of three kinds (tests/runtimes/
verify_sizes.py's configs): a decoder (Llama, SmolLM2's preset), an encoder-decoder (Whisper tiny) and an encoder
with a mask (BERT); median of N runs, with the share of the time some task waited for a CPU (/proc/pressure/cpu), as
the machine is shared.

Goal (issue 40): under 10 s on a 2-layer shrunk model. Run: `python bench/verify_speed.py [--runs N]`. Timings live
here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.generate_speed import cpu_pressure_us, machine  # noqa: E402
from tests.runtimes.verify_sizes import SHRUNK, source  # noqa: E402

MODELS = {"llama": "smollm2_135m", "whisper": "whisper_tiny", "bert": "bert_base_uncased"}


def command(family: str, preset: str) -> list[str]:
    config = [arg for key, value in SHRUNK[family][0].items() for arg in ("--config", f"{key}={json.dumps(value)}")]
    return [sys.executable, "-m", "linnet", "verify", str(source(family)), "--preset", preset, *config]


def one_run(cmd: list[str]) -> dict:
    """One fresh process: wall seconds, its CPU seconds (user + system of the child), the exit status, and the CPU
    wait share meanwhile."""
    p0, c0, t0 = cpu_pressure_us(), os.times(), time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall, c1, p1 = time.perf_counter() - t0, os.times(), cpu_pressure_us()
    cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    wait = None if p0 is None or p1 is None else 100 * (p1 - p0) / 1e6 / wall
    return {"wall_s": wall, "cpu_s": cpu, "exit": done.returncode, "cpu_wait_pct": wait}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "verify_speed.json"))
    args = parser.parse_args()
    rows = []
    for family, preset in MODELS.items():
        runs = [one_run(command(family, preset)) for _ in range(args.runs)]
        row = {
            "model": f"{family} ({preset}, 2 layers shrunk)",
            "exit": sorted({r["exit"] for r in runs}),
            "wall_s_median": statistics.median(r["wall_s"] for r in runs),
            "wall_s_min": min(r["wall_s"] for r in runs),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
            "cpu_wait_pct_median": statistics.median(r["cpu_wait_pct"] or 0 for r in runs),
            "runs": runs,
        }
        rows.append(row)
        print(
            f"{row['model']}: wall {row['wall_s_median']:.1f} s (min {row['wall_s_min']:.1f}), CPU "
            f"{row['cpu_s_median']:.1f} s, CPU wait {row['cpu_wait_pct_median']:.0f} %, exit {row['exit']}"
        )
    result = {"when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": machine(), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
