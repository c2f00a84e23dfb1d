"""What a hover on a module's parameters computes after each edit (issue 45: hover p99 <= 10 ms): writes
bench/results/cost_hover.json.

The language server's cost hover (linnet/lsp/costs.py) lowers the analysed model under the preset shown
(`lower_analysis`) and costs the program (`program_cost`), once per analysis: the first such hover after an edit
pays both on the request path. For each example, a fresh process per tree analyses it once, then lowers and costs
it `--runs` times (the first lowering in a process also imports and warms the IR: reported apart), and reports the
milliseconds of each step, p50 and max over the runs after the first.

`--peer DIR` runs the same in DIR's checkout (e.g. main before a change), the trees alternating. Every row holds
the cost's JSON digest: rows of the two trees with the same digest computed the same costs (the distance from the
reference, here the peer, is nil).
Run: `python bench/cost_hover.py [--peer DIR] [--runs N] [--examples NAME ...] [--out PATH]`. Timings live here,
never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from generate_speed import machine  # noqa: E402  (stdlib-only at import time)
from lsp_latency import pressure_snapshot  # noqa: E402

EXAMPLES = ("gpt_oss", "llama", "bert")

# one tree, one example: run in a fresh process whose path starts with that tree
WORKLOAD = """
import hashlib, json, sys, time
from linnet.semantics.program import Workspace
from linnet.ir.build import lower_analysis
from linnet.ir.cost import program_cost
path, runs = sys.argv[1], int(sys.argv[2])
analysis = Workspace().open(path, open(path, encoding="utf-8").read()).analyze(None)
preset = analysis.presets[0] if analysis.presets else None
rows = []
for _ in range(runs):
    t0 = time.perf_counter()
    program = lower_analysis(analysis, preset)
    t1 = time.perf_counter()
    cost = program_cost(program)
    t2 = time.perf_counter()
    rows.append(((t1 - t0) * 1000, (t2 - t1) * 1000))
digest = hashlib.sha256(json.dumps(cost.as_json(), sort_keys=True).encode()).hexdigest()[:16]
print(json.dumps({"preset": preset, "runs_ms": rows, "cost_digest": digest}))
"""


def run_tree(tree: Path, example: str, runs: int) -> dict:
    """One process of `tree` lowering and costing examples/`example`.linnet `runs` times."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    path = tree / "examples" / f"{example}.linnet"
    command = [sys.executable, "-c", WORKLOAD, str(path), str(runs)]
    # (run in `tree`: `python -c` puts the working directory first on the path, ahead of PYTHONPATH)
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    later = out["runs_ms"][1:]
    return {
        "tree": str(tree),
        "example": example,
        "preset": out["preset"],
        "first_lower_ms": round(out["runs_ms"][0][0], 1),
        "first_cost_ms": round(out["runs_ms"][0][1], 1),
        "lower_ms_p50": round(statistics.median(r[0] for r in later), 1),
        "lower_ms_max": round(max(r[0] for r in later), 1),
        "cost_ms_p50": round(statistics.median(r[1] for r in later), 1),
        "cost_ms_max": round(max(r[1] for r in later), 1),
        "cost_digest": out["cost_digest"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", type=Path, help="also run this checkout (e.g. main before a change)")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cost_hover.json")
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs is at least 2 (the first run is reported apart)")
    trees = [ROOT] + ([args.peer.resolve()] if args.peer else [])
    before = pressure_snapshot().get("avg60")  # (Linux PSI: % of the last 60 s some task waited for a CPU)
    rows = [run_tree(tree, example, args.runs) for example in args.examples for tree in trees]
    result = {
        "machine": machine(),
        "cpu_wait_pct_before": before,
        "cpu_wait_pct_after": pressure_snapshot().get("avg60"),
        "runs": args.runs,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for row in rows:
        print(
            f"{row['example']:>8} {Path(row['tree']).name:>8}  lower p50 {row['lower_ms_p50']:7.1f} ms  "
            f"cost p50 {row['cost_ms_p50']:7.1f} ms  (max {row['cost_ms_max']:.1f})  {row['cost_digest']}"
        )


if __name__ == "__main__":
    main()
