"""`linnet check` (the checker over files and folders, and with `--weights` against a checkpoint's headers) and
`linnet fmt` (the formatter). Both load the front end alone, never `linnet.compiler`, `linnet.runtimes`, torch or
jax (a test holds them to it); `check --weights` adds the checkpoint header reader (`linnet.runtimes.headers`:
numpy, never torch).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

from linnet.cli import common
from linnet.cli.common import EXIT_ERRORS, EXIT_OK, EXIT_USAGE
from linnet.syntax.sources import read_source_text


def _collect(paths: list[str]) -> tuple[list[Path], list[str]]:
    """`.linnet` files under `paths` (files as given, folders searched), each once (a file named again, by another
    spelling of its path or inside a folder given too, is checked once: its diagnostics would print twice), and
    I/O problems."""
    files: dict[str, Path] = {}  # by the file's resolved path, the first spelling given
    problems: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*.linnet") if f.is_file())
            if not found:
                problems.append(f"{raw}: no .linnet files in this folder")
        elif p.is_file():
            found = [p]
        else:
            problems.append(f"{raw}: no such file or folder")
            continue
        for f in found:
            files.setdefault(os.path.realpath(f), f)
    return list(files.values()), problems


def read_source(path: Path) -> str:
    """A source file's text: UTF-8, a leading byte-order mark dropped, line endings kept as they are (`\r\n`
    and a lone `\r` are line breaks to the front end, so positions and byte offsets are the file's own). Raises
    OSError and UnicodeDecodeError (NotUtf8, which says the line and column)."""
    return read_source_text(path)


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("..") else path
    except ValueError:
        return path


def _jobs(text: str) -> int:
    """`--jobs`'s value: a whole number of processes, at least 1, or `auto` (the CPUs this process may use)."""
    if text == "auto":
        from linnet.semantics.parallel import usable_cpus

        return len(usable_cpus())
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes, got `{text}`") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 process, got {n}")
    return n


def cmd_check(args: argparse.Namespace) -> int:
    """Check the files given, and every file they import (each once)."""
    # A one-shot run that only accumulates: what it allocates lives until the process ends (with `linnet.cli.entry`,
    # without the interpreter's teardown), so a collection finds next to nothing to free. The collections took up
    # to a quarter of the analysis of 100 copies of llama.linnet (5.7-7.1 CPU s with young collections at mypy's
    # threshold, 5.2-5.3 s without; peak RSS 344 MB against 373: bench/results/check_phases.md). Enabled again
    # after for a caller in the same process (a test), not where the process ends at once (`common.EXITS_AT_ONCE`):
    # the first allocation after enabling ran a young collection over every object made while it was off (the 5 MB
    # document: ~9 of 35 CPU s, after the diagnostics were printed).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _check(args)
    finally:
        if enabled and not common.EXITS_AT_ONCE:
            gc.enable()


def _check(args: argparse.Namespace) -> int:
    from linnet.semantics.parallel import default_jobs
    from linnet.semantics.program import Workspace
    from linnet.semantics.render import render_github, render_json, render_text, use_color

    files, problems = _collect(args.paths)
    for p in problems:
        print(f"linnet check: {p}", file=sys.stderr)
    if problems and (args.summary or not files):
        return EXIT_USAGE
    if args.summary:
        if args.weights is not None:  # the cost model reads the source's config, not a checkpoint's
            print("linnet check: --summary does not take --weights; run them as two commands", file=sys.stderr)
            return EXIT_USAGE
        from linnet.summary import cmd_summary

        return cmd_summary(args, files)
    texts: dict[str, str] = {}
    all_diags = []
    preset_seen = False
    unreadable = 0
    workspace = Workspace()
    documents = []
    analyses = {}
    for f in files:
        try:
            text = read_source(f)
        except (OSError, UnicodeDecodeError) as err:
            print(f"linnet check: {f}: cannot read ({err})", file=sys.stderr)
            unreadable += 1
            continue
        texts[str(f)] = text
        documents.append(workspace.open(str(f), text))
    checked = {workspace.key(d.source.path) for d in documents}
    for doc in documents:  # grows with the files they import
        analysis = doc.analyze(args.preset, jobs=args.jobs if args.jobs is not None else default_jobs(doc.text))
        analyses[doc.source.path] = analysis
        for path in analysis.files:
            if workspace.key(path) not in checked and (imported := workspace.get(path)) is not None:
                checked.add(workspace.key(path))
                documents.append(imported)
                texts[imported.source.path] = imported.text
        diags = analysis.diagnostics
        if args.preset and args.preset in analysis.declared_presets:
            preset_seen = True
            diags = [d for d in diags if d.presets is None or args.preset in d.presets]
        all_diags.extend(diags)
    if args.preset and not preset_seen and not unreadable and not problems:
        print(f"linnet check: no file declares preset `{args.preset}`", file=sys.stderr)
        return EXIT_USAGE
    if args.weights is not None:
        found = _check_weights(args, texts, analyses, [str(f) for f in files if str(f) in texts])
        if found is None:
            return EXIT_USAGE
        all_diags.extend(found)

    def source_of(path: str) -> str | None:
        if path not in texts:
            try:
                texts[path] = read_source(Path(path))
            except (OSError, UnicodeDecodeError):
                return None
        return texts[path]

    if args.format == "json":
        print(render_json(all_diags))
    elif args.format == "github":
        for d in all_diags:
            print(render_github(d, _display))
    else:
        color = use_color(sys.stdout)
        for d in all_diags:
            print(render_text(d, source_of, _display, color))
            print()
    n_err = sum(1 for d in all_diags if d.is_error)
    n_warn = len(all_diags) - n_err
    if args.format == "text":
        checked = len(documents)
        print(
            f"checked {checked} file{'s' if checked != 1 else ''}: {n_err} error{'s' if n_err != 1 else ''}, "
            f"{n_warn} warning{'s' if n_warn != 1 else ''}"
            + (f"; {unreadable} unreadable" if unreadable else "")
            + (f"; {len(problems)} not found" if problems else ""),
            file=sys.stderr,
        )
    if unreadable or problems:  # the other paths were still checked and reported
        return EXIT_USAGE
    return EXIT_ERRORS if n_err else EXIT_OK


