"""What scoping 64-bit types to Linnet's own calls costs a decode step (`linnet/compiler/jax/x64.py`), on the CPU.

Side by side in one process, interleaved in blocks: a decode step (`JaxStepModel.step`, B = 1, S = 1, the per-token
path `linnet generate` runs on the CPU) as shipped, the caller's flag off, so the step enters `jax.enable_x64(True)`
(`scoped`), against the same steps with the flag on for the whole process (`process-wide`: what Linnet did before
2026-12-06; each scoped call then only reads the flag, as the old `enable_x64()` did on each `jax_module()`). Both
run the same compiled executables. Also the bare cost of entering and leaving the context. Models: the small Llama of
the tests (2 layers, hidden 64: a step of well under a millisecond, where a fixed cost shows most) and SmolLM2-135M's
shape, both f32, random weights. Records CPU contention (Linux PSI's CPU wait over the run, load averages).

    PYTHONPATH=. python bench/x64_scope.py [--steps 200] [--out bench/results/x64_scope.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
from generate_speed import cpu_pressure_us, machine  # stdlib-only at import time (bench/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "examples" / "llama.linnet"
MODELS = {"small Llama (2 layers, hidden 64)": "small", "SmolLM2-135M shape": {"preset": "smollm2_135m"}}


def context_us(n: int = 200_000) -> float:
    """Microseconds to enter and leave `jax.enable_x64(True)` once (median of 5 runs of `n`)."""
    import jax

    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            with jax.enable_x64(True):
                pass
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def step_ms(sm, steps: int) -> list[float]:
    """Each decode step's milliseconds (one token in row 0 at positions 8, 9, ...)."""
    ids, row = np.ones((1, 1), np.int64), np.zeros(1, np.int64)
    out = []
    for i in range(steps):
        t = time.perf_counter()
        sm.step(ids, np.array([8 + i % 32], np.int64), row)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def measure(name: str, how: dict, steps: int, blocks: int) -> dict:
    import jax

    import linnet.jax as lj

    if how == "small":  # tests/runtimes/test_jax_backend.py's Llama (8 query heads over 2 KV heads)
        from tests.runtimes.test_jax_backend import SMALL

        how = {"config": SMALL}
    m = lj.load(LLAMA, max_positions=64, random_weights=True, seed=0, progress=False, **how)
    sm = m.step_model()
    times: dict[str, list[float]] = {"scoped": [], "process-wide": []}
    for _ in range(blocks):
        for side in times:
            jax.config.update("jax_enable_x64", side == "process-wide")
            try:
                step_ms(sm, 3)  # warm
                times[side] += step_ms(sm, steps)
            finally:
                jax.config.update("jax_enable_x64", False)
    row = {side: round(statistics.median(t), 4) for side, t in times.items()}
    row["difference_us"] = round((row["scoped"] - row["process-wide"]) * 1e3, 1)
    return {"model": name, "median_step_ms": row, "steps_each": steps * blocks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="decode steps a block")
    ap.add_argument("--blocks", type=int, default=5, help="blocks per side, interleaved")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "x64_scope.json")
    args = ap.parse_args(argv)
    import jax

    load0, wait0, t0 = os.getloadavg(), cpu_pressure_us(), time.perf_counter()
    record = {
        "what": __doc__.splitlines()[0],
        "machine": f"{machine()['processor']}, {os.cpu_count()} CPUs, jax {jax.__version__}",
        "enter_and_exit_us": round(context_us(), 3),
        "rows": [measure(name, how, args.steps, args.blocks) for name, how in MODELS.items()],
    }
    wall, wait1 = time.perf_counter() - t0, cpu_pressure_us()
    record["wall_s"] = round(wall, 1)
    record["cpu_wait_pct"] = None if wait0 is None or wait1 is None else round(100 * (wait1 - wait0) / 1e6 / wall, 1)
    record["loadavg_before"], record["loadavg_after"] = load0, os.getloadavg()
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
