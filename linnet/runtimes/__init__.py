"""Checkpoint loading, tokenizers and the generation runner (`linnet.runtimes`). Not landed yet;
see ARCHITECTURE.md. Nothing here is imported by `linnet check`."""
