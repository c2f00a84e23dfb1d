"""bench/check_shares.py's provenance (no timing is measured here): run from one checkout with PYTHONPATH naming
another, it measures the `linnet` PYTHONPATH names and records that checkout's commit, not the commit of the folder
it runs from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

# what check_shares.py imports from its own folder (lsp_latency's imports included)
BENCH_FILES = ("check_shares.py", "bigdoc_source.py", "lsp_latency.py", "check_speed.py", "generate_speed.py")


def git(cwd, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_the_result_names_the_commit_of_the_linnet_on_pythonpath(tmp_path):
    # another checkout: its own bench folder and a `linnet` of its own, committed (a commit other than this one's)
    other = tmp_path / "other"
    (other / "bench").mkdir(parents=True)
    for name in BENCH_FILES:
        shutil.copy(ROOT / "bench" / name, other / "bench" / name)
    (other / "linnet").mkdir()
    (other / "linnet" / "__init__.py").write_text('raise ImportError("the linnet of the folder run from")\n')
    git(other, "init", "-q")
    git(other, "add", ".")
    git(other, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "another checkout")
    out = tmp_path / "shares.json"
    # the script's main, run as `python bench/check_shares.py` runs it (its folder first on sys.path, not the
    # working directory: `-P`), with the measurement replaced by what it would measure: which linnet is imported
    run = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.path.insert(0, {str(other / "bench")!r})
        spec = importlib.util.spec_from_file_location("check_shares", {str(other / "bench" / "check_shares.py")!r})
        shares = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(shares)
        def measure(copies, jobs):
            import linnet.semantics.program
            return {{"measured": linnet.semantics.program.__file__, "jobs": jobs, "copies": copies}}
        shares.measure = measure
        shares.markdown = lambda result: ""
        sys.argv = ["check_shares.py", "--jobs", "2", "--copies", "1", "--out", {str(out)!r}]
        shares.main()
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-P", "-c", run], cwd=other, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["measured"] == str(ROOT / "linnet" / "semantics" / "program.py")
    assert result["linnet"] == str(ROOT)
    assert result["git"]["commit"] == git(ROOT, "rev-parse", "HEAD") != git(other, "rev-parse", "HEAD")
