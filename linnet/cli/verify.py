"""`linnet verify`: the source agrees with itself (`linnet.runtimes.verify`): exit 0 when every pair of computations
its entries promise agree, 1 naming the entries, the first position and the first module whose outputs part, 2 when
it cannot run (usage, a source with errors, an unknown preset, nothing to compare)."""

from __future__ import annotations

import argparse
import json
import sys

from linnet.cli.common import (
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_USAGE,
    FAILURES,
    add_common,
    check_paths,
    parse_config,
    parse_dims,
    use_default_preset,
)


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        check_paths(args)
        config = parse_config(args.config)
        dims = parse_dims(args.dim)
        use_default_preset(args)
        from linnet.runtimes.verify import verify

        report = verify(
            args.file, args.weights, preset=args.preset, config=config, dtype=args.dtype, numerics=args.numerics,
            backend=args.backend, device=args.device, dims=dims, seed=args.seed, max_batch=args.max_batch,
            max_positions=args.max_positions,
        )  # fmt: skip
    except FAILURES as err:  # it could not run: the source, the preset, the weights, nothing to compare
        print(f"linnet verify: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        print(json.dumps(report.to_json()))
    else:
        for note in report.notes:
            print(f"note: {note}", file=sys.stderr)
        sys.stdout.write(report.format_text())
    return EXIT_OK if report.agree else EXIT_ERRORS


def register(sub) -> None:
    """Add `verify` to the `linnet` parser."""
    p = sub.add_parser(
        "verify",
        help="check that the source agrees with itself: forward against cached steps, batched against one row, "
        "padded against unpadded, an encoder-decoder's forward against encode + decode steps",
    )
    add_common(p, max_batch=2)
    p.set_defaults(max_positions=32, func=cmd_verify)
    p.add_argument("--backend", choices=("torch", "torch-interpret"), default="torch", help="(default torch)")
    p.add_argument("--seed", type=int, default=0, help="of the random weights and inputs (0)")
    p.add_argument("--dim", action="append", metavar="NAME=SIZE", help="size of a dim variable other than B and S (8)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.description = (
        "Runs every pair of computations the entries promise agree, on --weights or seeded random ones, and "
        "compares them within the tolerance of --dtype and --numerics (docs/verify.md)."
    )
    for action in p._actions:  # verify's own defaults: a small cache (the checks run 7 tokens in at most 2 rows)
        if action.dest == "max_positions":
            action.help = "cache positions per row (32)"
