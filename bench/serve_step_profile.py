"""Where a batched decode step's time goes: Linnet's generated PyTorch `step` beside transformers' cached forward.

Issue 42 asks `linnet serve` for 1.5x transformers' static-batch `generate` at concurrency 8 and 32 on SmolLM2-135M
(f32, one torch thread each side). A serving engine can only win what the model step leaves to win, so this measures
the step itself at the batch sizes the serving benchmark runs, in one process, the sides alternating:

- `linnet`: the torch backend's `step` of B rows (`--max-batch 32`, `equivalent` numerics) decoding one token at
  position P of each row (rows prefilled with P prompt tokens), as the serving engine calls it;
- `transformers`: `LlamaForCausalLM.forward` of B rows of one token over a `DynamicCache` holding P positions
  (cropped back after each call), as `generate` calls it;
- `gemms_alone`: the same matrix products alone (`F.linear` on the checkpoint's weights at B rows: q, k, v, o,
  gate, up, down for every layer and the tied head), what no step can go below without other weights or threads.

Per side: the minimum and median over `--rounds` timed calls, and torch.profiler's self CPU time of a few calls
split into matrix products (`aten::mm`, `addmm`, `bmm`), attention (`scaled_dot_product`) and the rest, with the CPU
wait (Linux PSI) of the timed calls. Timings live here, never in tests.

Run: `python bench/serve_step_profile.py [--batch 8,32] [--positions 32] [--rounds 7] [--out PATH]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import generate_speed as gs  # noqa: E402  (bench/ is not a package)

THREADS = 1  # the setting on both sides


def timed(fn, rounds: int) -> dict:
    """`fn` once untimed, then `rounds` times: min and median ms, and the CPU wait % over the timed calls."""
    fn()
    times, pressure, start = [], gs.cpu_pressure_us(), time.perf_counter()
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    wall = time.perf_counter() - start
    after = gs.cpu_pressure_us()
    wait = None if pressure is None or after is None else 100 * (after - pressure) / 1e6 / wall
    return {"min_ms": min(times), "median_ms": statistics.median(times), "cpu_wait_pct": wait}


def op_shares(fn, calls: int = 3) -> dict:
    """torch.profiler's self CPU time of `calls` calls of `fn`, as shares: matrix products, attention, the rest."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    groups = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        name = event.key
        group = "matmul" if name in ("aten::mm", "aten::addmm", "aten::bmm") else "other"
        group = "attention" if "scaled_dot_product" in name else group
        groups[group] += event.self_cpu_time_total
    total = sum(groups.values()) or 1.0
    return {f"{k}_share": v / total for k, v in groups.items()} | {"ms_per_call": total / 1e3 / calls}


def sides(batch: int, positions: int, linnet_model, hf) -> dict:
    """The three callables at `batch` rows, each decoding at position `positions` after a prefill."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    ids = np.random.default_rng(0).integers(100, 10_000, (batch, positions), dtype=np.int64)
    rows = np.arange(batch, dtype=np.int64)
    linnet_model.step(ids, np.zeros(batch, np.int64), rows)
    token, at = ids[:, -1:], np.full(batch, positions, np.int64)
    with torch.inference_mode():
        cache = hf(torch.from_numpy(ids), use_cache=True, logits_to_keep=1).past_key_values
    hf_token = torch.from_numpy(token)

    def hf_step():
        with torch.inference_mode():
            hf(hf_token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-1)

    x, inner = torch.randn(batch, hf.config.hidden_size), torch.randn(batch, hf.config.intermediate_size)

    def gemms():
        with torch.inference_mode():
            for layer in hf.model.layers:
                a, m = layer.self_attn, layer.mlp
                for w in (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight):
                    F.linear(x, w)
                F.linear(x, m.gate_proj.weight), F.linear(x, m.up_proj.weight), F.linear(inner, m.down_proj.weight)
            F.linear(x, hf.lm_head.weight)

    return {"linnet": lambda: linnet_model.step(token, at, rows), "transformers": hf_step, "gemms_alone": gemms}


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        "# One batched decode step: Linnet's generated PyTorch beside transformers",
        "",
        f"Written by `bench/serve_step_profile.py` ({result['date']}). SmolLM2-135M-Instruct (embedded GGUF, "
        f"dequantized to f32), {s['threads']} torch thread, one decode token per row at position {s['positions']}, "
        f"{s['rounds']} timed calls per side and batch, the sides alternating. Machine: "
        f"{result['machine']['processor']}, {result['machine']['cpus']} CPUs, shared.",
        *(["", result["note"]] if result.get("note") else []),
        "",
        "| B | side | min ms | median ms | CPU wait % | matmul / attention / other (profiler self CPU) |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for row in result["rows"]:
        shares = row.get("profile")
        split = (
            f"{100 * shares['matmul_share']:.0f} / {100 * shares['attention_share']:.0f} / "
            f"{100 * shares['other_share']:.0f} %"
            if shares
            else "(matrix products only)"
        )
        wait = row["cpu_wait_pct"]
        lines.append(
            f"| {row['batch']} | {row['side']} | {row['min_ms']:.1f} | {row['median_ms']:.1f} | "
            f"{'-' if wait is None else f'{wait:.0f}'} | {split} |"
        )
    return "\n".join(lines + [""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="8,32", help="batch sizes (rows decoding together)")
    parser.add_argument("--positions", type=int, default=32, help="positions each row holds before the step")
    parser.add_argument("--rounds", type=int, default=7, help="timed calls per side and batch size")
    parser.add_argument("--note", help="a note for the results (contention, what changed)")
    parser.add_argument("--out", type=Path, help="results path without suffix (default bench/results/...)")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from linnet.runtimes.backends import get_backend

    torch.set_num_threads(THREADS)
    batches = [int(b) for b in args.batch.split(",")]
    linnet = get_backend("torch").load(str(gs.SOURCE), None, preset="smollm2_135m", max_batch=max(batches))
    torch.set_num_threads(THREADS)  # loading may choose its own count
    hf = AutoModelForCausalLM.from_pretrained(gs.gguf_dir(), gguf_file=gs.GGUF_NAME, dtype=torch.float32).eval()
    result = {
        "benchmark": "serve_step_profile",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": gs.machine(),
        "versions": gs.versions(),
        "settings": {"threads": THREADS, "positions": args.positions, "rounds": args.rounds, "batches": batches},
        **({"note": args.note} if args.note else {}),
        "rows": [],
    }
    for batch in batches:
        calls = sides(batch, args.positions, linnet.step_model(), hf)
        # alternate: one call of each side per round, so contention falls on all three alike
        rounds = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                rounds[name].append(timed(fn, 1))
        for name, fn in calls.items():
            times = [r["min_ms"] for r in rounds[name]]
            waits = [r["cpu_wait_pct"] for r in rounds[name] if r["cpu_wait_pct"] is not None]
            row = {"batch": batch, "side": name, "min_ms": min(times), "median_ms": statistics.median(times)}
            row["cpu_wait_pct"] = statistics.mean(waits) if waits else None
            if name != "gemms_alone":
                row["profile"] = op_shares(fn)
            result["rows"].append(row)
            print(row, file=sys.stderr, flush=True)
    gs.write_results(result, args.out or ROOT / "bench" / "results" / "serve_step_profile", markdown)


if __name__ == "__main__":
    main()
