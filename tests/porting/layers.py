"""The three layers a porting mistake can be caught by, run on a mutated source (tests/porting/catalogue.py): each
returns what it found (empty: not caught), or raises LayerMissing when this tree lacks the layer.

- `check_findings`: `linnet check`'s diagnostics (errors and warnings) and `check --weights`' on the checkpoint,
  less those the unmutated source has;
- `verify_findings`: `linnet verify FILE --weights W` exiting 1 (the command of issue 40's layer 2);
- `diff_findings`: `linnet.runtimes.diff.diff_model` against the reference model, loaded once per family.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from pathlib import Path

from tests.conftest import EXAMPLES
from tests.porting.catalogue import Mutation


class LayerMissing(Exception):
    """The layer (or the part of it a row relies on) is not in this tree; the message says which."""


def mutated_source(m: Mutation, folder: Path) -> Path:
    """Write every example into `folder` (the sources import each other) with `m` applied to its family's; returns
    the mutated file's path. Asserts `m.find` occurs `m.count` times (a catalogue row that no longer applies)."""
    path = copied_source(m.family, folder)
    text = path.read_text(encoding="utf-8")
    assert text.count(m.find) == m.count, f"{m.id}: `{m.find}` occurs {text.count(m.find)} times, not {m.count}"
    if m.only is None:
        text = text.replace(m.find, m.replace)
    else:
        parts = text.split(m.find)
        text = m.find.join(parts[: m.only + 1]) + m.replace + m.find.join(parts[m.only + 1 :])
    path.write_text(text, encoding="utf-8")
    return path


def copied_source(family: str, folder: Path) -> Path:
    """Every example copied into `folder`; returns the path of `family`'s."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in EXAMPLES.glob("*.linnet"):
        shutil.copy(f, folder / f.name)
    return folder / f"{family}.linnet"


def check_findings(path: Path, weights: Path, baseline: set[str] | None = None) -> set[str]:
    """`linnet check` and `check --weights` on `path`: every error and warning as "code: message", less `baseline`
    (the unmutated source's)."""
    from linnet.runtimes.headers import check_weights
    from linnet.semantics.program import Document

    text = path.read_text(encoding="utf-8")
    diags = list(Document(str(path), text).analyze().diagnostics)
    if not any(d.severity == "error" for d in diags):
        diags += check_weights(str(path), text, str(weights)).diagnostics
    found = {f"{d.code}: {d.message}" for d in diags if d.severity in ("error", "warning")}
    return found - (baseline or set())


def has_unused_warning() -> bool:
    """Whether the checker warns on a parameter declared and never read (issue 40's layer 1)."""
    from linnet.semantics.program import Document

    probe = (
        "config C { n: int = 4 }\n"
        "model M(c: C) {\n    a: Linear(c.n, c.n)\n    b: Linear(c.n, c.n)\n"
        "    entry fn forward(x: [B, c.n]) -> [B, c.n] { a(x) }\n}\n"
    )
    return any(d.severity == "warning" for d in Document("probe.linnet", probe).analyze().diagnostics)


def has_verify() -> bool:
    """Whether `linnet verify` is a command of this tree (issue 40's layer 2)."""
    from linnet.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return "verify" in sub.choices


def verify_findings(path: Path, weights: Path, unrunnable_ok: bool = False) -> set[str]:
    """`linnet verify path --weights weights`: its report's lines when it exits 1. Raises LayerMissing without the
    command; AssertionError on exit 2 (it could not run: a source the checkpoint does not fit), unless
    `unrunnable_ok` (the tally: then verify has not caught it, the checker has)."""
    if not has_verify():
        raise LayerMissing("`linnet verify` is not in this tree (issue 40's layer 2, branch issue40-verify)")
    from linnet.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["verify", str(path), "--weights", str(weights)])
    if code == 2 and unrunnable_ok:
        return set()
    assert code in (0, 1), f"linnet verify exited {code}: {err.getvalue()}"
    return set((out.getvalue() + err.getvalue()).splitlines()) if code == 1 else set()


def diff_findings(path: Path, weights: Path, library: str, reference_model) -> set[str]:
    """`linnet diff` on `path`: the modules that differ (the first one first), or why Linnet could not load it."""
    from linnet.errors import LinnetError
    from linnet.runtimes.diff import diff_model

    try:
        report = diff_model(path, str(weights), library, reference_model=reference_model)
    except LinnetError as err:
        return {f"cannot load: {str(err).splitlines()[0]}"}
    return {f"{m.label} ({m.entry}): max |Δ| {m.max_abs_diff}" for m in report.differences}
