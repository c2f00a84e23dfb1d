"""Which memory layout of an f32 weight the generated PyTorch module's `linear` reads fastest, by matrix shape and rows.

The generated module's `linear` (compiler/torch/codegen.py, `LINEAR`) runs up to 16 f32 rows on the CPU as blocks in
one `torch.bmm`: blocks of the weight's rows when it is stored [N, K] (the checkpoint's layout), blocks of K when it
is held transposed ([K, N] in memory; `codegen.stored_transposed` picks which weights a `fast` module holds so).
This measures both, and `F.linear` on both, for SmolLM2-135M's matrix shapes at 1, 2, 4, 16 and 512 rows.

Only same-memory comparisons count on a VM whose speed depends on where its pages lie (two loads of one model
differed by 20 % in decode step time here): each shape's buffers are allocated once and refilled in the layout under
test before it is timed, layouts alternating in each round, and each row is the median of the rounds. Every row
keeps its distance from reference: the largest |y - y_ref| / max |y_ref| against the product in f64.

    .venv/bin/python bench/weight_layouts.py [--rounds 7] [--out bench/results/weight_layouts]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from weight_streaming import generated_linear  # the module's own `linear`, from its text (bench/ runs as scripts)

# SmolLM2-135M's matrices, [N, K], and how many of each one decode step reads (30 layers and the tied head)
SHAPES = {
    "q_proj/o_proj": ((576, 576), 60),
    "k_proj/v_proj": ((192, 576), 60),
    "gate_proj/up_proj": ((1536, 576), 60),
    "down_proj": ((576, 1536), 30),
    "lm_head (tied)": ((49152, 576), 1),
}
ROWS = (1, 2, 4, 16, 512)
COPIES = 24  # distinct matrices of a shape per timed pass, so that a pass reads ~80 MB, past the 32 MB L3
LAYOUTS = ("[N, K]", "[K, N] (transposed)")


def measure(rounds: int, threads: int) -> list[dict]:
    """One row per shape, rows, layout and function: median µs a call over `rounds`, and the error from f64."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    linear = generated_linear()
    out = []
    for name, ((n, k), per_step) in SHAPES.items():
        copies = 1 if n * k > 8_000_000 else COPIES
        generator = torch.Generator().manual_seed(n * k)
        sources = [torch.randn(n, k, generator=generator) / k**0.5 for _ in range(copies)]
        buffers = [torch.empty(n * k) for _ in range(copies)]
        for rows in ROWS:
            x = torch.randn(rows, k, generator=generator)
            ref = (x.double() @ sources[0].double().t()).float()
            times: dict[tuple[str, str], list[float]] = {}
            errors: dict[tuple[str, str], float] = {}
            for r in range(rounds):
                for layout in LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]:
                    if layout == LAYOUTS[0]:
                        weights = [b.view(n, k).copy_(s) for b, s in zip(buffers, sources)]
                    else:
                        weights = [b.view(k, n).copy_(s.t()).t() for b, s in zip(buffers, sources)]
                    for fn_name, fn in (("linear", linear), ("F.linear", F.linear)):
                        y = fn(x, weights[0])  # warm, and checked
                        errors[(layout, fn_name)] = float((y - ref).abs().max() / ref.abs().max())
                        start = time.perf_counter()
                        for w in weights:
                            fn(x, w)
                        times.setdefault((layout, fn_name), []).append((time.perf_counter() - start) / copies)
            for (layout, fn_name), ts in times.items():
                us = statistics.median(ts) * 1e6
                out.append({
                    "matrix": name, "shape": [n, k], "rows": rows, "layout": layout, "function": fn_name,
                    "us_per_call": round(us, 1), "ms_per_step": round(us * per_step / 1e3, 3),
                    "gb_s": round(n * k * 4 / (us * 1e-6) / 1e9, 1), "max_rel_error": errors[(layout, fn_name)],
                    "rounds_us": [round(t * 1e6, 1) for t in ts],
                })  # fmt: skip
    return out


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| matrix [N, K] | rows | linear on [N, K] µs | linear on [K, N] µs | F.linear on [N, K] µs "
        "| F.linear on [K, N] µs | max rel error (linear, [K, N]) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["matrix"], r["rows"], r["layout"], r["function"]): r for r in rows}
    for name, ((n, k), _) in SHAPES.items():
        for count in ROWS:
            cell = [by[(name, count, layout, fn)]["us_per_call"] for fn in ("linear", "F.linear") for layout in LAYOUTS]
            error = by[(name, count, LAYOUTS[1], "linear")]["max_rel_error"]
            lines.append(f"| {name} [{n}, {k}] | {count} | {' | '.join(str(c) for c in cell)} | {error:.1e} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "weight_layouts"))
    args = parser.parse_args()
    import torch

    rows = measure(args.rounds, args.threads)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "rounds": args.rounds,
        "rows": rows,
    }
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    md = [f"# f32 weight layouts for the generated `linear` ({result['when']}, {args.threads} threads, median of "
          f"{args.rounds} rounds, same memory refilled per layout)", "", *table(rows), ""]  # fmt: skip
    Path(args.out + ".md").write_text("\n".join(md), encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
