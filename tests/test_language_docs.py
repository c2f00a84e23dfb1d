"""docs/language.md stays true: every `linnet` block checks clean and is formatted, unless the
next `text` block shows `$ linnet check FILE` with excerpts of this block; then checking the
block as FILE prints the diagnostic header lines shown there. A block whose first line is
`# file: NAME.linnet` is also written as NAME.linnet next to every block checked, so that
examples can import it."""

from __future__ import annotations

import re

import pytest

from linnet.cli import main
from linnet.syntax.fmt import format_source
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "language.md").read_text()
BLOCKS = [
    (m.group(1), m.group(2), DOC[: m.start()].count("\n") + 1, m.start(), m.end())
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", DOC, re.S | re.M)
]


def _shows(output: str, body: str) -> bool:
    """The output's source excerpts all come from `body` (not from a variant the prose
    describes, such as "leaving out the cast")."""
    excerpts = [m.group(1).strip() for m in re.finditer(r"^\s*\d+ \| (.*)$", output, re.M)]
    return all(e in body for e in excerpts if e)


def _cases():
    for i, (lang, body, line, _, _end) in enumerate(BLOCKS):
        if lang != "linnet":
            continue
        nxt = BLOCKS[i + 1] if i + 1 < len(BLOCKS) else None
        if nxt and nxt[0] == "text" and nxt[1].startswith("$ linnet check") and _shows(nxt[1], body):
            yield pytest.param(body, nxt[1], id=f"line{line}-error")
        else:
            yield pytest.param(body, None, id=f"line{line}")


NAMED = {m.group(1): body for lang, body, *_ in BLOCKS if (m := re.match(r"# file: (\S+\.linnet)\n", body))}


@pytest.mark.parametrize("body,output", list(_cases()))
def test_language_doc_examples(body, output, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    for name, text in NAMED.items():
        (tmp_path / name).write_text(text)
    if output is None:
        path = tmp_path / "example.linnet"
        path.write_text(body)
        assert main(["check", str(path.name)]) == 0, capsys.readouterr().out
        assert format_source(body) == body
        return
    name = output.split("\n")[0].split()[-1]
    (tmp_path / name).write_text(body)
    main(["check", name])
    printed = capsys.readouterr().out.split("\n")
    expected = [x for x in output.split("\n")[1:] if re.match(rf"{re.escape(name)}:\d+:\d+: (error|warning)\[", x)]
    assert expected, "the doc shows no diagnostic"
    for line in expected:
        assert line in printed, f"the doc shows\n  {line}\nbut linnet check prints\n  " + "\n  ".join(
            x for x in printed if x.startswith(name)
        )
