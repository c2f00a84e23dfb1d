"""The code passes `ruff check` and is `ruff format`-ted (settings in pyproject.toml, the
version pinned in constraints.txt and installed with the `test` extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PATHS = ["linnet", "tests", "bench", "tools"]
RUFF = str(Path(sys.executable).with_name("ruff"))


def test_ruff_check_and_format():
    check = subprocess.run([RUFF, "check", *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = subprocess.run([RUFF, "format", "--check", *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
