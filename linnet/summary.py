"""`linnet check --summary`: what each preset costs (`linnet.ir.cost`), as an aligned text table or
JSON, and the number formats the language server's hover shares.

Units: parameters in K/M/G (10^3, 10^6, 10^9), bytes in KiB/MiB/GiB (2^10, 2^20, 2^30), FLOPs in
MFLOP/GFLOP/TFLOP (10^6, 10^9, 10^12). Loads the front end only (no backend, no torch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the IR loads with `--summary` alone: every `linnet check` builds the parser that imports this
    from .ir.cost import ProgramCost

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


def format_count(n: int) -> str:
    """A parameter count: `354`, `12.3 K`, `134.52 M`, `8.03 G`."""
    for scale, unit, digits in ((1e9, "G", 2), (1e6, "M", 2), (1e3, "K", 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return str(n)


def format_bytes(n: float) -> str:
    """A size in binary units: `512 B`, `45.0 KiB`, `513.1 MiB`, `14.96 GiB`."""
    for shift, unit, digits in ((40, "TiB", 2), (30, "GiB", 2), (20, "MiB", 1), (10, "KiB", 1)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.{digits}f} {unit}"
    return f"{int(n)} B"


def format_flops(n: float) -> str:
    """FLOPs in decimal units: `688.1 KFLOP`, `275.3 MFLOP`, `15.41 GFLOP`, `1.23 TFLOP`."""
    for scale, unit, digits in ((1e12, "TFLOP", 2), (1e9, "GFLOP", 2), (1e6, "MFLOP", 1), (1e3, "KFLOP", 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} FLOP"


def cost_lines(cost: ProgramCost) -> list[tuple[str, str]]:
    """(label, value) rows of the parameters and the KV cache, as the table and hover show them."""
    params = " · ".join(f"{format_bytes(b)} {dtype}" for dtype, b in cost.param_bytes.items())
    rows = [("parameters", f"{format_count(cost.param_count)} ({cost.param_count:,}): {params}")]
    if cost.kv_bytes:
        kv = (
            f"{format_bytes(cost.kv_bytes_per_token)} per token · {format_bytes(cost.kv_bytes)} at "
            f"{cost.max_batch} x {cost.max_positions} positions ({cost.dtype})"
        )
        if cost.kv_bytes_at_context is not None:
            kv += f" · {format_bytes(cost.kv_bytes_at_context)} for one row of {cost.context_positions:,} (context)"
        rows.append(("KV cache", kv))
    return rows


CONVENTION = (
    "FLOPs: 2 x multiply-adds of matmuls, attention's QK^T and AV included (over S keys in forward, over all",
    "max_positions cache positions in step); elementwise ops not counted. Peak activations: an upper estimate.",
)
ENTRY_COLUMNS = ("entry", "B x S", "FLOPs", "per token", "attention", "peak activations")


def entry_rows(cost: ProgramCost) -> list[tuple[str, ...]]:
    """One row per entry run (`ENTRY_COLUMNS`): total FLOPs, FLOPs per token, the attention's
    share, and the peak activation estimate."""
    return [
        (
            e.entry,
            f"{e.batch} x {e.seq_len}",
            format_flops(e.flops),
            format_flops(e.flops_per_token),
            f"{100 * e.attention_flops / e.flops:.0f}%" if e.flops else "-",
            format_bytes(e.peak_activation_bytes),
        )
        for e in cost.entries
    ]


def render_table(path: str, cost: ProgramCost) -> str:
    """The text form: a header, the parameter and KV-cache lines, the entries as aligned columns
    (numbers right-aligned), and the conventions in one footnote."""
    preset = f"preset {cost.preset}" if cost.preset else "config defaults"
    header = f"{path}: {cost.model}, {preset} ({sizes_text(cost)})"
    return "\n".join([header] + [f"  {line}" for line in table_lines(cost)])


def sizes_text(cost: ProgramCost) -> str:
    return f"dtype {cost.dtype}, max_batch {cost.max_batch}, max_positions {cost.max_positions}"


def table_lines(cost: ProgramCost) -> list[str]:
    """The table's lines without the header or indentation (hover shows them in a code block)."""
    out = []
    lines = cost_lines(cost)
    width = max(len(label) for label, _ in lines)
    out += [f"{label.ljust(width)}  {value}" for label, value in lines]
    rows = [ENTRY_COLUMNS, *entry_rows(cost)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(ENTRY_COLUMNS))]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        out.append("  ".join(cells).rstrip())
    out += [f"{name}: not costed ({why})" for name, why in cost.skipped.items()]
    return out + list(CONVENTION)


def add_arguments(check: argparse.ArgumentParser) -> None:
    """`--summary` and the sizes it is computed at, on `linnet check`."""
    check.add_argument("--summary", action="store_true", help="print what each preset costs (parameters, FLOPs, KV)")
    check.add_argument("--seq-len", type=int, metavar="N", help="tokens per sequence for FLOPs (max_positions)")
    check.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32", help="working dtype (f32)")
    check.add_argument("--max-positions", type=int, default=768, metavar="N", help="cache positions per row (768)")
    check.add_argument("--max-batch", type=int, default=1, metavar="N", help="cache rows, the batch costed (1)")


def cmd_summary(args: argparse.Namespace, files: list[Path]) -> int:
    """Print the summary of every file with a root model, under `args.preset` or each preset it
    declares (the config defaults when it declares none). A file that does not check prints its
    diagnostics on stderr and makes the exit status 1; bad sizes are a usage error (2)."""
    from .errors import SourceError
    from .ir.build import lower_analysis, read_source
    from .ir.cost import program_cost
    from .semantics.program import Document

    for flag, value in (("--seq-len", args.seq_len), ("--max-positions", args.max_positions)):
        if value is not None and value < 1:
            print(f"linnet check: {flag} must be at least 1, got {value}", file=sys.stderr)
            return EXIT_USAGE
    if args.max_batch < 1:
        print(f"linnet check: --max-batch must be at least 1, got {args.max_batch}", file=sys.stderr)
        return EXIT_USAGE
    status, found, tables, records = EXIT_OK, False, [], []
    for f in files:
        try:
            path, text = read_source(f)
        except (OSError, SourceError) as err:
            print(f"linnet check: {err}", file=sys.stderr)
            status = max(status, EXIT_USAGE)
            continue
        analysis = Document(path, text).analyze()
        if analysis.model is None:
            continue  # a library file: nothing to cost
        presets = analysis.declared_presets if args.preset is None else [args.preset]
        presets = [p for p in presets if p in analysis.declared_presets] or ([None] if args.preset is None else [])
        for preset in presets:
            found = True
            try:
                program = lower_analysis(
                    analysis, preset, dtype=args.dtype, max_batch=args.max_batch, max_positions=args.max_positions
                )
            except SourceError as err:  # errors (the same under every preset: reported once)
                print(f"linnet check: {err}", file=sys.stderr)
                status = max(status, EXIT_ERRORS)
                break
            cost = program_cost(program, args.seq_len)
            tables.append(render_table(str(f), cost))
            records.append({"path": str(f), **cost.as_json()})
    if args.preset is not None and not found and status == EXIT_OK:
        print(f"linnet check: no model declares preset `{args.preset}`", file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        print(json.dumps(records, indent=2))
    elif tables:
        print("\n\n".join(tables))
    return status
