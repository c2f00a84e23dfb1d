"""What the language server tells the `linnet` worker it runs a view or a command in (`views.run_worker`), through
the environment: the CLI reads it (`linnet.cli`). Imports nothing: every command's start reads it."""

# The variable naming a JSON file of {path: text}: the editor's buffers a worker reads instead of the files on disk,
# so that a run, a StableHLO or ONNX view, a comparison, a diff or a verification sees the unsaved edits of the
# files the source imports, as the server's diagnostics do (`linnet.ir.analyses.buffers`).
BUFFERS_ENV = "LINNET_BUFFERS"
