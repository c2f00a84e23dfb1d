"""`linnet diff FILE --weights W [--reference transformers|diffusers|sentence-transformers]`: Linnet against the
reference implementation of the checkpoint, module by module (`linnet.runtimes.diff`).

Prints the first module, in execution order, whose output differs beyond the tolerance (where the source declares
it, the entry, max |Δ| and both shapes), then a summary of the rest. Exit 0 when every module compared agrees, 1 on
a difference (or a source Linnet cannot load on the weights), 2 when the reference cannot run (not installed, no
class for the checkpoint's architecture, a checkpoint it cannot read), no entry has a reference call, or for a
usage error. `--format json` prints the report as one JSON object (what the language server's lens reads).
"""

from __future__ import annotations

import argparse
import json
import sys

from linnet.cli.common import EXIT_ERRORS, EXIT_OK, EXIT_USAGE, FAILURES, UsageError, check_paths, fail, parse_config


def cmd_diff(args: argparse.Namespace) -> int:
    from linnet.runtimes.diff import diff_model
    from linnet.runtimes.diff.reference import ReferenceUnavailable

    try:
        check_paths(args)
        if not args.weights:
            raise UsageError("--weights is required: the checkpoint both sides load")
        if not args.tolerance >= 0:
            raise UsageError(f"--tolerance must be a number >= 0, got {args.tolerance}")
        config = parse_config(args.config)
    except FAILURES as err:
        return fail("diff", err)
    try:
        report = diff_model(args.file, args.weights, args.reference, args.preset, config, args.tolerance, args.seed)
    except ReferenceUnavailable as err:
        print(f"linnet diff: {err}", file=sys.stderr)
        return EXIT_USAGE
    except FAILURES as err:
        return fail("diff", err)
    if not report.modules:
        why = "; ".join(report.skipped)
        print(f"linnet diff: no entry of {args.file} has a reference call: {why}", file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        print(json.dumps(report.to_json()))
    else:
        print(format_text(report))
    return EXIT_ERRORS if report.differences else EXIT_OK


def format_text(report) -> str:
    """The report for a terminal: the run, the first difference as `path:line:col: error: ...`, the others one
    line each (at most 10, then a count), and what was compared."""
    from linnet.runtimes.backends.compare import format_delta

    entries = sorted({m.entry for m in report.modules})
    lines = [
        f"{report.file} against {report.reference} {report.architecture} on {report.weights} "
        f"(entries {', '.join(entries)}; tolerance {report.tolerance:g} x max(1, max |reference|))"
    ]
    diffs = report.differences
    for i, m in enumerate(diffs[:10]):
        where = f"{m.location[0]}:{m.location[1]}:{m.location[2]}: " if m.location else ""
        head = "error: first difference" if i == 0 else "  then"
        lines.append(
            f"{where}{head}: {m.label} ({m.entry}, call {m.call + 1}): max |Δ| {format_delta(m.max_abs_diff)} "
            f"(max |reference| {m.scale:.3g}), shapes {m.ours_shape} (Linnet) and {m.ref_shape} ({report.reference})"
        )
    if len(diffs) > 10:
        lines.append(f"  ... and {len(diffs) - 10} more differences")
    agree = len(report.modules) - len(diffs)
    worst = max((m.max_abs_diff for m in report.modules if m.agree and m.max_abs_diff is not None), default=0.0)
    lines.append(
        f"{len(report.modules)} module outputs compared: {agree} agree (largest max |Δ| among them {worst:.3g}), "
        f"{len(diffs)} differ"
    )
    lines += [f"skipped: {s}" for s in report.skipped]
    if report.not_compared:
        lines.append(f"not compared (shapes differ): {'; '.join(report.not_compared[:5])}")
    if report.only_linnet:
        lines.append(f"in Linnet only: {', '.join(report.only_linnet[:8])}")
    return "\n".join(lines)


def register(sub) -> None:
    """Add `linnet diff` to the `linnet` parser."""
    p = sub.add_parser("diff", help="compare every module with the reference implementation of the checkpoint")
    p.add_argument("file", metavar="FILE", help="a .linnet source with a root model")
    p.add_argument("--weights", metavar="W", help="HF directory, .gguf file or embedded id (required)")
    p.add_argument(
        "--reference",
        choices=("transformers", "diffusers", "sentence-transformers"),
        default="transformers",
        help="the library whose implementation of the checkpoint's architecture is the reference (transformers)",
    )
    p.add_argument("--preset", metavar="NAME", help="the preset the weights are for (default: the config's defaults)")
    p.add_argument("--config", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        metavar="ATOL",
        help="the max |Δ| of a module's output, times max(1, max |reference output|) (default 1e-4, f32)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (0)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_diff)
