"""A second real client: headless Neovim 0.7 (`vim.lsp.start_client`, its own sync and
position code) drives `python -m linnet lsp` on a copy of the planted-fault fixture, and
writes what it received as JSON. pytest-lsp is our own harness; Neovim is someone else's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).resolve().parent / "workspace" / "faults.linnet"
SERVER = [sys.executable, "-m", "linnet", "lsp"]
NVIM = shutil.which("nvim")

pytestmark = pytest.mark.skipif(NVIM is None, reason="nvim is not installed (CI: apt-get install neovim)")

# Run by `nvim --headless --clean -c "luafile init.lua"`; P holds the parameters. Neovim 0.7 API:
# no vim.lsp.start, so start_client + buf_attach_client on FileType.
INIT_LUA = r"""
local P = vim.fn.json_decode(vim.fn.readfile(PARAMS_PATH)[1])
local result = { diagnostics = {}, hover = vim.NIL, fixed = vim.NIL, errors = {} }

local function write()
  local f = assert(io.open(P.out, 'w'))
  f:write(vim.fn.json_encode(result))
  f:close()
end

local function simple(diags)
  local out = {}
  for _, d in ipairs(diags) do
    table.insert(out, { lnum = d.lnum, col = d.col, end_lnum = d.end_lnum, end_col = d.end_col,
                        code = d.code, severity = d.severity, message = d.message, source = d.source })
  end
  table.sort(out, function(a, b) return a.lnum < b.lnum or (a.lnum == b.lnum and a.col < b.col) end)
  return out
end

vim.o.swapfile = false
vim.cmd('autocmd BufRead,BufNewFile *.linnet setfiletype linnet')
local client_id = vim.lsp.start_client({
  name = 'linnet',
  cmd = P.cmd,
  cmd_cwd = P.cwd,
  root_dir = P.root,
  on_exit = function(code, signal) result.server_exit = { code = code, signal = signal } end,
})
if not client_id then
  table.insert(result.errors, 'start_client returned nil')
end
vim.cmd('autocmd FileType linnet lua vim.lsp.buf_attach_client(0, ' .. tostring(client_id or 0) .. ')')

