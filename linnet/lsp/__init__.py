"""The Linnet language server (`linnet lsp`): pygls 2 over stdio. `server.py` wires LSP
methods to the features, each in its own module; documents are analysed by the same
incremental front end as `linnet check` (`linnet.semantics.program.Document`)."""
