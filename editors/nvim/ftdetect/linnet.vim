" Linnet model sources.
au BufRead,BufNewFile *.linnet set filetype=linnet