local ok, err = pcall(function()
  vim.cmd('edit ' .. vim.fn.fnameescape(P.file))
  result.filetype = vim.bo.filetype
  result.attached = vim.lsp.buf_is_attached(0, client_id or 0)

  local got = vim.wait(P.wait_ms, function() return #vim.diagnostic.get(0) > 0 end, 20)
  result.diagnostics = simple(vim.diagnostic.get(0))
  if not got then table.insert(result.errors, 'no diagnostics within ' .. P.wait_ms .. ' ms') end

  -- hover where the cursor is, as K does (make_position_params converts to UTF-16)
  vim.api.nvim_win_set_cursor(0, { P.hover_line, P.hover_col })
  local params = vim.lsp.util.make_position_params()
  result.hover_position = params.position
  local responses, reason = vim.lsp.buf_request_sync(0, 'textDocument/hover', params, P.request_ms)
  if not responses then table.insert(result.errors, 'hover: ' .. tostring(reason)) end
  for _, r in pairs(responses or {}) do
    if r.err then table.insert(result.errors, 'hover error: ' .. vim.inspect(r.err)) end
    if r.result and r.result.contents then result.hover = r.result.contents end
    if r.result and r.result.range then result.hover_range = r.result.range end
  end

  -- an edit through Neovim's own incremental sync: `hh` -> `h` removes the unknown name
  vim.api.nvim_buf_set_text(0, P.fix_line, P.fix_col, P.fix_line, P.fix_col + 1, { '' })
  local fixed = vim.wait(P.wait_ms, function()
    local diags = vim.diagnostic.get(0)
    if #diags == 0 then return false end
    for _, d in ipairs(diags) do if d.code == 'L101' then return false end end
    return true
  end, 20)
  result.fixed = simple(vim.diagnostic.get(0))
  if not fixed then table.insert(result.errors, 'L101 still there after the fix') end
  result.text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\n')
end)
if not ok then table.insert(result.errors, 'lua: ' .. tostring(err)) end
write()
if client_id then vim.lsp.stop_client(client_id) end
vim.cmd('qa!')
"""


def run_neovim(tmp_path: Path, cmd: list[str], wait_ms: int = 20000, request_ms: int = 10000) -> tuple[dict, str]:
    """Neovim on a copy of faults.linnet with `cmd` as the server; (what it received, its stderr
    and LSP log, for failure messages)."""
    text = FAULTS.read_text(encoding="utf-8")
    source = tmp_path / "faults.linnet"
    source.write_text(text, encoding="utf-8")
    lines = text.split("\n")
    hover_line = next(i for i, line in enumerate(lines) if "let h = up(x)" in line)
    fix_line = next(i for i, line in enumerate(lines) if "gelu(hh)" in line)
    params = {
        "cmd": cmd,
        "cwd": str(ROOT),
        "root": str(tmp_path),
        "file": str(source),
        "out": str(tmp_path / "received.json"),
        "wait_ms": wait_ms,
        "request_ms": request_ms,
        "hover_line": hover_line + 1,  # nvim_win_set_cursor: 1-based line, 0-based byte column
        "hover_col": lines[hover_line].index("h = up"),
        "fix_line": fix_line,  # nvim_buf_set_text: 0-based
        "fix_col": lines[fix_line].index("hh"),
    }
    (tmp_path / "params.json").write_text(json.dumps(params), encoding="utf-8")
    init = tmp_path / "init.lua"
    init.write_text(f"local PARAMS_PATH = {json.dumps(str(tmp_path / 'params.json'))}\n" + INIT_LUA, encoding="utf-8")
    env = dict(os.environ)
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[var] = str(tmp_path / var.lower())
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-n", "-c", f"luafile {init}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = tmp_path / "xdg_cache_home" / "nvim" / "lsp.log"
    context = f"nvim exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\n"
    if log.exists():
        context += f"lsp.log:\n{log.read_text(encoding='utf-8', errors='replace')[-8000:]}"
    out = tmp_path / "received.json"
    assert out.exists(), f"Neovim wrote no result\n{context}"
    return json.loads(out.read_text(encoding="utf-8")), context


def test_neovim_receives_the_planted_diagnostics_and_hover(tmp_path):
    got, context = run_neovim(tmp_path, SERVER)
    print(context)  # shown by pytest on failure
    assert got["errors"] == [], context
    assert got["filetype"] == "linnet" and got["attached"] is True

    # vim.diagnostic: 0-based lnum, byte col; severity 1 = ERROR, 2 = WARN
    ERROR, WARN = 1, 2
    placed = [(d["code"], d["lnum"], d["col"], d["severity"]) for d in got["diagnostics"]]
    assert placed == [
        ("L901", 18, 12, WARN),
        ("L101", 19, 18, ERROR),
        ("L206", 23, 68, ERROR),
        ("L205", 24, 26, ERROR),
        ("L204", 32, 8, ERROR),
    ], context
    messages = {d["code"]: d["message"] for d in got["diagnostics"]}
    assert messages["L901"].startswith("`unused` is never used")
    assert messages["L101"].startswith("unknown name `hh`; did you mean `h`?")
    assert messages["L206"].startswith("c.intermediate_size / c.num_heads is not exact: 14 is not divisible by 3")
    assert "note: under preset `tiny_b`" in messages["L206"]
    assert messages["L205"].startswith("(n d) = 14 with n = 3: 14 is not divisible by 3")
    assert messages["L204"].startswith("`forward` returns [B, S, c.hidden_size], declared [B, S, c.intermediate_size]")
    assert all(d["source"] == "linnet" for d in got["diagnostics"])
    l101 = next(d for d in got["diagnostics"] if d["code"] == "L101")
    assert (l101["end_lnum"], l101["end_col"]) == (19, 20)  # `hh`

    # hover on `h` in `let h = up(x)`: the symbolic shape, then its numbers (the defaults; tiny_a agrees)
    assert got["hover_position"] == {"line": 17, "character": 12}
    assert got["hover"]["kind"] == "markdown"
    assert got["hover"]["value"] == "```linnet\nh: [B, S, c.intermediate_size]\n```\n\n= `[B, S, 16]`"
    assert got["hover_range"] == {"start": {"line": 17, "character": 12}, "end": {"line": 17, "character": 13}}

    # after Neovim's incremental didChange `hh` -> `h`, the other four remain where they were
    assert "down(gelu(h))" in got["text"]
    assert [(d["code"], d["lnum"], d["col"]) for d in got["fixed"]] == [
        ("L901", 18, 12),
        ("L206", 23, 68),
        ("L205", 24, 26),
        ("L204", 32, 8),
    ], context


def test_the_harness_reports_a_silent_server(tmp_path):
    """The same script against a server that answers nothing records no diagnostics and no
    hover, so the test above depends on what the server sends."""
    silent = [sys.executable, "-c", "import sys; sys.stdin.buffer.read()"]
    got, context = run_neovim(tmp_path, silent, wait_ms=1500, request_ms=1500)
    assert got["diagnostics"] == [] and got["hover"] is None, context
    assert any(e.startswith("no diagnostics") for e in got["errors"]), context
