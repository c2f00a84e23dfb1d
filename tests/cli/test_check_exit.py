"""How a `linnet check` process ends and collects (issue 45: `linnet check` on the 5 MB document): the analysis runs
without the cyclic garbage collector, which found next to nothing to free and cost 30 % of it (and stays off to the end:
enabled again, it collected every object the analysis made), and the process ends
without the interpreter's teardown (a full collection and the freeing of millions of objects one by one), its output
flushed first; other commands end as usual (their atexit work: threads, caches, temporary folders). A reader that
leaves early (`linnet check FILE | head -1`) does not change the verdict. Timings live in bench/check_phases.py, not
here: these tests check the behaviour."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from linnet.cli import main
from linnet.semantics import program
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import bigdoc_source  # noqa: E402  (bench/ is not a package; stdlib-only)

ATEXIT = "import atexit, sys\natexit.register(lambda: print('teardown ran', file=sys.stderr))\n"


def run_entry(args: list[str], tmp_path, hook: str = "") -> subprocess.CompletedProcess:
    """`linnet ARGS` through the process entry (`python -m linnet`), with an atexit hook that reports teardown and
    `hook`'s code run first."""
    code = (
        ATEXIT
        + hook
        + f"sys.argv = ['linnet', *{args!r}]\nimport runpy\nrunpy.run_module('linnet', run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def test_check_ends_without_teardown_and_with_all_its_output(tmp_path):
    path = tmp_path / "bigdoc.linnet"
    path.write_text(bigdoc_source.big_source(3), encoding="utf-8")
    result = run_entry(["check", str(path)], tmp_path)
    assert result.returncode == 1
    assert "teardown ran" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "checked 1 file: 30 errors, 3 warnings"
    # every diagnostic printed (a pipe's buffer flushed before the process ended), the last one whole
    assert result.stdout.count("error[L") == 30 and result.stdout.count("warning[L901]") == 3
    last_note = "= note: the values in this message are those under `smollm2_135m_2`; they differ under the others"
    assert result.stdout.rstrip().endswith(last_note)


def test_check_leaves_the_collector_off_when_the_process_ends_at_once(tmp_path):
    # the collector was enabled again when the command returned, and the first allocation after (printing the
    # summary, the exit's flush) ran a young collection over every object the analysis made with it off: ~9 of 35
    # CPU s of the 5 MB document (bench/results/check_phases_s7.md), for a process about to end without teardown
    path = tmp_path / "bigdoc.linnet"
    path.write_text(bigdoc_source.big_source(1), encoding="utf-8")
    hook = (
        "import gc, os\nreal_exit = os._exit\n"
        "def _exit(code):\n    print('collector at exit:', gc.isenabled(), file=sys.stderr, flush=True)\n"
        "    real_exit(code)\nos._exit = _exit\n"
    )
    result = run_entry(["check", str(path)], tmp_path, hook)
    assert result.returncode == 1
    assert "collector at exit: False" in result.stderr and "teardown ran" not in result.stderr


def test_other_commands_end_with_teardown(tmp_path):
    result = run_entry(["--version"], tmp_path)
    assert result.returncode == 0 and "teardown ran" in result.stderr


def test_check_analyses_without_the_collector_and_enables_it_again(monkeypatch, tmp_path):
    path = tmp_path / "one.linnet"
    path.write_text(bigdoc_source.big_source(1), encoding="utf-8")
    enabled_during = []
    real = program.Document.analyze

    def analyze(self, *args, **kwargs):
        enabled_during.append(gc.isenabled())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(program.Document, "analyze", analyze)
    assert gc.isenabled()
    assert main(["check", str(path)]) == 1
    assert enabled_during == [False]
    assert gc.isenabled()  # a caller in the same process (this test) gets its collector back


def run_with_reader_gone(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    """`linnet ARGS` (`python -m linnet`) whose stdout is a pipe closed before it writes: `linnet ... | head -0`."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "linnet", *args],
            cwd=tmp_path,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)},
            timeout=300,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("output", ["text", "json", "github"])
def test_check_with_errors_exits_1_when_its_reader_has_gone(tmp_path, output):
    # `linnet check FILE | head -1` on a file with errors exited 0: the closed pipe's BrokenPipeError was taken for
    # success. The verdict stands (1: errors), with no traceback; what it could not print is dropped
    path = tmp_path / "bigdoc.linnet"
    path.write_text(bigdoc_source.big_source(10), encoding="utf-8")  # 100 errors: more than the stream's buffer
    result = run_with_reader_gone(["check", "--format", output, str(path)], tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "Broken pipe" not in result.stderr
    if output == "text":
        assert result.stderr.strip().splitlines()[-1] == "checked 1 file: 100 errors, 10 warnings"


def test_fmt_check_exits_1_when_its_reader_has_gone(tmp_path):
    for n in range(400):  # enough `would reformat` lines to fill a pipe's buffer
        (tmp_path / f"model_{n:03}.linnet").write_text("config C {\n  x: int = 1\n}\n", encoding="utf-8")
    result = run_with_reader_gone(["fmt", "--check", str(tmp_path)], tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
