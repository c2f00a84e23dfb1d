"""The 5 MB document of issue 45 (bench/bigdoc_source.py: renamed copies of examples/llama.linnet with ten mistakes
in each), a few copies of it: the checker's diagnostics, rendered as `linnet check` prints them, are held to a golden
file written by the checker that checks each module body once per config (main at 2026-12-06; the labels that a
cached instance had taken from another use of equal sizes corrected since). A checker that shares work between
configs or copies must print exactly these; every copy but the first (the root `model`) reports the same findings
at the same places, its names aside; and every label points into its finding's own copy."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from linnet.semantics.program import Document
from linnet.semantics.render import render_text
from tests.conftest import ROOT, check_golden

sys.path.insert(0, str(ROOT / "bench"))
import bigdoc_source  # noqa: E402  (bench/ is not a package; stdlib-only)

GOLDEN = Path(__file__).with_name("golden") / "bigdoc_3_copies.txt"
COPIES = 3
PATH = "/tmp/bigdoc.linnet"


def _display(path: str) -> str:
    return "bigdoc.linnet" if path == PATH else Path(path).resolve().relative_to(ROOT).as_posix()


def _read(text: str):
    def read(path: str) -> str | None:
        return text if path == PATH else Path(path).read_text(encoding="utf-8")

    return read


def _unnumbered(text: str) -> str:
    """`text` with each copy's number dropped from the names it renamed (`LlamaMLP_2` -> `LlamaMLP_N`)."""
    return re.sub(r"\b(\w+?)_\d+\b", r"\1_N", text)


def test_big_document_diagnostics_equal_the_golden_file():
    text = bigdoc_source.big_source(COPIES)
    diagnostics = Document(PATH, text).analyze().diagnostics
    assert sum(d.is_error for d in diagnostics) == 10 * COPIES
    rendered = "\n\n".join(render_text(d, _read(text), _display) for d in diagnostics) + "\n"
    check_golden(GOLDEN, rendered)


def test_every_copy_after_the_first_reports_the_same_findings():
    text = bigdoc_source.big_source(COPIES)
    copy_lines = text.count("\n") // COPIES
    by_copy: dict[int, list] = {}
    for d in Document(PATH, text).analyze().diagnostics:
        copy, line = divmod(d.location.line - 1, copy_lines)
        presets = tuple(_unnumbered(p) for p in d.presets or ())
        by_copy.setdefault(copy, []).append((d.code, line, d.location.column, _unnumbered(d.message), presets))
    assert sorted(by_copy) == list(range(COPIES))
    normalised = [by_copy[i] for i in range(COPIES)]
    assert len(normalised[1]) == 11  # ten errors and the unread `let`
    assert all(found == normalised[1] for found in normalised[2:])


def test_every_label_points_into_its_own_copy():
    # the checker caches an instance's members and its methods' signatures for every use with equal arguments:
    # copy 1's `Embedding(c.vocab_size, c.hidden_size)` was copy 0's entry, so its L202 labelled copy 0's preset line
    # (`vocab_size = 49152`, line 35), and every `o_proj` labelled `hidden_size` (the entry of `q_proj`'s Linear)
    text = bigdoc_source.big_source(COPIES)
    copy_lines = text.count("\n") // COPIES
    crossed = []
    for d in Document(PATH, text).analyze().diagnostics:
        copy = (d.location.line - 1) // copy_lines
        for label in d.labels:
            if label.location.path == PATH and (label.location.line - 1) // copy_lines != copy:
                crossed.append((d.code, d.location.line, label.location.line, label.message))
    assert crossed == []
