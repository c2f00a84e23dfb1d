"""Headless Neovim 0.7, which has no `window/showDocument`, compares backends through the
`:LinnetCompare` user command exactly as docs/editors.md configures it, and gets the report as a
read-only buffer with a row per backend."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NVIM = shutil.which("nvim")

pytestmark = [
    pytest.mark.skipif(NVIM is None, reason="nvim is not installed (CI: apt-get install neovim)"),
    pytest.mark.slow,
]

INIT_LUA = r"""
local P = vim.fn.json_decode(vim.fn.readfile(PARAMS_PATH)[1])
local result = { errors = {} }
vim.o.swapfile = false
vim.cmd('autocmd BufRead,BufNewFile *.linnet setfiletype linnet')
local client_id = vim.lsp.start_client({ name = 'linnet', cmd = P.cmd, cmd_cwd = P.cwd, root_dir = P.root })
vim.cmd('autocmd FileType linnet lua vim.lsp.buf_attach_client(0, ' .. tostring(client_id or 0) .. ')')
local ok, err = pcall(function()
  vim.cmd('edit ' .. vim.fn.fnameescape(P.file))
  local ready = vim.wait(P.wait_ms, function()
    local c = vim.lsp.get_client_by_id(client_id)
    return c ~= nil and c.initialized
  end, 20)
  if not ready then table.insert(result.errors, 'the server did not initialize') end
  vim.cmd('LinnetCompare forward')
  local shown = vim.wait(P.compare_ms, function() return vim.api.nvim_buf_get_name(0):match('%.compare%.md$') end, 50)
  if not shown then table.insert(result.errors, 'no report buffer within ' .. P.compare_ms .. ' ms') end
  result.name = vim.api.nvim_buf_get_name(0)
  result.readonly = vim.bo.readonly
  result.lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
end)
if not ok then table.insert(result.errors, 'lua: ' .. tostring(err)) end
local f = assert(io.open(P.out, 'w'))
f:write(vim.fn.json_encode(result))
f:close()
if client_id then vim.lsp.stop_client(client_id) end
vim.cmd('qa!')
"""


def documented_command() -> str:
    """The `:LinnetCompare` snippet of docs/editors.md, as a user pastes it."""
    doc = (ROOT / "docs" / "editors.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```lua\n(-- :LinnetCompare.*?)```", doc, re.S)
    return block


def test_linnet_compare_opens_a_read_only_report_in_neovim_0_7(tmp_path):
    for framework in ("torch", "jax", "onnxruntime"):
        pytest.importorskip(framework)
    source = tmp_path / "mlp.linnet"
    shutil.copy(ROOT / "examples" / "mlp.linnet", source)
    params = {
        "cmd": [sys.executable, "-m", "linnet", "lsp"],
        "cwd": str(ROOT),
        "root": str(tmp_path),
        "file": str(source),
        "out": str(tmp_path / "received.json"),
        "wait_ms": 20000,
        "compare_ms": 240000,
    }
    (tmp_path / "params.json").write_text(json.dumps(params), encoding="utf-8")
    init = tmp_path / "init.lua"
    prelude = f"local PARAMS_PATH = {json.dumps(str(tmp_path / 'params.json'))}\n"
    init.write_text(prelude + documented_command() + INIT_LUA, encoding="utf-8")
    env = dict(os.environ, LINNET_CACHE_DIR=str(tmp_path / "cache"))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        env[var] = str(tmp_path / var.lower())
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-n", "-c", f"luafile {init}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = tmp_path / "received.json"
    assert out.exists(), f"Neovim wrote no result: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got["errors"] == [], got
    report = Path(got["name"])
    assert report.parent == tmp_path / "cache" / "reports" and report.name.startswith("mlp-")
    assert got["readonly"] is True  # 'readonly': the file has mode 0444
    assert got["lines"][0] == "# `forward` compared across backends"
    assert "preset `tiny`" in got["lines"][2]  # the file's first, as hovers quote
    rows = [line for line in got["lines"] if re.match(r"\| .* \(`[a-z-]+`\) \| ok \| \[1, 2\] float32 \|", line)]
    assert len(rows) == 4, got["lines"]
    assert "None: every backend that ran agrees." in got["lines"]
