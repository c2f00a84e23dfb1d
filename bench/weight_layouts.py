"""Which memory layout of an f32 weight the generated PyTorch module's `linear` reads fastest, by matrix shape and rows.

The generated module's `linear` (linnet/compiler/torch/prelude.py) runs up to 16 f32 rows on the CPU as
blocks in one `torch.bmm`: blocks of the weight's rows when it is stored [N, K] (the checkpoint's layout), blocks of K
when it is held transposed ([K, N] in memory; `fusion.hold_wide_weights_transposed` picks which weights a `fast` module
holds so). This measures both, and `F.linear` on both, for SmolLM2-135M's matrix shapes at 1, 2, 4, 16 and 512 rows; and
the layers that read one input (q, k and v; gate and up) apart, each weight in the layout the module holds it in alone
and run by `linear`, against joined, the weights adjacent in one buffer held transposed and run by the module's
`linears` (what an f32 `fast` module does: `codegen.module_passes`), at 1 and 2 rows.

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


def _matrices(n: int, k: int, copies: int):
    """A seeded generator, `copies` random [n, K] weights (scaled 1 / sqrt(K)) and as many flat buffers to lay
    them out in."""
    import torch

    generator = torch.Generator().manual_seed(n * k)
    sources = [torch.randn(n, k, generator=generator) / k**0.5 for _ in range(copies)]
    return generator, sources, [torch.empty(n * k) for _ in range(copies)]


def measure(rounds: int, threads: int) -> list[dict]:
    """One row per shape, rows, layout and function: median µs a call over `rounds`, and the error from f64."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    linear = generated_linear()
    out = []
    for name, ((n, k), per_step) in SHAPES.items():
        copies = 1 if n * k > 8_000_000 else COPIES
        generator, sources, buffers = _matrices(n, k, copies)
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


# SmolLM2-135M's linear layers that read one input, [N, K] each; each group runs once a layer, 30 a step
GROUPS = {
    "q_proj, k_proj, v_proj": [(576, 576), (192, 576), (192, 576)],
    "gate_proj, up_proj": [(1536, 576), (1536, 576)],
}
JOINED_ROWS = (1, 2)
ARRANGEMENTS = ("apart", "joined")


def measure_joined(rounds: int, threads: int, groups: dict = GROUPS, copies: int = COPIES) -> list[dict]:
    """One row per group, rows and arrangement: median µs a group over `rounds`, and the error from f64. Each copy's
    group lies in one buffer of sum N × K floats, refilled in the arrangement under test: apart, each weight [N, K]
    in memory (or [K, N] where N > K, as `fusion.hold_wide_weights_transposed` holds a wide weight alone), one `linear`
    each; joined, [K, sum N] in memory, one `linears`."""
    import torch

    torch.set_num_threads(threads)
    linear, linears = generated_linear(), generated_linear("linears")
    out = []
    for name, shapes in groups.items():
        k = shapes[0][1]
        sizes = [n for n, _ in shapes]
        total = sum(sizes)
        generator, sources, buffers = _matrices(total, k, copies)
        for rows in JOINED_ROWS:
            x = torch.randn(rows, k, generator=generator)
            ref = (x.double() @ sources[0].double().t()).float()
            times: dict[str, list[float]] = {}
            errors: dict[str, float] = {}
            for r in range(rounds):
                for arrangement in ARRANGEMENTS if r % 2 == 0 else ARRANGEMENTS[::-1]:
                    joined = arrangement == "joined"
                    if joined:
                        groups_now = [_rows_of(b.view(k, total).copy_(s.t()), sizes) for b, s in zip(buffers, sources)]
                    else:
                        groups_now = [_apart(b, s, sizes, k) for b, s in zip(buffers, sources)]
                    with torch.inference_mode():
                        first = groups_now[0]  # warm, and checked
                        y = torch.cat(linears(x, first) if joined else [linear(x, w) for w in first], -1)
                        errors[arrangement] = float((y - ref).abs().max() / ref.abs().max())
                        start = time.perf_counter()
                        for weights in groups_now:
                            if joined:
                                linears(x, weights)
                            else:
                                for w in weights:
                                    linear(x, w)
                        times.setdefault(arrangement, []).append((time.perf_counter() - start) / copies)
            for arrangement, ts in times.items():
                us = statistics.median(ts) * 1e6
                out.append({
                    "group": name, "shapes": [list(s) for s in shapes], "rows": rows, "arrangement": arrangement,
                    "us_per_group": round(us, 1), "ms_per_step": round(us * 30 / 1e3, 3),
                    "max_rel_error": errors[arrangement], "rounds_us": [round(t * 1e6, 1) for t in ts],
                })  # fmt: skip
    return out


def _rows_of(kn, sizes: list[int]) -> tuple:
    """The weights [n, K] that are consecutive column blocks of `kn` ([K, sum n] in memory)."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(kn[:, start : start + n].t() for start, n in zip(starts, sizes))


def _apart(buffer, source, sizes: list[int], k: int) -> tuple:
    """Each weight in its own stretch of `buffer`, [n, K] in memory or [K, n] where n > K."""
    weights, offset, start = [], 0, 0
    for n in sizes:
        part, rows = buffer[offset : offset + n * k], source[start : start + n]
        weights.append(part.view(k, n).copy_(rows.t()).t() if n > k else part.view(n, k).copy_(rows))
        offset, start = offset + n * k, start + n
    return tuple(weights)


def joined_table(rows: list[dict]) -> list[str]:
    lines = [
        "| layers (one input) | rows | apart µs | joined µs | joined / apart | ms a step saved (30 layers) "
        "| max rel error (joined) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["group"], r["rows"], r["arrangement"]): r for r in rows}
    for name, count in dict.fromkeys((r["group"], r["rows"]) for r in rows):
        apart, joined = by[(name, count, "apart")], by[(name, count, "joined")]
        ratio = joined["us_per_group"] / apart["us_per_group"]
        saved = apart["ms_per_step"] - joined["ms_per_step"]
        lines.append(
            f"| {name} | {count} | {apart['us_per_group']} | {joined['us_per_group']} | {ratio:.2f} | {saved:.2f} "
            f"| {joined['max_rel_error']:.1e} |"
        )
    return lines


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
    joined = measure_joined(args.rounds, args.threads)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "rounds": args.rounds,
        "rows": rows,
        "joined": joined,
    }
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    md = [f"# f32 weight layouts for the generated `linear` ({result['when']}, {args.threads} threads, median of "
          f"{args.rounds} rounds, same memory refilled per layout)", "", *table(rows), "",
          "Linear layers that read one input, apart (each weight in its own layout, one `linear` each) and joined "
          "(adjacent in one buffer held transposed, one `linears`), the same memory refilled in each:", "",
          *joined_table(joined), ""]  # fmt: skip
    Path(args.out + ".md").write_text("\n".join(md), encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
