"""`linnet backends` (the registry, and whether each backend can run here) and `linnet cache` (the persistent
compile caches).
"""

from __future__ import annotations

import argparse
import json
import sys

from linnet.cli.common import EXIT_OK, fail


def cmd_backends(args: argparse.Namespace) -> int:
    """`linnet backends`: the registry, one backend per line, and whether each can run here on
    `--device` (asking the framework, so this imports the installed ones)."""
    from linnet.runtimes.backends import BACKENDS

    rows = [b.describe(args.device, probe=True) for b in BACKENDS.values()]
    if args.format == "json":
        print(json.dumps(rows))
        return EXIT_OK
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        view = r["codeView"] or "-"
        where = "ok" if r["available"] else f"unavailable: {r['reason']}"
        print(
            f"{r['name']:<{width}}  {r['label']:<24} code {view:<9} dtypes {','.join(r['dtypes']):<12} "
            f"devices {','.join(r['devices']):<14} {where}"
        )
    return EXIT_OK


def cmd_cache(args: argparse.Namespace) -> int:
    """`linnet cache [info|clear]`: the persistent compile caches' folders and sizes, or remove them."""
    from linnet.runtimes.backends import caches

    reason = caches.unusable()
    if args.action == "clear":
        if reason:
            print(f"nothing to remove: cache off: {reason} (set {caches.ENV_DIR} to another folder)", file=sys.stderr)
            return EXIT_OK
        try:
            removed = caches.clear()
        except OSError as err:
            return fail("cache", err)
        for folder in removed:
            print(f"removed {folder}", file=sys.stderr)
        if not removed:
            print("nothing to remove", file=sys.stderr)
        return EXIT_OK
    root = caches.cache_root()
    if root is None:
        print(f"persistent caches are off ({caches.ENV_OFF} is set)")
        return EXIT_OK
    if reason:
        print(f"persistent caches are off: {reason} (set {caches.ENV_DIR} to another folder)")
        return EXIT_OK
    print(f"{root} (set {caches.ENV_DIR} to move it, {caches.ENV_OFF}=1 to turn caching off)")
    for framework, folder, size in caches.info():
        print(f"  {framework:<12} {size / 2**20:9.1f} MiB  {folder}")
    return EXIT_OK


def register(sub) -> None:
    """Add the subcommands of this module to the `linnet` parser."""
    ca = sub.add_parser("cache", help="show (info) or remove (clear) the persistent compile caches")
    ca.add_argument("action", nargs="?", choices=("info", "clear"), default="info")
    ca.set_defaults(func=cmd_cache)

    be = sub.add_parser("backends", help="list the backends and whether each can run here")
    be.add_argument("--device", default="cpu", help="the device to ask about (cpu, cuda, tpu)")
    be.add_argument("--format", choices=("text", "json"), default="text")
    be.set_defaults(func=cmd_backends)
