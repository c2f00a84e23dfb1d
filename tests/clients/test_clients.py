"""The editor clients: the VS Code extension builds, passes its own tests (unit, grammar, and a
smoke test that starts the real server through vscode-languageclient) and packages as a .vsix;
the Neovim runtime files highlight, detect and indent Linnet. `.ci/run` installs the
extension's npm dependencies and Neovim; without them these tests skip and say why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "vscode-extension"


def _npm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "LINNET_PYTHON": sys.executable}
    return subprocess.run(["npm", *args], cwd=EXTENSION, capture_output=True, text=True, timeout=timeout, env=env)


def _needs_npm() -> None:
    if shutil.which("npm") is None:
        pytest.skip("needs npm (Node 20)")
    if not (EXTENSION / "node_modules").is_dir():
        pytest.skip("run `npm ci` in vscode-extension/ first (.ci/run does)")


@pytest.mark.slow
def test_vscode_extension_builds_passes_its_tests_and_packages(tmp_path):
    _needs_npm()
    for step in (("run", "build"), ("test",), ("run", "test:smoke")):
        done = _npm(*step)
        assert done.returncode == 0, f"npm {' '.join(step)}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    # the smoke test ran against the real server, not skipped
    assert "skipped 0" in done.stdout, done.stdout[-2000:]
    vsix = tmp_path / "linnet.vsix"
    done = _npm("run", "package", "--", "--out", str(vsix))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    names = set(zipfile.ZipFile(vsix).namelist())
    for wanted in (
        "extension/package.json",
        "extension/dist/extension.js",
        "extension/syntaxes/linnet.tmLanguage.json",
        "extension/language-configuration.json",
        "extension/snippets/linnet.json",
    ):
        assert wanted in names, wanted
    assert not any("node_modules" in n or n.endswith(".ts") for n in names)


def test_neovim_runtime_files():
    if shutil.which("nvim") is None:
        pytest.skip("needs nvim (apt-get install neovim)")
    done = subprocess.run(
        ["nvim", "--headless", "-u", "NONE", "-i", "NONE", "-S", str(ROOT / "editors/nvim/test/syntax.vim")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "all checks passed" in output, output
