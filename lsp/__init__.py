"""The language server (`linnet.lsp`). Not landed yet; see ARCHITECTURE.md, "Language server
contract". It will analyse documents through `linnet.semantics.program.Document`."""
