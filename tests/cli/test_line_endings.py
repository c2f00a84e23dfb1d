"""`linnet check` and `linnet fmt` read a file with its own line endings: a `\r\n` file's JSON offsets are byte
offsets into the file as it is on disk (a tool applying a fix by byte edits the right text), and `fmt` keeps the
file's line endings."""

from __future__ import annotations

import json

import pytest

from linnet.cli import main

SOURCE = """\
config C {
    n: int = 4
}

model M(c: C) {
    fn forward(x: f32[B, c.n]) -> f32[B, c.n] {
        let h = exp(x)
        exp(hh)
    }
}
"""


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_check_json_offsets_are_the_files_own(tmp_path, capsys, ending):
    path = tmp_path / "m.linnet"
    path.write_bytes(SOURCE.replace("\n", ending).encode())
    assert main(["check", str(path), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    diagnostics = report if isinstance(report, list) else report["diagnostics"]
    unknown = next(d for d in diagnostics if d["code"] == "L101")
    start, end = unknown["location"]["start"], unknown["location"]["end"]
    raw = path.read_bytes()
    assert raw[start["byte"] : end["byte"]] == b"hh"
    assert (start["line"], start["column"]) == (8, 13)
    (edit,) = unknown["fixes"][0]["edits"]  # "replace with `h`"
    where = edit["location"]
    assert raw[where["start"]["byte"] : where["end"]["byte"]] == b"hh"


@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_fmt_keeps_the_files_line_endings(tmp_path, ending):
    path = tmp_path / "m.linnet"
    path.write_bytes("config C {\n  n: int=4\n}\n".replace("\n", ending).encode())
    assert main(["fmt", str(path)]) == 0
    assert path.read_bytes() == "config C {\n    n: int = 4\n}\n".replace("\n", ending).encode()
    assert main(["fmt", "--check", str(path)]) == 0
