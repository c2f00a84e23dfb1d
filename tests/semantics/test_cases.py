"""Checker goldens: annotated `.linnet` files under `cases/`.

A comment `# error[L201]: text` (or `warning[...]`) expects a diagnostic with that code whose
message contains `text`, on the first code line below the comment block. `# type: T` expects
the hover type of the name bound by the `let` on that line (T matched against the symbolic
form, the concrete form, or `symbolic = concrete`; `# type(preset): T` picks the preset).
`# label[L203]: text` expects a diagnostic of that code in the file with a secondary label on
the next code line whose text contains `text` (where a fault's declaration is labelled).
Every diagnostic of a case must be expected, and every expectation met.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from linnet.semantics.program import Document

CASES = sorted((Path(__file__).parent / "cases").glob("*.linnet"))
EXPECT = re.compile(r"#\s*(error|warning)\[(L\d{3})\]:\s*(.*?)\s*$")
TYPE = re.compile(r"#\s*type(?:\((\w+)\))?:\s*(.*?)\s*$")
LABEL = re.compile(r"#\s*label\[(L\d{3})\]:\s*(.*?)\s*$")


def expectations(text: str, with_labels: bool = False):
    lines = text.split("\n")
    diags, types, labels, pending_d, pending_t, pending_l = [], [], [], [], [], []
    for i, line in enumerate(lines, 1):
        stripped = line.strip()
        m = EXPECT.search(line)
        t = TYPE.search(line)
        lab = LABEL.search(line)
        if stripped.startswith("#") and (m or t or lab):
            if m:
                pending_d.append((m.group(1), m.group(2), m.group(3)))
            if t:
                pending_t.append((t.group(1), t.group(2)))
            if lab:
                pending_l.append((lab.group(1), lab.group(2)))
            continue
        if stripped.startswith("#") or not stripped:
            continue
        for sev, code, msg in pending_d:
            diags.append((i, sev, code, msg))
        for preset, typ in pending_t:
            types.append((i, preset, typ))
        for code, msg in pending_l:
            labels.append((i, code, msg))
        pending_d, pending_t, pending_l = [], [], []
    return (diags, types, labels) if with_labels else (diags, types)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_case(case: Path):
    text = case.read_text(encoding="utf-8")
    expected, types, labels = expectations(text, with_labels=True)
    analysis = Document(str(case), text).analyze()
    actual = [
        (d.location.line, d.severity, d.code, d.message) for d in analysis.diagnostics if d.location.path == str(case)
    ]
    unmatched = list(actual)
    missing = []
    for line, sev, code, msg in expected:
        hit = next((a for a in unmatched if a[0] == line and a[1] == sev and a[2] == code and msg in a[3]), None)
        if hit is None:
            missing.append(f"line {line}: {sev}[{code}]: {msg}")
        else:
            unmatched.remove(hit)
    extra = [f"line {n}: {s}[{c}]: {m}" for n, s, c, m in unmatched]
    assert not missing and not extra, "\nmissing:\n  " + "\n  ".join(missing) + "\nunexpected:\n  " + "\n  ".join(extra)
    for line, code, msg in labels:
        found = [(lab.location.line, lab.message) for d in analysis.diagnostics if d.code == code for lab in d.labels]
        assert any(n == line and msg in shown for n, shown in found), f"line {line}: no {code} label `{msg}` in {found}"
    lines = text.split("\n")
    for line, preset, typ in types:
        col = lines[line - 1].index("let ") + 4
        offset = sum(len(text_line) + 1 for text_line in lines[: line - 1]) + col
        info = analysis.type_at(offset, preset)
        assert info is not None, f"line {line}: no type"
        shown = {info.symbolic, info.concrete, f"{info.symbolic} = {info.concrete}"}
        assert typ in shown, f"line {line}: type {info.symbolic} = {info.concrete}, expected {typ}"


def test_enough_distinct_faults():
    codes = set()
    count = 0
    for case in CASES:
        expected, _ = expectations(case.read_text(encoding="utf-8"))
        count += len(expected)
        codes |= {c for _, _, c, _ in expected}
    assert count >= 40, count
    assert len(codes) >= 30, sorted(codes)
