"""`linnet check`, `linnet fmt` and `python -m linnet`: exit codes, output formats, rendered
snapshots, and the promise that checking loads neither backends nor torch/jax."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from linnet.cli import main
from tests.conftest import EXAMPLES, ROOT, check_golden

GOLDEN = Path(__file__).parent / "golden"
CASES = ROOT / "tests" / "semantics" / "cases"


def run_cli(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "linnet", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)},
    )


def test_examples_check_clean():
    result = run_cli("check", "examples")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""
    files = len(list(EXAMPLES.glob("*.linnet")))  # one per model family, and more as the zoo grows
    assert f"checked {files} files: 0 errors, 0 warnings" in result.stderr


def heavy_modules_loaded(argv: list[str], heavy=("torch", "jax", "jaxlib", "onnx", "onnxruntime", "numpy", "pygls")):
    """Run `linnet` with `argv` in a fresh interpreter: (exit status, the `heavy` packages and the backends,
    runtimes and language server it imported)."""
    code = (
        f"import sys\nfrom linnet.cli import main\nrc = main({argv!r})\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} "
        "or m.startswith(('linnet.compiler', 'linnet.runtimes', 'linnet.lsp')))\n"
        "print(rc, heavy, file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    rc, _, heavy_loaded = result.stderr.strip().splitlines()[-1].partition(" ")
    return int(rc), heavy_loaded


def test_check_loads_no_backend_and_no_framework():
    assert heavy_modules_loaded(["check", "examples"]) == (0, "[]")


def test_errors_exit_1_with_path_line_col(capsys):
    rc = main(["check", str(CASES / "gqa.linnet")])
    out = capsys.readouterr().out
    assert rc == 1
    first = out.splitlines()[0]
    assert first.endswith(
        "gqa.linnet:16:19: error[L206]: argument `q` of `attention`: dim 1 is 32, but must be "
        "Hkv * G with Hkv = 5 (from `k`): 32 is not divisible by 5"
    )


def test_usage_and_io_errors_exit_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing.linnet")]) == 2
    assert main(["check", str(tmp_path)]) == 2  # a folder without .linnet files
    assert main(["check"]) == 2
    assert main(["check", "--format", "xml", str(EXAMPLES)]) == 2
    assert main(["check", "--preset", "nonexistent", str(EXAMPLES)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_json_format(capsys):
    rc = main(["check", "--format", "json", str(CASES / "gqa.linnet")])
    data = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [(d["code"], d["location"]["start"]["line"], d["presets"]) for d in data] == [("L206", 16, ["bad_kv"])]
    assert {Path(lab["location"]["path"]).name for lab in data[0]["labels"]} == {"gqa.linnet", "attention.linnet"}
    assert data[0]["docs"] == "docs/diagnostics.md#l206"


def test_github_format(capsys):
    rc = main(["check", "--format", "github", str(CASES / "gqa.linnet")])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 1 and len(lines) == 1
    assert lines[0].startswith("::error file=")
    assert ",line=16,col=19,endLine=16,endColumn=20,title=L206::argument `q`" in lines[0]
    assert "%0Aunder preset `bad_kv`" in lines[0]


def test_preset_filter(capsys):
    assert main(["check", "--preset", "bad_kv", str(CASES / "gqa.linnet")]) == 1
    capsys.readouterr()
    # the defaults are fine: filtering to a preset without the fault reports nothing
    text = (CASES / "presets.linnet").read_text()
    assert "preset wide" in text
    assert main(["check", "--preset", "wide", str(CASES / "presets.linnet")]) == 0


@pytest.mark.parametrize("case", ["gqa", "presets", "syntax", "dtypes", "sharing", "parenthesised_quotes"])
def test_rendered_snapshots(case, capsys):
    main(["check", str((CASES / f"{case}.linnet").relative_to(ROOT))]) if Path.cwd() == ROOT else None
    result = run_cli("check", str((CASES / f"{case}.linnet").relative_to(ROOT)))
    check_golden(GOLDEN / f"{case}.txt", result.stdout)


def test_fmt_check_and_write(tmp_path, capsys):
    messy = tmp_path / "m.linnet"
    messy.write_text("fn f(x:[N])->[N]{\n  x*2.0  # twice\n}\n")
    assert main(["fmt", "--check", str(messy)]) == 1
    assert "would reformat" in capsys.readouterr().out
    assert main(["fmt", str(messy)]) == 0
    assert messy.read_text() == "fn f(x: [N]) -> [N] {\n    x * 2.0  # twice\n}\n"
    assert main(["fmt", "--check", str(messy)]) == 0
    broken = tmp_path / "b.linnet"
    broken.write_text("fn f(x: [N]) -> [N] {\n    let y = (x + ) * 2\n    y\n}\n")
    assert main(["fmt", str(broken)]) == 1
    assert "b.linnet:2:" in capsys.readouterr().err
    assert broken.read_text().startswith("fn f(x: [N]) -> [N] {\n    let y = (x + ) * 2")  # untouched


def test_python_api():
    import linnet

    diags = linnet.check("fn f(x: [N]) -> [M] { x }")
    assert [d.code for d in diags] == ["L101"]
    assert linnet.check(str(EXAMPLES / "mlp.linnet")) == []


def test_preset_with_its_own_config_error(tmp_path, capsys):
    f = tmp_path / "p.linnet"
    f.write_text("config C {\n    n: int = 2\n}\n\npreset bad = C { n = true }\n")
    assert main(["check", "--preset", "bad", str(f)]) == 1
    assert "error[L401]" in capsys.readouterr().out


def test_a_missing_path_does_not_hide_the_others(tmp_path, capsys):
    """language.md section 12: exit 2 on no such file or an empty folder, "the other files are still checked and
    reported"."""
    (tmp_path / "b.linnet").write_text("fn f(x: [N]) -> [M] {\n    x\n}\n")
    (tmp_path / "empty").mkdir()
    args = ["check", str(tmp_path / "missing.linnet"), str(tmp_path / "empty"), str(tmp_path / "b.linnet")]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "missing.linnet: no such file or folder" in captured.err
    assert "empty: no .linnet files in this folder" in captured.err
    assert "b.linnet:1:18: error[L101]: unknown dim `M`" in captured.out
    assert "checked 1 file: 1 error, 0 warnings; 2 not found" in captured.err


