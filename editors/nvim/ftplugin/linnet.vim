" Linnet: the formatter's conventions (`linnet fmt`: four spaces per level, `#` comments).
if exists("b:did_ftplugin")
  finish
endif
let b:did_ftplugin = 1

setlocal commentstring=#\ %s
" `##` lines are doc comments; list them first so `gq` and `o` keep the `##` leader.
setlocal comments=:##,:#
setlocal shiftwidth=4 softtabstop=4 tabstop=4 expandtab
setlocal formatoptions-=t formatoptions+=croql
setlocal suffixesadd=.linnet

let b:undo_ftplugin = "setlocal commentstring< comments< shiftwidth< softtabstop< tabstop< expandtab< formatoptions< suffixesadd<"
