"""What streaming layers costs where the "transfer" is a host memcpy: `--cpu-offload-gb` on the CPU (jax backend,
f32), SmolLM2-135M's shape with seeded random weights, with none, half and all of its 30 layers held in pinned host
memory, side by side in one run. The CPU has no host link to wait for, so the difference is the driver's own cost
(a program and a `device_put` a layer, and the wait for each: linnet/runtimes/backends/jax_offload.py) and the copy.

    python bench/offload_cpu.py [--out bench/results/offload_cpu.json]

Each configuration: a 32-token prompt, 32 greedy new tokens, 3 timed runs after a warm-up (median decode tok/s),
greedy tokens against the resident model's, and how contended the machine was (`generate_speed.timed_runs`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RUNS, PROMPT, NEW = 3, 32, 32


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "offload_cpu.json")
    args = ap.parse_args(argv)
    import generate_speed as gs

    import linnet
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    ids = np.random.default_rng(2).integers(0, 49152, PROMPT).tolist()
    rows, reference = [], None
    for label, cap in (("resident", None), ("15 of 30 layers offloaded", 0.2), ("30 of 30 layers offloaded", 1.0)):
        options = {} if cap is None else {"cpu_offload_gb": cap}
        model = linnet.load(
            ROOT / "examples" / "llama.linnet", backend="jax", preset="smollm2_135m", random_weights=True, seed=0,
            max_positions=PROMPT + NEW, progress=False, **options,
        )  # fmt: skip
        g = Generator(model.step_model(), None)
        g.warm_up(PROMPT)
        g.generate(ids, SamplingParams(max_new_tokens=NEW))
        gs.wait_for_quiet(30)
        results, contention = gs.timed_runs(lambda g=g: g.generate(ids, SamplingParams(max_new_tokens=NEW)), RUNS)
        tokens = results[0].token_ids
        reference = reference or tokens
        plan = model.offload
        rows.append(
            {
                "config": label,
                "offloaded_mb": 0 if plan is None else round(plan.offloaded_bytes / 1e6, 1),
                "decode_tok_s": round(statistics.median(r.decode_tokens_per_s for r in results), 2),
                "ttft_ms": round(statistics.median(r.prefill_s for r in results) * 1e3, 1),
                "greedy_equal_to_resident": tokens == reference,
                **{k: round(v, 2) if isinstance(v, float) else v for k, v in contention.items()},
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    out = {"bench": "offload_cpu", "date": time.strftime("%Y-%m-%d %H:%M"), "machine": gs.machine()}
    out |= {"loadavg_end": os.getloadavg(), "prompt": PROMPT, "new_tokens": NEW, "runs": RUNS, "rows": rows}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