def test_an_unreadable_file_does_not_hide_the_others(tmp_path, capsys):
    (tmp_path / "a.linnet").write_bytes("# caf\xe9\n".encode("latin-1"))
    (tmp_path / "b.linnet").write_text("fn f(x: [N]) -> [M] {\n    x\n}\n")
    (tmp_path / "c.linnet").write_text("\ufefffn g(x: [N]) -> [N] {\n    x\n}\n")  # a BOM is fine
    assert main(["check", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "a.linnet: cannot read" in captured.err
    assert "b.linnet:1:18: error[L101]: unknown dim `M`" in captured.out
    assert "c.linnet" not in captured.out
    assert main(["fmt", "--check", str(tmp_path / "a.linnet")]) == 2


def test_a_file_that_is_not_utf8_is_reported_at_its_line_and_column(tmp_path, capsys):
    """The error said "position 712": a byte offset into the chunk Python's reader had decoded (so past 8 KiB
    not even the file's). It says the line and column of the bad byte, as a diagnostic would."""
    lines = ["config C {"] + [f"    a{i}: int = {i}" for i in range(700)] + ["    b: int = 1  # caf\xe9", "}"]
    path = tmp_path / "a.linnet"
    path.write_bytes("\ufeff".encode() + "\r\n".join(lines).encode("latin-1"))  # a BOM, CRLF line endings
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot read (not UTF-8 text: byte 0xe9 at line 702, column 22 (invalid continuation byte))" in err, err
    assert main(["torch", str(path)]) != 0
    assert f"{path}: not UTF-8 text: byte 0xe9 at line 702, column 22" in capsys.readouterr().err


def test_carets_under_a_tab_indented_line_sit_under_what_they_mark(tmp_path, capsys):
    """The excerpt expanded tabs but the caret counted each tab as one column: it landed 3 columns left."""
    (tmp_path / "t.linnet").write_text("fn f(x: [B, S]) -> [B, S] {\n\tlet y = x + zz\n\t\ty\n}\n")
    assert main(["check", str(tmp_path / "t.linnet")]) == 1
    out = capsys.readouterr().out
    shown = next(line for line in out.splitlines() if "let y" in line)
    caret = next(line for line in out.splitlines() if "^" in line)
    assert "\t" not in shown and caret.index("^^") == shown.index("zz"), out


def test_a_file_named_twice_is_checked_and_reported_once(tmp_path, capsys, monkeypatch):
    # as itself twice, by another spelling of its path, and inside a folder given too (ruff and mypy check it once)
    (tmp_path / "b.linnet").write_text("fn f(x: [N]) -> [M] {\n    x\n}\n")
    (tmp_path / "c.linnet").write_text("fn g(x: [N]) -> [N] {\n    x\n}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "b.linnet", "./b.linnet", str(tmp_path / "b.linnet"), str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out.count("error[L101]: unknown dim `M`") == 1
    assert captured.err.strip() == "checked 2 files: 1 error, 0 warnings"


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("linnet ")


# Two files declaring one config with equal values, its fields in other orders: a dim prints as
# written in its own file whatever was checked before it in the same run.
DECLARED_LAST = """config C {
    total: int = kv * hd
    hd: int = 64
    kv: int = 3
}

fn f(c: C, x: [B, c.hd * c.kv]) -> [B, c.hd] {
    x
}
"""
DECLARED_FIRST = """config C {
    kv: int = 3
    hd: int = 64
    total: int = kv * hd
}

fn g(c: C, x: [B, c.kv * c.hd]) -> [B, c.kv] {
    x
}
"""


def test_dims_print_the_same_whatever_was_checked_before(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    (tmp_path / "a.linnet").write_text(DECLARED_LAST)
    (tmp_path / "b.linnet").write_text(DECLARED_FIRST)

    def headers(*names):
        main(["check", *[str(tmp_path / n) for n in names]])
        return sorted(line for line in capsys.readouterr().out.split("\n") if "error[" in line)

    alone = headers("a.linnet") + headers("b.linnet")
    assert any("returns [B, c.kv * c.hd], declared [B, c.kv]" in line for line in alone)
    assert any("returns [B, c.hd * c.kv], declared [B, c.hd]" in line for line in alone)
    assert headers("a.linnet", "b.linnet") == alone
    assert headers("b.linnet", "a.linnet") == alone
