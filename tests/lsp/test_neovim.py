"""A second real client: headless Neovim 0.7 drives `python -m linnet lsp` on a copy of the
planted-fault fixture through the setup docs/editors.md gives for Neovim 0.7 (the Lua block is
read from the doc and run as written, with `python` replaced by this interpreter, as the doc
says), presses `K` for hover and `<C-x><C-o>` for completion, and writes what it saw as JSON.
pytest-lsp is our own harness; Neovim is someone else's."""

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
FAULTS = Path(__file__).resolve().parent / "workspace" / "faults.linnet"
EDITORS_DOC = ROOT / "docs" / "editors.md"
SERVER = [sys.executable, "-m", "linnet", "lsp"]
DOC_CMD = "{ 'python', '-m', 'linnet', 'lsp' }"  # the doc's server command, which users adapt
NVIM = shutil.which("nvim")

pytestmark = pytest.mark.skipif(NVIM is None, reason="nvim is not installed (CI: apt-get install neovim)")


def neovim_07_snippet() -> str:
    """The Lua block of docs/editors.md's "Neovim 0.7" section, as written."""
    section = EDITORS_DOC.read_text(encoding="utf-8").split("### Neovim 0.7\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```lua\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the Neovim 0.7 section holds one Lua block"
    assert blocks[0].count(DOC_CMD) == 1, f"the snippet starts the server with {DOC_CMD}"
    return blocks[0]


# Run by `nvim --headless --clean -c "luafile init.lua"` after the doc's snippet; P holds the
# parameters. The doc's FileType autocommand starts the server and attaches the buffer.
DRIVER_LUA = r"""
local P = vim.fn.json_decode(vim.fn.readfile(PARAMS_PATH)[1])
local result = { diagnostics = {}, hover = vim.NIL, fixed = vim.NIL, completion = vim.NIL, errors = {} }

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

local function keys(text, mode)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(text, true, false, true), mode, false)
end

-- the lines of the floating window hover opened, if one is open
local function float_lines()
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(win).relative ~= '' then
      return vim.api.nvim_buf_get_lines(vim.api.nvim_win_get_buf(win), 0, -1, false), win
    end
  end
end

vim.o.swapfile = false
vim.opt.runtimepath:prepend(P.editors_nvim)  -- as the doc says; detection is set below
vim.cmd('autocmd BufRead,BufNewFile *.linnet setfiletype linnet')

local ok, err = pcall(function()
  vim.cmd('edit ' .. vim.fn.fnameescape(P.file))
  result.filetype = vim.bo.filetype
  -- the doc's on_attach runs once the server has answered `initialize`
  result.attached = vim.wait(P.wait_ms, function() return next(vim.lsp.buf_get_clients(0)) ~= nil end, 20)
  if not result.attached then
    table.insert(result.errors, 'no client attached within ' .. P.wait_ms .. ' ms')
    return
  end
  -- docs/editors.md's "Did the server attach?" expression, as written there
  result.attached_names = vim.tbl_map(function(c) return c.name end, vim.lsp.buf_get_clients(0))
  result.omnifunc = vim.bo.omnifunc
  local k = vim.fn.maparg('K', 'n', false, true)
  result.k_buffer_local = k.buffer == 1

  local got = vim.wait(P.wait_ms, function() return #vim.diagnostic.get(0) > 0 end, 20)
  result.diagnostics = simple(vim.diagnostic.get(0))
  if not got then table.insert(result.errors, 'no diagnostics within ' .. P.wait_ms .. ' ms') end
  write()

  -- hover: press K on `h` in `let h = up(x)` and read the floating window it opens
  vim.api.nvim_win_set_cursor(0, { P.hover_line, P.hover_col })
  keys('K', 'mx')
  local shown = vim.wait(P.request_ms, function() return float_lines() ~= nil end, 20)
  if shown then
    local lines, win = float_lines()
    result.hover = lines
    vim.api.nvim_win_close(win, true)
  else
    table.insert(result.errors, 'K opened no hover window')
  end
  write()

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
  write()

  -- completion: a new line `let zz = c.` in the body, then <C-x><C-o>; a timer reads the menu
  -- while Neovim stays in insert mode (feedkeys 'x!'), then leaves it
  vim.api.nvim_win_set_cursor(0, { P.hover_line, 0 })
  local waited = 0
  vim.fn.timer_start(20, function(timer)
    waited = waited + 20
    local info = vim.fn.complete_info({ 'items', 'pum_visible' })
    if #info.items > 0 or waited > P.request_ms then
      vim.fn.timer_stop(timer)
      local words = {}
      for _, item in ipairs(info.items) do table.insert(words, item.word) end
      result.completion = words
      result.completion_line = vim.api.nvim_get_current_line()
      keys('<C-e><Esc>', 'n')
    end
  end, { ['repeat'] = -1 })
  keys('olet zz = c.<C-x><C-o>', 'x!')
  if result.completion == vim.NIL or #result.completion == 0 then
    table.insert(result.errors, '<C-x><C-o> offered nothing')
  end
end)
if not ok then table.insert(result.errors, 'lua: ' .. tostring(err)) end
write()
for id, _ in pairs(vim.lsp.buf_get_clients(0)) do vim.lsp.stop_client(id) end
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
        "editors_nvim": str(ROOT / "editors" / "nvim"),
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
    lua_cmd = "{ " + ", ".join(json.dumps(part) for part in cmd) + " }"  # JSON strings are Lua strings here
    snippet = neovim_07_snippet().replace(DOC_CMD, lua_cmd)
    init = tmp_path / "init.lua"
    params_path = json.dumps(str(tmp_path / "params.json"))
    init.write_text(f"{snippet}\nlocal PARAMS_PATH = {params_path}\n{DRIVER_LUA}", encoding="utf-8")
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
    names = got["attached_names"]  # a Lua list comes back as a list, or as a dict when sparse
    assert list(names.values() if isinstance(names, dict) else names) == ["linnet"]
    expression = "vim.tbl_map(function(c) return c.name end, vim.lsp.buf_get_clients(0))"
    assert expression in EDITORS_DOC.read_text(encoding="utf-8").replace("\n", " ")

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

    # what the doc's on_attach set, buffer-local
    assert got["omnifunc"] == "v:lua.vim.lsp.omnifunc" and got["k_buffer_local"] is True

    # K on `h` in `let h = up(x)`: Neovim's hover window, in plain text as the doc's snippet asks (0.7 showed
    # Markdown's inline code with its backticks): the symbolic shape, then its numbers under the preset queries
    # read with none selected (the first, tiny_a, named though the defaults agree), no backtick anywhere
    assert got["hover"][0] == "h: [B, S, c.intermediate_size]", got["hover"]
    assert got["hover"][-1] == "= [B, S, 16] under preset tiny_a", got["hover"]
    assert not any("`" in line for line in got["hover"]), got["hover"]

    # <C-x><C-o> after `c.` on a new line in the body: the config's fields, the first one inserted
    assert got["completion"] == ["hidden_size", "intermediate_size", "num_heads"], context
    assert got["completion_line"] == "        let zz = c.hidden_size"

    # after Neovim's incremental didChange `hh` -> `h`, the other four remain where they were
    assert "down(gelu(h))" in got["text"] and "zz" not in got["text"]
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
    assert got["diagnostics"] == [] and got["hover"] is None and got["completion"] is None, context
    assert got["errors"] == ["no client attached within 1500 ms"], context
