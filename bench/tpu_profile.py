"""Where a decode step's time goes on the TPU: one greedy generation of bench/tpu.py's SmolLM2-135M shape (bf16,
seeded random weights, the device decode loop) under `jax.profiler.trace` with a Perfetto trace, summed by device op.

    python bench/tpu_profile.py --out DIR [--shape smollm2-135m] [--new 128]   on the TPU (bench/tpu.sh's install)
    python bench/tpu_profile.py --out DIR --dry-run                             the CPU, tiny sizes

Writes DIR/ops.json (each device op name: total µs, count, µs per decode step) and DIR/trace (the profile), and prints
the top rows. LINNET_SCAN_LAYERS picks scanned/unrolled; `XLA_FLAGS=--xla_dump_to=D --xla_dump_hlo_as_text
--xla_dump_hlo_module_re=.*jit_run.*` dumps the decode loop's optimized HLO.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tpu  # noqa: E402  (bench/tpu.py: its shapes, loader and random weights)


def summarize(trace_dir: Path, steps: int) -> list[dict]:
    """Device ops of the Perfetto trace under `trace_dir`, summed by name, longest first."""
    files = sorted(trace_dir.rglob("perfetto_trace.json.gz"))
    if not files:
        return []
    data = json.loads(gzip.open(files[-1]).read())
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            names[(e.get("pid"), e.get("tid") if e["name"] == "thread_name" else None)] = e["args"]["name"]
    total: dict[tuple, list] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") != "X":
            continue
        process = names.get((e.get("pid"), None), "")
        thread = names.get((e.get("pid"), e.get("tid")), "")
        if "TPU" not in process and "/device" not in process:
            continue
        key = (thread, e.get("name", ""))
        total[key][0] += float(e.get("dur", 0))
        total[key][1] += 1
    rows = [
        {"thread": t, "op": n, "total_us": round(us, 1), "count": c, "us_per_step": round(us / steps, 2)}
        for (t, n), (us, c) in total.items()
    ]
    return sorted(rows, key=lambda r: -r["total_us"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="smollm2-135m", choices=tuple(tpu.SHAPES))
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    import jax

    import linnet.runtimes.loading as loading

    loading.random_params = tpu.fast_random_params
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry_run else "tpu"
    prompt = 64 if args.dry_run else 512
    m = tpu.load(args.shape, args.dry_run, device=device, dtype="bf16", max_positions=prompt + args.new)
    ids = np.random.default_rng(2).integers(0, m.vocab_size, prompt).astype(np.int64)
    result, _ = tpu.greedy(m, ids, args.new, decode_loop=True)  # compiled and run once
    trace_dir = Path(tempfile.mkdtemp(prefix="linnet-profile-"))
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    g = Generator(m.step_model(decode_loop=True), None)
    g.generate(ids.tolist(), SamplingParams(max_new_tokens=args.new))
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        timed = g.generate(ids.tolist(), SamplingParams(max_new_tokens=args.new))
    rows = summarize(trace_dir, args.new - 1)
    step_ms = 1e3 / timed.decode_tokens_per_s if timed.decode_tokens_per_s else None
    (args.out / "ops.json").write_text(json.dumps({"ms_per_step": step_ms, "rows": rows}, indent=1))
    for f in trace_dir.rglob("*"):
        if f.is_file() and f.stat().st_size < 40_000_000:
            target = args.out / "trace" / f.relative_to(trace_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes())
    print(f"ms a step: {step_ms}")
    for r in rows[:40]:
        print(f"{r['us_per_step']:9.2f} us/step {r['count']:7d}x  {r['thread'][:24]:24s} {r['op'][:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
