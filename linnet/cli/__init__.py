"""The `linnet` command line (also `python -m linnet`): the parser and `main`; each command family is a module of
this package with its `register(sub)` (`check` and `fmt` in `check`, the code views in `emit`, `run`, `verify`,
`diff`, `generate`, `export`, `backends` and `cache` in `backends`, `serve`, `train`, `transcribe`).

Subcommands import only what they need: `check` and `fmt` load the front end alone, never
`linnet.compiler`, `linnet.runtimes`, torch or jax (a test holds them to it); `check --weights`
adds the checkpoint header reader (`linnet.runtimes.headers`: numpy, never torch).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import NoReturn

from linnet.cli import common
from linnet.cli.common import EXIT_ERRORS, EXIT_OK, EXIT_USAGE
from linnet.cli.pipes import readers_may_leave


def cmd_lsp(args: argparse.Namespace | None) -> int:
    try:
        from linnet.lsp.startup import load_server

        serve = load_server()
    except ImportError as err:
        print(f"linnet lsp: needs pygls and lsprotocol ({err}); pip install 'linnet[lsp]'", file=sys.stderr)
        return EXIT_USAGE
    return serve()


def build_parser() -> argparse.ArgumentParser:
    from linnet import __version__

    parser = argparse.ArgumentParser(prog="linnet", description="Linnet: statically checked neural-network models.")
    parser.add_argument("--version", action="version", version=f"linnet {__version__}")
    parser.add_argument(
        "--buffers",
        metavar="JSON",
        help="read the files this JSON object maps (path -> text) from it, not from disk: an editor's unsaved "
        "buffers (the language server's workers)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from linnet.cli import backends, check, diff, emit, export, generate, run, serve, train, transcribe, verify

    check.register(sub)
    lsp = sub.add_parser("lsp", help="the language server on stdio (needs linnet[lsp])")
    lsp.set_defaults(func=cmd_lsp)
    for command_family in (emit, run, verify, diff, generate, export, backends, serve, train, transcribe):
        command_family.register(sub)
    return parser


def _buffers(path: str | None):
    """The context in which a command reads the files of `--buffers` (a JSON file of {path: text}) as given there,
    not from disk (`linnet.ir.analyses.buffers`): a language server's worker reads the editor's buffers so
    (linnet/lsp/views.py); nothing to do without it."""
    if not path:
        return contextlib.nullcontext()
    import json

    from linnet.errors import LinnetError
    from linnet.ir.analyses import buffers

    try:
        with open(path, encoding="utf-8") as f:
            texts = json.load(f)
    except (OSError, ValueError) as err:
        raise LinnetError(f"--buffers {path}: {err}") from err
    if not isinstance(texts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in texts.items()):
        raise LinnetError(f"--buffers {path}: not a JSON object of path -> text")
    return buffers(texts)


# Commands whose process ends without the interpreter's teardown (`entry`): the front end alone, with no atexit work
# (no thread, cache or temporary folder to finish), and analyses of millions of objects that teardown would free one by
# one after a full collection (4.6-4.9 of 12.5-14.5 CPU s of `linnet check` on 100 copies of llama.linnet:
# bench/results/check_phases.md).
FAST_EXIT_COMMANDS = frozenset({"check", "fmt"})
# Commands whose exit status is a verdict (errors found, files to reformat, a source that disagrees with itself or
# its reference): it stands when the reader of their output leaves early (`linnet check FILE | head -1`), which
# ended them with 0 before (linnet/cli/pipes.py). The others (generate, run, the code views) stop there, with 0.
VERDICT_COMMANDS = frozenset({"check", "fmt", "verify", "diff"})


def entry() -> NoReturn:
    """The `linnet` process (the console script and `python -m linnet`): `main` on `sys.argv`, then exit with its
    status. After a command of FAST_EXIT_COMMANDS the output is flushed and the process ends at once (`os._exit`, as
    mypy's `--fast-exit` does); `main` itself never exits, so tests call it in their own process."""
    command = sys.argv[1] if len(sys.argv) > 1 else None
    common.EXITS_AT_ONCE = command in FAST_EXIT_COMMANDS
    code = main()
    if command in FAST_EXIT_COMMANDS:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (BrokenPipeError, ValueError):  # a reader that went away (`| head`), a closed stream
                pass
        os._exit(code or 0)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["lsp"]:
        return cmd_lsp(None)  # an editor starting the server: every other command's parser costs ~0.1 s of its start
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return EXIT_USAGE if exit_.code not in (0, None) else EXIT_OK
    from linnet.errors import LinnetError

    try:
        with _buffers(args.buffers):
            if args.command in VERDICT_COMMANDS:
                with readers_may_leave():
                    return args.func(args)
            return args.func(args)
    except LinnetError as err:  # each command reports its own; this keeps a traceback from any that slips
        print(f"linnet {args.command}: {err}", file=sys.stderr)
        return EXIT_ERRORS
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of a command's output went away (`linnet generate ... | head -c 20`)
        return EXIT_OK


if __name__ == "__main__":
    entry()
