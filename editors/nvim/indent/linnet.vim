" Linnet indentation: one level per bracket left open on the previous line, one less on a
" line that starts by closing one (what `linnet fmt` and the VS Code rules do).
if exists("b:did_indent")
  finish
endif
let b:did_indent = 1

setlocal autoindent nosmartindent nocindent
setlocal indentexpr=LinnetIndent(v:lnum)
setlocal indentkeys=0},0],0),!^F,o,O
let b:undo_indent = "setlocal autoindent< smartindent< cindent< indentexpr< indentkeys<"

if exists("*LinnetIndent")
  finish
endif

function! LinnetIndent(lnum) abort
  let prev = prevnonblank(a:lnum - 1)
  if prev == 0
    return 0
  endif
  let indent = indent(prev)
  " Strip a trailing comment and strings before looking at the last character.
  let prev_code = substitute(getline(prev), '"\%([^"\\]\|\\.\)*"', '""', 'g')
  let prev_code = substitute(prev_code, '\s*#.*$', '', '')
  if prev_code =~# '[{([]\s*$'
    let indent += shiftwidth()
  endif
  if getline(a:lnum) =~# '^\s*[})\]]'
    let indent -= shiftwidth()
  endif
  return max([indent, 0])
endfunction