def _check_weights(args: argparse.Namespace, texts: dict[str, str], analyses: dict, paths: list[str]) -> list | None:
    """The header check of `--weights` against each file given (`linnet.runtimes.headers.check_weights`, what
    loading would report, reading no tensor data); None after printing why the weights cannot be opened. A file
    whose `--preset` configures another config than its root model takes is skipped with a note (its preset's
    weights are not that model's)."""
    from linnet.errors import CheckpointError
    from linnet.ir.build import preset_model_mismatch
    from linnet.runtimes.headers import check_weights, read_headers

    try:
        read_headers(args.weights)
    except CheckpointError as err:
        print(f"linnet check: --weights: {err}", file=sys.stderr)
        return None
    found = []
    for path in paths:
        analysis = analyses.get(path)
        if args.preset and analysis is not None and args.preset in analysis.declared_presets:
            if (why := preset_model_mismatch(analysis, args.preset)) is not None:
                print(f"note: {_display(path)}: preset `{args.preset}` {why}", file=sys.stderr)
                continue
        report = check_weights(path, texts[path], args.weights, args.preset)
        for note in report.notes:
            print(f"note: {note}", file=sys.stderr)
        found.extend(report.diagnostics)
    return found


def cmd_fmt(args: argparse.Namespace) -> int:
    from linnet.syntax.fmt import FormatError, format_source

    files, problems = _collect(args.paths)
    for p in problems:
        print(f"linnet fmt: {p}", file=sys.stderr)
    if problems:
        return EXIT_USAGE
    status = EXIT_OK
    changed = 0
    for f in files:
        try:
            text = read_source(f)
        except (OSError, UnicodeDecodeError) as err:
            print(f"linnet fmt: {_display(str(f))}: cannot read ({err})", file=sys.stderr)
            status = EXIT_USAGE
            continue
        try:
            formatted = format_source(text)
        except FormatError as err:
            print(f"linnet fmt: {_display(str(f))}:{err.line}:{err.column}: cannot format: {err}", file=sys.stderr)
            status = EXIT_ERRORS
            continue
        if formatted == text:
            continue
        changed += 1
        if args.check:
            print(f"would reformat {_display(str(f))}")
            status = EXIT_ERRORS
        else:
            with f.open("w", encoding="utf-8", newline="") as out:  # the line endings format_source kept
                out.write(formatted)
            print(f"reformatted {_display(str(f))}")
    if args.check and changed == 0 and status == EXIT_OK:
        print(f"{len(files)} file{'s' if len(files) != 1 else ''} already formatted", file=sys.stderr)
    return status


def register(sub) -> None:
    """Add `check` and `fmt` to the `linnet` parser."""
    check = sub.add_parser("check", help="check .linnet files under the config defaults and every preset")
    check.add_argument("paths", nargs="+", metavar="PATH", help="files or folders")
    check.add_argument("--format", choices=("text", "json", "github"), default="text")
    check.add_argument("--preset", metavar="NAME", help="report only what fails under this preset")
    check.add_argument(
        "--weights",
        metavar="W",
        help="also check the files against a checkpoint's headers (a Hugging Face folder, a .gguf file or an "
        "embedded id), as loading would, under --preset (default: the config defaults); reads no tensor data",
    )
    check.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="check a big file's items in N processes (`auto`: the CPUs this process may use); the output is the "
        "same. Default: `auto` for a file of 64,000 characters or more, one process for a smaller one",
    )
    from linnet.summary import add_arguments

    add_arguments(check)
    check.set_defaults(func=cmd_check)

    fmt = sub.add_parser("fmt", help="format .linnet files (comments kept)")
    fmt.add_argument("paths", nargs="+", metavar="PATH", help="files or folders")
    fmt.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    fmt.set_defaults(func=cmd_fmt)
